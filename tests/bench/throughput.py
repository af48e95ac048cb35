"""(a) Cached RESOLVE throughput and latency over the unix socket, against a C floor.

    python -m tests.bench.throughput [--seconds S] [--clients 1,16,64] [--profile]

All servers run side by side and are measured with the same closed-loop load generator
(``loadgen.c``: C, epoll, connections spread over processes), taking turns, each point
``--rounds`` times (the median round is reported; a 2-core VM drifts a lot):

* the floor: ``c_responder.c``, a minimal single-threaded epoll server of the same framing
  answering every RESOLVE with a fixed 88-byte reply;
* the Python floor: ``trio_floor.py``, the C responder's job in Python with trio and the
  daemon's I/O style (what any trio server can reach here);
* rdma-core's C ``ibacm`` (Debian's, unmodified) as a node of the same simulated fabric on the
  emulated HCA (``ibacm-sim up --c-ibacm``; needs root for its private /run), when it can run;
* ours: a real ``ibacm`` (this venv's) on the simulated fabric (``ibacm-sim up``), the
  destination resolved once first so every measured request is a cache hit (the same for C):
  ``ibacm`` with its hot modules compiled (``ibacm.compiled``; the variant set-up builds),
  and ``ibacm_as_written`` on a second cluster with the modules as written (when there is
  no compiled build, ``ibacm`` is that variant and runs alone).

The request is what ``ib_acme -f n -s node1 -d node2`` sends (160 bytes, two NAME entries;
the C node asks from node3); the answers are 88 bytes. Besides requests per second and latency
percentiles it reports the server's CPU time per request (from /proc), which does not depend
on how the two cores are shared with the load generator. ``--profile`` runs the daemon under
cProfile instead (slower) and prints where its time goes.

Targets: at 64 clients >= 1.0x the real C ibacm's throughput and >= 0.75x the C responder's;
at 1 client p50 <= 1.2x the C responder's. Then the uncached path (``first_resolution``):
first resolutions through the ACM protocol and through an SA PathRecord, both daemons.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pstats
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ibacm.wire.client import AcmHdr, AcmMessage, AcmOp, AddrType, EpAddr, EpFlag
from tests.bench import first_resolution, plots
from tests.bench.common import (
    BENCH_DIR,
    RESULTS_DIR,
    VENV_BIN,
    BenchError,
    bench_env,
    exit_on_sigterm,
    gcc_build,
    parse_variants,
    proc_rss_mb,
    ratio,
    variant_env,
    verdict,
    write_results,
)

TARGET_RATIO_64_RESPONDER = 0.75
TARGET_RATIO_64_C_IBACM = 1.0
TARGET_P50_FACTOR = 1.2
C_NODE = "node3"


def resolve_request(source: str = "node1", dest: str = "node2") -> bytes:
    """The bytes of ``ib_acme -f n -s SOURCE -d DEST`` (160 bytes)."""
    message = AcmMessage(
        hdr=AcmHdr(opcode=AcmOp.RESOLVE),
        entries=[EpAddr.from_name(source, EpFlag.SOURCE), EpAddr.from_name(dest, EpFlag.DEST)],
    )
    return message.encode()


def exchange_once(path: str, request: bytes, timeout: float = 10.0) -> bytes:
    """Send one request and read its whole reply (used to fill the cache)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(request)
        reply = b""
        while len(reply) < 8 or len(reply) < int.from_bytes(reply[6:8], "little"):
            chunk = sock.recv(592)
            if not chunk:
                raise BenchError(f"{path} closed the connection before answering")
            reply += chunk
    return reply


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def run_load(
    loadgen: Path, sock: str, request_file: Path, clients: int, seconds: float, server_pid: int
) -> dict[str, Any]:
    """One closed-loop run; adds the server's CPU microseconds per request."""
    procs = min(clients, os.cpu_count() or 1)
    warmup = min(0.5, seconds / 4)
    before = cpu_seconds(server_pid)
    done = subprocess.run(
        [
            str(loadgen),
            sock,
            str(request_file),
            str(clients),
            str(seconds),
            str(warmup),
            str(procs),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=seconds + warmup + 60,
    )
    if done.returncode != 0:
        raise BenchError(f"load generator failed: {done.stderr.strip()}")
    figures: dict[str, Any] = json.loads(done.stdout)
    spent = cpu_seconds(server_pid) - before
    # The whole run (warm-up included) sent about rps x (seconds + warmup) requests.
    sent = figures["rps"] * (seconds + warmup)
    figures["server_cpu_us_per_request"] = round(spent / sent * 1e6, 2) if sent else None
    return figures


@contextlib.contextmanager
def c_responder(binary: Path, work: Path) -> Iterator[tuple[str, int]]:
    path = str(work / "c.sock")
    proc = subprocess.Popen([str(binary), path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise BenchError("the C responder did not start")
        yield path, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextlib.contextmanager
def trio_floor(work: Path) -> Iterator[tuple[str, int]]:
    """``trio_floor.py``: the same job as the C responder, in Python with trio."""
    path = str(work / "floor.sock")
    command = [sys.executable, "-m", "tests.bench.trio_floor", path]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=bench_env())
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise BenchError("the trio floor server did not start")
        yield path, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _daemon_cmd(profile_out: Path | None) -> str:
    if profile_out is None:
        return str(VENV_BIN / "ibacm")
    return f"{VENV_BIN / 'python'} -m tests.bench.profiled_daemon {profile_out}"


@contextlib.contextmanager
def sim_cluster(
    work: Path, profile_out: Path | None, with_c: bool, env: dict[str, str] | None = None
) -> Iterator[dict[str, tuple[str, int]]]:
    """A simulated cluster of real daemons: ours on node1 and node2, and rdma-core's C daemon
    on node3 when ``with_c``; yields {"ibacm": node1's (socket, pid), "c_ibacm": node3's}.
    ``env``: the daemons' environment (``bench_env()`` by default)."""
    sim_dir = work / "sim"
    env = bench_env() if env is None else env
    up = [str(VENV_BIN / "ibacm-sim"), "up", "--dir", str(sim_dir), "--log-level", "0"]
    up += ["--nodes", "3" if with_c else "2", "--daemon-cmd", _daemon_cmd(profile_out)]
    if with_c:
        up += ["--c-ibacm", C_NODE]
    done = subprocess.run(up, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise BenchError(f"ibacm-sim up failed:\n{done.stdout}{done.stderr}")
    try:
        pids = json.loads((sim_dir / "pids.json").read_text())["nodes"]
        found = {"ibacm": "node1", "c_ibacm": C_NODE} if with_c else {"ibacm": "node1"}
        yield {
            who: (str(sim_dir / node / "ibacm-unix.sock"), int(pids[node]))
            for who, node in found.items()
        }
    finally:
        subprocess.run(
            [str(VENV_BIN / "ibacm-sim"), "down", "--dir", str(sim_dir)],
            capture_output=True,
            env=env,
            check=False,
        )


def measure(
    binary_dir: Path,
    work: Path,
    clients: list[int],
    seconds: float,
    profile: bool,
    rounds: int,
    with_c: bool,
) -> dict[str, Any]:
    """All servers up at once; every point measured ``rounds`` times, the servers taking
    turns, so that drift of the machine (other load, CPU wake-up latency) hits all alike. The
    median round of each point is kept, every round is in ``rounds``."""
    responder = gcc_build(BENCH_DIR / "c_responder.c", binary_dir)
    loadgen = gcc_build(BENCH_DIR / "loadgen.c", binary_dir)
    requests = {"c_ibacm": resolve_request(C_NODE, "node2")}
    profile_out = RESULTS_DIR / "profiles" if profile else None
    results: dict[str, Any] = {}
    variants = parse_variants("compiled,as_written")
    with contextlib.ExitStack() as stack:
        servers = {
            "c_responder": stack.enter_context(c_responder(responder, work)),
            "trio_floor": stack.enter_context(trio_floor(work)),
            **stack.enter_context(sim_cluster(work, profile_out, with_c, variant_env(variants[0]))),
        }
        if len(variants) > 1:
            # The modules as written, beside the compiled ones (ibacm.compiled), same load.
            (work / "as_written").mkdir()
            written = stack.enter_context(
                sim_cluster(work / "as_written", None, False, variant_env("as_written"))
            )
            servers["ibacm_as_written"] = written["ibacm"]
        results["ibacm_variant"] = variants[0]
        request_files = {}
        for name, (sock, _pid) in servers.items():
            request = requests.get(name, resolve_request())
            request_files[name] = work / f"request-{name}.bin"
            request_files[name].write_bytes(request)
            reply = exchange_once(sock, request)
            if reply[2] != 0 or AddrType(int.from_bytes(reply[20:22], "little")) != AddrType.PATH:
                raise BenchError(f"{name} did not answer the RESOLVE: status {reply[2]}")
            results[f"{name}_reply_bytes"] = len(reply)
        runs = take_turns(loadgen, servers, request_files, clients, seconds, rounds)
        for name in ("ibacm", "ibacm_as_written", "c_ibacm"):
            if name in servers:
                results[f"{name}_rss_mb"] = proc_rss_mb(servers[name][1])
    for name, points in runs.items():
        results[name] = {count: median_run(found) for count, found in points.items()}
    results["rounds"] = runs
    if profile_out is not None:
        _print_profile(profile_out / "node1.prof")
    return results


def take_turns(
    loadgen: Path,
    servers: dict[str, tuple[str, int]],
    request_files: dict[str, Path],
    clients: list[int],
    seconds: float,
    rounds: int,
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every (clients) point ``rounds`` times, the servers taking turns, so that drift of the
    machine hits all alike: {server: {clients: [figures of each round]}}."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {name: {} for name in servers}
    for round_number in range(rounds):
        for count in clients:
            for name, (sock, pid) in servers.items():
                figures = run_load(loadgen, sock, request_files[name], count, seconds, pid)
                runs[name].setdefault(str(count), []).append(figures)
                _print_point(f"{name} #{round_number + 1}", figures)
    return runs


def median_run(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median throughput."""
    ordered = sorted(found, key=lambda figures: float(figures["rps"]))
    return ordered[len(ordered) // 2]


def _print_point(who: str, figures: dict[str, Any]) -> None:
    print(
        f"{who:16} clients={figures['clients']:3} {figures['rps']:10.0f} req/s  "
        f"p50 {figures['p50_us']:8.1f} us  p99 {figures['p99_us']:9.1f} us  "
        f"server CPU {figures['server_cpu_us_per_request']} us/req  errors {figures['errors']}"
    )


def _print_profile(path: Path) -> None:
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not path.exists():
        print("(no profile written)")
        return
    stats = pstats.Stats(str(path))
    stats.sort_stats("tottime").print_stats(30)


def summarize(results: dict[str, Any], clients: list[int]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for count in clients:
        ours, floor = results["ibacm"][str(count)], results["c_responder"][str(count)]
        python = results["trio_floor"][str(count)]
        point = {
            "throughput_ratio": ratio(ours["rps"], floor["rps"]),
            "p50_factor": ratio(ours["p50_us"], floor["p50_us"]),
            "cpu_per_request_factor": ratio(
                ours["server_cpu_us_per_request"] or 0, floor["server_cpu_us_per_request"] or 0
            ),
            "trio_floor_throughput_ratio": ratio(python["rps"], floor["rps"]),
            "trio_floor_p50_factor": ratio(python["p50_us"], floor["p50_us"]),
        }
        if "ibacm_as_written" in results:
            written = results["ibacm_as_written"][str(count)]
            point["compiled_vs_as_written_throughput_ratio"] = ratio(ours["rps"], written["rps"])
            point["compiled_vs_as_written_cpu_per_request"] = ratio(
                ours["server_cpu_us_per_request"] or 0, written["server_cpu_us_per_request"] or 0
            )
        if "c_ibacm" in results:
            c_ibacm = results["c_ibacm"][str(count)]
            point["vs_c_ibacm_throughput_ratio"] = ratio(ours["rps"], c_ibacm["rps"])
            point["vs_c_ibacm_p50_factor"] = ratio(ours["p50_us"], c_ibacm["p50_us"])
            point["c_ibacm_throughput_ratio"] = ratio(c_ibacm["rps"], floor["rps"])
        summary[str(count)] = point
    targets: dict[str, Any] = {}
    if "64" in summary:
        value = summary["64"]["throughput_ratio"]
        targets[f"throughput_64>={TARGET_RATIO_64_RESPONDER}x_c_responder"] = verdict(
            value is not None and value >= TARGET_RATIO_64_RESPONDER
        )
        value = summary["64"].get("vs_c_ibacm_throughput_ratio")
        targets[f"throughput_64>={TARGET_RATIO_64_C_IBACM}x_c_ibacm"] = (
            "not measured (no C daemon)"
            if "c_ibacm" not in results
            else verdict(value is not None and value >= TARGET_RATIO_64_C_IBACM)
        )
    if "1" in summary:
        value = summary["1"]["p50_factor"]
        targets[f"p50_1_client<={TARGET_P50_FACTOR}x_c_responder"] = verdict(
            value is not None and value <= TARGET_P50_FACTOR
        )
    return {"ratios": summary, "targets": targets}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("BENCH_SECONDS", 2)))
    parser.add_argument("--clients", default="1,16,64,256", help="comma-separated client counts")
    parser.add_argument("--profile", action="store_true", help="profile the daemon (cProfile)")
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", 3)))
    parser.add_argument(
        "--first-targets",
        type=int,
        default=40,
        help="destinations of the uncached first-resolution part (0: skip it)",
    )
    args = parser.parse_args(argv)
    exit_on_sigterm()
    clients = [int(part) for part in args.clients.split(",") if part.strip()]
    c_reason = first_resolution.c_support()
    if c_reason is not None:
        print(f"rdma-core's C ibacm is not measured: {c_reason}")
    with tempfile.TemporaryDirectory(prefix="ibacm-bench-") as tmp:
        work = Path(tmp)
        results = measure(
            work, work, clients, args.seconds, args.profile, args.rounds, c_reason is None
        )
        first = (
            first_resolution.run(work, args.first_targets, ["acm", "sa"])
            if args.first_targets > 0 and c_reason is None and not args.profile
            else None
        )
    summary = summarize(results, clients)
    for count, values in summary["ratios"].items():
        c_part = ""
        if "vs_c_ibacm_throughput_ratio" in values:
            c_part = (
                f"; C ibacm {values['c_ibacm_throughput_ratio']}x the C responder; "
                f"ibacm {values['vs_c_ibacm_throughput_ratio']}x C ibacm "
                f"(p50 {values['vs_c_ibacm_p50_factor']}x)"
            )
        print(
            f"clients={count:>3}: trio floor {values['trio_floor_throughput_ratio']}x the C "
            f"responder (p50 {values['trio_floor_p50_factor']}x); ibacm "
            f"throughput {values['throughput_ratio']}x the C responder, "
            f"p50 {values['p50_factor']}x, "
            f"server CPU per request {values['cpu_per_request_factor']}x{c_part}"
        )
    targets = dict(summary["targets"])
    if first is not None:
        targets.update(first["targets"])
    for target, outcome in targets.items():
        print(f"target {target}: {outcome}")
    write_results(
        "throughput_profiled" if args.profile else "throughput",
        {
            "seconds_per_point": args.seconds,
            "rounds_per_point": args.rounds,
            "request_bytes": 160,
            **results,
            **summary,
            "targets": targets,
            "first_resolution": first,
        },
    )
    if not args.profile:
        plots.plot("throughput")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
