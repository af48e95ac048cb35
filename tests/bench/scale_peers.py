"""The wire-level peers of ``scale.py``: N - K nodes that speak the ACM protocol and nothing else.

A peer has a UD QP on its own port of the simulated fabric and no daemon, no cache, no
task: memory is O(N) for all of them. At the job start each multicasts the request its daemon
would send first (for its ring successor, by name), built with the project's codec
(``acm_request``) and offering the groups a daemon with the same options offers (two with
route_prot acm: the minimum rate/MTU group and the port's own). One listener QP, on a peer's
port joined to the ACM group through the SA, hears every multicast request; a request from a
full daemon for a peer's name is answered unicast from that peer's own port
(``acm_response``, naming the group a daemon would pick), so the daemon learns the right LID
and GID. Every MAD the listener hears is decoded with the codecs (one that does not decode
is an error of the run), and each full daemon's request is compared, byte for byte, with the
request a peer sends for the same source, destination and TID: the peers' MADs are a
daemon's.

A request from one peer for another is not answered: the answer would only sit in a receive
queue nobody reads (its memory would be counted as the daemons'); the daemons never see such
answers on a real fabric either (they are unicast between the two peers).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ibacm.config.options import Options
from ibacm.fabric.api import MULTICAST_QPN, AddressVector, ReceivedMad, SaDestination, UdQp
from ibacm.fabric.sim.world import SimWorld
from ibacm.provider.acmp.groups import (
    McGroup,
    build_join,
    parse_join_reply,
    plan_groups,
    select_group,
)
from ibacm.wire.acm_mad import ACM_METHOD_RESOLVE, AcmMad, acm_request, acm_response
from ibacm.wire.client import AddrType, EpAddr
from ibacm.wire.errors import WireError

JOIN_TID = 0x5CA1E
DEFAULT_PKEY = 0xFFFF


@dataclass
class Peer:
    name: str
    qp: UdQp
    lid: int
    gid: bytes


@dataclass
class PeerPool:
    """N - K nodes that speak the ACM protocol on the wire and nothing else."""

    peers: dict[bytes, Peer]
    """By the 64-byte padded name they answer for."""
    listener: UdQp
    """One QP on a peer's port, joined to the ACM group: hears every multicast request."""
    groups: dict[bytes, McGroup]
    """The groups a peer offers, by MGID, lowest preference first (a daemon's groups)."""
    group: AddressVector
    """Group 0, where requests are multicast."""
    answered: int = 0
    unanswered: int = 0
    """Requests from one peer for another (see the module docstring)."""
    heard: int = 0
    daemon_requests: int = 0
    """Requests heard from full daemons, each compared with a peer's request."""
    differing: list[str] = field(default_factory=list)
    """Full daemons' requests whose bytes are not those a peer builds for them."""
    cpu: float = 0.0
    """CPU spent hearing and answering (the peers' work, not a daemon's)."""
    undecodable: list[str] = field(default_factory=list)

    @property
    def mgids(self) -> list[bytes]:
        """What a peer's request offers: its groups, lowest preference first."""
        return list(self.groups)

    async def job_start(self, ring: list[str]) -> int:
        """Every peer multicasts its first request (for its ring successor); how many."""
        position = {name: index for index, name in enumerate(ring)}
        mgids = self.mgids
        sent = 0
        for key, peer in self.peers.items():
            successor = ring[(position[peer.name] + 1) % len(ring)]
            mad = acm_request(
                sent + 1, AddrType.NAME, successor.encode(), AddrType.NAME, key, mgids
            )
            await peer.qp.send(mad.encode(), self.group, MULTICAST_QPN)
            sent += 1
        return sent

    async def serve(self) -> None:
        """Answer every multicast request for a peer's name, unicast from that peer."""
        while True:
            received = await self.listener.receive()
            self.heard += 1
            started = time.process_time()
            await self._answer(received)
            self.cpu += time.process_time() - started

    async def _answer(self, received: ReceivedMad) -> None:
        try:
            mad = AcmMad.decode(received.mad)
        except WireError as exc:
            self.undecodable.append(str(exc))
            return
        if mad.is_response or mad.method != ACM_METHOD_RESOLVE:
            return
        from_peer = mad.src_type == AddrType.NAME and mad.src in self.peers
        if not from_peer:
            self._compare(mad, received.mad)
        peer = self.peers.get(mad.dest) if mad.dest_type == AddrType.NAME else None
        if peer is None:
            return
        if from_peer:
            self.unanswered += 1
            return
        chosen = select_group(mad.gids, self.groups)  # as a daemon picks its answer's group
        if chosen is None:
            return
        answer = acm_response(mad.tid, chosen.mgid).encode()
        back = AddressVector(dlid=received.slid, dgid=received.sgid)
        await peer.qp.send(answer, back, received.src_qp)
        self.answered += 1

    def _compare(self, mad: AcmMad, raw: bytes) -> None:
        """A full daemon's request against the one a peer builds for the same addresses."""
        self.daemon_requests += 1
        ours = acm_request(mad.tid, mad.dest_type, mad.dest, mad.src_type, mad.src, self.mgids)
        if ours.encode() != raw:
            self.differing.append(f"tid {mad.tid:#x}: {raw.hex()} != {ours.encode().hex()}")


def acm_groups(world: SimWorld, name: str, options: Options) -> list[McGroup]:
    """The ACM groups a daemon of ``name`` joins with ``options`` (default P_Key), lowest
    preference first."""
    port = world.port(name, world.node(name).devices[0], 1)
    specs = plan_groups(options, port.rate, port.mtu)
    return [McGroup(index, spec, DEFAULT_PKEY) for index, spec in enumerate(specs)]


async def open_peers(world: SimWorld, names: list[str], options: Options) -> PeerPool:
    """One UD QP per peer; the first peer's port joins group 0 for the listener."""
    groups = acm_groups(world, names[0], options)
    group = groups[0]
    peers: dict[bytes, Peer] = {}
    for name in names:
        device = (await world.fabric(name).open())[0]
        port = device.port(1)
        qp = await port.open_ud(0, recv_depth=1)  # what a peer receives is not read
        node = world.node(name)
        peers[EpAddr.from_name(name).info] = Peer(name, qp, node.lids[0], node.gids[0])
    first = world.node(names[0])
    device = (await world.fabric(names[0]).open())[0]
    port = device.port(1)
    attrs = await port.query()
    listener = await port.open_ud(0, recv_depth=max(1024, len(names)))
    mgid = group.mgid
    join = build_join(JOIN_TID, group, first.gids[0], DEFAULT_PKEY)
    reply = await port.sa_send(
        join, SaDestination(attrs.sm_lid, attrs.sm_sl, 0), timeout_ms=1000, retries=3
    )
    mlid = parse_join_reply(reply, JOIN_TID, mgid).mlid
    await listener.attach_mcast(mgid, mlid)
    offered = {group.mgid: group for group in groups}
    return PeerPool(peers, listener, offered, AddressVector(dlid=mlid, dgid=mgid))
