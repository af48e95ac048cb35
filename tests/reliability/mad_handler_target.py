"""A fuzz target that reaches the provider's MAD handler, not only the decoder.

Each input is one MAD received by node1's ``AcmpProvider`` on a 3-node ``SimWorld`` (the
acmp test harness), handed to the code that receives it in the daemon:

* an ACM MAD (any class byte but 0x03) goes to the function the endpoint's receive loop
  calls, ``AcmpEndpoint.receive_mad``. So requests are matched against node1's addresses,
  senders are learned into its cache (and a peer's LID change noticed), answers are queued
  and sent, route queries go to the simulated SA and responses are matched against what is
  outstanding;
* an SA MAD (class byte 0x03) is the SA's answer to a PathRecord query of node1: a stranger
  (a fresh GID per input) asks node1 for its address, node1 learns it and asks the SA for
  the route (``Resolver`` -> ``SaPaths.get``), and the input comes back from the core's SA
  transport as the reply; ``check_path_reply``, the record decoding, the route phase, the
  cache entry going READY or failing, and the answer to the stranger all run on it. With
  method GetTable(Resp) (0x12/0x92) it answers a bulk route GetTable instead
  (``SaPaths.get_table`` then ``BulkRoutes.load``). A TID of 0 in the input stands
  for the TID asked (so mutations get past the TID check); any other TID is kept.

The world runs on trio in a thread of its own; every input is handled, and every task it
started has run until it blocks, before the next input. An SA answer of BUSY is retried at
once (the rig sets the backoff to 0), so no input waits on the wall clock.

Input layout of an ACM MAD: bytes 0..255 are the MAD (shorter inputs are zero padded, as a
receive buffer is). The optional 20 bytes after it choose the sender: byte 256 selects
node2, node3 or the GID/LID/QPN in bytes 257..275, so the fuzzer also covers unknown senders
and LID changes. An SA MAD is the whole input (a reassembled RMPP reply may be longer than
256 bytes), zero padded to 256.

A handler exception, an error logged by the daemon, or the world's trio run ending is a
crash. This module is imported by ``atheris_targets`` (instrumented with the rest of ibacm).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio
import trio.lowlevel
import trio.testing

from ibacm.config.options import Options
from ibacm.fabric.api import ReceivedMad, SaTimeout
from ibacm.provider.acmp import routes
from ibacm.provider.acmp.endpoint import AcmpEndpoint
from ibacm.provider.acmp.entry import EntryState
from ibacm.provider.acmp.keys import GID, NAME, cache_key
from ibacm.provider.api import CorePort
from ibacm.wire.acm_mad import acm_request, acm_response
from ibacm.wire.mad import (
    MadStatus,
    Method,
    MgmtClass,
    SaAttr,
    SaMad,
    SaStatus,
    build_path_get,
    build_path_get_table,
    build_sa_response,
    sa_status_word,
)
from ibacm.wire.path_record import PathRecord
from tests.provider.acmp.harness import cluster

MAD_SIZE = 256
START_TIMEOUT = 60.0
SA_CLASS = int(MgmtClass.SUBN_ADM)
STRANGER_PREFIX = bytes.fromhex("fe80000000000000fa22")
"""GIDs of the strangers whose route queries the input answers: this prefix + a counter."""
STRANGER_QPN = 0x3A5
SaRequest = Callable[[CorePort, bytes], Awaitable[bytes]]
SETTLE_ROUNDS = 20
"""An input whose tasks are still busy after this many settles is a hang (a crash)."""


class RigFailure(Exception):
    """The simulated node stopped (an exception in one of its tasks), or an input hung."""


@dataclass(frozen=True)
class Sender:
    gid: bytes
    lid: int
    qpn: int


@dataclass
class SaCounts:
    """What the SA side of the rig did (the handler-level counters a test can read)."""

    answered: int = 0
    """Fuzz inputs handed to the provider as the SA's reply."""
    ready: int = 0
    """Route queries the input made READY (a usable PathRecord answer)."""
    failed: int = 0
    """Route queries that ended without a route (unusable answer, SA status, BUSY)."""
    tables: int = 0
    """GetTable answers loaded as bulk routes."""
    bulk_paths: int = 0
    """Records of those answers that node1 then found as its bulk route to their DGID/DLID."""


class _Armed:
    """The input, waiting to be the reply to the matching query."""

    def __init__(self, reply: bytes, table: bool, peer: bytes) -> None:
        self.reply = reply.ljust(MAD_SIZE, b"\0")
        self.table = table
        self.peer = peer

    def matches(self, query: SaMad, dgid: bytes) -> bool:
        if self.table:
            return query.mad.method == Method.GET_TABLE
        return query.mad.method == Method.GET and dgid == self.peer

    def answer(self, query: SaMad) -> bytes:
        if any(self.reply[8:16]):
            return self.reply
        return self.reply[:8] + query.mad.tid.to_bytes(8, "big") + self.reply[16:]


