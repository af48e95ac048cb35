"""Run ``ibacm`` under cProfile, one profile file per simulated node.

    python -m tests.bench.profiled_daemon OUT_DIR <ibacm arguments...>

``ibacm-sim up --daemon-cmd`` gives every node the same command; this wrapper names the
profile after the node (``--sim-node``) so the daemons do not overwrite each other's file.
"""

from __future__ import annotations

import cProfile
import sys
from pathlib import Path

from ibacm.core.cli import main as ibacm_main


def main() -> int:
    out_dir = Path(sys.argv[1])
    args = sys.argv[2:]
    node = args[args.index("--sim-node") + 1] if "--sim-node" in args else "ibacm"
    profiler = cProfile.Profile()
    status = 1
    try:
        status = profiler.runcall(ibacm_main, args)
    finally:
        out_dir.mkdir(parents=True, exist_ok=True)
        profiler.dump_stats(str(out_dir / f"{node}.prof"))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
