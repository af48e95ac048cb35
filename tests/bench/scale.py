"""A job start of N nodes, sampled: what one daemon and the SA pay at 10,000 and 40,000 nodes.

    python -m tests.bench.scale [--nodes 1024,4096,10000,40000] [--full 16]
                                [--configs acm,bulk,c_baseline]
    python -m tests.bench.scale --one N K CONFIG      # one point, in this process
    python -m tests.bench.scale --report-only --storm-extra FILE   # compare again, no run

The storm (``storm.py``) runs all N daemons in full and stops near 4,096 nodes (N^2 cache
entries in one process). Here K daemons (K >= 16, spread evenly over the node list) run in
full: the real core (``Topology`` + ``Dispatcher``) and the real ``ibacmp`` on a ``SimWorld``
under trio's autojump ``MockClock``, as in the storm. The other N - K nodes are wire-level
peers on the same fabric (``PeerPool``): at the job start each multicasts the ACM request its
daemon would send first (for its ring successor, from its host name), and whenever a full
daemon multicasts a request for a peer's name, that peer answers it unicast from its own
port, as a daemon does. Their MADs are built with the project's codecs, and every MAD they
hear is decoded with them (a MAD that does not decode is an error of the run). The SA is the
simulated SA, answering whatever the full daemons ask (PathRecord GET, bulk GetTable).

The full daemons make their first request (for their ring successor) at the job start too,
through their dispatchers, so every node multicasts once as in the storm. Then every full
daemon resolves all N - 1 other nodes by name, one after another, through its dispatcher
with the 160-byte RESOLVE frame of ``ib_acme -f n``, and every answer is checked (status 0,
a PATH whose DLID and DGID are the target's).

Per full daemon (median and max over the K):

* ``cpu_s``: the CPU of the daemon's part of the job start: every MAD its endpoint handled
  (timed around the receive loop's ``PeerProtocol.handle``; the N - 1 first requests and
  the answers to its own), plus its resolution loop, run alone, less what was done meanwhile
  by the daemons' MAD handlers, the peers and the simulated SA (all in this process);
* ``sim_s``: simulated time from the first request heard to the last peer resolved;
* MADs received and sent (ACM requests and answers, from the endpoint's counters, and SA
  queries from the world's);
* ``rss_mb``: an idle daemon's RSS (``IDLE_RSS_MB``, measured by ``make bench-startup``) plus
  the daemon's share of the RSS growth while the K daemons worked, and the bytes per cache
  entry that growth comes to.

For the fabric: multicast requests, SA PathRecord queries and the PathRecords the SA sent
(``SubnetAdministrator.records_sent``: a bulk GetTable carries one per port).

Targets at N = 40,000 with ``acm``: each full daemon <= 2 s CPU and <= 64 MB RSS; the SA
answers <= N queries in total (0 with acm); and at N = 1,024 (and 4,096 with
``--storm-extra``: ``storm --one 4096 acm`` takes 7-15 minutes) the sampled per-daemon
figures within 20% of the full storm's (``results/storm.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing

from ibacm.acmp.groups import McGroup, build_join, parse_join_reply
from ibacm.config.options import Options
from ibacm.fabric.api import MULTICAST_QPN, AddressVector, ReceivedMad, SaDestination, UdQp
from ibacm.fabric.sim.topology import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.provider.api import Counter as AcmCounter
from ibacm.wire.acm_mad import ACM_METHOD_RESOLVE, AcmMad, acm_request, acm_response
from ibacm.wire.client import HDR_LEN, AcmHdr, AcmOp, AddrType, EpAddr, EpFlag
from ibacm.wire.errors import WireError
from tests.bench import plots
from tests.bench.common import (
    RESULTS_DIR,
    BenchError,
    current_rss_mb,
    exit_on_sigterm,
    verdict,
    write_results,
)
from tests.bench.storm import (
    ACM_CLASS,
    ACM_REQUEST,
    CONFIGS,
    GC_THRESHOLDS,
    path_queries,
    quiet_logging,
    wait_ready,
)
from tests.reliability.live import CoreNode, start_core_node

PATH_RECORD_ATTR = 0x35
ADDR_QUERY = AcmCounter.ADDR_QUERY
IDLE_RSS_MB_DEFAULT = 39.0
"""An idle daemon's RSS when ``make bench-startup`` has not left a measurement."""
TARGET_CPU_S, TARGET_RSS_MB = 2.0, 64.0
BASELINE_MAX = 4096
"""c_baseline (one SA query per resolution) is not run above this N by default."""


