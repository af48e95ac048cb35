"""Run the atheris fuzz targets of ``atheris_targets``, one target per process.

    python -m tests.reliability.atheris_fuzz TARGET|all [--runs N] [--seconds S]
    python -m tests.reliability.atheris_fuzz TARGET --replay FILE

atheris (libFuzzer) can be set up only once per process and ends the process when it is
done, so this parent writes the target's seed corpus to a temporary directory and runs each
target in a child (``--child``) that instruments ``ibacm`` as it imports it. The parent
reads libFuzzer's report and prints one line per target: runs, coverage (edges and
features), corpus size, and the crash, if any. A crashing input is kept in
``tests/reliability/crashes/`` and the exit status is 1; ``--replay`` reruns a saved input
in-process (no atheris needed) and shows the traceback.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CRASHES = HERE / "crashes"
DEFAULT_RUNS = 100_000
INPUT_TIMEOUT = 10
"""Seconds one input may take before libFuzzer calls it a hang (a crash too)."""
MAX_LEN = 4096

_STATUS = re.compile(r"^#(\d+)\s+\w+\s+(?:cov: (\d+) ft: (\d+) )?corp: (\d+)/", re.M)
_EXECUTED = re.compile(r"^stat::number_of_executed_units: (\d+)", re.M)
_ARTIFACT = re.compile(r"Test unit written to (\S+)")
_SEED = re.compile(r"INFO: Seed: (\d+)")


@dataclass
class Outcome:
    """What one child run reported."""

    target: str
    returncode: int
    runs: int
    coverage: int
    features: int
    corpus: int
    seconds: float
    seed: str
    crash: Path | None
    log: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.crash is None

    def line(self) -> str:
        head = (
            f"{self.target:<15} runs {self.runs:>8}  cov {self.coverage:>5}  "
            f"ft {self.features:>6}  corpus {self.corpus:>5}  {self.seconds:6.1f}s"
        )
        if self.ok:
            return head + "  ok"
        where = self.crash.relative_to(REPO) if self.crash else f"exit {self.returncode}"
        return f"{head}  CRASH ({where}; seed {self.seed})"


def parse_report(target: str, returncode: int, log: str, seconds: float) -> Outcome:
    """libFuzzer's stderr -> an Outcome (the last status line carries cov/ft/corpus)."""
    statuses = _STATUS.findall(log)
    last = statuses[-1] if statuses else ("0", "0", "0", "0")
    executed = _EXECUTED.search(log)
    artifact = _ARTIFACT.search(log)
    seed = _SEED.search(log)
    return Outcome(
        target=target,
        returncode=returncode,
        runs=int(executed.group(1)) if executed else int(last[0]),
        coverage=int(last[1] or 0),
        features=int(last[2] or 0),
        corpus=int(last[3]),
        seconds=seconds,
        seed=seed.group(1) if seed else "?",
        crash=Path(artifact.group(1)).resolve() if artifact else None,
        log=log,
    )


def libfuzzer_args(corpus: Path, target: str, runs: int | None, seconds: float | None) -> list[str]:
    args = [
        f"-artifact_prefix={CRASHES}/{target}-",
        f"-timeout={INPUT_TIMEOUT}",
        f"-max_len={MAX_LEN}",
        "-print_final_stats=1",
    ]
    if runs is not None:
        args.append(f"-runs={runs}")
    if seconds is not None:
        args.append(f"-max_total_time={max(1, round(seconds))}")
    return [*args, str(corpus)]


def run_target(target: str, runs: int | None, seconds: float | None) -> Outcome:
    """Fuzz one target in a child process, seeded with the target's corpus."""
    from tests.reliability.atheris_targets import seeds

    CRASHES.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"atheris-{target}-") as tmp:
        corpus = Path(tmp)
        for number, seed in enumerate(seeds(target)):
            (corpus / f"seed-{number:03d}").write_bytes(seed[:MAX_LEN])
        command = [
            sys.executable,
            "-m",
            "tests.reliability.atheris_fuzz",
            "--child",
            target,
            *libfuzzer_args(corpus, target, runs, seconds),
        ]
        started = time.monotonic()
        done = subprocess.run(
            command,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            check=False,
        )
        elapsed = time.monotonic() - started
    return parse_report(target, done.returncode, done.stdout + done.stderr, elapsed)


def run_targets(
    names: Sequence[str], runs: int | None, seconds: float | None, jobs: int = 1
) -> Iterator[Outcome]:
    """Fuzz ``names``, ``jobs`` children at a time; outcomes in the order of ``names``."""
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        yield from pool.map(lambda name: run_target(name, runs, seconds), names)


def crash_excerpt(outcome: Outcome) -> str:
    """The traceback part of a crashed child's report."""
    log = outcome.log
    start = log.find("=== Uncaught Python exception")
    if start < 0:
        start = max(0, len(log) - 3000)
    return log[start : start + 4000]


# -- the child: instrument, then fuzz ------------------------------------------------------------


def _fail_on_logged_errors() -> None:
    """An error the daemon would log counts as a crash; everything else is dropped."""
    import structlog

    def gate(_: Any, method: str, event: Any) -> Any:
        if method in ("error", "critical", "exception"):
            raise AssertionError(f"logged {method}: {dict(event)}")
        raise structlog.DropEvent

    structlog.configure(processors=[gate], cache_logger_on_first_use=False)


def child(target: str, libfuzzer: list[str]) -> None:
    """Set atheris up on ``target`` and fuzz; libFuzzer ends the process."""
    import atheris  # type: ignore[import-untyped]

    with atheris.instrument_imports(include=["ibacm"]):
        from tests.reliability.atheris_targets import TARGETS

    _fail_on_logged_errors()
    atheris.Setup([sys.argv[0], *libfuzzer], TARGETS[target].make())
    atheris.Fuzz()


def replay(target: str, path: Path) -> int:
    from tests.reliability.atheris_targets import TARGETS

    _fail_on_logged_errors()
    try:
        TARGETS[target].make()(path.read_bytes())
    except Exception:
        traceback.print_exc()
        return 1
    print(f"{target}: {path} passes")
    return 0


# -- command line ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.reliability.atheris_fuzz")
    parser.add_argument("target", help="a target name, or 'all'")
    parser.add_argument("--runs", type=int, help=f"inputs per target (default {DEFAULT_RUNS})")
    parser.add_argument("--seconds", type=float, help="time limit per target")
    parser.add_argument("--jobs", type=int, default=1, help="targets fuzzed at once")
    parser.add_argument("--replay", type=Path, help="run one saved input through TARGET")
    parser.add_argument("--list", action="store_true", help="print the target names")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        child(argv[1], argv[2:])
        return 2  # not reached: libFuzzer exits
    args = parse_args(argv)
    from tests.reliability.atheris_targets import TARGETS

    if args.list:
        print("\n".join(TARGETS))
        return 0
    names = list(TARGETS) if args.target == "all" else [args.target]
    unknown = [name for name in names if name not in TARGETS]
    if unknown:
        print(f"unknown target {unknown[0]!r}; known: {', '.join(TARGETS)}", file=sys.stderr)
        return 2
    if args.replay is not None:
        return replay(names[0], args.replay)
    runs = args.runs if args.runs is not None or args.seconds is not None else DEFAULT_RUNS
    failed = 0
    for outcome in run_targets(names, runs, args.seconds, args.jobs):
        print(outcome.line(), flush=True)
        if not outcome.ok:
            failed += 1
            print(crash_excerpt(outcome), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