class HandlerRig:
    """node1's provider on a running 3-node SimWorld, fed one received MAD at a time."""

    def __init__(self) -> None:
        self._started = threading.Event()
        self._stop: trio.Event | None = None
        self._failure: BaseException | None = None
        self.token: trio.lowlevel.TrioToken | None = None
        self.endpoint: AcmpEndpoint | None = None
        self.senders: list[Sender] = []
        self.mgids: list[bytes] = []
        self.sa = SaCounts()
        self._armed: _Armed | None = None
        self._strangers = 0
        self._busy_backoff = routes.BUSY_BACKOFF_INITIAL
        routes.BUSY_BACKOFF_INITIAL = 0.0
        self._thread = threading.Thread(target=self._run, name="mad-handler-rig", daemon=True)
        self._thread.start()
        if not self._started.wait(START_TIMEOUT) or self.endpoint is None:
            routes.BUSY_BACKOFF_INITIAL = self._busy_backoff
            raise RigFailure(f"the simulated cluster did not start: {self._failure!r}")

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            self._failure = exc
        finally:
            self._started.set()

    async def _main(self) -> None:
        # Short timeouts: a request that waits on a peer gives up soon, as inputs go by fast.
        options = Options()
        options.timeout = 50
        options.retries = 1
        async with cluster(3, options) as running:
            self.endpoint = running.endpoint("node1")
            for node in ("node2", "node3"):
                host = running.world.node(node)
                qpn = running.endpoint(node).qpn
                self.senders.append(Sender(host.gids[0], host.lids[0], qpn))
            self.mgids = list(self.endpoint.joined)
            core = running["node1"].core
            # The provider holds the core; its SA queries now come through ``_sa_request``.
            real = core.sa_request

            async def sa_request(port: CorePort, mad: bytes) -> bytes:
                return await self._sa_request(real, port, mad)

            core.sa_request = sa_request  # type: ignore[method-assign]
            # None started without waiting (``sa_start``): every query is ``sa_request``'s.
            core.sa_start = lambda port, mad: None  # type: ignore[method-assign]
            self.token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            self._started.set()
            await self._stop.wait()

    def close(self) -> None:
        if self.token is not None and self._thread.is_alive():
            stop = self._stop
            assert stop is not None
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(stop.set, trio_token=self.token)
        self._thread.join(10)
        routes.BUSY_BACKOFF_INITIAL = self._busy_backoff

    def received(self, data: bytes) -> ReceivedMad:
        """The completion a receive loop would get for ``data`` (see the module docstring)."""
        mad = data[:MAD_SIZE].ljust(MAD_SIZE, b"\0")
        tail = data[MAD_SIZE : MAD_SIZE + 20]
        choice = tail[0] % 3 if tail else 0
        if choice < 2:
            sender = self.senders[choice]
        else:
            raw = tail[1:].ljust(19, b"\0")
            lid = int.from_bytes(raw[16:18], "big") or 1
            sender = Sender(raw[:16], lid, int.from_bytes(raw[18:19], "big") | 0x100)
        return self._from(sender, mad)

    def _from(self, sender: Sender, mad: bytes) -> ReceivedMad:
        return ReceivedMad(
            mad=mad,
            sgid=sender.gid,
            dgid=self.mgids[0] if self.mgids else bytes(16),
            slid=sender.lid,
            src_qp=sender.qpn,
        )

    def feed(self, data: bytes) -> None:
        """Hand one input to the provider; returns once everything it started is blocked."""
        handle = self._handle_sa if data[1:2] == bytes([SA_CLASS]) else self._handle
        try:
            trio.from_thread.run(handle, data, trio_token=self.token)
        except trio.RunFinishedError:
            raise RigFailure(f"the simulated node stopped: {self._failure!r}") from self._failure

    async def _handle(self, data: bytes) -> None:
        assert self.endpoint is not None
        self.endpoint.receive_mad(self.received(data))
        await trio.testing.wait_all_tasks_blocked()

    # -- SA answers ----------------------------------------------------------------------

    async def _sa_request(self, real: SaRequest, port: CorePort, mad: bytes) -> bytes:
        query = SaMad.decode(mad)
        dgid = bytes(16)
        if query.mad.attr_id == SaAttr.PATH_RECORD:
            dgid = PathRecord.decode(query.data[:64]).dgid
        armed = self._armed
        if armed is not None and armed.matches(query, dgid):
            self._armed = None
            self.sa.answered += 1
            return armed.answer(query)
        if dgid.startswith(STRANGER_PREFIX):
            # A retry (after BUSY) for a stranger: nobody else answers for it.
            raise SaTimeout("the fuzz input was the only answer")
        return await real(port, mad)

    async def _handle_sa(self, data: bytes) -> None:
        table = len(data) > 3 and data[3] & 0x7F == Method.GET_TABLE
        try:
            if table:
                await self._answer_table(data)
            else:
                await self._answer_route_query(data)
        finally:
            self._armed = None

    async def _answer_route_query(self, data: bytes) -> None:
        """A stranger asks node1 for its address; node1's route query gets ``data``."""
        ep = self.endpoint
        assert ep is not None
        self._strangers += 1
        number = self._strangers
        gid = STRANGER_PREFIX + number.to_bytes(6, "big")
        stranger = Sender(gid, 0x2000 + number % 0x8000, STRANGER_QPN)
        self._armed = _Armed(data, table=False, peer=gid)
        request = acm_request(number & 0xFFFFFFFF, NAME, b"node1", GID, gid, self.mgids[:1])
        ep.receive_mad(self._from(stranger, request.encode()))
        key = cache_key(GID, gid)
        entry = ep.cache.get(key)
        for _ in range(SETTLE_ROUNDS):
            await trio.testing.wait_all_tasks_blocked()
            if entry is None or not entry.busy:
                break
        else:
            raise RigFailure(f"the route query of stranger {number} never ended")
        if entry is not None:
            if entry.state is EntryState.READY:
                self.sa.ready += 1
            else:
                self.sa.failed += 1
            ep.cache.remove(key)  # strangers come once: keep the cache small

    async def _answer_table(self, data: bytes) -> None:
        """node1's bulk route GetTable gets ``data``; the records become its bulk table."""
        ep = self.endpoint
        assert ep is not None
        self._armed = _Armed(data, table=True, peer=b"")
        port = ep.port
        outcome, records = await port.sa.get_table(PathRecord(sgid=port.gid, pkey=ep.pkey))
        if outcome.status == 0:
            self.sa.tables += 1
            ep.bulk.load(records, ep.gid)
            now = trio.current_time()
            self.sa.bulk_paths += sum(
                ep.bulk_route(record.dgid, record.dlid, now) is not None for record in records
            )
        ep.bulk.by_gid, ep.bulk.by_lid = {}, {}  # next inputs see the SA again
        await trio.testing.wait_all_tasks_blocked()


