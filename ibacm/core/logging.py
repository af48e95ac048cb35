"""Logging of the daemon: structlog in front, stdlib ``logging`` underneath, one renderer.

* JSON lines when the output is not a terminal (or ``log_format json``); a console renderer
  on a terminal. stdlib records (from libraries) go through the same renderer through
  ``structlog.stdlib.ProcessorFormatter``.
* ``log_file``: ``stdout``, ``stderr`` or a path opened for APPEND (C truncated it at every
  start, defect 18) and reopened on SIGHUP for logrotate.
* ``log_level`` 0-2: 0 warnings and errors (plus the configuration banner at start-up, which
  goes through the ``ibacm.config`` logger, always enabled at info), 1 info, 2 debug.
* Every record that is written is also offered to the admin event bus as ``kind="log"``.
* Timestamps are ISO 8601 local time with milliseconds and the UTC offset,
  ``YYYY-MM-DDTHH:MM:SS.mmm+HH:MM`` (``datetime.fromisoformat`` reads them).
* Logging never stops the daemon: a line that cannot be written (disk full, file removed or
  read-only, stderr closed) is counted (``ibacm.losses``) (admin status, metrics) and reported
  on stderr at most once per ``REPORT_INTERVAL``, never with a traceback per line; a reopen
  that fails keeps the stream it had.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import IO, Any, Protocol

import structlog

from ibacm.log import get_logger as get_logger  # re-exported: the daemon's loggers
from ibacm.losses import REPORT_INTERVAL, Losses, reason, say

CONFIG_LOGGER = "ibacm.config"
"""Logger of the start-up configuration banner, written at every log level (as C does)."""

LOG_FILE_MODE = 0o666
"""Mode of a new log file before the umask (what ``open(path, "a")`` gave)."""

_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}
_PLAIN = (str, int, float, bool, type(None))
_STANDARD = ("stdout", "stderr")

log = get_logger(__name__)


class EventSink(Protocol):
    def publish(self, kind: str, data: Mapping[str, Any]) -> None: ...


def python_level(acm_level: int) -> int:
    """stdlib level for an ACM ``log_level`` (values above 2 mean "everything")."""
    if acm_level <= 0:
        return logging.WARNING
    return _LEVELS.get(acm_level, logging.DEBUG)


def timestamp_now() -> str:
    """Local time, ISO 8601 with milliseconds and the UTC offset."""
    return datetime.datetime.now().astimezone().isoformat(timespec="milliseconds")


def _timestamp(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event_dict.setdefault("timestamp", timestamp_now())
    return event_dict


def _plain(value: Any) -> Any:
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


# -- destinations ------------------------------------------------------------------------------


class LogStream:
    """stdout or stderr (a text stream the daemon does not own)."""

    def __init__(self, name: str, stream: IO[str] | None) -> None:
        self.name = name
        self.stream = stream

    def write_line(self, text: str) -> None:
        stream = self.stream
        if stream is None:  # no stderr at all (started detached): nothing to write to
            raise OSError(f"no {self.name}")
        stream.write(text + "\n")
        stream.flush()

    def isatty(self) -> bool:
        try:
            return self.stream is not None and self.stream.isatty()
        except (AttributeError, ValueError, OSError):
            return False

    def close(self) -> None:
        """Not ours to close."""


class LogFile:
    """A log file opened for appending; each line is one ``write(2)`` of its own.

    Unbuffered, so a failed write loses exactly the lines it was given (a buffer would keep
    them and write them later, or fail again at close). A line cut short by a full disk is
    ended by the next line that is written, which then starts on a line of its own.
    """

    def __init__(self, path: str) -> None:
        self.name = path
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        self.fd = os.open(path, flags, LOG_FILE_MODE)
        self._torn = False

    def write_line(self, text: str) -> None:
        data = (("\n" if self._torn else "") + text + "\n").encode("utf-8", "backslashreplace")
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):
                written += os.write(self.fd, view[written:])
        except OSError:
            if written:
                self._torn = True
            raise
        self._torn = False

    def isatty(self) -> bool:
        try:
            return os.isatty(self.fd)
        except OSError:
            return False

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


Destination = LogStream | LogFile


def open_destination(destination: str) -> Destination:
    """``stdout``, ``stderr`` or a file opened for appending (``OSError`` if it cannot be)."""
    lowered = destination.lower()
    if lowered == "stdout":
        return LogStream("stdout", sys.stdout)
    if lowered == "stderr":
        return LogStream("stderr", sys.stderr)
    return LogFile(destination)


class _Handler(logging.Handler):
    """Writes formatted records to a destination; a failure costs the line, never a raise."""

    def __init__(self, destination: Destination, losses: Losses) -> None:
        super().__init__()
        self.destination = destination
        self.losses = losses

    def emit(self, record: logging.LogRecord) -> None:
        destination = self.destination
        try:
            destination.write_line(self.format(record))
        except Exception as exc:  # a bad record (a library's %-format) is a lost line too
            self.losses.lost(destination.name, reason(exc))
            return
        if self.losses.failing:
            self.losses.recovered(destination.name)
            # Also in the log itself, so whoever reads it knows there is a gap before here.
            log.warning("log lines lost", lost_since_start=self.losses.total)

    def flush(self) -> None:
        """Every line was written when it was emitted."""

    def swap(self, destination: Destination) -> None:
        """Write to ``destination`` from now on; the old one is closed."""
        # Under the handler's lock: a worker thread may be writing to the old one right now.
        with self.lock or contextlib.nullcontext():
            old, self.destination = self.destination, destination
            old.close()

    def close(self) -> None:
        with self.lock or contextlib.nullcontext():
            self.destination.close()
        super().close()


class LogControl:
    """The daemon's handle on logging: level, destination, reopen, event bus, lines lost."""

    def __init__(
        self, *, report_interval: float = REPORT_INTERVAL, clock: Callable[[], float] | None = None
    ) -> None:
        self.handler: _Handler | None = None
        self.destination = "stderr"
        self.level = 0
        self.format = "auto"
        self.bus: EventSink | None = None
        self.losses = Losses("log line", report_interval, clock or time.monotonic)

    # -- set-up ------------------------------------------------------------------------------
    def configure(self, *, destination: str, level: int, log_format: str = "auto") -> None:
        """(Re)build the structlog + stdlib pipeline writing to ``destination``."""
        self.destination = destination
        self.format = log_format
        try:
            target = open_destination(destination)
        except OSError as exc:
            # C falls back to stdout; stderr is where an operator looks for trouble.
            say(f"ibacm: cannot open log file {destination}: {reason(exc)}; logging to stderr")
            target = open_destination("stderr")
        renderer: structlog.types.Processor
        if self._wants_json(target):
            renderer = structlog.processors.JSONRenderer()
        else:
            renderer = structlog.dev.ConsoleRenderer(colors=False)
        shared: list[structlog.types.Processor] = [
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            _timestamp,
        ]
        structlog.configure(
            processors=[
                structlog.stdlib.filter_by_level,
                *shared,
                structlog.stdlib.PositionalArgumentsFormatter(),
                structlog.processors.StackInfoRenderer(),
                structlog.processors.format_exc_info,
                structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
            ],
            logger_factory=structlog.stdlib.LoggerFactory(),
            wrapper_class=structlog.stdlib.BoundLogger,
            cache_logger_on_first_use=False,
        )
        formatter = structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.processors.format_exc_info],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                self._publish,
                renderer,
            ],
        )
        handler = _Handler(target, self.losses)
        handler.setFormatter(formatter)
        root = logging.getLogger()
        old = self.handler
        root.addHandler(handler)
        self.handler = handler
        if old is not None:
            root.removeHandler(old)
            old.close()
        logging.getLogger(CONFIG_LOGGER).setLevel(logging.INFO)
        self.set_level(level)

    def _wants_json(self, target: Destination) -> bool:
        if self.format == "json":
            return True
        if self.format == "console":
            return False
        return not target.isatty()

    # -- run time ----------------------------------------------------------------------------
    def set_level(self, level: int) -> None:
        self.level = level
        logging.getLogger().setLevel(python_level(level))

    def reopen(self) -> None:
        """Reopen a log file (SIGHUP, after logrotate moved it); no-op for stdout/stderr.

        Never raises: when the file cannot be opened the lines keep going where they went
        (the file opened before, or stderr), and stderr and the log say so."""
        handler = self.handler
        if handler is None or self.destination.lower() in _STANDARD:
            return
        try:
            target = open_destination(self.destination)
        except OSError as exc:
            still = handler.destination.name
            say(
                f"ibacm: cannot reopen log file {self.destination}: {reason(exc)}; "
                f"still logging to {still}"
            )
            log.error(
                "log file not reopened", path=self.destination, error=reason(exc), still=still
            )
            return
        handler.swap(target)

    def status(self) -> dict[str, Any]:
        """JSON-able state for the admin snapshot: where lines go and how many were lost."""
        writing = self.handler.destination.name if self.handler is not None else None
        return {"destination": self.destination, "writing_to": writing, **self.losses.status()}

    def close(self) -> None:
        if self.handler is not None:
            logging.getLogger().removeHandler(self.handler)
            self.handler.close()
            self.handler = None

    def _publish(
        self, _: Any, __: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        bus = self.bus
        if bus is not None:
            # Logging must never fail because of a subscriber.
            with contextlib.suppress(Exception):
                bus.publish("log", {k: _plain(v) for k, v in event_dict.items()})
        return event_dict
