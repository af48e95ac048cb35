"""What a client costs: one-shot connections, cached RESOLVEs and pipelining, against C floors.

    python -m tests.bench.throughput [--seconds S] [--rounds R] [--oneshot 1,16]
        [--clients 1,16,64,256,1024,4096] [--depths 8,64] [--first-targets N]
        [--trace-resolutions N] [--churn] [--profile]

Every server is up at once and measured with the same load generator (``loadgen.c``: C, epoll,
clients spread over processes, every request accounted), taking turns point by point, each
point ``--rounds`` times (the median round by throughput is reported; every round is kept):

* ``c_responder``: ``c_responder.c``, a minimal single-threaded epoll server of the same framing
  answering every RESOLVE with a fixed 88-byte reply (the floor);
* ``noop_loop``: "the no-work loop" of the daemon's own kind (``trio_floor.py --kind thread``:
  an epoll loop in a thread started by ``trio.to_thread.run_sync``), and beside it
  ``noop_task_loop``, the trio-task kind (``--kind task``);
* ``c_ibacm``: rdma-core's C ``ibacm`` (Debian's, unmodified) as node3 of the simulated fabric on
  the emulated HCA (``ibacm-sim up --c-ibacm``; needs root for its private /run), when it can run;
* ``ibacm``: ours (this venv's) on the simulated fabric, its hot modules compiled
  (``ibacm.compiled``), and ``ibacm_as_written`` on a second cluster with the modules as
  written (without a compiled build, ``ibacm`` is that variant and runs alone).

Points: one-shot connections (``loadgen -m oneshot``: connect, one RESOLVE, whole reply, close,
as ``ib_acme`` does) at 1 and 16 clients; cached RESOLVEs on persistent connections at 1 to 4096
clients; one connection pipelining 8 and 64 RESOLVEs. The request is what
``ib_acme -f n -s node1 -d node2`` sends (160 bytes; C asks from node3), resolved once first so
every measured request is a cache hit. Each figure has the 1-minute load average beside it and
the server's CPU time per answered request (per connection, one-shot), from /proc. A server
may not answer everyone: each point says what each server did ("answered all", "N clients never
answered", "server died": a dead simulated node is restarted so later points run).

Then the uncached first resolution (``first_resolution``, over ACM and SA, on sim and pyverbs),
the daemons' own time from a system-call trace (``daemon_time``), and with ``--churn`` the
churn benchmark (``churn``). The targets of issue 28 are printed met / NOT met with their figures
and written to ``results/throughput.json``; ``plots.py`` draws ``docs/img/throughput.svg``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ibacm.wire.client import AddrType
from tests.bench import churn, daemon_time, first_resolution, load, plots
from tests.bench.common import (
    RESULTS_DIR,
    BenchError,
    exit_on_sigterm,
    parse_variants,
    proc_rss_mb,
    ratio,
    variant_env,
    verdict,
    write_results,
)
from tests.bench.servers import (
    LOOPS,
    Cluster,
    exchange_once,
    noop_loop,
    resolve_request,
    sim_cluster,
)

C_NODE = "node3"
OURS_NODE = "node1"
TARGET_ONESHOT_16 = 2.0  # x C ibacm's connections per second
TARGET_ONESHOT_1 = 0.6
TARGET_P50_1 = 1.2  # x the C responder's p50
TARGET_64_C = 0.7  # x C ibacm's requests per second
TARGET_64_LOOP = 0.9  # x the no-work loop's
TARGET_P99_1024_US = 500_000
TARGET_PIPELINE_CPU = 2.0  # x the no-work loop's CPU per request


SECTION_MODES: dict[str, load.Mode] = {
    "oneshot": "oneshot",
    "cached": "closed",
    "pipeline": "pipeline",
}
"""Each section of points and the load generator's mode for it."""


@dataclass(frozen=True)
class Point:
    """One measured situation: ``section`` oneshot, cached or pipeline."""

    section: str
    clients: int
    depth: int = 1

    @property
    def key(self) -> str:
        if self.section == "pipeline":
            return f"pipeline_{self.depth}"
        return f"{self.section}_{self.clients}"

    @property
    def mode(self) -> load.Mode:
        return SECTION_MODES[self.section]


@dataclass
class Server:
    """A measured server; ``restart`` (simulated nodes) brings a dead one back, new pid."""

    name: str
    sock: str
    pid: int
    request: bytes
    restart: Callable[[], int] | None = None


