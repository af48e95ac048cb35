"""(b) The all-to-all storm: N nodes each resolving every other node (an MPI job start).

    python -m tests.bench.storm [--nodes 256,1024] [--configs bulk,acm,c_baseline]
    python -m tests.bench.storm --one 1024 bulk [--profile FILE]   # one point, in this process

Everything runs in one process on a ``SimWorld`` under trio's autojump ``MockClock``: the
simulated completion time comes from the mock clock, wall time and peak RSS are real. Each
node is the real core (``Topology`` + ``Dispatcher``, no sockets) with the real ``ibacmp``
provider; every resolution is a real 160-byte RESOLVE frame (``-f n -s nodeI -d nodeJ``)
handed to the dispatcher, in ring order (node i asks i+1, i+2, ...), one per client round
trip (``CLIENT_RTT`` of simulated time) per node, and every answer's DLID is checked.

Configurations:

* ``bulk``: route_prot sa with ``route_bulk_preload yes`` (one PathRecord GetTable per
  endpoint at start-up, RMPP-reassembled), so the storm itself needs no SA query;
* ``acm``: route_prot acm (routes from the shared multicast group);
* ``c_baseline``: what the C daemon does: route_prot sa, no bulk preload, sa_depth 1, one
  PathRecord query per resolution.

Each (N, configuration) runs in a fresh child process so that its peak RSS is its own. The
N daemons share one heap here, N times bigger than any real daemon's, so the harness freezes
the start-up objects out of the garbage collector and collects less often (recorded as
``gc`` in the results). Targets at N = 1024: <= 1.05 N multicast requests, <= N SA
PathRecord queries (bulk), <= 15 s wall with acm and <= 60 s for the others (``wall_s``: the
storm itself; the start-up's wall time is ``startup.wall_s``).

Every daemon's receive queue holds the first burst of N-1 requests (``recv_depth`` =
max(1024, N)); see ``storm_point``.

Each bulk/acm point up to N = 1024 runs ``--rounds`` times (3); the round with the median
wall time is reported, with every round's wall time beside it.

N = 4096 (``BENCH_FULL=1``) holds all N daemons' caches in this one process: N(N-1) = 16.8 M
entries at 400-700 bytes each plus, with ``bulk``, N tables of N paths: peak RSS measured
10.5 GB (``acm``) and 13.5 GB (``bulk``), which a 24 GB machine holds when nothing else big
runs. ``c_baseline`` is not run above N = 1024
(``--baseline-all`` does): N(N-1) = 16.8 M SA queries through one simulated SA take about
1 ms of wall each, some 4-5 hours.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import structlog
import trio
import trio.testing

import ibacm
from ibacm.config.option_values import RouteProt
from ibacm.config.options import Options
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire.client import HDR_LEN, AcmHdr, AcmOp, AddrType, EpAddr, EpFlag
from tests.bench import plots, storm_cluster
from tests.bench.common import (
    BenchError,
    as_written,
    current_rss_mb,
    exit_on_sigterm,
    parse_variants,
    self_peak_rss_mb,
    time_batches,
    variant_env,
    verdict,
    write_results,
)
from tests.reliability.live import CoreNode, start_core_node

CONFIGS: dict[str, dict[str, Any]] = {
    "bulk": {"route_prot": RouteProt.SA, "route_bulk_preload": True},
    "acm": {"route_prot": RouteProt.ACM},
    "c_baseline": {"route_prot": RouteProt.SA, "route_bulk_preload": False, "sa_depth": 1},
}
SA_CLASS, ACM_CLASS = 0x03, 0x2C
ACM_REQUEST, ACM_RESPONSE = 0x01, 0x81
SA_METHODS = {0x01: "Get", 0x02: "Set", 0x12: "GetTable", 0x15: "Delete"}
SA_ATTRS = {0x35: "PathRecord", 0x38: "MCMemberRecord"}
PATH_RECORD_ATTR = 0x35
CLIENT_RTT = 20e-6
"""Simulated seconds between one resolution of a node and its next: the MPI process's round
trip to its local daemon (a unix-socket request; ``throughput.py`` measures 12-60 us). With
no gap at all, every node would ask for its next peer microseconds after its first answer,
before the multicast requests of distant nodes have reached it, and about 2N multicast
requests result (a race against the fabric's propagation that real clients never win)."""
BASELINE_MAX = 1024
GC_THRESHOLDS = (50_000, 20, 100)
READY_TIMEOUT = 3600.0
"""Simulated seconds the start-up may take (joins and bulk preloads through one SA)."""


def quiet_logging() -> None:
    """Warnings and errors only, as a daemon at log_level 0 (and no per-event cost)."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def request_frames(names: list[str]) -> list[bytes]:
    """Per node, the 72-byte NAME entry as SOURCE and as DEST (frames are built by joining)."""
    return [EpAddr.from_name(name).encode() for name in names]


def _flagged(entry: bytes, flag: int) -> bytes:
    return flag.to_bytes(4, "little") + entry[4:]


def sa_requests(counters: Counter[tuple[int, int, int]]) -> dict[str, int]:
    """SA MADs sent by the daemons (requests, not the SA's answers), by method and attribute."""
    found: dict[str, int] = {}
    for (mgmt_class, method, attr), count in sorted(counters.items()):
        if mgmt_class != SA_CLASS or method & 0x80 or count <= 0:
            continue
        name = f"{SA_ATTRS.get(attr, hex(attr))} {SA_METHODS.get(method, hex(method))}"
        found[name] = found.get(name, 0) + count
    return found


def path_queries(counters: Counter[tuple[int, int, int]]) -> int:
    return sum(
        count
        for (mgmt_class, method, attr), count in counters.items()
        if mgmt_class == SA_CLASS and attr == PATH_RECORD_ATTR and not method & 0x80
    )


async def wait_ready(nodes: list[CoreNode], bulk: bool) -> None:
    with trio.fail_after(READY_TIMEOUT):
        while True:
            endpoints = [ep for node in nodes for ep in node.endpoints()]
            ready = len(endpoints) >= len(nodes) and all(ep.ready for ep in endpoints)
            if ready and (not bulk or all(ep.bulk.by_gid for ep in endpoints)):
                return
            await trio.sleep(0.05)


async def storm_point(
    nodes_count: int,
    config_name: str,
    work: Path,
    profile: Path | None = None,
    client_rtt: float = CLIENT_RTT,
    daemon_cpu: bool = False,
) -> dict[str, Any]:
    """One (N, configuration) point; runs inside ``trio.run`` with the mock clock.

    ``daemon_cpu`` also times the daemons' own work (every MAD handler call and every
    client request answered at once), so the storm gives a per-daemon figure that leaves
    out the simulated fabric and the harness, as ``scale.py`` measures it; the timers cost
    about a second of wall at N = 1024. After the storm each daemon answers its N - 1
    resolutions again, one daemon after another (``warm_clients``): the same cache hits with
    that daemon's objects in the CPU's caches, as on a node of its own. Inside the storm each
    round steps through all N daemons' objects in one heap of N^2 entries."""
    # Every receiver gets the N-1 first requests in one burst: its receive queue holds them
    # all, as an operator sizes recv_depth to the fabric. With the default (1024, as C) a
    # job start of more than 1025 nodes drops part of the burst at every receiver, and each
    # daemon that missed a peer asks for it again by multicast, N-1 more MADs each time.
    config = {**CONFIGS[config_name], "recv_depth": max(Options().recv_depth, nodes_count)}
    world = SimWorld(generate(nodes_count))
    names = world.node_names
    # The N daemons share this one heap, N times bigger than any real daemon's (the bulk
    # preload alone makes N tables of N paths): collect the young generation less often
    # from the start, or full collections scanning it all cost a third of the start-up.
    thresholds = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    wall0 = time.perf_counter()
    rss0 = current_rss_mb()
    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        nodes = [await start_core_node(world, work, name, nursery, **config) for name in names]
        sim0 = trio.current_time()
        await wait_ready(nodes, bool(config.get("route_bulk_preload")))
        startup = {
            "simulated_s": round(trio.current_time() - sim0, 3),
            "wall_s": round(time.perf_counter() - wall0, 2),
            "sa_requests": sa_requests(world.counters),
            "rss_mb": round(current_rss_mb() - rss0, 1),
        }
        # Keep what start-up made out of the collector: full collections would scan it all.
        gc.collect()
        gc.freeze()
        spent = [0.0, 0.0]  # the daemons' own work, with daemon_cpu: clients, MAD handlers
        if daemon_cpu:
            for node in nodes:
                for endpoint in node.endpoints():
                    _time_handler(endpoint, spent, 1)
        before = Counter(world.counters)
        entries_before = sum(len(ep.cache) for node in nodes for ep in node.endpoints())
        rss_before = current_rss_mb()
        outcome: Counter[int] = Counter()
        wrong_paths = 0
        entries = request_frames(names)
        header = AcmHdr(opcode=AcmOp.RESOLVE, length=160).encode()
        sources = [header + _flagged(entry, EpFlag.SOURCE) for entry in entries]
        dests = [_flagged(entry, EpFlag.DEST) for entry in entries]
        # Every answer is checked: a PATH entry whose DLID (path bytes 40-41) is the target's.
        dlids = [world.node(name).lids[0].to_bytes(2, "big") for name in names]
        dlid_at = HDR_LEN + 8 + 40

        def check(target: int, reply: bytes) -> None:
            nonlocal wrong_paths
            outcome[reply[2]] += 1
            if reply[2] == 0 and (
                reply[20] != AddrType.PATH or reply[dlid_at : dlid_at + 2] != dlids[target]
            ):
                wrong_paths += 1

        # The clients, driven as the daemon's own poller drives a connection: one request per
        # node per client round trip (CLIENT_RTT), answered at once when the daemon can
        # (``CoreNode.answer_now``, a cache hit), else by a task that waits
        # (``resolve``); a node whose resolution took longer goes on at once with the steps
        # it missed. One loop per tick instead of a task per client: the harness costs
        # little beside the daemons' work.
        released = 0
        steps = [1] * nodes_count
        waiting = [False] * nodes_count

        def advance(index: int, storm: trio.Nursery) -> None:
            node = nodes[index]
            while steps[index] <= released and not waiting[index]:
                target = (index + steps[index]) % nodes_count
                frame = sources[index] + dests[target]
                if daemon_cpu:
                    started = time.process_time()
                    reply = node.answer_now(frame)
                    spent[0] += time.process_time() - started
                else:
                    reply = node.answer_now(frame)
                if reply is None:
                    waiting[index] = True
                    storm.start_soon(wait_for, index, target, frame, storm)
                    return
                check(target, reply)
                steps[index] += 1

        async def wait_for(index: int, target: int, frame: bytes, storm: trio.Nursery) -> None:
            check(target, await nodes[index].dispatcher.resolve(frame, "storm"))
            steps[index] += 1
            waiting[index] = False
            advance(index, storm)

        profiler = cProfile.Profile() if profile is not None else None
        sim1 = trio.current_time()
        wall1 = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        async with trio.open_nursery() as storm:
            for step in range(1, nodes_count):
                released = step  # what advance() may issue up to
                for index in range(nodes_count):
                    advance(index, storm)
                await trio.sleep(client_rtt)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(str(profile))
        storm_wall = time.perf_counter() - wall1
        storm_sim = trio.current_time() - sim1
        warm = warm_clients(nodes, sources, dests) if daemon_cpu else 0.0
        during = Counter(world.counters)
        during.subtract(before)
        entries_after = sum(len(ep.cache) for node in nodes for ep in node.endpoints())
        rss_after = current_rss_mb()
        for node in nodes:
            await node.stop()
        nursery.cancel_scope.cancel()
    gc.set_threshold(*thresholds)
    resolutions = nodes_count * (nodes_count - 1)
    new_entries = entries_after - entries_before
    figures: dict[str, Any] = {
        "nodes": nodes_count,
        "config": config_name,
        "client_rtt_us": client_rtt * 1e6,
        "modules": ibacm.variant.describe(),
        "gc": f"thresholds {GC_THRESHOLDS} from the start, frozen after start-up",
        "options": {k: (v.name.lower() if hasattr(v, "name") else v) for k, v in config.items()},
        "resolutions": resolutions,
        "succeeded": outcome.get(0, 0),
        "statuses": {str(k): v for k, v in sorted(outcome.items())},
        "wrong_paths": wrong_paths,
        "multicast_requests": during.get((ACM_CLASS, ACM_REQUEST, 0), 0),
        "unicast_replies": during.get((ACM_CLASS, ACM_RESPONSE, 0), 0),
        "sa_requests": sa_requests(during),
        "sa_path_queries": path_queries(during),
        "sa_path_queries_incl_startup": path_queries(world.counters),
        "simulated_completion_s": round(storm_sim, 6),
        "wall_s": round(storm_wall, 2),
        "wall_per_resolution_us": round(storm_wall / resolutions * 1e6, 1),
        "startup": startup,
        "cache_entries": entries_after,
        "cache_entries_added": new_entries,
        "bytes_per_cache_entry": (
            round((rss_after - rss_before) * 1024 * 1024 / new_entries) if new_entries > 0 else None
        ),
        "peak_rss_mb": round(self_peak_rss_mb(), 1),
        **(
            {
                "daemon_cpu_s_per_daemon": round(sum(spent) / nodes_count, 4),
                "daemon_clients_cpu_s_per_daemon": round(spent[0] / nodes_count, 4),
                "daemon_handler_cpu_s_per_daemon": round(spent[1] / nodes_count, 4),
                "warm_clients_cpu_s_per_daemon": round(warm / nodes_count, 4),
            }
            if daemon_cpu
            else {}
        ),
        "world_stats": dict(world.stats),
    }
    return figures


def _time_handler(endpoint: Any, spent: list[float], slot: int) -> None:
    def add(_mads: int, seconds: float) -> None:
        spent[slot] += seconds

    time_batches(endpoint.qp, add)


def warm_clients(nodes: list[CoreNode], sources: list[bytes], dests: list[bytes]) -> float:
    """CPU of every daemon answering its N - 1 resolutions again, one daemon at a time (all
    cache hits by now; a miss is an error of the run)."""
    count = len(nodes)
    spent = 0.0
    for index, node in enumerate(nodes):
        frames = [sources[index] + dests[(index + step) % count] for step in range(1, count)]
        started = time.process_time()
        for frame in frames:
            if node.answer_now(frame) is None:
                raise RuntimeError(f"{node.name}: a resolution of the storm is no cache hit")
        spent += time.process_time() - started
    return spent


def run_one(
    nodes_count: int,
    config_name: str,
    profile: Path | None = None,
    client_rtt: float = CLIENT_RTT,
    daemon_cpu: bool = False,
) -> dict[str, Any]:
    quiet_logging()
    with tempfile.TemporaryDirectory(prefix="ibacm-storm-") as tmp:
        clock = trio.testing.MockClock(autojump_threshold=0)
        point = functools.partial(
            storm_point, profile=profile, client_rtt=client_rtt, daemon_cpu=daemon_cpu
        )
        return trio.run(point, nodes_count, config_name, Path(tmp), clock=clock)


def run_child(
    nodes_count: int, config_name: str, timeout: float, client_rtt_us: float, variant: str
) -> dict[str, Any]:
    """One point in a fresh interpreter (its own peak RSS) running ``variant``."""
    command = [sys.executable, "-m", "tests.bench.storm", "--one", str(nodes_count), config_name]
    command += ["--client-rtt-us", str(client_rtt_us)]
    started = time.perf_counter()
    point = {"nodes": nodes_count, "config": config_name, "variant": variant}
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=variant_env(variant, dict(os.environ)),
        )
    except subprocess.TimeoutExpired:
        return point | {"error": f"timeout {timeout:g}s"}
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        return point | {"error": tail}
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    figures["variant"] = variant
    figures["process_wall_s"] = round(time.perf_counter() - started, 1)
    return figures


def run_rounds(
    nodes_count: int,
    config_name: str,
    timeout: float,
    client_rtt_us: float,
    rounds: int,
    variants: list[str],
) -> list[dict[str, Any]]:
    """The point ``rounds`` times per variant, each in a fresh interpreter, the variants
    taking turns; per variant the figures of the round with the median storm wall time,
    with every round's wall times beside them (a 2-core VM's speed drifts by a fifth from
    one minute to the next)."""
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in variants}
    for _ in range(rounds):
        for variant in variants:
            runs[variant].append(
                run_child(nodes_count, config_name, timeout, client_rtt_us, variant)
            )
    return [_median_round(found) for found in runs.values()]


