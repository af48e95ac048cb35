"""The logrotate configuration, run by the real logrotate."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, require_peer, require_root
from tests.packaging.simfabric import Hub, node_files, wait_for

CONFIG = REPO / "packaging" / "ibacm.logrotate"


def private_copy(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The shipped configuration with its two paths (log, pid file) moved into tmp_path."""
    log, pidfile = tmp_path / "ibacm.log", tmp_path / "ibacm.pid"
    text = CONFIG.read_text()
    assert text.count("/var/log/ibacm.log") == 1
    assert "/run/ibacm.pid" in text
    text = text.replace("/var/log/ibacm.log", str(log)).replace("/run/ibacm.pid", str(pidfile))
    conf = tmp_path / "ibacm.logrotate"
    conf.write_text(text)
    conf.chmod(0o644)
    return conf, log, pidfile


def rotate(conf: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    logrotate = require_peer("logrotate")
    return subprocess.run(
        [logrotate, "-f", "-s", str(tmp_path / "state"), str(conf)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    sleeper = subprocess.Popen(["sleep", "300"])
    yield sleeper
    sleeper.kill()
    sleeper.wait()


def test_shipped_file_parses() -> None:
    logrotate = require_peer("logrotate")
    done = subprocess.run(
        [logrotate, "-d", str(CONFIG)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "error" not in (done.stdout + done.stderr).lower()
    assert "rotating pattern: /var/log/ibacm.log" in done.stdout + done.stderr


def test_rotation_moves_the_log_and_spares_a_foreign_pid(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    require_root("logrotate refuses configuration files not owned by root")
    conf, log, pidfile = private_copy(tmp_path)
    log.write_text("2026-11-21T10:00:00.000: old record\n")
    pidfile.write_text(f"{bystander.pid}\n")  # stale: the pid now belongs to "sleep"
    done = rotate(conf, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ibacm.log.1").read_text().endswith("old record\n")
    assert not log.exists()  # no copytruncate: the daemon creates it again on SIGHUP
    time.sleep(0.2)
    assert bystander.poll() is None, "postrotate sent SIGHUP to a process that is not ibacm"


@pytest.mark.slow
def test_rotation_makes_the_running_daemon_reopen_its_log(sim_hub: Hub, tmp_path: Path) -> None:
    require_root("logrotate refuses configuration files not owned by root")
    files = node_files(tmp_path / "node", sim_hub, "node4")
    conf, log, pidfile = private_copy(tmp_path / "node")
    assert (log, pidfile) == (files.log_file, files.pid_file)
    daemon = subprocess.Popen(files.command("-P"), stderr=subprocess.PIPE, text=True)
    try:
        wait_for(files.unix_socket.exists, 30, "the daemon's client socket")
        before = log.read_text()
        assert "serving clients" in before

        done = rotate(conf, tmp_path / "node")
        assert done.returncode == 0, done.stderr

        # SIGHUP from postrotate: the daemon creates a fresh log and keeps running.
        wait_for(log.exists, 20, "the reopened log file")
        wait_for(lambda: "configuration reloaded" in log.read_text(), 20, "a record in it")
        assert (tmp_path / "node" / "ibacm.log.1").read_text().startswith(before)
        assert daemon.poll() is None
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
    assert daemon.returncode == 0, daemon.stderr.read() if daemon.stderr else ""
