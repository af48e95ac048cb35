"""Live MAD fuzzing on demand: N crafted class 0x2C MADs into running daemons, with progress.

    python -m tests.reliability.live_mad_fuzz [--inputs 100000] [--seed 1] [--every 2]
                                              [--stall-limit 120]

Two real daemons (node1, node2: ``Daemon`` + ``ibacmp`` on an in-process ``SimWorld``) and a
rogue QP on node3 that puts each input on the wire, unicast to node1's endpoint QP or
multicast to the ACM group: random bytes, valid requests and responses with random fields
(addresses, types, TIDs, MGIDs, statuses) and valid MADs with a few bytes changed, from a
seeded PRNG so a run can be repeated. Each input is handled by every daemon before the next
goes out. Every few seconds it prints the inputs done, the rate, node1's cache size, MADs it
counted bad, its RSS, and whether both daemons still answer a client. An input that does
not settle gets a STALLED line every few seconds instead (what the run is doing: tasks,
runnable tasks, the next timer, node1's outstanding requests and resolutions, the SA
queue), and after ``--stall-limit`` seconds the run fails. At the end each daemon forgets
the other and resolves it again through the ACM protocol and the SA, and must get the
fabric's path (both ends' GIDs and LIDs), the same path it resolved before the fuzz.

Exit status 0 when every check held, 1 otherwise (the line says which).

The stall reported once (the hypothesis-driven test_mad_fuzz stopping near 40,000 inputs)
did not come back when measured, nor did any of its suspected causes show. That test, with
progress added, ran 60,000 inputs at a steady 450 to 550 per second on an idle machine and
20,000 at 400 to 490 per second with both cores kept busy by two spinning processes (CPU
starvation slows it by a tenth, no more): throughout, 36 trio tasks, 4 timers, no ACM
request outstanding and an empty SA queue (no unbounded queue, no stuck credit). What
grows is its RSS, 66 to 212 MB (about 2.5 KB per example, hypothesis's own: node1's cache
held 225 entries; this runner stays at 47 to 62 MB over 10^5), and node1's cache: every
valid request from a new source address is learned (that is the protocol), bounded by
``addr_timeout`` expiry, not by count (6,627 entries after 10^5 here). This runner needs
little CPU: 10^5 inputs in 117 s, 9.4 s of it CPU; an input's time is mostly the wait for
every task to stay blocked for CUSHION. The old test printed nothing while it ran, so a
slow run could not be told from a stalled one; here both show, and a stall says where.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import trio
import trio.lowlevel
import trio.testing

from ibacm.fabric.api import MULTICAST_QPN, AddressVector, UdQp
from ibacm.wire.acm_mad import AcmMad, acm_request, acm_response
from ibacm.wire.client import AcmMessage
from ibacm.wire.errors import WireError
from ibacm.wire.path_record import PathRecord
from tests.reliability.live import Client, LiveCluster, live_cluster, resolve_frame

MAD_SIZE = 256
CUSHION = 0.0005
"""Seconds every task must have been blocked for an input to count as handled."""
STALL_LIMIT = 120.0
"""Seconds an input may take to settle before the run gives up (a failure)."""
ADDRESS_TYPES = (1, 2, 3, 4, 5)  # name, ip, ip6, gid, lid (and out-of-range ones below)


@dataclass
class Progress:
    done: int = 0
    total: int = 0
    undecodable: int = 0
    bad_counted: int = 0
    cache_entries: int = 0
    rss_mb: float = 0.0
    answering: bool = True
    started: float = field(default_factory=time.monotonic)
    settled_at: float = field(default_factory=time.monotonic)
    """When the last input settled (or the last check ended)."""
    stalled: float = 0.0
    """Seconds the current input has not settled, once that is ``every`` or more."""
    diagnosis: str = ""

    @property
    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    def line(self) -> str:
        if self.stalled:
            return (
                f"{self.done}/{self.total} inputs  STALLED: input {self.done + 1} has not "
                f"settled for {self.stalled:.0f} s; {self.diagnosis}"
            )
        return (
            f"{self.done}/{self.total} inputs  {self.rate:.0f}/s  node1: cache "
            f"{self.cache_entries} entries, {self.bad_counted} counted bad "
            f"({self.undecodable} undecodable sent), RSS {self.rss_mb:.0f} MB, "
            f"daemons {'answering' if self.answering else 'NOT answering'}"
        )


class Inputs:
    """Seeded MAD generator: random, valid with random fields, mutated valid."""

    def __init__(self, seed: int, mgids: list[bytes]) -> None:
        self.rng = random.Random(seed)
        self.mgids = mgids
        self.seeds = [
            acm_request(7, 1, b"node1", 1, b"node3", mgids).encode(),
            acm_request(8, 1, b"nobody", 1, b"node2", mgids).encode(),
            acm_response(7, mgids[0]).encode(),
            acm_response(9, mgids[0], status=1).encode(),
        ]

    def _address(self, kind: int) -> bytes:
        rng = self.rng
        if kind == 1:
            return rng.choice([b"node1", b"node2", b"node3", b"nobody"]) + bytes(rng.randrange(3))
        if kind == 2:
            return bytes([10, 0, 0, rng.randrange(256)])
        return rng.randbytes(2 if kind == 5 else 16)  # a LID; an IPv6 address or a GID

    def valid(self) -> bytes:
        rng = self.rng
        if rng.random() < 0.5:
            mgids = [rng.choice([*self.mgids, rng.randbytes(16)])]
            return acm_response(rng.randrange(1 << 32), mgids[0], rng.randrange(8)).encode()
        dest_type = rng.choice((*ADDRESS_TYPES, 0, 6, 255))
        src_type = rng.choice((*ADDRESS_TYPES, 0, 7))
        mgids = [rng.choice([*self.mgids, rng.randbytes(16)]) for _ in range(rng.randrange(1, 4))]
        # Types without an address layout go out as their raw byte (acm_request refuses them).
        dest_kind = dest_type if dest_type in ADDRESS_TYPES else 1
        src_kind = src_type if src_type in ADDRESS_TYPES else 1
        mad: AcmMad = acm_request(
            rng.randrange(1 << 32),
            dest_kind,
            self._address(dest_kind),
            src_kind,
            self._address(src_kind),
            mgids,
        )
        return replace(mad, dest_type=dest_type, src_type=src_type).encode()

    def mutated(self) -> bytes:
        data = bytearray(self.rng.choice(self.seeds))
        for _ in range(self.rng.randrange(1, 9)):
            data[self.rng.randrange(MAD_SIZE)] = self.rng.randrange(256)
        return bytes(data)

    def next(self) -> tuple[bytes, bool]:
        pick = self.rng.random()
        if pick < 0.25:
            mad = self.rng.randbytes(MAD_SIZE)
        elif pick < 0.6:
            mad = self.valid()
        else:
            mad = self.mutated()
        return mad, self.rng.random() < 0.5


@dataclass
class Rogue:
    qp: UdQp
    unicast: AddressVector
    qpn: int
    group: AddressVector


async def rogue_on(cluster: LiveCluster, node: str = "node3") -> Rogue:
    device = (await cluster.world.fabric(node).open())[0]
    qp = await device.port(1).open_ud(0, recv_depth=4)
    target = cluster["node1"].endpoints()[0]
    group = target.group0
    assert group.mgid is not None and group.mlid
    lid = cluster.world.node("node1").lids[0]
    return Rogue(
        qp,
        AddressVector(dlid=lid, dgid=cluster.world.node("node1").gids[0]),
        target.qpn,
        AddressVector(dlid=group.mlid, dgid=group.mgid),
    )


def _rss_mb() -> float:
    """Resident set size now (VmRSS), else the peak."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def settle() -> None:
    """Until every daemon task has handled the input (all blocked for CUSHION seconds)."""
    await trio.testing.wait_all_tasks_blocked(cushion=CUSHION)