def _route_reply(query: PathRecord, status: int, record: bytes, table: bool = False) -> bytes:
    """The SA's answer to node1's query for ``query``, TID 0 (= the TID asked)."""
    build = build_path_get_table if table else build_path_get
    return build_sa_response(SaMad.decode(build(0, query)), status, record)


def sa_seeds(rig: HandlerRig) -> list[bytes]:
    """SA answers to node1's route queries: a usable PathRecord, NO_RECORDS, BUSY, a wrong
    TID, and GetTable answers with records from node1 (its bulk routes)."""
    ep = rig.endpoint
    assert ep is not None
    own_gid, own_lid = ep.port.gid, ep.port.lid
    peer_gid = STRANGER_PREFIX + (1).to_bytes(6, "big")
    path = PathRecord(
        dgid=peer_gid, sgid=own_gid, dlid=0x2001, slid=own_lid, reversible=True, numb_path=1,
        pkey=0xFFFF, mtu_selector=2, mtu=5, rate_selector=2, rate=16,
        packet_life_selector=2, packet_life=18,
    )  # fmt: skip
    query = PathRecord(sgid=own_gid, dgid=peer_gid, pkey=0xFFFF)
    good = _route_reply(query, 0, path.encode())
    paths = [
        PathRecord(dgid=sender.gid, sgid=own_gid, dlid=sender.lid, slid=own_lid, pkey=0xFFFF)
        for sender in rig.senders
    ]
    table_query = PathRecord(sgid=own_gid, pkey=0xFFFF)
    return [
        good,
        _route_reply(query, sa_status_word(SaStatus.NO_RECORDS), b""),
        _route_reply(query, MadStatus.BUSY, b""),
        good[:8] + (0x1234).to_bytes(8, "big") + good[16:],
        _route_reply(table_query, 0, b"".join(p.encode() for p in [path, *paths]), table=True),
        _route_reply(table_query, 0, b"", table=True),
    ]


def handler_seeds(rig: HandlerRig) -> list[bytes]:
    """MADs node2 and node3 would send: requests for node1's addresses and for others, and
    responses (the tail picks the sender: 0 node2, 1 node3, 2 a stranger); and the SA's
    answers to node1's route queries (``sa_seeds``)."""
    mgid = rig.mgids[0] if rig.mgids else bytes(16)
    requests = [
        acm_request(1, 1, b"node1", 1, b"node2", [mgid]),
        acm_request(2, 2, bytes([10, 0, 0, 1]), 2, bytes([10, 0, 0, 2]), [mgid]),
        acm_request(3, 1, b"node3", 1, b"node2", [mgid]),
        acm_request(4, 3, rig.senders[0].gid, 4, rig.senders[1].gid, [mgid]),
        acm_request(5, 5, (2).to_bytes(2, "big"), 1, b"nobody", [mgid, bytes(16)]),
    ]
    responses = [acm_response(6, mgid), acm_response(7, mgid, status=1)]
    out = []
    for index, mad in enumerate([*requests, *responses]):
        raw = mad.encode()
        out += [raw, raw + bytes([index % 3]) + bytes(19)]
    return [*out, *sa_seeds(rig)]
