"""``ibacm-tui`` in a real terminal (tmux), driven with keys and read off the screen."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.conftest import require_peer
from tests.tui.cluster import BIN, SimCluster, tool_env
from tests.tui.workload import BackgroundWorkload

MGID = "ff15:4001:ffff:3:400::"


class Terminal:
    """One tmux server (own socket name) with one 120x35 session."""

    def __init__(self, tmux: str, name: str) -> None:
        self.tmux = tmux
        self.name = name

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.tmux, "-L", self.name, *args],
            env=tool_env(),
            capture_output=True,
            text=True,
            timeout=20,
            check=check,
        )

    def start(self, command: list[str]) -> None:
        self.run("new-session", "-d", "-s", "tui", "-x", "120", "-y", "35", shlex.join(command))

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "tui", *keys)

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "tui").stdout

    def alive(self) -> bool:
        return self.run("has-session", "-t", "tui", check=False).returncode == 0

    def wait_for(self, *texts: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen() if self.alive() else "(the dashboard exited)"
            if all(text in screen for text in texts):
                return screen
            if time.monotonic() > deadline:
                missing = [text for text in texts if text not in screen]
                raise AssertionError(f"{missing} not on screen:\n{screen}")
            time.sleep(0.1)

    def wait_gone(self, text: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while text in self.screen():
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} still on screen:\n{self.screen()}")
            time.sleep(0.1)

    def kill(self) -> None:
        self.run("kill-server", check=False)


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    term = Terminal(require_peer("tmux"), f"ibacm-tui-test-{os.getpid()}")
    try:
        yield term
    finally:
        term.kill()


def test_a_person_watches_a_busy_node_and_quits(cluster: SimCluster, terminal: Terminal) -> None:
    command = [str(BIN / "ibacm-tui"), "--dir", str(cluster.dir), "--node", "node1"]
    with BackgroundWorkload(cluster.client_socket("node1"), "node1", ["node2", "node1"]):
        terminal.start(command)
        screen = terminal.wait_for("connected to node1", "mlx5_0/1/0xffff", "Hit rate", "ready")
        assert "10.0.0.1/16" in screen
        terminal.keys("2")
        terminal.wait_for(MGID, "joined", "0xc0")
        terminal.keys("3")
        terminal.wait_for("node2", "READY")
        # Escape on Cache, then the next tab: the keys must not end up in the filter field.
        terminal.keys("Escape")
        time.sleep(0.5)  # a person's pause (an Escape at once followed by a key is Alt+key)
        terminal.keys("4")
        screen = terminal.wait_for("Route cache hit rate", "Resolves/s", "/s)")
        assert "%" in screen.split("Route cache hit rate", 1)[1].splitlines()[0]
        terminal.keys("5")
        terminal.wait_for("INFO", "ibacm.admin: admin socket listening")
        terminal.keys("?")
        terminal.wait_for("live view of one ibacm daemon")
        terminal.keys("Escape")
        terminal.wait_gone("live view of one ibacm daemon")  # as a person, look before q
        terminal.keys("q")
        deadline = time.monotonic() + 10
        while terminal.alive():
            assert time.monotonic() < deadline, f"q did not quit:\n{terminal.screen()}"
            time.sleep(0.1)
