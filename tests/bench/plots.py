"""Plots of the last benchmark results, for docs/benchmarks.md.

    python -m tests.bench.plots [throughput] [storm] [scale]

Reads ``tests/bench/results/<name>.json`` and writes ``docs/img/<name>.svg``: throughput
against clients (one line per server), and the storm's wall time and SA PathRecord queries
against N (one line per configuration). matplotlib is the ``bench`` extra
(``pip install -e '.[bench]'``), never a dependency of the daemon; without it the benchmarks
still run and say how to get the plots.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.bench.common import REPO_ROOT, RESULTS_DIR, as_written

DOCS_IMG = REPO_ROOT / "docs" / "img"
LABELS = {
    "c_responder": "C epoll responder (floor)",
    "noop_loop": "no-work loop, thread (the daemon's kind)",
    "noop_task_loop": "no-work loop, trio task",
    "c_ibacm": "rdma-core C ibacm",
    "ibacm": "ibacm (ours)",
    "ibacm_as_written": "ibacm, modules as written",
}
CPU_POINTS = ("oneshot_1", "oneshot_16", "pipeline_8", "pipeline_64")
"""The throughput points whose server CPU per request (per connection, one-shot) is drawn."""


def _pyplot() -> Any | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots skipped: matplotlib is missing (pip install -e '.[bench]')")
        return None
    plt.rcParams["svg.hashsalt"] = "ibacm"  # the same figures give the same file
    plt.rcParams["svg.fonttype"] = "none"  # text stays text: a small, greppable file
    return plt


def throughput_plot(results: dict[str, Any], out: Path) -> Path | None:
    plt = _pyplot()
    if plt is None:
        return None
    figure, (rps_axis, p99_axis, cpu_axis) = plt.subplots(1, 3, figsize=(15, 4.5))
    points: dict[str, dict[str, Any]] = results.get("points", {})
    drawn = [server for server in LABELS if isinstance(points.get(server), dict)]
    for server in drawn:
        cached = sorted(
            int(key.split("_")[1]) for key in points[server] if key.startswith("cached_")
        )
        figures = [points[server][f"cached_{count}"] for count in cached]
        label = LABELS[server]
        # A point where the server did not answer everyone (or died) is drawn hollow.
        rps_axis.plot(cached, [f["rps"] / 1000 for f in figures], "-", label=label)
        p99_axis.plot(cached, [max(f["p99_us"], 1) for f in figures], "-", label=label)
        for axis, values in (
            (rps_axis, [f["rps"] / 1000 for f in figures]),
            (p99_axis, [max(f["p99_us"], 1) for f in figures]),
        ):
            full = [
                (c, v) for c, v, f in zip(cached, values, figures, strict=True) if f["answered_all"]
            ]
            short = [
                (c, v)
                for c, v, f in zip(cached, values, figures, strict=True)
                if not f["answered_all"]
            ]
            color = axis.get_lines()[-1].get_color()
            if full:
                axis.plot(*zip(*full, strict=True), "o", color=color)
            if short:
                axis.plot(*zip(*short, strict=True), "o", color=color, fillstyle="none")
    for axis, title in (
        (rps_axis, "cached RESOLVE, k requests/s"),
        (p99_axis, "cached RESOLVE, p99 latency, µs (hollow: not all answered)"),
    ):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent clients")
        axis.set_title(title, fontsize=9)
        axis.grid(True, alpha=0.3)
    p99_axis.set_yscale("log")
    width = 0.8 / max(len(drawn), 1)
    for index, server in enumerate(drawn):
        values = [(points[server].get(key) or {}).get("cpu_us_median") or 0 for key in CPU_POINTS]
        offsets = [at + index * width for at in range(len(CPU_POINTS))]
        cpu_axis.bar(offsets, values, width, label=LABELS[server])
    cpu_axis.set_xticks([at + 0.4 - width / 2 for at in range(len(CPU_POINTS))])
    cpu_axis.set_xticklabels(CPU_POINTS, fontsize=8)
    cpu_axis.set_yscale("log")
    cpu_axis.set_title("server CPU per request (one-shot: per connection), µs", fontsize=9)
    cpu_axis.grid(True, axis="y", alpha=0.3)
    rps_axis.legend(fontsize=7)
    figure.suptitle(f"Throughput ({results.get('when', '')}, {_machine(results)})", fontsize=9)
    return _save(plt, figure, out)


def storm_plot(results: dict[str, Any], out: Path) -> Path | None:
    plt = _pyplot()
    if plt is None:
        return None
    by_config: dict[str, list[dict[str, Any]]] = {}
    for point in results.get("points", []):
        if "skipped" not in point and "error" not in point:
            label = point["config"] + (", modules as written" if as_written(point) else "")
            by_config.setdefault(label, []).append(point)
    figure, (wall_axis, sa_axis) = plt.subplots(1, 2, figsize=(10, 4))
    for config, points in sorted(by_config.items()):
        points.sort(key=lambda point: point["nodes"])
        nodes = [point["nodes"] for point in points]
        wall_axis.plot(nodes, [point["wall_s"] for point in points], "o-", label=config)
        queries = [max(point.get("sa_path_queries", 0), 0.5) for point in points]
        sa_axis.plot(nodes, queries, "o-", label=config)
    for axis, title in ((wall_axis, "storm wall time, s"), (sa_axis, "SA PathRecord queries")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("nodes (N)")
        axis.set_title(title)
        axis.grid(True, alpha=0.3)
    wall_axis.legend(fontsize=8)
    figure.suptitle(f"Job-start storm ({results.get('when', '')}, {_machine(results)})", fontsize=9)
    return _save(plt, figure, out)


def scale_plot(results: dict[str, Any], out: Path) -> Path | None:
    plt = _pyplot()
    if plt is None:
        return None
    by_config: dict[str, list[dict[str, Any]]] = {}
    for point in results.get("points", []):
        if "skipped" not in point and "error" not in point:
            by_config.setdefault(point["config"], []).append(point)
    figure, (cpu_axis, sa_axis) = plt.subplots(1, 2, figsize=(10, 4))
    for config, points in sorted(by_config.items()):
        points.sort(key=lambda point: point["nodes"])
        nodes = [point["nodes"] for point in points]
        cpu = [point["per_daemon"]["cpu_s"]["median"] for point in points]
        cpu_axis.plot(nodes, cpu, "o-", label=config)
        # What the SA sends for the whole cluster: each of the N daemons asks as one of
        # the K full ones did (0 is drawn at 1 on the log scale).
        records = [
            max(point["fabric"]["sa_path_records_incl_startup"] / point["full"] * point["nodes"], 1)
            for point in points
        ]
        sa_axis.plot(nodes, records, "o-", label=config)
    for config, points in sorted(_by_config(results.get("process_points", [])).items()):
        nodes = [point["nodes"] for point in points]
        cpu = [point["per_daemon"]["cpu_s"]["median"] for point in points]
        cpu_axis.plot(nodes, cpu, "s--", label=f"{config}, daemon in its own process")
    titles = ("CPU per daemon for its job start, s", "PathRecords the SA sends, all N nodes")
    for axis, title in zip((cpu_axis, sa_axis), titles, strict=True):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("nodes (N)")
        axis.set_title(title)
        axis.grid(True, alpha=0.3)
    cpu_axis.legend(fontsize=8)
    title = f"Sampled job start ({results.get('when', '')}, {_machine(results)})"
    figure.suptitle(title, fontsize=9)
    return _save(plt, figure, out)


def _by_config(points: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for point in sorted(points, key=lambda point: point.get("nodes", 0)):
        if "skipped" not in point and "error" not in point:
            found.setdefault(point["config"], []).append(point)
    return found


def _machine(results: dict[str, Any]) -> str:
    machine = results.get("machine", {})
    return f"{machine.get('cores', '?')} cores, CPython {machine.get('python', '?')}"


def _save(plt: Any, figure: Any, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(out, format=out.suffix.lstrip("."), metadata={"Date": None})
    plt.close(figure)
    print(f"-> {out.relative_to(REPO_ROOT) if out.is_relative_to(REPO_ROOT) else out}")
    return out


PLOTS = {"throughput": throughput_plot, "storm": storm_plot, "scale": scale_plot}


def plot(name: str) -> Path | None:
    """The plot of ``results/<name>.json`` (None when the file or matplotlib is missing)."""
    source = RESULTS_DIR / f"{name}.json"
    if not source.exists():
        print(f"no {source.relative_to(REPO_ROOT)}: run the benchmark first")
        return None
    return PLOTS[name](json.loads(source.read_text()), DOCS_IMG / f"{name}.svg")


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or list(PLOTS)
    unknown = [name for name in names if name not in PLOTS]
    if unknown:
        print(f"unknown plot(s) {', '.join(unknown)}; known: {', '.join(PLOTS)}")
        return 2
    for name in names:
        plot(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