def idle_rss_mb() -> float:
    """The idle RSS ``make bench-startup`` measured last (a real daemon process)."""
    try:
        startup = json.loads((RESULTS_DIR / "startup.json").read_text())
        return float(startup["summary"]["idle_rss_mb"]["median"])
    except (OSError, ValueError, KeyError, TypeError):
        return IDLE_RSS_MB_DEFAULT


# -- the wire-level peers ------------------------------------------------------------------------


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
    mgid: bytes
    group: AddressVector
    answered: int = 0
    heard: int = 0
    cpu: float = 0.0
    """CPU spent hearing and answering (the peers' work, not a daemon's)."""
    undecodable: list[str] = field(default_factory=list)

    async def job_start(self, ring: list[str]) -> int:
        """Every peer multicasts its first request (for its ring successor); how many."""
        position = {name: index for index, name in enumerate(ring)}
        sent = 0
        for key, peer in self.peers.items():
            successor = ring[(position[peer.name] + 1) % len(ring)]
            mad = acm_request(
                sent + 1, AddrType.NAME, successor.encode(), AddrType.NAME, key, [self.mgid]
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
        peer = self.peers.get(mad.dest) if mad.dest_type == AddrType.NAME else None
        if peer is None:
            return
        answer = acm_response(mad.tid, self.mgid).encode()
        back = AddressVector(dlid=received.slid, dgid=received.sgid)
        await peer.qp.send(answer, back, received.src_qp)
        self.answered += 1


async def open_peers(world: SimWorld, names: list[str], group: McGroup) -> PeerPool:
    """One UD QP per peer; the first peer's port joins the ACM group for the listener."""
    peers: dict[bytes, Peer] = {}
    for name in names:
        device = (await world.fabric(name).open())[0]
        port = device.port(1)
        qp = await port.open_ud(0, recv_depth=1)  # answers to a peer are not read: dropped
        node = world.node(name)
        peers[EpAddr.from_name(name).info] = Peer(name, qp, node.lids[0], node.gids[0])
    first = world.node(names[0])
    device = (await world.fabric(names[0]).open())[0]
    port = device.port(1)
    attrs = await port.query()
    listener = await port.open_ud(0, recv_depth=max(1024, len(names)))
    tid = 0x5CA1E
    mgid, mlid = group.mgid, group.mlid
    join = build_join(tid, group, first.gids[0], 0xFFFF)
    reply = await port.sa_send(
        join, SaDestination(attrs.sm_lid, attrs.sm_sl, 0), timeout_ms=1000, retries=3
    )
    parse_join_reply(reply, tid, mgid)
    await listener.attach_mcast(mgid, mlid)
    return PeerPool(peers, listener, mgid, AddressVector(dlid=mlid, dgid=mgid))


@dataclass
class HandlerTime:
    cpu: float = 0.0
    calls: int = 0


def time_handler(node: CoreNode) -> HandlerTime:
    """Count the CPU of every MAD the daemon's endpoint handles (its receive loop calls
    ``protocol.handle``): the daemon's own share of a burst, without the simulated fabric's."""
    timer = HandlerTime()
    for endpoint in node.endpoints():
        protocol = endpoint.protocol
        handle = protocol.handle

        def timed(received: ReceivedMad, handle: Any = handle) -> None:
            started = time.process_time()
            try:
                handle(received)
            finally:
                timer.cpu += time.process_time() - started
                timer.calls += 1

        protocol.handle = timed  # type: ignore[method-assign]
    return timer


def time_sa(world: SimWorld) -> HandlerTime:
    """The CPU the simulated SA spends answering (in this process, but not the daemons')."""
    timer = HandlerTime()
    sa = world.sa
    handle = sa.handle

    def timed(requester: Any, mad: bytes) -> list[bytes]:
        started = time.process_time()
        try:
            return handle(requester, mad)
        finally:
            timer.cpu += time.process_time() - started
            timer.calls += 1

    sa.handle = timed  # type: ignore[method-assign]
    return timer


# -- one point -----------------------------------------------------------------------------------


class Frames:
    """The 160-byte RESOLVE of ``ib_acme -f n -s SOURCE -d DEST``, from parts made once (the
    harness must cost little beside the daemon's work it measures)."""

    def __init__(self, names: list[str]) -> None:
        header = AcmHdr(opcode=AcmOp.RESOLVE, length=160).encode()
        entries = {name: EpAddr.from_name(name).encode()[4:] for name in names}
        self.sources = {
            name: header + EpFlag.SOURCE.to_bytes(4, "little") + entry
            for name, entry in entries.items()
        }
        self.dests = {
            name: EpFlag.DEST.to_bytes(4, "little") + entry for name, entry in entries.items()
        }

    def frame(self, source: str, dest: str) -> bytes:
        return self.sources[source] + self.dests[dest]


def _process_cpu() -> float:
    return time.process_time()


async def scale_point(
    nodes_count: int, full_count: int, config_name: str, work: Path
) -> dict[str, Any]:
    config = {**CONFIGS[config_name], "recv_depth": max(Options().recv_depth, nodes_count)}
    world = SimWorld(generate(nodes_count))
    names = world.node_names
    step = nodes_count / full_count
    full_names = [names[int(i * step)] for i in range(full_count)]
    full_set = set(full_names)
    peer_names = [name for name in names if name not in full_set]
    gc.set_threshold(*GC_THRESHOLDS)
    wall0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        nodes: list[CoreNode] = [
            await start_core_node(world, work, name, nursery, **config) for name in full_names
        ]
        await wait_ready(nodes, bool(config.get("route_bulk_preload")))
        group0 = nodes[0].endpoints()[0].group0
        assert group0.mgid is not None and group0.mlid
        pool = await open_peers(world, peer_names, group0)
        nursery.start_soon(pool.serve)
        handling = {node.name: time_handler(node) for node in nodes}
        sa_time = time_sa(world)
        # The simulated fabric's routing tables (one per switch a multicast leaves from) are
        # made now, so the RSS the daemons add during the job start is theirs alone.
        for name in names:
            switch = world.port(name, "mlx5_0", 1).switch
            if switch:
                world.router.switch_distances(switch)
        startup_wall = time.perf_counter() - wall0
        gc.collect()
        gc.freeze()
        rss_before = current_rss_mb()
        counters_before = Counter(world.counters)
        records_before = world.sa.records_sent[PATH_RECORD_ATTR]
        entries_before = sum(len(ep.cache) for node in nodes for ep in node.endpoints())
        # Phase 1: the job start's first burst. Every node asks for its ring successor at
        # once: the full daemons through their dispatcher (a multicast each, as nothing is
        # known yet), the peers on the wire; every request reaches every daemon.
        sim_start = trio.current_time()
        cpu0, wall1 = _process_cpu(), time.perf_counter()
        frames = Frames(names)
        position = {name: index for index, name in enumerate(names)}
        first: list[bytes] = []
        async with trio.open_nursery() as firsts:
            for node in nodes:
                successor = names[(position[node.name] + 1) % len(names)]
                frame = frames.frame(node.name, successor)
                firsts.start_soon(_first_request, node, frame, first)
            await trio.testing.wait_all_tasks_blocked()
            peer_requests = await pool.job_start(names)
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(0.001)  # the burst crosses the fabric
        burst_cpu = _process_cpu() - cpu0
        burst_wall = time.perf_counter() - wall1
        # Phase 2: each daemon alone resolves all the others, answers checked.
        per_daemon: list[dict[str, Any]] = []
        dlids = {name: world.node(name).lids[0] for name in names}
        dgids = {name: world.node(name).gids[0] for name in names}
        failures: Counter[str] = Counter()
        for node in nodes:
            endpoint = node.endpoints()[0]
            sent_before = (
                endpoint.stats.responses_sent,
                node.topology.services.counters.values[ADDR_QUERY],
            )
            handlers_before = sum(timer.cpu for timer in handling.values())
            sa_before, peers_before = sa_time.cpu, pool.cpu
            cpu1, wall2, sim1 = _process_cpu(), time.perf_counter(), trio.current_time()
            for target in names:
                if target == node.name:
                    continue
                frame = frames.frame(node.name, target)
                reply = node.dispatcher.answer_now(frame) or node.dispatcher.resolve_now(frame)
                if reply is None:
                    reply = await node.dispatcher.resolve(frame, "scale")
                failures[_check(reply, dlids[target], dgids[target])] += 1
            own_cpu = _process_cpu() - cpu1
            per_daemon.append(
                {
                    "node": node.name,
                    # Its clients' work: the loop's CPU less the MADs it handled meanwhile
                    # (counted below with all the MADs it handled, of any phase),
                    # and less what the others did meanwhile: the other daemons' handlers
                    # (answering it), the peers and the simulated SA (all in this process).
                    "own_cpu_s": own_cpu
                    - (sum(timer.cpu for timer in handling.values()) - handlers_before)
                    - (sa_time.cpu - sa_before)
                    - (pool.cpu - peers_before),
                    "own_wall_s": time.perf_counter() - wall2,
                    "sim_s": trio.current_time() - sim_start,
                    "own_sim_s": trio.current_time() - sim1,
                    "requests_received": endpoint.stats.requests_received,
                    "responses_received": endpoint.stats.responses_received,
                    "responses_sent": endpoint.stats.responses_sent - sent_before[0],
                    "addr_queries_sent": node.topology.services.counters.values[ADDR_QUERY]
                    - sent_before[1],
                    "cache_entries": len(endpoint.cache),
                }
            )
        rss_after = current_rss_mb()
        entries_after = sum(len(ep.cache) for node in nodes for ep in node.endpoints())
        during = Counter(world.counters)
        during.subtract(counters_before)
        records = world.sa.records_sent[PATH_RECORD_ATTR] - records_before
        for node in nodes:
            await node.stop()
        nursery.cancel_scope.cancel()
    if pool.undecodable:
        raise BenchError(f"a peer heard MADs that do not decode: {pool.undecodable[:3]}")
    growth_mb = max(rss_after - rss_before, 0.0) / full_count
    added = (entries_after - entries_before) / full_count
    idle = idle_rss_mb()
    daemons = []
    for figures in per_daemon:
        timer = handling[figures["node"]]
        figures["mads_handled"] = timer.calls
        figures["handler_cpu_s"] = timer.cpu
        figures["cpu_s"] = figures["own_cpu_s"] + timer.cpu
        daemons.append(figures)
    sa_queries = path_queries(during)
    return {
        "nodes": nodes_count,
        "full": full_count,
        "config": config_name,
        "resolutions": full_count * (nodes_count - 1),
        "succeeded": failures.get("ok", 0),
        "failures": {k: v for k, v in failures.items() if k != "ok"},
        "peer_requests": peer_requests,
        "peer_answers": pool.answered,
        "per_daemon": {
            key: _spread([figures[key] for figures in daemons])
            for key in (
                "cpu_s",
                "handler_cpu_s",
                "own_cpu_s",
                "mads_handled",
                "sim_s",
                "requests_received",
                "responses_received",
                "responses_sent",
                "addr_queries_sent",
                "cache_entries",
            )
        },
        "rss_growth_mb_per_daemon": round(growth_mb, 2),
        "rss_mb_per_daemon": round(idle + growth_mb, 1),
        "idle_rss_mb": idle,
        "bytes_per_cache_entry": round(growth_mb * 1024 * 1024 / added) if added > 0 else None,
        "fabric": {
            "multicast_requests": during.get((ACM_CLASS, ACM_REQUEST, 0), 0),
            "multicast_requests_by_full_daemons": during.get((ACM_CLASS, ACM_REQUEST, 0), 0)
            - peer_requests,
            "sa_path_queries": sa_queries,
            "sa_path_records": records,
            "sa_path_queries_incl_startup": path_queries(world.counters),
            "sa_path_records_incl_startup": world.sa.records_sent[PATH_RECORD_ATTR],
        },
        "startup_wall_s": round(startup_wall, 1),
        "sa_cpu_s": round(sa_time.cpu, 3),
        "burst": {
            "process_cpu_s": round(burst_cpu, 3),
            "wall_s": round(burst_wall, 3),
            "daemons_cpu_s": round(sum(t.cpu for t in handling.values()), 3),
        },
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


async def _first_request(node: CoreNode, frame: bytes, replies: list[bytes]) -> None:
    replies.append(await node.dispatcher.resolve(frame, "scale"))


def _check(reply: bytes, dlid: int, dgid: bytes) -> str:
    if reply[2] != 0:
        return f"status {reply[2]}"
    if int.from_bytes(reply[20:22], "little") != AddrType.PATH:
        return "no path"
    path = reply[HDR_LEN + 8 : HDR_LEN + 8 + 64]
    if int.from_bytes(path[40:42], "big") != dlid:
        return "wrong DLID"
    if path[8:24] != dgid:
        return "wrong DGID"
    return "ok"


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "max": round(max(values), 4),
    }


def run_one(nodes_count: int, full_count: int, config_name: str) -> dict[str, Any]:
    quiet_logging()
    with tempfile.TemporaryDirectory(prefix="ibacm-scale-") as tmp:
        clock = trio.testing.MockClock(autojump_threshold=0)
        return trio.run(scale_point, nodes_count, full_count, config_name, Path(tmp), clock=clock)


def run_child(
    nodes_count: int, full_count: int, config_name: str, timeout: float
) -> dict[str, Any]:
    """One point in a fresh interpreter (its own RSS)."""
    command = [sys.executable, "-m", "tests.bench.scale", "--one"]
    command += [str(nodes_count), str(full_count), config_name]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"nodes": nodes_count, "config": config_name, "error": f"timeout {timeout:g}s"}
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        return {"nodes": nodes_count, "config": config_name, "error": tail}
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    figures["process_wall_s"] = round(time.perf_counter() - started, 1)
    return figures


