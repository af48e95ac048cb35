"""The ``ibacm-sim`` commands that ask the hub (``ibacm.tools.sim_hub_commands``), against a
real hub process, and what they answer from the topology when it is down."""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.tools.sim_hub_commands import fabric_event, fault, stats, text_command
from ibacm.tools.sim_layout import Layout, SimToolError
from ibacm.tools.spawn import module_command


def args(root: Path, **values: object) -> argparse.Namespace:
    return argparse.Namespace(**{"dir": str(root), "json": True, **values})


def cluster_dir(root: Path) -> Layout:
    layout = Layout(root)
    layout.topology.write_text(generate(2).to_json())
    return layout


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Layout]:
    """A hub serving the cluster in ``tmp_path``, as ``ibacm-sim up`` starts it."""
    layout = cluster_dir(tmp_path)
    command = [*module_command("ibacm.fabric.sim.hub"), "--dir", str(tmp_path)]
    command += ["--topology-json", str(layout.topology)]
    with open(layout.hub_log, "ab") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not layout.hub_socket.exists():
            assert proc.poll() is None, layout.hub_log.read_text()
            assert time.monotonic() < deadline, "the hub did not start"
            time.sleep(0.05)
        yield layout
    finally:
        proc.terminate()
        proc.wait(30)


def test_hosts_and_routes_come_from_the_topology_when_the_hub_is_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = cluster_dir(tmp_path)
    world = SimWorld(generate(2))
    assert text_command(args(tmp_path, json=False), "hosts") == 0
    assert capsys.readouterr().out == world.hosts_file()
    assert text_command(args(tmp_path, json=False), "routes") == 0
    assert capsys.readouterr().out == world.route_dump()
    assert text_command(args(tmp_path), "routes") == 0
    described = {section["description"] for section in json.loads(capsys.readouterr().out)}
    assert {"node1 mlx5_0", "node2 mlx5_0"} <= described
    assert not layout.hub_socket.exists()  # answered without starting anything


def test_a_command_for_a_hub_that_is_down_says_so(tmp_path: Path) -> None:
    cluster_dir(tmp_path)
    with pytest.raises(SimToolError, match="cannot reach the simulator hub"):
        fault(args(tmp_path, name=None, value=None))


def test_hosts_as_json_name_address_type_and_gid(
    hub: Layout, capsys: pytest.CaptureFixture[str]
) -> None:
    assert text_command(args(hub.root), "hosts") == 0
    entries = json.loads(capsys.readouterr().out)
    assert {"node1", "node2"} <= {entry["address"] for entry in entries}
    assert {entry["type"] for entry in entries} >= {"NAME", "IP"}
    assert all(entry["gid"].startswith("fe80:") for entry in entries)


def test_faults_are_set_and_shown(hub: Layout, capsys: pytest.CaptureFixture[str]) -> None:
    assert fault(args(hub.root, name="loss", value="0.25")) == 0
    assert json.loads(capsys.readouterr().out)["loss"] == 0.25
    with pytest.raises(SimToolError, match="needs a value"):
        fault(args(hub.root, name="loss", value=None))


def test_a_new_lid_shows_in_the_routes_and_the_stats_have_names(
    hub: Layout, capsys: pytest.CaptureFixture[str]
) -> None:
    event = args(hub.root, command="set-lid", node="node2", lid=77, device="mlx5_0", port=1)
    assert fabric_event(event) == 0
    assert text_command(args(hub.root), "routes") == 0
    lids = {
        section["description"]: section["lid"] for section in json.loads(capsys.readouterr().out)
    }
    assert any("node2" in description and lid == 77 for description, lid in lids.items()), lids
    assert stats(args(hub.root)) == 0
    report = json.loads(capsys.readouterr().out)
    assert "sm_lid" in report and all(set(c) >= {"class", "count"} for c in report["counters"])
