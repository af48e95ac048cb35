"""Would compiling the cached-RESOLVE path help? ibacm as it is against the same code compiled.

    python -m tests.bench.native_trial [--clients 1,64] [--rounds 3] [--seconds 2]

The modules every cached RESOLVE runs through (``MODULES``: framing, the connection's
read/answer/write loop, the dispatcher) are compiled with mypyc, the compiler that comes with
mypy (this venv has it), into a copy of the package in a temporary directory. Two simulated
clusters run side by side: one with the daemon as shipped, one whose daemons import the
compiled copy first (``PYTHONSAFEPATH`` + ``PYTHONPATH``; /proc/PID/maps is checked for the
compiled library). The same C load generator as ``make bench-throughput`` drives both,
taking turns, each point ``--rounds`` times; the median round is reported with the ratio
compiled / as shipped of throughput and of server CPU per request.

Not a target of its own: it measures what the compiled variant would buy before the build
and packaging cost of shipping it is paid (docs/benchmarks.md says what was found).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.bench import throughput
from tests.bench.common import (
    BENCH_DIR,
    REPO_ROOT,
    VENV_BIN,
    BenchError,
    bench_env,
    exit_on_sigterm,
    gcc_build,
    ratio,
    write_results,
)

MODULES = ("ibacm/wire/client.py", "ibacm/core/clients.py", "ibacm/core/dispatch.py")
"""The cached-RESOLVE path's own modules that mypyc compiles unchanged."""


def build_native(out: Path, modules: tuple[str, ...] = MODULES) -> Path:
    """A copy of the package with ``modules`` compiled in place; its root directory."""
    mypyc = VENV_BIN / "mypyc"
    if not mypyc.exists() or shutil.which("gcc") is None:
        raise BenchError("mypyc (pip install mypy) and gcc are needed to build the variant")
    root = out / "native"
    shutil.copytree(REPO_ROOT / "ibacm", root / "ibacm", ignore=shutil.ignore_patterns("*.pyc"))
    done = subprocess.run(
        [str(mypyc), *modules], cwd=root, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise BenchError(f"mypyc failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return root


def native_env(root: Path) -> dict[str, str]:
    """The daemons' environment: the compiled copy ahead of the repository."""
    env = bench_env()
    env["PYTHONSAFEPATH"] = "1"  # no script directory ahead of PYTHONPATH
    env["PYTHONPATH"] = os.pathsep.join((str(root), str(REPO_ROOT)))
    return env


def runs_compiled(pid: int, root: Path) -> bool:
    """Whether process ``pid`` mapped the compiled variant (mypyc's shared library of the
    group: modules of one group import each other through it, not through their shims)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return any(str(root) in line and "__mypyc.cpython-" in line for line in maps.splitlines())


def measure(work: Path, clients: list[int], seconds: float, rounds: int) -> dict[str, Any]:
    root = build_native(work)
    loadgen = gcc_build(BENCH_DIR / "loadgen.c", work)
    request = throughput.resolve_request()
    request_file = work / "request.bin"
    request_file.write_bytes(request)
    with contextlib.ExitStack() as stack:
        (work / "shipped").mkdir()
        (work / "compiled").mkdir()
        clusters = {
            "shipped": stack.enter_context(throughput.sim_cluster(work / "shipped", None, False)),
            "compiled": stack.enter_context(
                throughput.sim_cluster(work / "compiled", None, False, native_env(root))
            ),
        }
        servers = {name: cluster["ibacm"] for name, cluster in clusters.items()}
        for name, (sock, _pid) in servers.items():
            reply = throughput.exchange_once(sock, request)  # the cache filled
            if reply[2] != 0:
                raise BenchError(f"{name} did not answer the RESOLVE: status {reply[2]}")
        if not runs_compiled(servers["compiled"][1], root):
            raise BenchError("the compiled variant's daemon did not load the compiled modules")
        if runs_compiled(servers["shipped"][1], root):
            raise BenchError("the daemon as shipped loaded the compiled modules")
        request_files = dict.fromkeys(servers, request_file)
        runs = throughput.take_turns(loadgen, servers, request_files, clients, seconds, rounds)
    medians = {
        name: {count: throughput.median_run(found) for count, found in points.items()}
        for name, points in runs.items()
    }
    summary = {}
    for point in map(str, clients):
        shipped, compiled = medians["shipped"][point], medians["compiled"][point]
        summary[point] = {
            "throughput_ratio": ratio(compiled["rps"], shipped["rps"]),
            "cpu_per_request_ratio": ratio(
                compiled["server_cpu_us_per_request"] or 0,
                shipped["server_cpu_us_per_request"] or 0,
            ),
        }
    return {
        "modules": list(MODULES),
        "medians": medians,
        "rounds": runs,
        "compiled_vs_shipped": summary,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    clients = [int(part) for part in args.clients.split(",") if part.strip()]
    with tempfile.TemporaryDirectory(prefix="ibacm-native-") as tmp:
        results = measure(Path(tmp), clients, args.seconds, args.rounds)
    for count, values in results["compiled_vs_shipped"].items():
        print(
            f"clients={count:>3}: compiled / as shipped: throughput {values['throughput_ratio']}x, "
            f"server CPU per request {values['cpu_per_request_ratio']}x"
        )
    write_results("native_trial", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
