"""The lock/pid file: one ibacm per lock file, holding its pid.

As in C: ``open(O_RDWR|O_CREAT, 0640)`` and ``lockf(F_TLOCK)``; then, fixing the C defect, the
file is truncated before ``"<pid>\\n"`` is written, and it is removed on a clean exit.
POSIX record locks belong to the process, so the lock must be taken after daemonizing.
"""

from __future__ import annotations

import fcntl
import os
from types import TracebackType
from typing import Self


class LockFileError(Exception):
    """The lock file could not be created or is held by another ibacm."""


class PidLock:
    """Holds the lock on ``path`` from ``acquire`` until ``release``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        except OSError as exc:
            raise LockFileError(f"cannot open lock file {self.path}: {exc.strerror}") from exc
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            holder = _read_pid(self.path)
            who = f" by pid {holder}" if holder else ""
            raise LockFileError(
                f"lock file {self.path} is held{who}: another ibacm is already running"
            ) from exc
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            os.close(fd)
            raise LockFileError(f"cannot write lock file {self.path}: {exc.strerror}") from exc
        self._fd = fd

    def release(self) -> None:
        """Remove the file and drop the lock (unlink first, so no one locks a dying file)."""
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _read_pid(path: str) -> int | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            text = handle.read(32).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
