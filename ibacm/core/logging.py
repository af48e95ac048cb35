"""Logging of the daemon: structlog in front, stdlib ``logging`` underneath, one renderer.

* JSON lines when the output is not a terminal (or ``log_format json``); a console renderer
  on a terminal. stdlib records (from libraries) go through the same renderer through
  ``structlog.stdlib.ProcessorFormatter``.
* ``log_file``: ``stdout``, ``stderr`` or a path opened for APPEND (C truncated it at every
  start, defect 18) and reopened on SIGHUP for logrotate.
* ``log_level`` 0-2: 0 warnings and errors (plus the configuration banner at start-up, which
  goes through the ``ibacm.config`` logger, always enabled at info), 1 info, 2 debug.
* Every record that is written is also offered to the admin event bus as ``kind="log"``.
* Timestamps are local time with milliseconds, ``YYYY-MM-DDTHH:MM:SS.mmm`` (options.md §10).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import sys
from collections.abc import Mapping, MutableMapping
from typing import IO, Any, Protocol

import structlog

from ibacm.log import get_logger as get_logger  # re-exported: the daemon's loggers

CONFIG_LOGGER = "ibacm.config"
"""Logger of the start-up configuration banner, written at every log level (as C does)."""

_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}
_PLAIN = (str, int, float, bool, type(None))


class EventSink(Protocol):
    def publish(self, kind: str, data: Mapping[str, Any]) -> None: ...


def python_level(acm_level: int) -> int:
    """stdlib level for an ACM ``log_level`` (values above 2 mean "everything")."""
    if acm_level <= 0:
        return logging.WARNING
    return _LEVELS.get(acm_level, logging.DEBUG)


def _timestamp(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    now = datetime.datetime.now()
    event_dict.setdefault(
        "timestamp", now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}"
    )
    return event_dict


def _plain(value: Any) -> Any:
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


class LogControl:
    """The daemon's handle on logging: level, destination, reopen, event bus."""

    def __init__(self) -> None:
        self.handler: logging.StreamHandler[IO[str]] | None = None
        self.destination = "stderr"
        self.level = 0
        self.format = "auto"
        self.bus: EventSink | None = None
        self._owned: IO[str] | None = None

    # -- set-up ------------------------------------------------------------------------------
    def configure(self, *, destination: str, level: int, log_format: str = "auto") -> None:
        """(Re)build the structlog + stdlib pipeline writing to ``destination``."""
        self.destination = destination
        self.format = log_format
        stream = self._open(destination)
        renderer: structlog.types.Processor
        if self._wants_json(stream):
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
        handler: logging.StreamHandler[IO[str]] = logging.StreamHandler(stream)
        handler.setFormatter(formatter)
        root = logging.getLogger()
        if self.handler is not None and self.handler in root.handlers:
            root.removeHandler(self.handler)
        root.addHandler(handler)
        self.handler = handler
        logging.getLogger(CONFIG_LOGGER).setLevel(logging.INFO)
        self.set_level(level)

    def _wants_json(self, stream: IO[str]) -> bool:
        if self.format == "json":
            return True
        if self.format == "console":
            return False
        try:
            return not stream.isatty()
        except (AttributeError, ValueError):
            return True

    def _open(self, destination: str) -> IO[str]:
        lowered = destination.lower()
        if lowered == "stdout":
            return sys.stdout
        if lowered == "stderr":
            return sys.stderr
        try:
            stream = open(destination, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        except OSError as exc:
            # C falls back to stdout; stderr is where an operator looks for trouble.
            print(
                f"ibacm: cannot open log file {destination}: {exc.strerror}; logging to stderr",
                file=sys.stderr,
            )
            return sys.stderr
        self._close_owned()
        self._owned = stream
        return stream

    def _close_owned(self) -> None:
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    # -- run time ----------------------------------------------------------------------------
    def set_level(self, level: int) -> None:
        self.level = level
        logging.getLogger().setLevel(python_level(level))

    def reopen(self) -> None:
        """Reopen a log file (SIGHUP, after logrotate moved it); no-op for stdout/stderr."""
        if self.handler is None or self.destination.lower() in ("stdout", "stderr"):
            return
        old = self._owned
        self._owned = None
        stream = self._open(self.destination)
        self.handler.setStream(stream)
        if old is not None and old is not stream:
            old.close()

    def close(self) -> None:
        root = logging.getLogger()
        if self.handler is not None:
            with contextlib.suppress(ValueError, OSError):  # the stream may be closed already
                self.handler.flush()
            root.removeHandler(self.handler)
            self.handler = None
        self._close_owned()

    def _publish(
        self, _: Any, __: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        bus = self.bus
        if bus is not None:
            # Logging must never fail because of a subscriber.
            with contextlib.suppress(Exception):
                bus.publish("log", {k: _plain(v) for k, v in event_dict.items()})
        return event_dict