def diagnose(cluster: LiveCluster) -> str:
    """What the run is doing while an input does not settle (the STALLED lines)."""
    stats = trio.lowlevel.current_statistics()
    endpoint = cluster["node1"].endpoints()[0]
    busy = sum(1 for entry in endpoint.cache if entry.busy)
    return (
        f"{stats.tasks_living} tasks, {stats.tasks_runnable} runnable, next timer in "
        f"{stats.seconds_to_next_deadline:.3f} s; node1: {len(endpoint.outstanding)} ACM "
        f"requests outstanding, {busy} resolutions running, "
        f"{endpoint.stats.credit_overdrafts} credit overdrafts, "
        f"{endpoint.stats.responses_dropped} responses dropped; "
        f"SA queue {cluster.world.sa_queue_length}"
    )


async def _answering(cluster: LiveCluster) -> bool:
    """Both daemons answer a client (node1 -> node2 and back) within 10 s."""
    for src, dst in (("node1", "node2"), ("node2", "node1")):
        found = await resolve_path(cluster, src, dst)
        if isinstance(found, str):
            return False
    return True


async def resolve_path(cluster: LiveCluster, src: str, dst: str) -> PathRecord | str:
    """``src``'s daemon resolves ``dst`` for a client: the path, or what went wrong."""
    client = await Client.connect(cluster[src].socket_path)
    try:
        with trio.move_on_after(10):
            reply = await client.request(resolve_frame(src, dst))
            try:
                message = AcmMessage.decode(reply)
                if message.hdr.status != 0 or len(message.entries) != 1:
                    return f"status {message.hdr.status}, {len(message.entries)} entries"
                return message.entries[0].path()
            except WireError as exc:
                return f"undecodable answer: {exc}"
        return "no answer within 10 s"
    finally:
        await client.aclose()


