"""Lifecycle of real ``ibacm`` processes on a simulated cluster (``ibacm-sim up``).

* SIGTERM: exit status 0, the socket files gone, the cache saved on the way out, and the next
  start answers from the restored cache;
* SIGHUP while a client keeps resolving: every request answered, the connection kept, the cache
  kept;
* kill -9: nothing graceful happens, yet a restart (stale lock and socket files left behind)
  serves again and has the cache back from the last periodic save (``cache_file`` and
  ``cache_save_interval``).

The restored cache shows through NODELAY: a NODELAY request is answered from the cache or
with ENODATA at once, never by asking the fabric first.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ibacm.wire.client import AcmStatus, EpFlag
from tests.reliability.live import blocking_request, resolve_frame

BIN = Path(sys.executable).parent
RESOLVE = resolve_frame("node1", "node2")
CACHED_ONLY = resolve_frame("node1", "node2", EpFlag.NODELAY)


def env() -> dict[str, str]:
    """This venv's tools first on PATH: ``ibacm-sim up`` starts the ``ibacm`` it finds."""
    return dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")


def sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ibacm-sim"), *args], capture_output=True, text=True, env=env(), timeout=120
    )


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def wait_for(predicate: object, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Node1:
    """node1 of the cluster, restartable with its own command line."""

    root: Path
    command: list[str]
    process: subprocess.Popen[bytes] | None = None
    pid: int = 0

    @property
    def dir(self) -> Path:
        return self.root / "node1"

    @property
    def socket(self) -> str:
        return str(self.dir / "ibacm-unix.sock")

    @property
    def cache_file(self) -> Path:
        return self.dir / "cache.json"

    def start(self) -> None:
        log = open(self.dir / "restart.out", "ab")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(
            self.command,
            env=env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.pid = self.process.pid
        wait_for(self.serving, what="node1 to serve")

    def serving(self) -> bool:
        try:
            return blocking_request(self.socket, RESOLVE, timeout=2.0)[2] == 0
        except OSError:
            return False

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait_exit(self, timeout: float = 20.0) -> int | None:
        if self.process is not None:
            return self.process.wait(timeout=timeout)
        wait_for(lambda: not alive(self.pid), timeout, "node1 to exit")
        return None


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Node1]:
    """Two nodes up; node1 restarted with ``cache_file`` and a 1 s save interval."""
    root = tmp_path / "sim"
    done = sim("up", "--nodes", "2", "--dir", str(root), "--log-level", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    node: Node1 | None = None
    try:
        pid = json.loads((root / "pids.json").read_text())["nodes"]["node1"]
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        node = Node1(root, [part.decode() for part in raw], pid=pid)
        node.signal(signal.SIGTERM)
        node.wait_exit()
        with open(node.dir / "ibacm_opts.cfg", "a") as opts:
            opts.write(f"cache_file {node.cache_file}\ncache_save_interval 1\n")
        node.start()
        yield node
    finally:
        if node is not None and node.process is not None and node.process.poll() is None:
            node.process.kill()
            node.process.wait()
        sim("down", "--dir", str(root), "--grace", "5")


def saved_entries(path: Path) -> int:
    """How many cache entries the cache file holds (0 while it is missing or being replaced)."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return 0
    endpoints = data.get("endpoints", {}) if isinstance(data, dict) else {}
    return sum(len(entries) for entries in endpoints.values())


def test_sigterm_saves_the_cache_and_the_next_start_restores_it(cluster: Node1) -> None:
    assert blocking_request(cluster.socket, RESOLVE)[2] == AcmStatus.SUCCESS
    cluster.signal(signal.SIGTERM)
    assert cluster.wait_exit() == 0
    assert not Path(cluster.socket).exists()
    assert not (cluster.dir / "ibacm.pid").exists()
    assert cluster.cache_file.exists()
    cluster.start()
    reply = blocking_request(cluster.socket, CACHED_ONLY)
    assert (reply[2], len(reply)) == (AcmStatus.SUCCESS, 88)


def test_signals_during_the_shutdown_never_kill_it(cluster: Node1) -> None:
    """An impatient second SIGTERM, a Ctrl-C or logrotate's SIGHUP while the daemon stops:
    it still finishes (cache saved, socket gone) and exits 0, not killed by the signal."""
    assert blocking_request(cluster.socket, RESOLVE)[2] == AcmStatus.SUCCESS
    assert cluster.process is not None
    cluster.signal(signal.SIGTERM)
    sent = 0
    deadline = time.monotonic() + 20
    while cluster.process.poll() is None and time.monotonic() < deadline:
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            cluster.signal(signum)  # an exited child stays a zombie until waited for
            sent += 1
        time.sleep(0.001)
    assert cluster.wait_exit() == 0, f"after {sent} more signals"
    assert not Path(cluster.socket).exists()
    assert cluster.cache_file.exists()
    events = [json.loads(line)["event"] for line in (cluster.dir / "ibacm.log").open()]
    last_run = events[len(events) - events[::-1].index("shutting down") :]
    assert "configuration reloaded" not in last_run and last_run[-1] == "ibacm stopped", last_run


def test_sighup_keeps_clients_and_cache(cluster: Node1) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as kept:
        kept.settimeout(10)
        kept.connect(cluster.socket)
        kept.sendall(RESOLVE)
        assert kept.recv(592)[2] == AcmStatus.SUCCESS
        for round_number in range(30):
            if round_number % 10 == 5:
                cluster.signal(signal.SIGHUP)
            kept.sendall(CACHED_ONLY)
            reply = kept.recv(592)
            assert (reply[2], len(reply)) == (AcmStatus.SUCCESS, 88), round_number
            time.sleep(0.02)
    assert alive(cluster.pid)


def test_kill_9_then_restart_restores_the_periodic_save(cluster: Node1) -> None:
    assert blocking_request(cluster.socket, RESOLVE)[2] == AcmStatus.SUCCESS
    wait_for(lambda: saved_entries(cluster.cache_file) > 0, what="a periodic cache save")
    cluster.signal(signal.SIGKILL)
    cluster.wait_exit()
    # Nothing was cleaned up: the lock file and the socket file are still there.
    assert Path(cluster.socket).exists()
    cluster.start()
    reply = blocking_request(cluster.socket, CACHED_ONLY)
    assert (reply[2], len(reply)) == (AcmStatus.SUCCESS, 88)
