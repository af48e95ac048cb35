"""``ibacm-sim status`` (``ibacm.tools.sim_status``) of a cluster that is down: what each node
would run, its addresses and sockets, and an exit status that says it is not healthy."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from ibacm.fabric.sim.topo_file import generate
from ibacm.tools.sim_layout import Layout, SimToolError, write_pids
from ibacm.tools.sim_status import status, status_report


def down_cluster(root: Path) -> Layout:
    layout = Layout(root)
    layout.topology.write_text(generate(2).to_json())
    write_pids(layout, {"hub": None, "nodes": {}, "daemon_cmd": ["/opt/ibacm"], "kinds": {}})
    return layout


def test_a_cluster_that_is_down(tmp_path: Path) -> None:
    layout = down_cluster(tmp_path)
    report = status_report(layout)
    assert report["hub"]["state"] == "down"
    node = report["nodes"][0]
    assert (node["name"], node["state"], node["pid"], node["kind"]) == (
        "node1",
        "down",
        None,
        "sim",
    )
    assert node["admin_socket"] == str(layout.admin_socket("node1"))
    assert node["gid"].startswith("fe80::") and node["lid"] > 0 and node["ipv4"]
    # What start would run: the daemon command up recorded, for this node.
    assert node["command"][0] == "/opt/ibacm" and "node1" in node["command"]
    assert node["started_by_sim"] is None and node["listening"] == []


def test_the_exit_status_and_both_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    down_cluster(tmp_path)
    assert status(argparse.Namespace(dir=str(tmp_path), json=True)) == 1
    assert [n["name"] for n in json.loads(capsys.readouterr().out)["nodes"]] == ["node1", "node2"]
    assert status(argparse.Namespace(dir=str(tmp_path), json=False)) == 1
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("hub  pid -  down") and table[1].split()[:3] == [
        "NODE",
        "KIND",
        "LID",
    ]
    assert any(line.startswith("node2  starts with: /opt/ibacm") for line in table)


def test_no_cluster_and_a_damaged_topology_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(SimToolError, match="holds no simulated cluster"):
        status_report(Layout(tmp_path))
    Layout(tmp_path).topology.write_text("{}")
    with pytest.raises(SimToolError, match=r"topology\.json"):
        status_report(Layout(tmp_path))