def points_of(oneshot: list[int], clients: list[int], depths: list[int]) -> list[Point]:
    return [
        *(Point("oneshot", count) for count in oneshot),
        *(Point("cached", count) for count in clients),
        *(Point("pipeline", 1, depth) for depth in depths),
    ]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def outcome(figures: dict[str, Any], died: bool) -> str:
    """What the server did at this point, in words."""
    parts = []
    if died:
        parts.append("server died")
    if figures["never_answered"]:
        parts.append(f"{figures['never_answered']} of {figures['clients']} clients never answered")
    owed = figures["unanswered"] + figures["lost_on_reset"]
    if owed:
        parts.append(f"{owed} of {figures['sent']} requests unanswered")
    if figures["resets"] and not died:
        parts.append(f"{figures['resets']} disconnects")
    if figures["errors"]:
        parts.append(f"{figures['errors']} error answers")
    if figures["refused"]:
        parts.append(f"{figures['refused']} connects refused")
    return "; ".join(parts) or "answered all"


def measure_point(
    loadgen: Path, server: Server, request_file: Path, point: Point, seconds: float
) -> dict[str, Any]:
    figures = load.run(
        loadgen,
        server.sock,
        request_file,
        point.clients,
        seconds,
        mode=point.mode,
        depth=point.depth,
        server_pid=server.pid,
    )
    died = not alive(server.pid)
    figures["outcome"] = outcome(figures, died)
    figures["answered_all"] = figures["outcome"] == "answered all"
    if died and server.restart is not None:
        try:
            server.pid = server.restart()
            exchange_once(server.sock, server.request)  # cached again for the next points
            figures["restarted"] = True
        except (BenchError, OSError) as exc:
            # The later points of this server then say "server died" with nobody listening.
            print(f"{server.name} could not be restarted: {exc}")
            figures["restart_failed"] = str(exc)
            server.restart = None
    return figures


