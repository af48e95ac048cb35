"""``ibacm-sim up``/``down`` and one node's ``stop``/``start`` (``ibacm.tools.sim_cluster``)
with real daemons on a real hub, and the checks that refuse before anything starts."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import trio

from ibacm.fabric.sim.faults import FaultSettingError
from ibacm.fabric.sim.topo_file import TopologyError, generate
from ibacm.tools import sim_cluster
from ibacm.tools.sim import build_parser
from ibacm.tools.sim_layout import Layout, SimToolError, read_pids
from ibacm.tools.sim_status import status_report


def up(root: Path, *extra: str) -> int:
    args = build_parser().parse_args(["up", "--dir", str(root), *extra])
    return trio.run(sim_cluster.up, args)


def node_command(root: Path, command: str, node: str) -> int:
    args = build_parser().parse_args([command, "--dir", str(root), node])
    return trio.run(sim_cluster.run_node_command, args)


def states(root: Path) -> dict[str, str]:
    report = status_report(Layout(root))
    return {"hub": report["hub"]["state"]} | {n["name"]: n["state"] for n in report["nodes"]}


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ((), "up needs --nodes N or --topology FILE"),
        (("--nodes", "2", "--daemon-cmd", " "), "--daemon-cmd is empty"),
        (("--nodes", "2", "--c-ibacm", "node7"), "node7"),
    ],
)
def test_bad_arguments_start_nothing(tmp_path: Path, extra: tuple[str, ...], error: str) -> None:
    with pytest.raises(SimToolError, match=error):
        up(tmp_path / "c", *extra)
    assert not (tmp_path / "c").exists()


def test_a_bad_fault_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(FaultSettingError):
        up(tmp_path / "c", "--nodes", "1", "--loss", "2")
    assert not (tmp_path / "c").exists()


def test_a_node_of_a_cluster_that_is_down_cannot_start(tmp_path: Path) -> None:
    root = tmp_path / "c"
    root.mkdir()
    (root / "topology.json").write_text(generate(2).to_json())
    with pytest.raises(SimToolError, match="is not up"):
        node_command(root, "start", "node1")
    with pytest.raises(TopologyError):
        node_command(root, "stop", "node9")


def test_up_stop_start_down(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "c"
    try:
        assert up(root, "--nodes", "2") == 0
        assert states(root) == {"hub": "running", "node1": "running", "node2": "running"}
        first = read_pids(Layout(root))["nodes"]["node2"]
        assert node_command(root, "stop", "node2") == 0
        assert states(root)["node2"] == "stopped"
        assert not Layout(root).client_socket("node2").exists()
        assert node_command(root, "start", "node2") == 0
        assert states(root)["node2"] == "running"
        assert read_pids(Layout(root))["nodes"]["node2"] != first
    finally:
        trio.run(partial(sim_cluster.down, Layout(root), grace=10.0))
    assert "stopped 2 node(s) and the hub" in capsys.readouterr().out
    assert sorted(p.name for p in root.rglob("*") if p.suffix in (".sock", ".pid")) == []
    assert (root / "node1" / "ibacm.log").exists()  # logs are kept
