"""The loggers every module writes to: structlog, asked only when the level lets a record out.

A structlog lazy proxy assembles a fresh bound logger and runs the processor chain just to
have ``filter_by_level`` drop the event: about 15 µs for a debug line that is never written,
which is more than a cached RESOLVE costs. ``get_logger`` returns a thin gate that asks the
stdlib logger (whose level test Python caches) first, and hands the call to structlog only
when the record would be written. structlog's configuration stays live (nothing is cached),
so ``ibacm.core.logging`` and tests may reconfigure it at any time.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

_DEBUG = logging.DEBUG
_INFO = logging.INFO
_WARNING = logging.WARNING
_ERROR = logging.ERROR


class Logger:
    """A module's logger: ``debug``/``info``/``warning``/``error``/``exception`` with
    structlog's event-plus-key-values signature."""

    __slots__ = ("_gate", "_structlog", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._gate = logging.getLogger(name)
        self._structlog = structlog.get_logger(name)

    def enabled(self, level: int) -> bool:
        return self._gate.isEnabledFor(level)

    def debug(self, event: str, **values: Any) -> None:
        if self._gate.isEnabledFor(_DEBUG):
            self._structlog.debug(event, **values)

    def info(self, event: str, **values: Any) -> None:
        if self._gate.isEnabledFor(_INFO):
            self._structlog.info(event, **values)

    def warning(self, event: str, **values: Any) -> None:
        if self._gate.isEnabledFor(_WARNING):
            self._structlog.warning(event, **values)

    def error(self, event: str, **values: Any) -> None:
        if self._gate.isEnabledFor(_ERROR):
            self._structlog.error(event, **values)

    def exception(self, event: str, **values: Any) -> None:
        """An error with the exception being handled (from inside an ``except`` block)."""
        if self._gate.isEnabledFor(_ERROR):
            self._structlog.exception(event, **values)


def get_logger(name: str) -> Logger:
    return Logger(name)