def path_problem(cluster: LiveCluster, src: str, dst: str, path: PathRecord | str) -> str | None:
    """Why ``path`` is not the fabric's path from ``src`` to ``dst`` (None: it is)."""
    if isinstance(path, str):
        return path
    source, dest = cluster.world.node(src), cluster.world.node(dst)
    real = (source.gids[0], source.lids[0], dest.gids[0], dest.lids[0])
    got = (path.sgid, path.slid, path.dgid, path.dlid)
    if got != real:
        return f"path {got} is not the fabric's {real}"
    return None


async def _watchdog(
    cluster: LiveCluster,
    progress: Progress,
    every: float,
    stall_limit: float,
    report: Callable[[Progress], None],
    failures: list[str],
    feeding: trio.CancelScope,
) -> None:
    """Progress goes on while an input does not settle: a STALLED line every ``every``
    seconds says what the run is doing; after ``stall_limit`` seconds the fuzz gives up."""
    while True:
        await trio.sleep(every)
        stalled = time.monotonic() - progress.settled_at
        if stalled < every:
            continue
        progress.stalled = stalled
        progress.diagnosis = diagnose(cluster)
        report(progress)
        if stalled >= stall_limit:
            failures.append(
                f"input {progress.done + 1} did not settle in {stalled:.0f} s: {progress.diagnosis}"
            )
            feeding.cancel()
            return