# -- report ----------------------------------------------------------------------------------------


def print_point(figures: dict[str, Any]) -> None:
    if "error" in figures or "skipped" in figures:
        why = figures.get("error") or figures.get("skipped")
        print(f"N={figures['nodes']:6} {figures['config']:10} {why}")
        return
    daemon = figures["per_daemon"]
    fabric = figures["fabric"]
    print(
        f"N={figures['nodes']:6} {figures['config']:10} K={figures['full']} ok "
        f"{figures['succeeded']}/{figures['resolutions']}  per daemon: CPU "
        f"{daemon['cpu_s']['median']:.3f} s (max {daemon['cpu_s']['max']:.3f}; MADs "
        f"{daemon['handler_cpu_s']['median']:.3f} s for {daemon['mads_handled']['median']:.0f}, "
        f"clients {daemon['own_cpu_s']['median']:.3f} s), sim "
        f"{daemon['sim_s']['median'] * 1e3:.1f} ms, "
        f"heard {daemon['requests_received']['median']:.0f} requests, RSS "
        f"{figures['rss_mb_per_daemon']} MB ({figures['bytes_per_cache_entry']} B/entry)  "
        f"fabric: mcast {fabric['multicast_requests']}, SA PR queries "
        f"{fabric['sa_path_queries']}, records {fabric['sa_path_records']} "
        f"(+start-up {fabric['sa_path_records_incl_startup'] - fabric['sa_path_records']})"
    )


