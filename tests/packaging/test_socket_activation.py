"""Socket activation and sd_notify with the real systemd-socket-activate (no systemd as PID 1).

systemd-socket-activate listens where ibacm.socket would, starts ``ibacm --systemd`` on the
first connection with the listening socket as fd 3 (LISTEN_FDS/LISTEN_PID), exactly as
systemd does for the unit. A datagram socket plays systemd's NOTIFY_SOCKET.
"""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import require_peer
from tests.packaging.simfabric import (
    IBACM,
    Hub,
    NodeFiles,
    node_files,
    process_gone,
    wait_for,
)

pytestmark = pytest.mark.slow


class NotifyListener:
    """The manager's end of NOTIFY_SOCKET: collects every KEY=VALUE datagram."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[dict[str, str]] = []

    def wait_for(self, key: str, timeout: float) -> dict[str, str]:
        """The first message (already received or arriving within ``timeout``) with ``key``."""
        for message in self.messages:
            if key in message:
                return message
        self.sock.settimeout(timeout)
        while True:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                raise AssertionError(f"no {key} from the daemon within {timeout} s") from None
            message = dict(line.split("=", 1) for line in data.decode().splitlines() if line)
            self.messages.append(message)
            if key in message:
                return message

    def close(self) -> None:
        self.sock.close()


def activate(files: NodeFiles, notify: Path) -> subprocess.Popen[str]:
    tool = require_peer("systemd-socket-activate")
    return subprocess.Popen(
        [
            tool,
            "-l",
            str(files.unix_socket),
            "-E",
            f"NOTIFY_SOCKET={notify}",
            "--",
            str(IBACM),
            "--systemd",
            "-O",
            str(files.options),
            *files.daemon_args(),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_socket_activated_daemon_serves_and_notifies(sim_hub: Hub, tmp_path: Path) -> None:
    ib_acme = require_peer("/usr/bin/ib_acme")
    files = node_files(tmp_path, sim_hub, "node1")
    listener = NotifyListener(tmp_path / "notify.sock")
    manager = activate(files, listener.path)
    try:
        wait_for(files.unix_socket.exists, 10, "systemd-socket-activate's listening socket")
        assert not files.pid_file.exists(), "the daemon must start only on the first connection"
        # The first client starts the daemon; the real C ib_acme waits in its one recv().
        query = subprocess.run(
            [ib_acme, "-S", str(files.unix_socket), "-P"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        ready = listener.wait_for("READY", timeout=30)
        assert ready["READY"] == "1"
        assert int(ready["MAINPID"]) == manager.pid  # activate execs the daemon in place
        assert "serving" in ready.get("STATUS", "")
        assert query.returncode == 0, query.stdout + query.stderr
        lines = query.stdout.splitlines()
        assert lines[0].startswith("svc,Error Count,Resolve Count,No Data")
        assert lines[1].startswith(f"{files.unix_socket},")
        assert lines[-1] == "return status 0x0"
        # Under socket activation the daemon leaves the well-known symlink to the socket
        # unit (Symlinks=) and writes its pid file.
        assert not (files.run_dir / "ibacm.sock").exists()
        assert files.pid_file.read_text().strip() == str(manager.pid)

        manager.send_signal(signal.SIGTERM)
        stopping = listener.wait_for("STOPPING", timeout=30)
        assert stopping["STOPPING"] == "1"
        assert manager.wait(timeout=30) == 0
        order = [next(iter(m)) for m in listener.messages if "READY" in m or "STOPPING" in m]
        assert order == ["READY", "STOPPING"]
        assert not files.pid_file.exists()
    finally:
        if manager.poll() is None:
            manager.kill()
            manager.wait()
        listener.close()


def test_daemon_refuses_foreign_inherited_sockets(sim_hub: Hub, tmp_path: Path) -> None:
    # systemd-socket-activate --datagram hands over a datagram socket: not what ibacm.socket
    # passes, so start-up must fail with a clear message instead of serving nothing.
    tool = require_peer("systemd-socket-activate")
    files = node_files(tmp_path, sim_hub, "node2")
    sock_path = tmp_path / "dgram.sock"
    manager = subprocess.Popen(
        [
            tool,
            "--datagram",
            "-l",
            str(sock_path),
            "--",
            str(IBACM),
            "--systemd",
            "-O",
            str(files.options),
            *files.daemon_args(),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(sock_path.exists, 10, "the datagram socket")
        client = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        client.sendto(b"wake up", str(sock_path))
        client.close()
        output, _ = manager.communicate(timeout=60)
        assert manager.returncode == 1
        assert "neither a listening stream socket nor a netlink socket" in output
        assert not files.pid_file.exists()
    finally:
        if manager.poll() is None:
            manager.kill()
            manager.wait()
    assert process_gone(manager.pid)
