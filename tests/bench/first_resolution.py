"""The uncached path: latency of a daemon's first resolution of a destination.

    python -m tests.bench.first_resolution [--targets N] [--route-prot acm,sa]

One simulated cluster per route protocol: three measured daemons, each on a node of its own
(``c_ibacm``: rdma-core's C daemon on the emulated HCA; ``ibacm_hw``: ours with ``--fabric hw``,
the real pyverbs on the same emulated HCA, so the same MAD path as C; ``ibacm``: ours on the
simulated fabric directly), and N target nodes running ours. Every measured daemon resolves
every target once, by name, as ``ib_acme -f n -s SELF -d TARGET`` would: the address through the
ACM protocol (a multicast request, a unicast answer), then with ``route_prot sa`` the path
through an SA PathRecord query. The three take turns per target, so drift hits them alike.
Each answer is checked (status 0, a path whose DLID is the target's LID).

Targets: ours no slower than C at the median, on pyverbs (ibacm_hw against c_ibacm: the same
device path) and on the simulated fabric, over ACM and over SA.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ibacm.wire.client import AcmHdr, AcmMessage, AcmOp, AddrType, EpAddr, EpFlag
from ibacm.wire.path_record import PATH_RECORD_LEN, PathRecord
from tests.bench.common import (
    VENV_BIN,
    BenchError,
    bench_env,
    exit_on_sigterm,
    load_average,
    percentile,
    ratio,
    verdict,
    write_results,
)
from tests.bench.servers import timed_exchange

MEASURED = {"c_ibacm": "node1", "ibacm_hw": "node2", "ibacm": "node3"}


def c_support() -> str | None:
    """Why the C daemon and the emulated HCA cannot run here (None: they can)."""
    from ibacm.tools import sim_kinds

    kinds = {"node1": sim_kinds.NodeKind.C, "node2": sim_kinds.NodeKind.HW}
    try:
        sim_kinds.check_support(kinds)
    except sim_kinds.KindError as exc:
        return str(exc)
    return None


def name_request(source: str, dest: str) -> bytes:
    entries = [EpAddr.from_name(source, EpFlag.SOURCE), EpAddr.from_name(dest, EpFlag.DEST)]
    return AcmMessage(hdr=AcmHdr(opcode=AcmOp.RESOLVE), entries=entries).encode()


def checked_dlid(reply: bytes) -> int:
    """The DLID of a RESOLVE answer; BenchError unless it is a success with a path."""
    message = AcmMessage.decode(reply)
    if message.hdr.status != 0:
        raise BenchError(f"resolution failed: status {message.hdr.status}")
    for entry in message.entries:
        if entry.type == AddrType.PATH:
            return PathRecord.decode(entry.info[:PATH_RECORD_LEN]).dlid
    raise BenchError("the answer holds no path")


@contextlib.contextmanager
def cluster(work: Path, nodes: int, route_prot: str) -> Iterator[dict[str, Any]]:
    """``ibacm-sim up`` with the three measured kinds; yields the status document."""
    sim_dir = work / f"sim-{route_prot}"
    env = bench_env()
    up = [str(VENV_BIN / "ibacm-sim"), "up", "--nodes", str(nodes), "--dir", str(sim_dir)]
    up += ["--log-level", "0", "--route-prot", route_prot]
    up += ["--c-ibacm", MEASURED["c_ibacm"], "--hw", MEASURED["ibacm_hw"]]
    done = subprocess.run(up, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise BenchError(f"ibacm-sim up failed:\n{done.stdout}{done.stderr}")
    try:
        status = subprocess.run(
            [str(VENV_BIN / "ibacm-sim"), "status", "--dir", str(sim_dir), "--json"],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        document: dict[str, Any] = json.loads(status.stdout)
        document["dir"] = str(sim_dir)
        yield document
    finally:
        subprocess.run(
            [str(VENV_BIN / "ibacm-sim"), "down", "--dir", str(sim_dir)],
            capture_output=True,
            env=env,
            check=False,
        )


def measure(work: Path, targets: int, route_prot: str) -> dict[str, Any]:
    nodes = len(MEASURED) + targets
    with cluster(work, nodes, route_prot) as status:
        lids = {node["name"]: node["lid"] for node in status["nodes"]}
        sim_dir = Path(status["dir"])
        samples: dict[str, list[float]] = {who: [] for who in MEASURED}
        for index in range(len(MEASURED) + 1, nodes + 1):
            target = f"node{index}"
            order = list(MEASURED.items())
            shift = index % len(order)  # each daemon goes first as often as the others
            for who, node in order[shift:] + order[:shift]:
                sock = str(sim_dir / node / "ibacm-unix.sock")
                seconds, reply = timed_exchange(sock, name_request(node, target))
                dlid = checked_dlid(reply)
                if dlid != lids[target]:
                    raise BenchError(f"{who} resolved {target} to LID {dlid}, not {lids[target]}")
                samples[who].append(seconds)
    figures: dict[str, Any] = {}
    for who, values in samples.items():
        ordered = sorted(values)
        figures[who] = {
            "resolutions": len(ordered),
            "p50_us": round(percentile(ordered, 0.5) * 1e6, 1),
            "p99_us": round(percentile(ordered, 0.99) * 1e6, 1),
            "loadavg": load_average(),
        }
    return figures


def summarize(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    targets: dict[str, str] = {}
    factors: dict[str, Any] = {}
    for prot, figures in results.items():
        c_p50 = figures["c_ibacm"]["p50_us"]
        factors[prot] = {
            "ibacm_hw_p50_vs_c": ratio(figures["ibacm_hw"]["p50_us"], c_p50),
            "ibacm_p50_vs_c": ratio(figures["ibacm"]["p50_us"], c_p50),
        }
        for who, fabric in (("ibacm_hw", "pyverbs"), ("ibacm", "sim")):
            value = factors[prot][f"{who}_p50_vs_c"]
            targets[f"uncached_{prot}_{fabric}_p50<=c_ibacm"] = (
                f"{verdict(value is not None and value <= 1.0)}: {who} p50 "
                f"{figures[who]['p50_us']:.0f} us = {value}x C ibacm {c_p50:.0f} us"
            )
    return {"p50_factors": factors, "targets": targets}


def run(work: Path, targets: int, protocols: list[str]) -> dict[str, Any]:
    """Measure and print; the figures and verdicts for a caller's result file."""
    reason = c_support()
    if reason is not None:
        raise BenchError(f"the first-resolution benchmark needs the C daemon: {reason}")
    results = {prot: measure(work, targets, prot) for prot in protocols}
    summary = summarize(results)
    for prot, figures in results.items():
        for who, values in figures.items():
            print(
                f"first resolution ({prot:3}) {who:9} p50 {values['p50_us']:9.1f} us  "
                f"p99 {values['p99_us']:9.1f} us  ({values['resolutions']} destinations, "
                f"load {values['loadavg']:.1f})"
            )
    for target, outcome in summary["targets"].items():
        print(f"target {target}: {outcome}")
    return {"targets_per_daemon": targets, **results, **summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=40, help="destinations per daemon")
    parser.add_argument("--route-prot", default="acm,sa", help="comma-separated: acm, sa")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    protocols = [p.strip() for p in args.route_prot.split(",") if p.strip()]
    with tempfile.TemporaryDirectory(prefix="ibacm-bench-") as tmp:
        figures = run(Path(tmp), args.targets, protocols)
    write_results("first_resolution", figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
