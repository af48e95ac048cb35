"""A node's daemon as a process (``ibacm.tools.sim_nodes``): its command, how it is told
apart from another node's, whether it serves, and a start that fails naming its log."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ibacm.config.paths import STATE_DIR_ENV
from ibacm.tools import sim_procs
from ibacm.tools.sim_kinds import NodeKind
from ibacm.tools.sim_layout import CLIENT_SOCKET, OPTS_FILE, Layout, SimToolError, write_pids
from ibacm.tools.sim_nodes import (
    await_ready,
    daemon_env,
    find_daemons,
    listening,
    matcher,
    node_command,
    node_marker,
    process_state,
    ready_waiter,
    recorded_command,
    serving,
    spawn,
)
from ibacm.tools.sim_ready import ReadyListener

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_sim_node_command_names_its_hub_node_and_files(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    command, marker = node_command(layout, "node1", NodeKind.SIM, ["ibacm"])
    assert command[:4] == ["ibacm", "-P", "--fabric", "sim"]
    assert command[command.index("--sim-hub") + 1] == str(layout.hub_socket)
    assert command[command.index("-O") + 1] == str(layout.node_dir("node1") / OPTS_FILE)
    assert marker == node_marker("node1") and marker != node_marker("node10")[: len(marker)]


def test_a_start_runs_what_up_recorded(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    pids = {"daemon_cmd": ["/opt/ibacm", "-v"], "kinds": {"node2": "sim"}}
    kind, command, _marker = recorded_command(layout, pids, "node2")
    assert kind is NodeKind.SIM and command[:3] == ["/opt/ibacm", "-v", "-P"]


def test_each_daemon_has_its_own_state_directory(tmp_path: Path) -> None:
    env = daemon_env({"PATH": "/bin"}, tmp_path / "node1", None)
    assert env == {"PATH": "/bin", STATE_DIR_ENV: str(tmp_path / "node1")}


def test_a_command_line_is_matched_to_its_node_only(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    match = matcher(layout, ["node1", "node10"])
    opts10 = layout.node_dir("node10") / OPTS_FILE
    assert match(["python", "-m", "ibacm.core.cli", "-O", str(opts10)]) == "node10"
    assert match(["/usr/sbin/ibacm", f"--x={layout.node_dir('node1')}/log"]) == "node1"
    assert match(["vi", str(opts10)]) is None


def test_states_of_a_process(processes: list[subprocess.Popen[bytes]]) -> None:
    proc = subprocess.Popen([*SLEEP, *node_marker("node1").split()])
    processes.append(proc)
    marker = node_marker("node1")
    assert process_state(None, marker, lambda: True) == "down"
    assert process_state(proc.pid, node_marker("node2"), lambda: True) == "stopped"
    assert process_state(proc.pid, marker, lambda: False) == "starting"
    assert process_state(proc.pid, marker, lambda: True) == "running"


def test_a_node_serves_once_its_client_socket_accepts(tmp_path: Path) -> None:
    assert not serving(tmp_path) and listening(tmp_path) == []
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with server:
        server.bind(str(tmp_path / CLIENT_SOCKET))
        server.listen()
        assert serving(tmp_path)
        assert listening(tmp_path) == [str(tmp_path / CLIENT_SOCKET)]


def test_a_daemon_is_found_by_its_recorded_pid_or_its_command_line(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    layout = Layout(tmp_path)
    recorded = subprocess.Popen([*SLEEP, *node_marker("node1").split()])
    by_hand = subprocess.Popen([*SLEEP, "ibacm.core.cli", f"{layout.node_dir('node2')}/x"])
    processes += [recorded, by_hand]
    # Popen returns once exec closed its error pipe, before the kernel has set the new
    # command line up: /proc/PID/cmdline reads empty for a moment.
    deadline = time.monotonic() + 10
    while not all(sim_procs.cmdline(p.pid) for p in (recorded, by_hand)):
        assert time.monotonic() < deadline, "the sleepers never showed their command lines"
        time.sleep(0.005)
    write_pids(layout, {"nodes": {"node1": recorded.pid}})
    found = find_daemons(layout, {"nodes": {"node1": recorded.pid}}, ["node1", "node2", "node3"])
    assert (found["node1"].pid, found["node1"].recorded) == (recorded.pid, True)
    assert (found["node2"].pid, found["node2"].recorded) == (by_hand.pid, False)
    assert "node3" not in found


def test_a_process_that_dies_before_ready_is_named_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "node1.out"
    command = [sys.executable, "-c", "print('no fabric here', flush=True); exit(3)"]

    async def start_and_wait() -> None:
        listener = ReadyListener()
        listener.bind()
        try:
            waiter = ready_waiter(listener, "nodes")
            waiter.add("node1", spawn(command, log, dict(os.environ, NOTIFY_SOCKET=listener.name)))
            await await_ready(waiter, {"node1": [log]}, 30.0)
        finally:
            listener.close()

    with pytest.raises(SimToolError, match="node1") as caught:
        trio.run(start_and_wait)
    assert "no fabric here" in str(caught.value)


def test_a_command_that_cannot_start_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SimToolError, match="cannot start"):
        spawn([str(tmp_path / "missing")], tmp_path / "log", dict(os.environ))
