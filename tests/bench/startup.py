"""(c) Daemon start-up to READY and idle RSS.

    python -m tests.bench.startup [--runs 5]

A 2-node simulated cluster is brought up with ``ibacm-sim up`` (this venv's ``ibacm``); then
node1's daemon is stopped and started again, ``--runs`` times, with the same command line and
our own ``NOTIFY_SOCKET``. For each start it measures:

* exec to sd_notify ``READY=1`` (the daemon serves its socket from then on);
* READY to the first successful RESOLVE of node2 by name (joins done, peer answered);
* resident set after a second of idling, and its peak so far;
* SIGTERM to exit (graceful shutdown).

The floor next to it: how long this interpreter takes to start and exit (``python -c pass``)
and to import the daemon's modules, so the share that is ours is visible.

Targets: READY within 0.5 s and an idle RSS of at most 40 MB (medians).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.bench.common import (
    VENV_BIN,
    BenchError,
    bench_env,
    proc_rss_mb,
    verdict,
    write_results,
)
from tests.bench.servers import resolve_request

READY_TIMEOUT = 60.0
IDLE_SECONDS = 1.0
TARGET_READY_MS = 500.0
TARGET_RSS_MB = 40.0


def notify_socket() -> tuple[socket.socket, str]:
    """An abstract datagram socket for sd_notify messages."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"ibacm-bench-{os.getpid()}-{time.monotonic_ns()}"
    sock.bind(b"\0" + name.encode())
    return sock, "@" + name


def wait_ready(sock: socket.socket, proc: subprocess.Popen[bytes]) -> float:
    """Monotonic time at which READY=1 arrived."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        sock.settimeout(0.1)
        try:
            data = sock.recv(4096)
        except TimeoutError:
            if proc.poll() is not None:
                raise BenchError(f"the daemon exited with {proc.returncode} before READY") from None
            continue
        if b"READY=1" in data.split(b"\n"):
            return time.monotonic()
    raise BenchError(f"no READY=1 within {READY_TIMEOUT:g} s")


def first_resolve(path: str, started: float) -> float:
    """Seconds from ``started`` until a RESOLVE of node2 succeeds."""
    request = resolve_request()
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(10)
                conn.connect(path)
                conn.sendall(request)
                reply = conn.recv(592)
        except OSError:
            reply = b""
        if len(reply) >= 16 and reply[2] == 0:
            return time.monotonic() - started
        time.sleep(0.005)
    raise BenchError("node2 never resolved")


def stop(pid: int) -> None:
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except FileNotFoundError:
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)


def one_start(command: list[str], env: dict[str, str], client_socket: str) -> dict[str, Any]:
    sock, name = notify_socket()
    with sock:
        started = time.monotonic()
        proc = subprocess.Popen(
            command,
            env=dict(env, NOTIFY_SOCKET=name),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            ready = wait_ready(sock, proc)
            resolved = first_resolve(client_socket, ready)
            time.sleep(IDLE_SECONDS)
            rss = proc_rss_mb(proc.pid)
            term = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            stopped = time.monotonic()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {
        "ready_ms": round((ready - started) * 1000, 1),
        "first_resolve_after_ready_ms": round(resolved * 1000, 1),
        "idle_rss_mb": round(rss["rss_mb"], 1),
        "peak_rss_mb": round(rss["peak_rss_mb"], 1),
        "shutdown_ms": round((stopped - term) * 1000, 1),
        "exit_status": proc.returncode,
    }


def interpreter_floor(env: dict[str, str]) -> dict[str, float]:
    def timed(code: str) -> float:
        best = float("inf")
        for _ in range(3):
            began = time.monotonic()
            subprocess.run([sys.executable, "-c", code], env=env, check=True)
            best = min(best, time.monotonic() - began)
        return round(best * 1000, 1)

    return {
        "python_start_ms": timed("pass"),
        "import_daemon_ms": timed(
            "import ibacm.core.cli, ibacm.provider.acmp.provider, ibacm.fabric.sim.hub"
        ),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("ready_ms", "first_resolve_after_ready_ms", "idle_rss_mb", "shutdown_ms")
    return {
        key: {
            "median": statistics.median(run[key] for run in runs),
            "min": min(run[key] for run in runs),
            "max": max(run[key] for run in runs),
        }
        for key in keys
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    env = bench_env()
    sim = str(VENV_BIN / "ibacm-sim")
    with tempfile.TemporaryDirectory(prefix="ibacm-startup-") as tmp:
        sim_dir = Path(tmp) / "sim"
        up = [sim, "up", "--nodes", "2", "--dir", str(sim_dir), "--log-level", "0"]
        done = subprocess.run(up, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise BenchError(f"ibacm-sim up failed:\n{done.stdout}{done.stderr}")
        try:
            pid = int(json.loads((sim_dir / "pids.json").read_text())["nodes"]["node1"])
            command = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            stop(pid)
            client_socket = str(sim_dir / "node1" / "ibacm-unix.sock")
            runs = []
            for number in range(args.runs):
                run = one_start([part.decode() for part in command], env, client_socket)
                print(f"run {number + 1}: {run}")
                runs.append(run)
        finally:
            subprocess.run([sim, "down", "--dir", str(sim_dir)], capture_output=True, env=env)
    floor = interpreter_floor(env)
    summary = summarize(runs)
    print(
        f"start-up to READY: median {summary['ready_ms']['median']} ms "
        f"(python start {floor['python_start_ms']} ms, imports {floor['import_daemon_ms']} ms)"
    )
    print(f"idle RSS: median {summary['idle_rss_mb']['median']} MB")
    targets = {
        f"ready<={TARGET_READY_MS:g}ms": verdict(summary["ready_ms"]["median"] <= TARGET_READY_MS),
        f"idle_rss<={TARGET_RSS_MB:g}MB": verdict(
            summary["idle_rss_mb"]["median"] <= TARGET_RSS_MB
        ),
    }
    for target, outcome in targets.items():
        print(f"target {target}: {outcome}")
    write_results("startup", {"runs": runs, "summary": summary, "floor": floor, "targets": targets})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
