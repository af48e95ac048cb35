"""The state directory of a simulated cluster (``ibacm.tools.sim_layout``): pids.json, the
topology, socket path limits and what a stopped node leaves behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibacm.fabric.sim.topo_file import generate
from ibacm.tools import sim_kinds
from ibacm.tools.sim_layout import (
    ADMIN_SOCKET,
    CLIENT_SOCKET,
    LOCK_FILE,
    LOG_FILE,
    OPTS_FILE,
    Layout,
    SimToolError,
    check_socket_paths,
    node_names,
    read_pids,
    read_topology,
    remove_node_files,
    write_pids,
)


def test_pids_round_trip_and_defaults(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    assert read_pids(layout) == {"hub": None, "nodes": {}}
    write_pids(layout, {"hub": 41, "nodes": {"node1": 42}, "daemon_cmd": ["ibacm"]})
    assert read_pids(layout) == {"hub": 41, "nodes": {"node1": 42}, "daemon_cmd": ["ibacm"]}
    assert not layout.pids.with_suffix(".tmp").exists()  # written whole, then renamed


def test_the_hub_pid_file_stands_in_for_an_unrecorded_hub(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.hub_pid.write_text("1234\n")
    assert read_pids(layout)["hub"] == 1234


@pytest.mark.parametrize(("text", "said"), [("{not json", "unreadable"), ("[1]", "not a JSON")])
def test_a_damaged_pids_file_is_a_clear_error(tmp_path: Path, text: str, said: str) -> None:
    layout = Layout(tmp_path)
    layout.pids.write_text(text)
    with pytest.raises(SimToolError, match=said) as caught:
        read_pids(layout)
    assert str(layout.pids) in str(caught.value)


def test_a_directory_without_topology_is_no_cluster(tmp_path: Path) -> None:
    with pytest.raises(SimToolError, match="holds no simulated cluster"):
        read_topology(Layout(tmp_path))


def test_nodes_are_those_recorded_and_those_of_the_topology(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.topology.write_text(generate(2).to_json())
    assert read_topology(layout).host_names == ["node1", "node2"]
    assert node_names(layout, {"nodes": {"node9": 1}}) == ["node9", "node1", "node2"]


def test_a_directory_too_deep_for_a_unix_socket_is_refused(tmp_path: Path) -> None:
    check_socket_paths(Layout(tmp_path), ["node1"])
    deep = Layout(tmp_path / ("d" * 100))
    with pytest.raises(SimToolError, match="use a shorter --dir"):
        check_socket_paths(deep, ["node1"])


def test_a_stopped_node_keeps_its_logs_and_configuration(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    node_dir = layout.node_dir("node1")
    node_dir.mkdir()
    kept = [LOG_FILE, OPTS_FILE, "ibacm.out"]
    removed = [CLIENT_SOCKET, ADMIN_SOCKET, LOCK_FILE, "ibacm-tcp.port", "other.sock"]
    for name in [*kept, *removed, sim_kinds.EMU_SOCKET]:
        (node_dir / name).write_text("x")
    remove_node_files(layout, "node1", device_too=False)
    left = sorted(path.name for path in node_dir.iterdir())
    assert left == sorted([*kept, sim_kinds.EMU_SOCKET])  # its device still serves
    remove_node_files(layout, "node1", device_too=True)
    assert sorted(path.name for path in node_dir.iterdir()) == sorted(kept)
