"""Multicast groups: which are joined, the join MAD, the join reply, group choice."""

from __future__ import annotations

import random

import pytest
import trio

from ibacm.config.option_values import RouteProt
from ibacm.config.options import Options
from ibacm.fabric.api import SaTimeout
from ibacm.provider.acmp.groups import (
    GroupSpec,
    JoinError,
    McGroup,
    build_join,
    group_av,
    group_path,
    jittered,
    join_forever,
    joined_mgids,
    parse_join_reply,
    plan_groups,
    select_group,
)
from ibacm.wire.mad import MadHeader, McMemberRecord, SaAttr, SaHeader, SaMad

PORT_GID = bytes.fromhex("fe800000000000000002c9030001e3f1")

# mad-protocol.md §9.9: the join of group 0 (10 Gb/s, 2048) for that port GID, TID 7.
SPEC_JOIN = bytes.fromhex(
    "01030202000000000000000000000007"
    "00380000000000000000000000000000"
    "00000000000000000000000000000000"
    "0000000000 01b3f7 ff154001ffff0003".replace(" ", "")
    + "04000000000000 00fe80000000000000".replace(" ", "")
    + "0002c9030001e3f1 80010000 0000 84 00".replace(" ", "")
    + "ffff 83 00 00000000 51 00 0000 00000000".replace(" ", "")
)


def opts(**changes: object) -> Options:
    options = Options()
    for key, value in changes.items():
        setattr(options, key, value)
    return options


def test_join_mad_matches_the_spec_example() -> None:
    group = McGroup(0, GroupSpec(rate=3, mtu=4), 0xFFFF)
    assert build_join(7, group, PORT_GID, 0xFFFF)[:112] == SPEC_JOIN


def test_route_prot_sa_joins_only_group_zero() -> None:
    assert plan_groups(opts(), port_rate=16, port_mtu=5) == [GroupSpec(3, 4)]


def test_route_prot_acm_adds_the_port_group_when_it_differs() -> None:
    acm = opts(route_prot=RouteProt.ACM)
    assert plan_groups(acm, 16, 5) == [GroupSpec(3, 4), GroupSpec(16, 5)]
    assert plan_groups(acm, 3, 4) == [GroupSpec(3, 4)]
    assert plan_groups(acm, 0, 5) == [GroupSpec(3, 4)]  # unknown rate: no rate-0 group


def test_mgid_carries_pkey_with_full_member_bit_rate_and_mtu() -> None:
    group = McGroup(1, GroupSpec(7, 5), 0x7FFF)
    assert group.mgid.hex() == "ff154001ffff00070500000000000000"


def _reply(request: bytes, record: McMemberRecord, status: int = 0, method: int = 0x81) -> bytes:
    sent = SaMad.decode(request)
    header = MadHeader(
        method=method, status=status, tid=sent.mad.tid | (5 << 32), attr_id=SaAttr.MC_MEMBER_RECORD
    )
    return SaMad(mad=header, sa=SaHeader(), data=record.encode()).encode()


def _granted(mgid: bytes) -> McMemberRecord:
    return McMemberRecord(
        mgid=mgid,
        port_gid=PORT_GID,
        qkey=0x80010000,
        mlid=0xC001,
        mtu_selector=2,
        mtu=4,
        tclass=0,
        pkey=0xFFFF,
        rate_selector=2,
        rate=3,
        packet_life_selector=2,
        packet_life=18,
        sl=1,
        flow_label=0x12345,
        hop_limit=3,
        scope=5,
        join_state=1,
    )


def test_join_reply_gives_the_group_av_and_path() -> None:
    group = McGroup(0, GroupSpec(3, 4), 0xFFFF)
    request = build_join(9, group, PORT_GID, 0xFFFF)
    granted = parse_join_reply(_reply(request, _granted(group.mgid)), 9, group.mgid)
    group.apply(granted, sgid_index=0, port_lid=7)
    assert group.joined and group.mlid == 0xC001
    av = group_av(granted, 0)
    assert (av.dlid, av.dgid, av.sl, av.static_rate) == (0xC001, group.mgid, 1, 3)
    assert (av.flow_label, av.hop_limit) == (0x12345, 3)
    path = group_path(granted, 7)
    assert (path.dgid, path.sgid, path.dlid, path.slid) == (group.mgid, PORT_GID, 0xC001, 7)
    assert path.reversible_numpath == 0x81 and path.sl == 1 and path.pkey == 0xFFFF
    assert (path.mtu_byte, path.rate_byte, path.packetlifetime_byte) == (0x84, 0x83, 0x92)


