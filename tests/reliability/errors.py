"""Collect the error records the daemons log while a suite runs (a logged exception counts
as a crash of that request even though the daemon survives it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping
from typing import Any

import structlog

_FAILURES = ("error", "critical", "exception")


@contextlib.contextmanager
def logged_errors() -> Iterator[list[dict[str, Any]]]:
    """Route structlog to a collector of error records for the duration; restore after."""
    saved = structlog.get_config()
    found: list[dict[str, Any]] = []

    def collect(_: Any, method: str, event: MutableMapping[str, Any]) -> Any:
        if method in _FAILURES:
            found.append(dict(event))
        raise structlog.DropEvent

    structlog.configure(
        processors=[collect],
        wrapper_class=structlog.stdlib.BoundLogger,
        logger_factory=structlog.PrintLoggerFactory(),
        cache_logger_on_first_use=False,
    )
    try:
        yield found
    finally:
        structlog.configure(**saved)
