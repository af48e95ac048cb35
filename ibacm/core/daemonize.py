"""Classic double-fork daemonization, with the start-up result reported to the caller.

C calls ``daemon(0, 0)`` first and the shell never learns whether start-up worked. Here the
original process waits on a pipe until the daemon reports: ``0`` once it serves (the
original process then exits 0), or an exit status plus a one-line message, which the original
process prints on its stderr before exiting with that status. The daemon itself runs in a new
session, in ``/``, with stdin/stdout/stderr on /dev/null.
"""

from __future__ import annotations

import os
import sys

_NO_REPORT = "ibacm: the daemon exited during start-up without saying why (see the log file)"


class Readiness:
    """The daemon's end of the pipe to the waiting original process."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    @property
    def pending(self) -> bool:
        return self._fd is not None

    def report(self, status: int, message: str = "") -> None:
        """Tell the waiting process the outcome; only the first report counts."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.write(fd, f"{status}\n{message}".encode(errors="replace"))
        except OSError:
            pass  # the original process is gone; nobody to tell
        finally:
            os.close(fd)


def _wait_for_report(fd: int) -> tuple[int, str]:
    chunks = []
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    text = b"".join(chunks).decode(errors="replace")
    head, _, message = text.partition("\n")
    if not head.strip().lstrip("-").isdigit():
        return 1, _NO_REPORT
    return int(head), message.strip()


def _null_stdio() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if null > 2:
        os.close(null)


def daemonize() -> Readiness:
    """Fork twice; returns in the daemon. The original process never returns: it exits
    with the status the daemon reports."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    if os.fork() > 0:
        os.close(write_fd)
        status, message = _wait_for_report(read_fd)
        if message:
            print(message, file=sys.stderr, flush=True)
        os._exit(status & 0xFF)
    os.close(read_fd)
    os.setsid()
    if os.fork() > 0:
        # The session leader exits so the daemon can never regain a controlling terminal.
        os._exit(0)
    os.chdir("/")
    _null_stdio()
    return Readiness(write_fd)