@pytest.mark.parametrize(
    ("status", "method", "tid", "mgid", "reason"),
    [
        (0x0200, 0x81, 9, None, "SA status 0x0200"),
        (0x0001, 0x81, 9, None, "SA status 0x0001"),  # BUSY is a failure too
        (0, 0x01, 9, None, "not GetResp"),
        (0, 0x81, 8, None, "does not match"),
        (0, 0x81, 9, bytes(16), "reply is for MGID"),
    ],
)
def test_failed_join_replies_say_why(
    status: int, method: int, tid: int, mgid: bytes | None, reason: str
) -> None:
    group = McGroup(0, GroupSpec(3, 4), 0xFFFF)
    request = build_join(9, group, PORT_GID, 0xFFFF)
    reply = _reply(request, _granted(mgid if mgid is not None else group.mgid), status, method)
    with pytest.raises(JoinError, match=reason):
        parse_join_reply(reply, tid, group.mgid)


def test_a_truncated_join_reply_is_a_join_error() -> None:
    with pytest.raises(JoinError, match="malformed"):
        parse_join_reply(b"\x01\x03", 1, bytes(16))


def test_the_most_preferred_common_group_is_chosen() -> None:
    low = McGroup(0, GroupSpec(3, 4), 0xFFFF)
    high = McGroup(1, GroupSpec(16, 5), 0xFFFF)
    joined = {low.mgid: low, high.mgid: high}
    other = bytes.fromhex("ff154001ffff00070500000000000000")
    assert select_group([low.mgid, high.mgid], joined) is high
    assert select_group([low.mgid, other], joined) is low
    assert select_group([other], joined) is None
    assert select_group([], joined) is None


def test_only_joined_groups_are_advertised() -> None:
    low = McGroup(0, GroupSpec(3, 4), 0xFFFF)
    high = McGroup(1, GroupSpec(16, 5), 0xFFFF)
    low.apply(_granted(low.mgid), 0, 1)
    assert joined_mgids([low, high]) == [low.mgid]


@pytest.mark.trio
async def test_joins_are_retried_with_exponential_backoff(autojump_clock: object) -> None:
    group = McGroup(0, GroupSpec(3, 4), 0xFFFF)
    attempts: list[float] = []

    async def attempt(_: McGroup) -> None:
        attempts.append(trio.current_time())
        if len(attempts) < 6:
            raise SaTimeout("no answer")

    start = trio.current_time()
    await join_forever(group, attempt, initial_ms=1000, max_ms=4000)
    gaps = [b - a for a, b in zip([start, *attempts], attempts, strict=False)][1:]
    # Each wait is between half and all of the backoff 1, 2, 4, 4, 4 s.
    for gap, backoff in zip(gaps, [1.0, 2.0, 4.0, 4.0, 4.0], strict=True):
        assert backoff / 2 <= gap <= backoff
    assert group.attempts == 6 and group.last_error == "no answer"


@pytest.mark.trio
async def test_nodes_that_failed_together_do_not_retry_in_step(autojump_clock: object) -> None:
    """An SM restart fails every node's join at once: their retries must spread out."""
    retries: list[float] = []

    async def node() -> None:
        group = McGroup(0, GroupSpec(3, 4), 0xFFFF)

        async def attempt(_: McGroup) -> None:
            if group.attempts == 1:
                raise SaTimeout("SM restarting")
            retries.append(trio.current_time())

        await join_forever(group, attempt, initial_ms=1000, max_ms=60000)

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(50):
            nursery.start_soon(node)
    offsets = sorted(t - start for t in retries)
    assert len(offsets) == 50 and offsets[0] >= 0.5 and offsets[-1] <= 1.0
    assert len({round(t, 3) for t in offsets}) >= 40  # spread over the half second
    assert offsets[-1] - offsets[0] > 0.3


@pytest.mark.trio
async def test_the_jitter_comes_from_the_generator_given(autojump_clock: object) -> None:
    async def fail_twice(group: McGroup) -> None:
        if group.attempts < 3:
            raise SaTimeout("no answer")

    runs = []
    for _ in range(2):
        group = McGroup(0, GroupSpec(3, 4), 0xFFFF)
        start = trio.current_time()
        await join_forever(group, fail_twice, 1000, 8000, random.Random(30))
        runs.append(trio.current_time() - start)
    same = random.Random(30)
    expected = jittered(1.0, same) + jittered(2.0, same)
    assert runs == [pytest.approx(expected)] * 2  # reproducible for a seed
    assert expected != pytest.approx(3.0)
