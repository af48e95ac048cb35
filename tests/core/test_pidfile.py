"""The lock/pid file: exclusive per process, truncated, removed on release."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ibacm.core.pidfile import LockFileError, PidLock


def test_pid_written_over_a_longer_old_one_and_removed(tmp_path: Path) -> None:
    path = tmp_path / "ibacm.pid"
    with PidLock(str(path)):
        assert path.read_text() == f"{os.getpid()}\n"
        umask = os.umask(0)
        os.umask(umask)
        assert path.stat().st_mode & 0o777 == 0o640 & ~umask
    assert not path.exists()
    path.write_text("123456789012\n")
    with PidLock(str(path)):
        assert path.read_text() == f"{os.getpid()}\n"  # C left trailing digits here
    assert not path.exists()


def test_second_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ibacm.pid"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from ibacm.core.pidfile import PidLock; "
            f"lock = PidLock({str(path)!r}); lock.acquire(); print('held', flush=True); "
            "sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(LockFileError, match=f"held by pid {holder.pid}"):
            PidLock(str(path)).acquire()
    finally:
        holder.communicate("")
    # The holder exited without release: the lock died with it, the file stays.
    lock = PidLock(str(path))
    lock.acquire()
    lock.release()


def test_unwritable_location(tmp_path: Path) -> None:
    with pytest.raises(LockFileError, match="cannot open lock file"):
        PidLock(str(tmp_path / "no-such-dir" / "ibacm.pid")).acquire()
