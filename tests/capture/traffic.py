"""Real MAD traffic on a simulated fabric, for the capture and metrics tests.

``acm_exchange`` does what two ibacmp endpoints do when one resolves the other: both join the
ACM group 0 through the SA (MCMemberRecord SET) and attach their QPs, the requester asks the
SA for a path (PathRecord GET), multicasts an ACM resolve request and gets the unicast
response. Only the requester's fabric is tapped, so what a capture holds is exactly what one
daemon sends and receives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from ibacm.fabric.api import (
    MULTICAST_QPN,
    AddressVector,
    Fabric,
    Port,
    PortAttributes,
    SaDestination,
)
from ibacm.fabric.capture import MadTrace, SaExchange
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire.acm_mad import AcmMad, acm_request, acm_response, mgid_for
from ibacm.wire.client import AddrType
from ibacm.wire.mad import McMemberRecord, SaMad, build_mc_join, build_path_get
from ibacm.wire.path_record import PathRecord

ACM_QKEY = 0x80010000
GROUP0 = mgid_for(0xFFFF, rate=3, mtu=4)  # ff15:4001:ffff:0003:0400::
GROUP1 = mgid_for(0xFFFF, rate=16, mtu=5)
REQUEST_TID = 0x1234
JOIN_TID = 7
PATH_TID = 9


@asynccontextmanager
async def running(world: SimWorld) -> AsyncIterator[SimWorld]:
    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        yield world
        nursery.cancel_scope.cancel()


@dataclass(frozen=True)
class Exchange:
    """What happened, for the assertions."""

    requester: PortAttributes
    responder: PortAttributes
    requester_qpn: int
    responder_qpn: int
    mlid: int
    path: PathRecord
    request: AcmMad
    response: AcmMad


async def _first_port(fabric: Fabric) -> tuple[Port, PortAttributes]:
    device = (await fabric.open())[0]
    port = device.port(1)
    return port, await port.query()


async def _join(port: Port, attrs: PortAttributes, tid: int) -> McMemberRecord:
    record = McMemberRecord(
        mgid=GROUP0,
        port_gid=attrs.gids[0],
        qkey=ACM_QKEY,
        mtu_selector=2,
        mtu=4,
        pkey=0xFFFF,
        rate_selector=2,
        rate=3,
        scope=5,
        join_state=1,
    )
    answer = SaMad.decode(await _sa(port, attrs, build_mc_join(tid, record)))
    assert answer.mad.status == 0, f"join failed: status 0x{answer.mad.status:04x}"
    return McMemberRecord.decode(answer.data[:56])


async def _sa(port: Port, attrs: PortAttributes, mad: bytes) -> bytes:
    dest = SaDestination(attrs.sm_lid, attrs.sm_sl, attrs.sa_pkey_index())
    return await port.sa_send(mad, dest, timeout_ms=200, retries=2)


async def acm_exchange(requester_fabric: Fabric, responder_fabric: Fabric) -> Exchange:
    """Joins, a PathRecord query and one ACM resolve request/response (see the docstring)."""
    req_port, req = await _first_port(requester_fabric)
    resp_port, resp = await _first_port(responder_fabric)
    group = await _join(req_port, req, JOIN_TID)
    await _join(resp_port, resp, JOIN_TID + 100)
    req_qp = await req_port.open_ud(0, recv_depth=16)
    resp_qp = await resp_port.open_ud(0, recv_depth=16)
    await req_qp.attach_mcast(GROUP0, group.mlid)
    await resp_qp.attach_mcast(GROUP0, group.mlid)

    query = PathRecord(sgid=req.gids[0], dgid=resp.gids[0], pkey=0xFFFF)
    path_answer = SaMad.decode(await _sa(req_port, req, build_path_get(PATH_TID, query)))
    assert path_answer.mad.status == 0, f"path query failed: 0x{path_answer.mad.status:04x}"
    path = PathRecord.decode(path_answer.data[:64])

    request = acm_request(
        REQUEST_TID,
        AddrType.IP,
        bytes([10, 0, 0, 2]),
        AddrType.IP,
        bytes([10, 0, 0, 1]),
        [GROUP0, GROUP1],
    )
    await req_qp.send(request.encode(), AddressVector(dlid=group.mlid, dgid=GROUP0), MULTICAST_QPN)
    got = await resp_qp.receive()
    response = acm_response(REQUEST_TID, GROUP0)
    await resp_qp.send(response.encode(), AddressVector(dlid=got.slid, dgid=got.sgid), got.src_qp)
    # The requester hears its own multicast (IB loopback) and then the answer.
    seen = [await req_qp.receive(), await req_qp.receive()]
    assert sorted(AcmMad.decode(m.mad).method for m in seen) == [0x01, 0x81]
    return Exchange(req, resp, req_qp.qpn, resp_qp.qpn, group.mlid, path, request, response)


class Recorder:
    """A tap observer that keeps everything it is told."""

    def __init__(self) -> None:
        self.traces: list[MadTrace] = []
        self.exchanges: list[SaExchange] = []

    def on_mad(self, trace: MadTrace) -> None:
        self.traces.append(trace)

    def on_sa_exchange(self, exchange: SaExchange) -> None:
        self.exchanges.append(exchange)

    def take(self) -> tuple[list[MadTrace], list[SaExchange]]:
        """What was recorded, without the times (which differ from one call to the next)."""
        traces = [dataclasses.replace(t, time=0.0) for t in self.traces]
        exchanges = [dataclasses.replace(e, latency=0.0) for e in self.exchanges]
        self.traces, self.exchanges = [], []
        return traces, exchanges
