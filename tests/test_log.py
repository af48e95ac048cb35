"""The loggers' level gate (ibacm.log): a record the level drops never reaches structlog's
processors, and a level changed at run time takes effect at once."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog

from ibacm.log import get_logger

NAME = "ibacm.tests.gate"


@pytest.fixture
def gate() -> Iterator[logging.Logger]:
    stdlib = logging.getLogger(NAME)
    before = stdlib.level
    try:
        yield stdlib
    finally:
        stdlib.setLevel(before)


def test_a_record_below_the_level_never_reaches_the_processors(gate: logging.Logger) -> None:
    log = get_logger(NAME)
    gate.setLevel(logging.INFO)
    # capture_logs replaces the whole processor chain, level filter included: whatever is
    # captured got past the gate alone.
    with structlog.testing.capture_logs() as logs:
        log.debug("dropped", n=1)
        log.info("kept", n=2)
        log.warning("kept too")
        gate.setLevel(logging.DEBUG)  # live: nothing was cached
        log.debug("now kept", n=3)
        gate.setLevel(logging.ERROR)
        log.warning("dropped again")
        log.error("failed")
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("kept", "info"),
        ("kept too", "warning"),
        ("now kept", "debug"),
        ("failed", "error"),
    ]
    assert logs[0]["n"] == 2 and logs[2]["n"] == 3
    assert [log.enabled(level) for level in (logging.WARNING, logging.ERROR)] == [False, True]


def test_exception_carries_the_exception_being_handled(gate: logging.Logger) -> None:
    log = get_logger(NAME)
    gate.setLevel(logging.INFO)
    with structlog.testing.capture_logs() as logs:
        try:
            raise OSError("disk full")
        except OSError:
            log.exception("cannot save the cache", path="x")
    assert [(e["event"], e["log_level"], e["exc_info"], e["path"]) for e in logs] == [
        ("cannot save the cache", "error", True, "x")
    ]