async def run(
    tmp_path: Path,
    inputs: int,
    seed: int = 1,
    *,
    every: float = 2.0,
    stall_limit: float = STALL_LIMIT,
    report: Callable[[Progress], None] = lambda progress: None,
) -> tuple[Progress, list[str]]:
    """Fuzz; the last progress and the failed checks (empty: all held)."""
    failures: list[str] = []
    async with live_cluster(tmp_path, 3, start=2, timeout=200, retries=2) as cluster:
        node1 = cluster["node1"]
        pairs = (("node1", "node2"), ("node2", "node1"))
        before = {pair: await resolve_path(cluster, *pair) for pair in pairs}
        progress = Progress(total=inputs, answering=await _answering(cluster))
        for (src, dst), path in before.items():
            problem = path_problem(cluster, src, dst, path)
            if problem is not None:
                failures.append(f"{src} -> {dst} before the fuzz: {problem}")
        rogue = await rogue_on(cluster)
        endpoint = node1.endpoints()[0]
        source = Inputs(seed, list(endpoint.joined))
        bad_before = endpoint.stats.bad_mads
        async with trio.open_nursery() as nursery:
            feeding = trio.CancelScope()
            nursery.start_soon(
                _watchdog, cluster, progress, every, stall_limit, report, failures, feeding
            )
            with feeding:
                await _feed(cluster, rogue, source, progress, every, report, failures)
            nursery.cancel_scope.cancel()
        progress.bad_counted = endpoint.stats.bad_mads - bad_before
        if not (node1.alive and cluster["node2"].alive):
            failures.append("a daemon died")
        if progress.bad_counted < progress.undecodable:
            failures.append(
                f"{progress.undecodable} undecodable MADs sent, only "
                f"{progress.bad_counted} counted bad"
            )
        # The protocol still works: each daemon forgets the other, asks again through the
        # ACM protocol and the SA, and gets the fabric's path (the one it had before).
        for src, dst in pairs:
            await cluster[src].daemon.flush(None, None)
            path = await resolve_path(cluster, src, dst)
            problem = path_problem(cluster, src, dst, path)
            if problem is None and path != before[(src, dst)]:
                problem = f"path {path} differs from the one before the fuzz"
            if problem is not None:
                failures.append(f"{src} -> {dst} after the fuzz: {problem}")
    return progress, failures


async def _feed(
    cluster: LiveCluster,
    rogue: Rogue,
    source: Inputs,
    progress: Progress,
    every: float,
    report: Callable[[Progress], None],
    failures: list[str],
) -> None:
    endpoint = cluster["node1"].endpoints()[0]
    bad_before = endpoint.stats.bad_mads
    next_report = time.monotonic() + every
    for number in range(1, progress.total + 1):
        mad, multicast = source.next()
        try:
            AcmMad.decode(mad)
        except WireError:
            progress.undecodable += 1
        if multicast:
            await rogue.qp.send(mad, rogue.group, MULTICAST_QPN)
        else:
            await rogue.qp.send(mad, rogue.unicast, rogue.qpn)
        # Every daemon task has handled it before the next one goes out.
        await settle()
        progress.done = number
        progress.settled_at = time.monotonic()
        progress.stalled, progress.diagnosis = 0.0, ""
        if progress.settled_at >= next_report or number == progress.total:
            progress.bad_counted = endpoint.stats.bad_mads - bad_before
            progress.cache_entries = len(endpoint.cache)
            progress.rss_mb = _rss_mb()
            progress.answering = await _answering(cluster)
            report(progress)
            if not progress.answering:
                failures.append(f"the daemons stopped answering after {number} inputs")
                return
            progress.settled_at = time.monotonic()
            next_report = progress.settled_at + every


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--every", type=float, default=2.0, help="seconds between progress")
    parser.add_argument(
        "--stall-limit",
        type=float,
        default=STALL_LIMIT,
        help="seconds one input may take to settle before the run fails",
    )
    args = parser.parse_args(argv)

    def report(progress: Progress) -> None:
        print(progress.line(), flush=True)

    with tempfile.TemporaryDirectory(prefix="ibacm-live-fuzz-") as tmp:
        progress, failures = trio.run(
            lambda: run(
                Path(tmp),
                args.inputs,
                args.seed,
                every=args.every,
                stall_limit=args.stall_limit,
                report=report,
            )
        )
    for failure in failures:
        print(f"FAILED: {failure}")
    if not failures:
        print(f"ok: {progress.done} inputs in {time.monotonic() - progress.started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