def _median_round(runs: list[dict[str, Any]]) -> dict[str, Any]:
    failed = [figures for figures in runs if "error" in figures]
    if failed:
        return failed[0]
    runs.sort(key=lambda figures: figures["wall_s"])
    median = dict(runs[len(runs) // 2])
    median["rounds"] = {
        "wall_s": [figures["wall_s"] for figures in runs],
        "startup_wall_s": sorted(figures["startup"]["wall_s"] for figures in runs),
        "peak_rss_mb": sorted(figures["peak_rss_mb"] for figures in runs),
    }
    return median


def print_point(figures: dict[str, Any]) -> None:
    if "error" in figures:
        print(f"N={figures['nodes']:5} {figures['config']:10} FAILED: {figures['error']}")
        return
    variant = " (as written)" if as_written(figures) else ""
    print(
        f"N={figures['nodes']:5} {figures['config'] + variant:10} ok {figures['succeeded']}/"
        f"{figures['resolutions']}  mcast {figures['multicast_requests']}  "
        f"ucast {figures['unicast_replies']}  SA PR {figures['sa_path_queries']} "
        f"(+startup {figures['sa_path_queries_incl_startup'] - figures['sa_path_queries']})  "
        f"sim {figures['simulated_completion_s']}s  wall {figures['wall_s']}s "
        f"(start-up {figures['startup']['wall_s']}s)  "
        f"peak RSS {figures['peak_rss_mb']} MB  {figures['bytes_per_cache_entry']} B/entry"
        + (f"  (median of walls {figures['rounds']['wall_s']})" if "rounds" in figures else "")
    )


WALL_TARGETS_1024 = {"acm": 15.0}
"""Storm wall targets at N = 1024 (seconds); the other configurations keep 60 s."""


def targets(points: list[dict[str, Any]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for figures in points:
        if figures.get("nodes") != 1024 or "error" in figures or "skipped" in figures:
            continue
        n = figures["nodes"]
        config = figures["config"]
        if as_written(figures):
            config += " (as written)"
        found[f"{config}: multicast requests <= 1.05N"] = verdict(
            figures["multicast_requests"] <= 1.05 * n
        )
        limit = WALL_TARGETS_1024.get(figures["config"], 60.0)
        found[f"{config}: wall <= {limit:g} s"] = verdict(figures["wall_s"] <= limit)
        found[f"{config}: all resolved"] = verdict(figures["succeeded"] == figures["resolutions"])
        if figures["config"] == "bulk":
            found[f"{config}: SA PathRecord queries <= N (incl. start-up GetTables)"] = verdict(
                figures["sa_path_queries_incl_startup"] <= n
            )
    return found


C_REAL_MAX = 64
"""c_real runs one C daemon and one device process per node: 64 is what 2 cores start in a
minute or two."""


def c_real(count: int, most: int = C_REAL_MAX) -> dict[str, Any]:
    if count > most:
        skipped = f"c_real not run above N={most} (a process pair per node; see --c-real-max)"
        print(f"N={count:5} c_real     skipped: {skipped}")
        return {"nodes": count, "config": "c_real", "skipped": skipped}
    figures = storm_cluster.c_real_point(count)
    storm_cluster.print_c_real(figures)
    return figures


def compare_c_real(points: list[dict[str, Any]]) -> None:
    """The model (c_baseline) beside the real C daemons (c_real) at the same N."""
    by_key = {(p["nodes"], p["config"]): p for p in points if "error" not in p}
    for (count, config), real in sorted(by_key.items()):
        model = by_key.get((count, "c_baseline"))
        if config != "c_real" or "skipped" in real or model is None or "skipped" in model:
            continue
        print(
            f"N={count:5} c_real vs c_baseline: SA PathRecord queries {real['sa_path_queries']} "
            f"vs {model['sa_path_queries']}, multicast requests {real['multicast_requests']} vs "
            f"{model['multicast_requests']}, unicast replies {real['unicast_replies']} vs "
            f"{model['unicast_replies']}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs=2, metavar=("N", "CONFIG"), help="one point, here")
    default_nodes = "256,1024,4096" if os.environ.get("BENCH_FULL") == "1" else "256,1024"
    parser.add_argument("--nodes", default=default_nodes)
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"{', '.join(CONFIGS)}, and c_real (real C daemons, N <= --c-real-max)",
    )
    parser.add_argument(
        "--c-real-max",
        type=int,
        default=C_REAL_MAX,
        help=f"largest N run with real C daemons (default {C_REAL_MAX}; ~40 MB per node)",
    )
    parser.add_argument(
        "--baseline-max",
        type=int,
        default=BASELINE_MAX,
        help=f"largest N run with c_baseline (default {BASELINE_MAX}; N(N-1) SA queries)",
    )
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds per point")
    parser.add_argument(
        "--baseline-all", action="store_true", help=f"run c_baseline above N={1024} too"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help=f"runs of each bulk/acm point up to N={BASELINE_MAX}; the median wall is reported",
    )
    parser.add_argument("--profile", metavar="FILE", help="with --one: cProfile the storm phase")
    parser.add_argument(
        "--daemon-cpu",
        action="store_true",
        help="with --one: also time the daemons' own work (per-daemon CPU, as bench-scale)",
    )
    parser.add_argument(
        "--client-rtt-us", type=float, default=CLIENT_RTT * 1e6, help="see CLIENT_RTT"
    )
    parser.add_argument(
        "--variants",
        default="compiled,as_written",
        help="ibacm's hot modules compiled and/or as written (ibacm.compiled); taking turns",
    )
    args = parser.parse_args(argv)
    exit_on_sigterm()
    if args.one:
        count, config = int(args.one[0]), args.one[1]
        if config not in CONFIGS:
            raise BenchError(f"unknown configuration {config!r}; known: {', '.join(CONFIGS)}")
        profile = Path(args.profile) if args.profile else None
        figures = run_one(count, config, profile, args.client_rtt_us / 1e6, args.daemon_cpu)
        print(json.dumps(figures))
        return 0
    variants = parse_variants(args.variants)
    points = []
    for count in (int(part) for part in args.nodes.split(",") if part.strip()):
        for config in (part.strip() for part in args.configs.split(",") if part.strip()):
            if config == "c_real":
                points.append(c_real(count, args.c_real_max))
                continue
            if config == "c_baseline" and count > args.baseline_max and not args.baseline_all:
                # N(N-1) SA queries through one simulated SA: hours of wall time at 4096.
                skipped = f"not run above N={args.baseline_max} (use --baseline-all)"
                points.append({"nodes": count, "config": config, "skipped": skipped})
                print(f"N={count:5} {config:10} skipped: {skipped}")
                continue
            rounds = max(1, args.rounds) if config != "c_baseline" and count <= BASELINE_MAX else 1
            # c_baseline models C's configuration: its cost is the SA's, run once.
            run_variants = variants if config != "c_baseline" else variants[:1]
            for figures in run_rounds(
                count, config, args.timeout, args.client_rtt_us, rounds, run_variants
            ):
                print_point(figures)
                points.append(figures)
    compare_c_real(points)
    found = targets(points)
    for target, outcome in found.items():
        print(f"target {target}: {outcome}")
    write_results("storm", {"points": points, "targets": found})
    plots.plot("storm")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
