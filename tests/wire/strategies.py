"""Hypothesis strategies for the wire objects (shared by the wire tests)."""

from __future__ import annotations

from hypothesis import strategies as st

from ibacm.wire.acm_mad import ACM_METHOD_RESOLVE, ACM_METHOD_RESP, AcmMad
from ibacm.wire.client import AcmHdr, AcmMessage, AcmOp, EpAddr
from ibacm.wire.mad import MadHeader, McMemberRecord, SaHeader, SaMad
from ibacm.wire.path_record import PathRecord


def uint(bits: int) -> st.SearchStrategy[int]:
    return st.integers(min_value=0, max_value=(1 << bits) - 1)


gids = st.binary(min_size=16, max_size=16)

path_records = st.builds(
    PathRecord,
    service_id=uint(64),
    dgid=gids,
    sgid=gids,
    dlid=uint(16),
    slid=uint(16),
    raw_traffic=st.booleans(),
    flow_label=uint(20),
    hop_limit=uint(8),
    tclass=uint(8),
    reversible=st.booleans(),
    numb_path=uint(7),
    pkey=uint(16),
    qos_class=uint(12),
    sl=uint(4),
    mtu_selector=uint(2),
    mtu=uint(6),
    rate_selector=uint(2),
    rate=uint(6),
    packet_life_selector=uint(2),
    packet_life=uint(6),
    preference=uint(8),
    reserved=st.binary(min_size=6, max_size=6),
    flow_reserved=uint(3),
)

ep_addrs = st.builds(
    EpAddr,
    flags=uint(32),
    type=uint(16),
    info=st.binary(min_size=64, max_size=64),
    reserved=uint(16),
)

resolve_headers = st.builds(
    AcmHdr,
    version=st.just(1),
    opcode=st.sampled_from([AcmOp.RESOLVE, AcmOp.RESOLVE | 0x80]),
    status=uint(8),
    data0=uint(8),
    data1=uint(8),
    data2=uint(8),
    tid=uint(64),
)

acm_messages = st.builds(
    AcmMessage, hdr=resolve_headers, entries=st.lists(ep_addrs, min_size=0, max_size=8)
)

mc_member_records = st.builds(
    McMemberRecord,
    mgid=gids,
    port_gid=gids,
    qkey=uint(32),
    mlid=uint(16),
    mtu_selector=uint(2),
    mtu=uint(6),
    tclass=uint(8),
    pkey=uint(16),
    rate_selector=uint(2),
    rate=uint(6),
    packet_life_selector=uint(2),
    packet_life=uint(6),
    sl=uint(4),
    flow_label=uint(20),
    hop_limit=uint(8),
    scope=uint(4),
    join_state=uint(4),
    proxy_join=st.booleans(),
    proxy_reserved=uint(7),
    reserved=st.binary(min_size=6, max_size=6),
)

acm_mads = st.builds(
    AcmMad,
    method=st.sampled_from([ACM_METHOD_RESOLVE, ACM_METHOD_RESP]),
    status=uint(16),
    tid=uint(64),
    dest_type=uint(8),
    dest_length=uint(8),
    src_type=uint(8),
    src_length=uint(8),
    resp_resources=uint(8),
    init_depth=uint(8),
    reserved=uint(8),
    dest=st.binary(min_size=64, max_size=64),
    src=st.binary(min_size=64, max_size=64),
    gids=st.lists(gids, max_size=6),
)

mad_headers = st.builds(
    MadHeader,
    base_version=uint(8),
    mgmt_class=uint(8),
    class_version=uint(8),
    method=uint(8),
    status=uint(16),
    class_specific=uint(16),
    tid=uint(64),
    attr_id=uint(16),
    reserved=uint(16),
    attr_mod=uint(32),
)

sa_headers = st.builds(
    SaHeader,
    rmpp_version=uint(8),
    rmpp_type=uint(8),
    rmpp_flags=uint(8),
    rmpp_status=uint(8),
    seg_num=uint(32),
    paylen_newwin=uint(32),
    sm_key=uint(64),
    attr_offset=uint(16),
    reserved=uint(16),
    comp_mask=uint(64),
)

sa_mads = st.builds(
    SaMad, mad=mad_headers, sa=sa_headers, data=st.binary(min_size=200, max_size=200)
)
