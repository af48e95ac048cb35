"""What every benchmark shares: machine facts, result files, C builds, RSS, percentiles.

Benchmarks run on demand (``make bench``), never in the test command. Each prints its
figures and writes them, with the facts of the machine they were measured on, to
``tests/bench/results/<name>.json`` (gitignored).
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
REPO_ROOT = BENCH_DIR.parent.parent
VENV_BIN = Path(sys.executable).parent
"""The interpreter's bin directory: the venv's ``ibacm``, ``ibacm-sim`` and ``ib_acme``."""


class BenchError(Exception):
    """A benchmark cannot run here (no gcc, a daemon did not start...)."""


def exit_on_sigterm() -> None:
    """SIGTERM (timeout(1), a CI cancel) unwinds like Ctrl-C, so every ``finally`` that takes a
    simulated cluster down runs: a killed benchmark leaves no daemons behind."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def machine_facts() -> dict[str, Any]:
    """Where the figures come from: they mean little without it."""
    facts: dict[str, Any] = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "memory_gb": _memory_gb(),
    }
    try:
        import trio

        facts["trio"] = trio.__version__
    except ImportError:  # pragma: no cover - trio is a dependency
        pass
    import ibacm

    facts["ibacm_modules"] = ibacm.variant.describe()  # children inherit IBACM_COMPILED
    return facts


VARIANTS = {"compiled": "1", "as_written": "0"}
"""The two variants of ibacm's hot modules (``ibacm.compiled``) and their IBACM_COMPILED."""


def parse_variants(text: str) -> list[str]:
    """``--variants`` (comma-separated): those asked for; "compiled" only when built here."""
    from ibacm.compiled import ENV, choose

    wanted = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in wanted if name not in VARIANTS]
    if unknown:
        raise BenchError(f"unknown variant {unknown[0]!r}; known: {', '.join(VARIANTS)}")
    built = choose({ENV: "auto"})
    if "compiled" in wanted and not built.compiled:
        print(f"no compiled variant ({built.reason}): as written only")
        wanted = [name for name in wanted if name != "compiled"] or ["as_written"]
    return wanted


def as_written(figures: dict[str, Any]) -> bool:
    """Whether a benchmark point ran the modules as written (``variant_env``)."""
    return bool(figures.get("variant", "compiled") != "compiled")


def variant_env(variant: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (``bench_env()`` by default) for a child that runs ``variant``."""
    found = dict(bench_env() if env is None else env)
    found["IBACM_COMPILED"] = VARIANTS[variant]
    return found


def time_batches(qp: Any, on_batch: Callable[[int, float], None]) -> None:
    """Time an endpoint's receive loop through its QP (both variants: a compiled handler
    cannot be wrapped): ``on_batch(MADs, process seconds)`` for each batch, from when
    ``receive_many`` returned it to the loop's next call, which comes once the batch is
    handled (the loop does not wait in between)."""
    receive_many = qp.receive_many
    taken: list[float | int] = []

    async def timed(limit: int) -> Any:
        if taken:
            on_batch(int(taken[1]), time.process_time() - taken[0])
            taken.clear()
        batch = await receive_many(limit)
        taken.extend((time.process_time(), len(batch)))
        return batch

    qp.receive_many = timed


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def write_results(name: str, figures: dict[str, Any]) -> Path:
    """Write ``results/<name>.json`` (figures + machine facts + time) and say where."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_facts(),
        **figures,
    }
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    print(f"-> {path.relative_to(REPO_ROOT)}")
    return path


def gcc_build(source: Path, out_dir: Path) -> Path:
    """Compile one C file of this directory with gcc -O2; the binary lands in ``out_dir``."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BenchError("gcc is needed to build the C baseline (apt-get install gcc)")
    binary = out_dir / source.stem
    command = [gcc, "-O2", "-Wall", "-Wextra", "-pthread", "-o", str(binary), str(source)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BenchError(f"gcc failed on {source.name}:\n{done.stderr}")
    return binary


def bench_env() -> dict[str, str]:
    """The environment for child processes: this venv's tools first on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("PYTHONUNBUFFERED", "1")
    # Helpers such as tests.bench.profiled_daemon run from the repository root.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def load_average() -> float:
    """The 1-minute load average, written beside each figure (a 2-core VM shared with others)."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def self_peak_rss_mb() -> float:
    """Peak resident set of this process (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def proc_rss_mb(pid: int) -> dict[str, float]:
    """Current (VmRSS) and peak (VmHWM) resident set of ``pid`` in MiB."""
    values: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values["rss_mb" if key == "VmRSS" else "peak_rss_mb"] = int(rest.split()[0]) / 1024
    return values


def current_rss_mb() -> float:
    return proc_rss_mb(os.getpid())["rss_mb"]


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (nan when empty)."""
    if not sorted_values:
        return math.nan
    index = round(fraction * (len(sorted_values) - 1))
    return float(sorted_values[index])


def ratio(ours: float, baseline: float) -> float | None:
    return round(ours / baseline, 3) if baseline else None


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"
