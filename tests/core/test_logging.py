"""Logging: JSON lines, levels 0-2, stdlib records, append + reopen, the admin event bus."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio

from ibacm.core.events import EventBus
from ibacm.core.logging import CONFIG_LOGGER, LogControl, get_logger, python_level


@pytest.fixture
def control() -> Iterator[LogControl]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    control = LogControl()
    try:
        yield control
    finally:
        control.close()
        structlog.reset_defaults()
        root.setLevel(level)
        root.handlers[:] = handlers
        logging.getLogger(CONFIG_LOGGER).setLevel(logging.NOTSET)


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_levels_map_to_acm_log_level() -> None:
    assert [python_level(n) for n in (0, 1, 2, 7)] == [30, 20, 10, 10]


def test_json_lines_levels_and_stdlib_records(tmp_path: Path, control: LogControl) -> None:
    path = tmp_path / "ibacm.log"
    path.write_text('{"event": "from an earlier run"}\n')
    control.configure(destination=str(path), level=0)
    log = get_logger("ibacm.test")
    log.info("hidden at level 0")
    log.warning("port down", port="mlx5_0/1")
    get_logger(CONFIG_LOGGER).info("option", name="log level", value="0")
    logging.getLogger("some.library").error("library trouble %d", 42)
    control.set_level(2)
    log.debug("request", client="unix:1")
    lines = records(path)
    assert lines[0] == {"event": "from an earlier run"}  # appended, not truncated (defect 18)
    assert [(r["event"], r["level"]) for r in lines[1:]] == [
        ("port down", "warning"),
        ("option", "info"),
        ("library trouble 42", "error"),
        ("request", "debug"),
    ]
    assert lines[1]["port"] == "mlx5_0/1"
    assert lines[3]["logger"] == "some.library"
    stamp = lines[1]["timestamp"]
    assert len(stamp) == 23 and stamp[10] == "T" and stamp[19] == "."  # YYYY-MM-DDTHH:MM:SS.mmm


def test_reopen_after_logrotate(tmp_path: Path, control: LogControl) -> None:
    path = tmp_path / "ibacm.log"
    control.configure(destination=str(path), level=1)
    log = get_logger("ibacm.test")
    log.info("before rotation")
    path.rename(tmp_path / "ibacm.log.1")
    log.info("still into the rotated file")
    control.reopen()
    log.info("after reopen")
    assert [r["event"] for r in records(tmp_path / "ibacm.log.1")] == [
        "before rotation",
        "still into the rotated file",
    ]
    assert [r["event"] for r in records(path)] == ["after reopen"]


def test_console_format_and_bad_path(
    tmp_path: Path, control: LogControl, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "console.log"
    control.configure(destination=str(path), level=1, log_format="console")
    get_logger("ibacm.test").info("hello", who="world")
    text = path.read_text()
    assert "hello" in text and "who=world" in text and not text.startswith("{")
    control.configure(destination=str(tmp_path / "no" / "such.log"), level=1)
    assert "cannot open log file" in capsys.readouterr().err


@pytest.mark.trio
async def test_records_are_offered_to_the_event_bus(tmp_path: Path, control: LogControl) -> None:
    bus = EventBus()
    control.configure(destination=str(tmp_path / "ibacm.log"), level=1)
    control.bus = bus
    with bus.subscribe(kinds=["log"]) as subscription:
        get_logger("ibacm.test").warning("address removed", address=b"\x01", n=3)
        get_logger("ibacm.test").debug("below the level: not offered")
        with trio.fail_after(1):
            event = await subscription.receive()
        assert event.kind == "log"
        assert event.data["event"] == "address removed"
        assert event.data["level"] == "warning"
        assert event.data["n"] == 3
        assert event.data["address"] == str(b"\x01")
        with pytest.raises(trio.WouldBlock):
            subscription.receive_nowait()


def test_filtered_records_never_reach_structlog(tmp_path: Path, control: LogControl) -> None:
    """The level gate in front of structlog: a filtered call runs no processor at all, and a
    level change applies to loggers made before it (nothing is cached)."""
    control.configure(destination=str(tmp_path / "ibacm.log"), level=0)
    seen: list[str] = []

    def spy(_: Any, method: str, event: MutableMapping[str, Any]) -> Any:
        seen.append(f"{method}:{event['event']}")
        raise structlog.DropEvent

    processors = structlog.get_config()["processors"]
    structlog.configure(processors=[spy, *processors])
    log = get_logger("ibacm.test")
    log.debug("filtered")
    log.info("filtered too")
    log.warning("written")
    control.set_level(2)
    log.debug("now written")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("with the exception")
    assert seen == ["warning:written", "debug:now written", "exception:with the exception"]


def test_the_daemon_does_not_load_rich_and_writes_plain_tracebacks(tmp_path: Path) -> None:
    # structlog.dev would import rich (4.5 MB, 70 ms) for coloured tracebacks; the daemon
    # renders JSON or plain lines, so ibacm imports structlog without it.
    log_file = tmp_path / "console.log"
    code = f"""
import sys
import ibacm.core.cli
from ibacm.core.logging import LogControl, get_logger
assert "rich" not in sys.modules, "the daemon's command loaded rich"
control = LogControl()
control.configure(destination={str(log_file)!r}, level=1, log_format="console")
try:
    1 / 0
except ZeroDivisionError:
    get_logger("ibacm.test").exception("it broke")
control.close()
import rich.console  # later imports (a provider, the dashboard) still get rich
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    text = log_file.read_text()
    assert "it broke" in text
    assert "Traceback (most recent call last)" in text and "ZeroDivisionError" in text