def take_turns(
    loadgen: Path,
    servers: list[Server],
    request_files: dict[str, Path],
    points: list[Point],
    seconds: float,
    rounds: int,
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every point ``rounds`` times, the servers taking turns, so that drift of the machine
    hits all alike: {server: {point key: [figures of each round]}}."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {server.name: {} for server in servers}
    for round_number in range(rounds):
        for point in points:
            for server in servers:
                figures = measure_point(loadgen, server, request_files[server.name], point, seconds)
                runs[server.name].setdefault(point.key, []).append(figures)
                _print_point(f"{server.name} #{round_number + 1}", point, figures)
    return runs


def median_run(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median throughput, with every round's outcome beside it."""
    ordered = sorted(found, key=lambda figures: float(figures["rps"]))
    chosen = dict(ordered[len(ordered) // 2])
    chosen["outcomes"] = [figures["outcome"] for figures in found]
    chosen["answered_all_rounds"] = all(figures["answered_all"] for figures in found)
    chosen["loadavg_rounds"] = [figures["loadavg"] for figures in found]
    chosen["cpu_us_median"] = _median(
        [figures.get("server_cpu_us_per_request") for figures in found]
    )
    return chosen


def _median(values: list[Any]) -> float | None:
    present = [float(value) for value in values if value is not None]
    return round(statistics.median(present), 2) if present else None


def _print_point(who: str, point: Point, figures: dict[str, Any]) -> None:
    unit = "conn/s" if point.section == "oneshot" else "req/s"
    print(
        f"{who:20} {point.key:14} {figures['rps']:9.0f} {unit:6}  p50 {figures['p50_us']:9.1f} us"
        f"  p99 {figures['p99_us']:10.1f} us  CPU {figures['server_cpu_us_per_request']} us/req"
        f"  load {figures['loadavg']:.2f}  {figures['outcome']}",
        flush=True,
    )


def _sim_server(cluster: Cluster, name: str, node: str, request: bytes) -> Server:
    return Server(
        name, cluster.sock(node), cluster.pid(node), request, lambda: cluster.restart(node)
    )


def measure(
    work: Path,
    points: list[Point],
    seconds: float,
    profile: bool,
    rounds: int,
    with_c: bool,
) -> dict[str, Any]:
    """All servers up at once; every point measured ``rounds`` times, the servers taking
    turns. The median round of each point is kept, every round is in ``rounds``."""
    loadgen, responder = load.build(work)
    profile_out = RESULTS_DIR / "profiles" if profile else None
    results: dict[str, Any] = {}
    variants = parse_variants("compiled,as_written")
    request = resolve_request()
    with contextlib.ExitStack() as stack:
        sock, pid = stack.enter_context(load.c_responder(responder, work))
        servers = [Server("c_responder", sock, pid, request)]
        for name, kind in LOOPS.items():
            sock, pid = stack.enter_context(noop_loop(work, kind))
            servers.append(Server(name, sock, pid, request))
        cluster = stack.enter_context(
            sim_cluster(work, profile_out, [C_NODE] if with_c else [], variant_env(variants[0]))
        )
        if with_c:
            servers.append(_sim_server(cluster, "c_ibacm", C_NODE, resolve_request(C_NODE)))
        servers.append(_sim_server(cluster, "ibacm", OURS_NODE, request))
        if len(variants) > 1:
            # The modules as written, beside the compiled ones (ibacm.compiled), same load.
            (work / "as_written").mkdir()
            written = stack.enter_context(
                sim_cluster(work / "as_written", None, [], variant_env("as_written"), nodes=2)
            )
            servers.append(_sim_server(written, "ibacm_as_written", OURS_NODE, request))
        results["ibacm_variant"] = variants[0]
        request_files = {}
        for server in servers:
            request_files[server.name] = work / f"request-{server.name}.bin"
            request_files[server.name].write_bytes(server.request)
            reply = exchange_once(server.sock, server.request)
            if reply[2] != 0 or AddrType(int.from_bytes(reply[20:22], "little")) != AddrType.PATH:
                raise BenchError(f"{server.name} did not answer the RESOLVE: status {reply[2]}")
        runs = take_turns(loadgen, servers, request_files, points, seconds, rounds)
        results["rss_mb"] = {
            server.name: proc_rss_mb(server.pid)
            for server in servers
            if server.name.startswith(("ibacm", "c_ibacm")) and alive(server.pid)
        }
    results["servers"] = [server.name for server in servers]
    results["points"] = {
        name: {key: median_run(found) for key, found in by_point.items()}
        for name, by_point in runs.items()
    }
    results["rounds"] = runs
    if profile_out is not None:
        _print_profile(profile_out / f"{OURS_NODE}.prof")
    return results


def _print_profile(path: Path) -> None:
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not path.exists():
        print("(no profile written)")
        return
    stats = pstats.Stats(str(path))
    stats.sort_stats("tottime").print_stats(30)


def _figure(points: dict[str, Any], server: str, key: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = points.get(server, {}).get(key)
    return found


def _target(ok: bool | None, text: str, missing: str = "not measured") -> str:
    return f"{missing}: {text}" if ok is None else f"{verdict(ok)}: {text}"


def targets_of(results: dict[str, Any]) -> dict[str, str]:
    """The targets of issue 28 that these points measure, met / NOT met with the figures."""
    points = results["points"]
    found: dict[str, str] = {}

    def rps_vs(key: str, base: str, factor: float, name: str, unit: str) -> None:
        ours, other = _figure(points, "ibacm", key), _figure(points, base, key)
        if ours is None or other is None:
            found[name] = f"not measured ({key} of ibacm and {base})"
            return
        value = ratio(ours["rps"], other["rps"])
        text = (
            f"ibacm {ours['rps']:.0f} {unit} = {value}x {base} {other['rps']:.0f} "
            f"(load {ours['loadavg']:.1f}/{other['loadavg']:.1f})"
        )
        found[name] = _target(value is not None and value >= factor, text)

    rps_vs(
        "oneshot_16",
        "c_ibacm",
        TARGET_ONESHOT_16,
        f"oneshot_16>={TARGET_ONESHOT_16}x_c_ibacm",
        "conn/s",
    )
    rps_vs(
        "oneshot_1",
        "c_ibacm",
        TARGET_ONESHOT_1,
        f"oneshot_1>={TARGET_ONESHOT_1}x_c_ibacm",
        "conn/s",
    )
    ours, floor = _figure(points, "ibacm", "cached_1"), _figure(points, "c_responder", "cached_1")
    name = f"cached_1_p50<={TARGET_P50_1}x_c_responder"
    if ours is None or floor is None:
        found[name] = "not measured (cached_1)"
    else:
        value = ratio(ours["p50_us"], floor["p50_us"])
        found[name] = _target(
            value is not None and value <= TARGET_P50_1,
            f"ibacm p50 {ours['p50_us']:.1f} us = {value}x {floor['p50_us']:.1f} us",
        )
    rps_vs("cached_64", "c_ibacm", TARGET_64_C, f"cached_64>={TARGET_64_C}x_c_ibacm", "req/s")
    rps_vs(
        "cached_64", "noop_loop", TARGET_64_LOOP, f"cached_64>={TARGET_64_LOOP}x_noop_loop", "req/s"
    )
    for count in (1024, 4096):
        ours = _figure(points, "ibacm", f"cached_{count}")
        name = f"cached_{count}_every_request_answered"
        if count == 1024:
            name += f"_p99<={TARGET_P99_1024_US // 1000}ms"
        if ours is None:
            found[name] = f"not measured (cached_{count})"
            continue
        ok = bool(ours["answered_all_rounds"])
        if count == 1024:
            ok = ok and ours["p99_us"] <= TARGET_P99_1024_US
        found[name] = _target(
            ok, f"{'; '.join(ours['outcomes'])}; p99 {ours['p99_us'] / 1000:.1f} ms"
        )
    ours, loop = (
        _figure(points, "ibacm", "pipeline_64"),
        _figure(points, "noop_loop", "pipeline_64"),
    )
    name = f"pipeline_64_cpu<={TARGET_PIPELINE_CPU}x_noop_loop"
    if ours is None or loop is None or not ours["cpu_us_median"] or not loop["cpu_us_median"]:
        found[name] = "not measured (pipeline_64)"
    else:
        value = ratio(ours["cpu_us_median"], loop["cpu_us_median"])
        found[name] = _target(
            value is not None and value <= TARGET_PIPELINE_CPU,
            f"ibacm {ours['cpu_us_median']} us/req = {value}x {loop['cpu_us_median']} us/req",
        )
    return found


def table(results: dict[str, Any]) -> list[str]:
    """The figures as a markdown table: one row per point, one column per server."""
    names: list[str] = results["servers"]
    keys = list(next(iter(results["points"].values())).keys())
    lines = [
        "| point | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for key in keys:
        cells = []
        for name in names:
            fig = results["points"][name].get(key)
            if fig is None:
                cells.append("")
                continue
            unit = "conn/s" if key.startswith("oneshot") else "req/s"
            cell = (
                f"{fig['rps']:.0f} {unit}, p50 {_us(fig['p50_us'])}, p99 {_us(fig['p99_us'])}, "
                f"CPU {fig['cpu_us_median']} us, load {fig['loadavg']:.1f}"
            )
            if fig["outcome"] != "answered all":
                cell += f"; {fig['outcome']}"
            cells.append(cell)
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return lines


def _us(value: float) -> str:
    return f"{value / 1000:.1f} ms" if value >= 10_000 else f"{value:.0f} us"


def _part(name: str, measure_it: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A later part of the run; its failure is reported, not fatal to the figures so far."""
    try:
        return measure_it()
    except BenchError as exc:
        print(f"{name} not measured: {exc}")
        return {"error": str(exc), "targets": {name.replace(" ", "_"): f"not measured: {exc}"}}


def _counts(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds",
        type=float,
        default=float(os.environ.get("BENCH_SECONDS", 1.0)),
        help="measured seconds per run",
    )
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", 3)))
    parser.add_argument("--oneshot", default="1,16", help="one-shot client counts ('' skips)")
    parser.add_argument("--clients", default="1,16,64,256,1024,4096", help="cached RESOLVE")
    parser.add_argument("--depths", default="8,64", help="pipelining depths ('' skips)")
    parser.add_argument("--profile", action="store_true", help="profile the daemon (cProfile)")
    parser.add_argument(
        "--first-targets",
        type=int,
        default=20,
        help="destinations of the uncached first-resolution part (0: skip it)",
    )
    parser.add_argument(
        "--trace-resolutions",
        type=int,
        default=5,
        help="first resolutions traced for the daemons' own time (0: skip it)",
    )
    parser.add_argument("--churn", action="store_true", help="run the churn benchmark too")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    points = points_of(_counts(args.oneshot), _counts(args.clients), _counts(args.depths))
    c_reason = first_resolution.c_support()
    if c_reason is not None:
        print(f"rdma-core's C ibacm is not measured: {c_reason}")
    with tempfile.TemporaryDirectory(prefix="ibacm-bench-") as tmp:
        work = Path(tmp)
        results = measure(work, points, args.seconds, args.profile, args.rounds, c_reason is None)
        first = own_time = churned = None
        if c_reason is None and not args.profile:
            if args.first_targets > 0:
                (work / "first").mkdir()
                first = _part(
                    "first resolution",
                    lambda: first_resolution.run(work / "first", args.first_targets, ["acm", "sa"]),
                )
            if args.trace_resolutions > 0:
                (work / "trace").mkdir()
                own_time = _part(
                    "daemon time", lambda: daemon_time.run(work / "trace", args.trace_resolutions)
                )
        if args.churn and not args.profile:
            churned = _part(
                "churn", lambda: churn.run(churn.DEFAULT_ROUNDS, churn.DEFAULT_CONNECTIONS)
            )
    targets = targets_of(results)
    if c_reason is not None:
        for name in ("uncached_first_resolution", "daemon_time"):
            targets[name] = f"not measured: {c_reason}"
    for part in (first, own_time, churned):
        if part is not None:
            targets.update(part["targets"])
    print()
    print("\n".join(table(results)))
    for target, text in targets.items():
        print(f"target {target}: {text}")
    write_results(
        "throughput_profiled" if args.profile else "throughput",
        {
            "seconds_per_point": args.seconds,
            "rounds_per_point": args.rounds,
            "request_bytes": 160,
            **results,
            "table": table(results),
            "targets": targets,
            "first_resolution": first,
            "daemon_time": own_time,
            "churn": churned,
        },
    )
    if not args.profile:
        plots.plot("throughput")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
