"""What a file that cannot be written costs: counted, and said on stderr, never a traceback.

The log file and a MAD capture file may sit on a full (or removed, or read-only) file system.
The daemon keeps serving; each lost log line or capture record is counted (admin status,
metrics) and reported on stderr, which needs no disk, at most once per interval.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

REPORT_INTERVAL = 60.0
"""Seconds between two stderr reports of the same kind of losses."""


def say(text: str) -> None:
    """A line for the operator on stderr, which may itself be what fails."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        print(text, file=sys.stderr, flush=True)


def reason(exc: BaseException) -> str:
    """Why a write failed, briefly (``No space left on device``)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


@dataclass(eq=False)
class Losses:
    """Items that could not be written: counted, and said on stderr when the first is lost,
    then at most once per ``interval`` while more are, and when writing works again after a
    report (a disk that is nearly full lets some writes through: that must not flood
    either). ``what`` names one item (``log line``); the clock is injectable for tests."""

    what: str
    interval: float = REPORT_INTERVAL
    clock: Callable[[], float] = time.monotonic
    total: int = 0
    error: str | None = None
    """Why the last item was lost, with the file's name."""
    failing: bool = False
    """The last write failed."""
    _unreported: int = 0
    _reported_at: float | None = field(default=None, repr=False)
    _said_failing: bool = False

    def lost(self, destination: str, why: str, count: int = 1) -> None:
        self.total += count
        self._unreported += count
        self.error = f"{destination}: {why}"
        self.failing = True
        now = self.clock()
        if self._reported_at is not None and now - self._reported_at < self.interval:
            return
        self._reported_at = now
        self._said_failing = True
        say(
            f"ibacm: cannot write {destination}: {why}; {self._unreported} {self.what}(s) lost "
            f"({self.total} since start); next report in {self.interval:g} s at most"
        )
        self._unreported = 0

    def recovered(self, destination: str) -> None:
        """A write worked after failed ones: say so if the failure was said, with what was
        lost since."""
        self.failing = False
        if not self._said_failing:
            return
        self._said_failing = False
        say(
            f"ibacm: writing {destination} again; {self._unreported} more {self.what}(s) lost "
            f"({self.total} since start)"
        )
        self._unreported = 0

    def status(self) -> dict[str, Any]:
        return {"lost": self.total, "failing": self.failing, "error": self.error}