def storm_points(extra: list[Path]) -> list[dict[str, Any]]:
    """The full storm's points: ``results/storm.json`` and any ``storm --one`` outputs."""
    found: list[dict[str, Any]] = []
    with contextlib.suppress(OSError, ValueError, KeyError):
        found += json.loads((RESULTS_DIR / "storm.json").read_text())["points"]
    for path in extra:
        try:
            found.append(json.loads(path.read_text().strip().splitlines()[-1]))
        except (OSError, ValueError, IndexError) as exc:
            raise BenchError(f"--storm-extra {path}: not a storm --one result ({exc})") from exc
    return found


def storm_agreement(points: list[dict[str, Any]], storm: list[dict[str, Any]]) -> dict[str, Any]:
    """Sampled per-daemon figures against the full storm's at the same N and config."""
    found: dict[str, Any] = {}
    for point in points:
        if "error" in point or "skipped" in point:
            continue
        for full in storm:
            if (full.get("nodes"), full.get("config")) != (point["nodes"], point["config"]):
                continue
            if "error" in full or "skipped" in full:
                continue
            n = point["nodes"]
            # The daemons' own work when the storm timed it (``--daemon-cpu``), else its
            # wall time per daemon (one CPU-bound process: fabric and harness included).
            measured = "daemon_cpu_s_per_daemon" in full
            storm_cpu = full["daemon_cpu_s_per_daemon"] if measured else full["wall_s"] / n
            storm_bytes = full.get("bytes_per_cache_entry")
            sampled_cpu = point["per_daemon"]["cpu_s"]["median"]
            entry = {
                "storm_cpu_measure": "daemon work" if measured else "wall / N",
                "storm_cpu_s_per_daemon": round(storm_cpu, 4),
                "sampled_cpu_s_per_daemon": sampled_cpu,
                "cpu_ratio": round(sampled_cpu / storm_cpu, 3) if storm_cpu else None,
                "storm_bytes_per_entry": storm_bytes,
                "sampled_bytes_per_entry": point["bytes_per_cache_entry"],
                "bytes_ratio": (
                    round(point["bytes_per_cache_entry"] / storm_bytes, 3)
                    if storm_bytes and point["bytes_per_cache_entry"]
                    else None
                ),
            }
            found[f"{n} {point['config']}"] = entry
    return found


