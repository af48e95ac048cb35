"""Running ``loadgen.c`` (built with the system compiler) and the C responder it is checked on.

``run`` gives loadgen's JSON figures (every request accounted: sent, answered, errors, lost on
a reset, unanswered at the end, refused connects, clients never answered; latency percentiles
of the measured window) plus the server's CPU per answered request, from /proc.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from tests.bench.common import BENCH_DIR, BenchError, gcc_build, load_average

Mode = Literal["closed", "oneshot", "pipeline"]


def build(out_dir: Path) -> tuple[Path, Path]:
    """(loadgen, c_responder) compiled into ``out_dir``."""
    return gcc_build(BENCH_DIR / "loadgen.c", out_dir), gcc_build(
        BENCH_DIR / "c_responder.c", out_dir
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def run(
    loadgen: Path,
    sock: str,
    request_file: Path,
    clients: int,
    seconds: float,
    *,
    mode: Mode = "closed",
    depth: int = 1,
    warmup: float | None = None,
    grace: float = 2.0,
    server_pid: int | None = None,
) -> dict[str, Any]:
    """One loadgen run; adds ``server_cpu_us_per_request`` when ``server_pid`` is given (None
    when the server died meanwhile or answered nothing) and the load average."""
    procs = min(clients, os.cpu_count() or 1)
    warmup = min(0.5, seconds / 4) if warmup is None else warmup
    command = [str(loadgen), "-m", mode, "-k", str(depth), "-p", str(procs)]
    command += ["-w", str(warmup), "-g", str(grace), sock, str(request_file)]
    command += [str(clients), str(seconds)]
    before = _cpu_or_none(server_pid)
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=False,
        timeout=seconds + warmup + grace + 60,
    )
    if done.returncode != 0:
        raise BenchError(f"load generator failed: {done.stderr.strip()}")
    figures: dict[str, Any] = json.loads(done.stdout)
    after = _cpu_or_none(server_pid)
    if server_pid is not None:
        spent = None if before is None or after is None else after - before
        answered = figures["answered"]
        figures["server_cpu_us_per_request"] = (
            round(spent / answered * 1e6, 2) if spent is not None and answered else None
        )
    figures["loadavg"] = load_average()
    return figures


def churn_command(
    loadgen: Path,
    sock: str,
    garbage_file: Path,
    processes: int,
    connections: int,
    seconds: float = 600.0,
) -> list[str]:
    """``loadgen -m churn``: PROCESSES x CONNECTIONS connect-send-close rounds, at most
    ``seconds``."""
    command = [str(loadgen), "-m", "churn", "-n", str(processes * connections)]
    return [*command, "-p", str(processes), sock, str(garbage_file), str(processes), str(seconds)]


def churn(
    loadgen: Path,
    sock: str,
    garbage_file: Path,
    processes: int,
    connections: int,
    seconds: float = 600.0,
    prefix: list[str] | None = None,
) -> dict[str, Any]:
    """Run the churn (under ``prefix``, e.g. setpriv); loadgen's figures."""
    command = [
        *(prefix or []),
        *churn_command(loadgen, sock, garbage_file, processes, connections, seconds),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, timeout=seconds + 60
    )
    if done.returncode != 0:
        raise BenchError(f"the churn failed: {done.stderr.strip()}")
    figures: dict[str, Any] = json.loads(done.stdout)
    return figures


def _cpu_or_none(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        return cpu_seconds(pid)
    except (OSError, IndexError, ValueError):
        return None  # the server is gone


@contextlib.contextmanager
def c_responder(binary: Path, work: Path) -> Iterator[tuple[str, int]]:
    """``c_responder.c`` listening in ``work``: yields (socket path, pid)."""
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
