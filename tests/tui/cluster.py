"""A simulated cluster of real ``ibacm`` daemons for the dashboard tests (``ibacm-sim up``).

The daemons are separate processes, as in production; the tests attach to their admin
sockets. ``restart`` stops one node's daemon and starts it again with the same command
line, which is how the dashboard's "disconnected, then reconnected" path is exercised.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def tool_env() -> dict[str, str]:
    """Environment in which this virtualenv's ``ibacm``, ``ibacm-sim`` and ``ibacm-tui`` win."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("NOTIFY_SOCKET", None)
    return env


def connectable(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def wait_until(predicate: object, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass
class SimCluster:
    dir: Path
    nodes: list[str]
    restarted: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def node_dir(self, node: str) -> Path:
        return self.dir / node

    def admin_socket(self, node: str) -> Path:
        return self.node_dir(node) / "ibacm-admin.sock"

    def client_socket(self, node: str) -> Path:
        return self.node_dir(node) / "ibacm-unix.sock"

    def daemon_pid(self, node: str) -> int:
        if node in self.restarted:
            return self.restarted[node].pid
        pids = json.loads((self.dir / "pids.json").read_text())
        return int(pids["nodes"][node])

    def stop_daemon(self, node: str) -> list[str]:
        """SIGTERM the node's daemon and wait for it to go; returns its command line."""
        pid = self.daemon_pid(node)
        command = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        os.kill(pid, signal.SIGTERM)
        if node in self.restarted:
            self.restarted.pop(node).wait(20)
        else:
            wait_until(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), "daemon exit")
        return [part.decode() for part in command]

    def start_daemon(self, node: str, command: list[str]) -> None:
        log = open(self.node_dir(node) / "ibacm.out", "ab")  # noqa: SIM115 - owned by Popen
        with log:
            self.restarted[node] = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=tool_env(),
                start_new_session=True,
            )
        wait_until(lambda: connectable(self.admin_socket(node)), f"{node} admin socket")

    def down(self) -> None:
        for node, proc in list(self.restarted.items()):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            del self.restarted[node]
        subprocess.run(
            [str(BIN / "ibacm-sim"), "down", "--dir", str(self.dir)],
            env=tool_env(),
            capture_output=True,
            timeout=60,
            check=False,
        )


def _zombie(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return fields[0] == "Z"


def start_cluster(directory: Path, nodes: int = 2) -> SimCluster:
    """``ibacm-sim up --nodes N --dir DIR``; fails the test with the tool's output if it fails."""
    result = subprocess.run(
        [str(BIN / "ibacm-sim"), "up", "--nodes", str(nodes), "--dir", str(directory)],
        env=tool_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    cluster = SimCluster(directory, [f"node{n}" for n in range(1, nodes + 1)])
    if result.returncode != 0:
        cluster.down()
        pytest.fail(f"ibacm-sim up failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return cluster