def targets(points: list[dict[str, Any]], agreement: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    for point in points:
        if "error" in point or "skipped" in point:
            continue
        n, config = point["nodes"], point["config"]
        found[f"N={n} {config}: every resolution right"] = verdict(
            point["succeeded"] == point["resolutions"]
        )
        if n == 40_000 and config == "acm":
            found["N=40000 acm: CPU per daemon <= 2 s"] = verdict(
                point["per_daemon"]["cpu_s"]["max"] <= TARGET_CPU_S
            )
            found["N=40000 acm: RSS per daemon <= 64 MB"] = verdict(
                point["rss_mb_per_daemon"] <= TARGET_RSS_MB
            )
        if n == 40_000:
            queries = point["fabric"]["sa_path_queries_incl_startup"]
            limit = 0 if config == "acm" else n
            found[f"N=40000 {config}: SA PathRecord queries <= {limit}"] = verdict(queries <= limit)
    for key, entry in agreement.items():
        for what in ("cpu_ratio", "bytes_ratio"):
            value = entry.get(what)
            if value is not None:
                found[f"{key}: sampled {what[:-6]} within 20% of the storm"] = verdict(
                    abs(value - 1) <= 0.2
                )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs=3, metavar=("N", "K", "CONFIG"), help="one point, here")
    parser.add_argument("--nodes", default="1024,4096,10000,40000")
    parser.add_argument("--full", type=int, default=16, help="daemons run in full (K >= 16)")
    parser.add_argument("--configs", default="acm,bulk,c_baseline")
    parser.add_argument("--baseline-max", type=int, default=BASELINE_MAX)
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds per point")
    parser.add_argument(
        "--storm-extra",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="a `storm --one N CONFIG` output to compare with (N = 4096 takes 15 minutes)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="recompute the comparison and targets of results/scale.json, measuring nothing",
    )
    args = parser.parse_args(argv)
    exit_on_sigterm()
    if args.one:
        n, k, config = int(args.one[0]), int(args.one[1]), args.one[2]
        if config not in CONFIGS:
            raise BenchError(f"unknown configuration {config!r}; known: {', '.join(CONFIGS)}")
        print(json.dumps(run_one(n, k, config)))
        return 0
    if args.full < 16:
        parser.error("--full must be at least 16")
    points = []
    if args.report_only:
        try:
            points = json.loads((RESULTS_DIR / "scale.json").read_text())["points"]
        except (OSError, ValueError, KeyError) as exc:
            raise BenchError(f"no results/scale.json to report on ({exc})") from exc
    for n in [] if args.report_only else (int(p) for p in args.nodes.split(",") if p.strip()):
        for config in (part.strip() for part in args.configs.split(",") if part.strip()):
            if config == "c_baseline" and n > args.baseline_max:
                skipped = f"not run above N={args.baseline_max} (--baseline-max)"
                figures: dict[str, Any] = {"nodes": n, "config": config, "skipped": skipped}
            else:
                figures = run_child(n, args.full, config, args.timeout)
            print_point(figures)
            points.append(figures)
    agreement = storm_agreement(points, storm_points(args.storm_extra))
    for key, entry in agreement.items():
        print(f"{key}: sampled against the full storm: {entry}")
    found = targets(points, agreement)
    for target, outcome in found.items():
        print(f"target {target}: {outcome}")
    write_results("scale", {"points": points, "storm_agreement": agreement, "targets": found})
    plots.plot("scale")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
