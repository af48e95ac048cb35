"""Double-fork daemonization (ibacm.core.daemonize) in real processes: the shell that started
the daemon gets its start-up outcome as the exit status and one stderr line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ibacm.core.daemonize import Readiness
from tests.conftest import REPO

# The daemon's side: writes what it sees to argv[1], then reports argv[2] (or nothing).
DAEMON = """
import json, os, sys
from ibacm.core.daemonize import daemonize
started_in = os.getsid(0)
readiness = daemonize()
with open(sys.argv[1], "w") as out:
    json.dump({"pid": os.getpid(), "sid": os.getsid(0), "leader_sid": started_in,
               "cwd": os.getcwd(), "pending": readiness.pending,
               "stdin": os.readlink("/proc/self/fd/0")}, out)
if sys.argv[2] != "none":
    status, _, message = sys.argv[2].partition(":")
    readiness.report(int(status), message)
    readiness.report(9, "a second report is ignored")
"""


def start(
    tmp_path: Path, report: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    seen = tmp_path / "seen.json"
    done = subprocess.run(
        [sys.executable, "-c", DAEMON, str(seen), report],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    deadline = time.monotonic() + 10  # the daemon may still be writing after a bad start
    while not seen.exists() or not seen.read_text():
        assert time.monotonic() < deadline, done.stderr
        time.sleep(0.01)
    result: dict[str, object] = json.loads(seen.read_text())
    return done, result


def test_the_daemon_reports_it_serves_and_the_shell_gets_0(tmp_path: Path) -> None:
    done, daemon = start(tmp_path, "0")
    assert (done.returncode, done.stderr) == (0, "")
    # A new session, not led by itself (it can never get a controlling terminal), in /,
    # with stdio on /dev/null.
    assert daemon["sid"] != daemon["leader_sid"] and daemon["sid"] != daemon["pid"]
    assert (daemon["cwd"], daemon["stdin"], daemon["pending"]) == ("/", os.devnull, True)


@pytest.mark.parametrize(
    ("report", "status", "stderr"),
    [
        ("3:cannot open the address file", 3, "cannot open the address file\n"),
        ("none", 1, "ibacm: the daemon exited during start-up without saying why"),
    ],
)
def test_a_failed_start_is_the_shells_exit_status_and_message(
    tmp_path: Path, report: str, status: int, stderr: str
) -> None:
    done, _ = start(tmp_path, report)
    assert done.returncode == status
    assert done.stderr.startswith(stderr), done.stderr


def test_only_the_first_report_counts_and_a_gone_shell_is_no_error() -> None:
    read_fd, write_fd = os.pipe()
    readiness = Readiness(write_fd)
    readiness.report(0)
    readiness.report(5, "too late")  # already closed: ignored
    assert not readiness.pending
    with os.fdopen(read_fd, "rb") as pipe:
        assert pipe.read() == b"0\n"
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # the original process is gone
    gone = Readiness(write_fd)
    gone.report(1, "nobody hears this")
    assert not gone.pending
