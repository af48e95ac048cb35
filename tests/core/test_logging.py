"""Logging: JSON lines, levels 0-2, stdlib records, append + reopen, the admin event bus,
ISO 8601 timestamps, and what a file that cannot be written costs (lines, never the daemon)."""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio

from ibacm.core.events import EventBus
from ibacm.core.logging import CONFIG_LOGGER, LogControl, get_logger, python_level
from ibacm.losses import Losses
from tests.conftest import ibacm_sim, require_peer
from tests.fullfs import free, full_tmpfs


class Clock:
    """A hand-moved clock for the report interval."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def control(clock: Clock) -> Iterator[LogControl]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    control = LogControl(report_interval=60.0, clock=clock)
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
    for line in lines[1:]:
        stamp = datetime.datetime.fromisoformat(line["timestamp"])
        assert stamp.utcoffset() is not None


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


def test_timestamps_are_iso_8601_with_the_local_utc_offset(
    tmp_path: Path, control: LogControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ibacm.log"
    monkeypatch.setenv("TZ", "IST-5:30")  # POSIX rule: no tz database needed
    time.tzset()
    try:
        control.configure(destination=str(path), level=1)
        before = datetime.datetime.now(datetime.UTC)
        get_logger("ibacm.test").info("stamped")
        logging.getLogger("some.library").warning("stamped too")
        after = datetime.datetime.now(datetime.UTC)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    for line in records(path):
        stamp = datetime.datetime.fromisoformat(line["timestamp"])
        assert line["timestamp"].endswith("+05:30")
        assert stamp.utcoffset() == datetime.timedelta(hours=5, minutes=30)
        # Milliseconds: the stamp may be up to 1 ms before the moment it was taken.
        assert before - datetime.timedelta(milliseconds=1) <= stamp <= after


def lost_reports(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("ibacm: cannot write ")]


def test_a_device_that_refuses_every_write_costs_lines_counted_and_reported_once_per_interval(
    control: LogControl, clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    # /dev/full fails every write with ENOSPC, as a full file system does.
    control.configure(destination="/dev/full", level=2)
    log = get_logger("ibacm.test")
    for n in range(500):
        log.debug("request", n=n)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Logging error" not in err
    assert lost_reports(err) == [
        "ibacm: cannot write /dev/full: No space left on device; 1 log line(s) lost "
        "(1 since start); next report in 60 s at most"
    ]
    assert control.status() == {
        "destination": "/dev/full",
        "writing_to": "/dev/full",
        "lost": 500,
        "failing": True,
        "error": "/dev/full: No space left on device",
    }
    clock.now = 59.0
    log.warning("still within the interval")
    assert lost_reports(capsys.readouterr().err) == []
    clock.now = 60.0
    log.warning("one interval later")
    assert lost_reports(capsys.readouterr().err) == [
        "ibacm: cannot write /dev/full: No space left on device; 501 log line(s) lost "
        "(502 since start); next report in 60 s at most"
    ]
    control.reopen()  # what killed the daemon: the old stream's buffer flushed at reopen
    log.warning("after reopen")
    assert control.status()["lost"] == 503


def test_a_full_tmpfs_costs_lines_then_writing_resumes_with_a_note_in_the_log(
    tmp_path: Path, control: LogControl, capsys: pytest.CaptureFixture[str]
) -> None:
    with full_tmpfs(tmp_path / "full", room=4096) as full:
        path = full / "ibacm.log"
        control.configure(destination=str(path), level=1)
        log = get_logger("ibacm.test")
        for n in range(40):  # 4 KiB of room: the first few fit, one is cut short
            log.info("request", n=n, padding="x" * 400)
        lost = control.status()["lost"]
        assert 20 < lost < 40
        free(full)
        log.info("room again")
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert len(lost_reports(err)) == 1
        assert f"ibacm: writing {path} again; {lost - 1} more log line(s) lost" in err
        assert control.status()["failing"] is False
        lines = path.read_text().splitlines()
        whole = []
        for line in lines:
            try:
                whole.append(json.loads(line))
            except json.JSONDecodeError:
                whole.append(None)
        # At most the one line the disk cut short is broken; the next one starts afresh.
        assert whole.count(None) <= 1
        events = [r for r in whole if r is not None]
        assert [r["n"] for r in events if r["event"] == "request"] == list(range(40 - lost))
        assert events[-2]["event"] == "room again"
        assert events[-1]["event"] == "log lines lost"
        assert events[-1]["lost_since_start"] == lost


def test_a_failed_reopen_keeps_the_old_file_and_says_so(
    tmp_path: Path, control: LogControl, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "logs"
    directory.mkdir()
    path = directory / "ibacm.log"
    control.configure(destination=str(path), level=1)
    log = get_logger("ibacm.test")
    log.info("before")
    rotated = tmp_path / "ibacm.log.1"
    path.rename(rotated)
    directory.rmdir()  # the log directory is gone: the reopen cannot create the file
    control.reopen()
    log.info("after the failed reopen")
    assert (
        f"ibacm: cannot reopen log file {path}: No such file or directory; "
        f"still logging to {path}" in capsys.readouterr().err
    )
    events = records(rotated)
    assert [r["event"] for r in events] == [
        "before",
        "log file not reopened",
        "after the failed reopen",
    ]
    assert events[1]["error"] == "No such file or directory"
    directory.mkdir()
    control.reopen()
    log.info("reopened")
    assert [r["event"] for r in records(path)] == ["reopened"]
    assert control.status()["lost"] == 0


def test_a_closed_stderr_costs_lines_not_the_caller(
    control: LogControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    read, write = os.pipe()
    os.close(read)  # EPIPE on every write (SIGPIPE is ignored by Python)
    broken = os.fdopen(write, "w")
    monkeypatch.setattr("sys.stderr", broken)
    control.configure(destination="stderr", level=1)
    get_logger("ibacm.test").warning("nobody reads this")
    assert control.status()["lost"] == 1
    assert control.status()["error"] == f"stderr: {os.strerror(errno.EPIPE)}"
    monkeypatch.undo()
    with contextlib.suppress(OSError):  # the text layer still holds the unwritten line
        broken.close()


def test_a_nearly_full_disk_that_lets_some_writes_through_does_not_flood_either(
    clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    losses = Losses("log line", 60.0, clock)
    for second in range(120):  # every other write fails, for two minutes
        clock.now = float(second)
        losses.lost("ibacm.log", "No space left on device")
        losses.recovered("ibacm.log")
    assert capsys.readouterr().err.splitlines() == [
        "ibacm: cannot write ibacm.log: No space left on device; 1 log line(s) lost "
        "(1 since start); next report in 60 s at most",
        "ibacm: writing ibacm.log again; 0 more log line(s) lost (1 since start)",
        "ibacm: cannot write ibacm.log: No space left on device; 60 log line(s) lost "
        "(61 since start); next report in 60 s at most",
        "ibacm: writing ibacm.log again; 0 more log line(s) lost (61 since start)",
    ]
    assert losses.status() == {
        "lost": 120,
        "failing": False,
        "error": "ibacm.log: No space left on device",
    }


# -- a real daemon (ibacm-sim) whose log file is on a full disk --------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _admin_status(node: Path) -> tuple[str, dict[str, Any]]:
    """``ibacm-admin status`` as printed, and its JSON."""
    command = [
        sys.executable,
        "-m",
        "ibacm.tools.admin_cli",
        "--admin",
        str(node / "ibacm-admin.sock"),
    ]
    text = subprocess.run([*command, "status"], capture_output=True, text=True, timeout=60)
    assert text.returncode == 0, text.stderr
    raw = subprocess.run([*command, "--json", "status"], capture_output=True, text=True, timeout=60)
    assert raw.returncode == 0, raw.stderr
    return text.stdout, json.loads(raw.stdout)


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        body = response.read().decode()
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in the metrics:\n{body}")


def _resolve(ib_acme: str, node: Path) -> str:
    done = subprocess.run(
        [ib_acme, "-S", str(node / "ibacm-unix.sock"), "-s", "10.0.0.1", "-d", "10.0.0.2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stdout


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.peer
def test_a_daemon_logging_to_a_full_disk_keeps_serving_counts_and_survives_sighup(
    tmp_path: Path,
) -> None:
    ib_acme = require_peer("ib_acme")
    started = time.monotonic()
    with full_tmpfs(tmp_path / "full") as full:
        logs = full / "logs"
        logs.mkdir()  # an empty directory needs no blocks: it fits on the full tmpfs
        log_file = logs / "ibacm.log"
        port = _free_port()
        extra = tmp_path / "extra.cfg"
        extra.write_text(f"log_file {log_file}\nmetrics_port {port}\n")
        sim = tmp_path / "sim"
        try:
            up = ibacm_sim("up", "--nodes", "2", "--dir", str(sim), "--opts", str(extra),
                           "--log-level", "2")  # fmt: skip
            assert up.returncode == 0, up.stderr
            node = sim / "node1"
            pid = json.loads((sim / "pids.json").read_text())["nodes"]["node1"]
            stderr = node / "ibacm.out"
            for _ in range(50):
                assert "dlid: 3" in _resolve(ib_acme, node)

            text, snapshot = _admin_status(node)
            state = snapshot["daemon"]["log"]
            assert state["failing"] and state["lost"] > 50
            assert state["error"] == f"{log_file}: No space left on device"
            assert f"log: {log_file}, " in text and "line(s) lost; failing:" in text
            assert _metric(port, "ibacm_log_lines_lost_total") >= state["lost"]

            # SIGHUP while the file cannot be written: the reopen used to end the daemon. The
            # reload that follows the reopen shows in the status: log_level 2 becomes 1.
            opts = node / "ibacm_opts.cfg"
            opts.write_text(opts.read_text().replace("log_level 2\n", "log_level 1\n"))
            os.kill(pid, signal.SIGHUP)
            _wait_for(
                lambda: _admin_status(node)[1]["daemon"]["log_level"] == 1, "the first reload"
            )
            # SIGHUP with a reopen that fails: logrotate moved the file, the directory is gone.
            log_file.rename(full / "ibacm.log.1")
            logs.rmdir()
            os.kill(pid, signal.SIGHUP)
            _wait_for(lambda: "cannot reopen log file" in stderr.read_text(), "the reopen report")
            assert "dlid: 3" in _resolve(ib_acme, node)
            os.kill(pid, 0)  # alive
            text, snapshot = _admin_status(node)
            assert snapshot["daemon"]["log"]["lost"] > state["lost"]

            out = stderr.read_text()
            assert "Traceback" not in out and "Logging error" not in out
            assert (
                f"ibacm: cannot reopen log file {log_file}: No such file or directory; "
                f"still logging to {log_file}"
            ) in out
            reports = [line for line in out.splitlines() if line.startswith("ibacm: cannot write")]
            assert 1 <= len(reports) <= 1 + (time.monotonic() - started) // 60, reports
            assert reports[0].startswith(
                f"ibacm: cannot write {log_file}: No space left on device; "
            )
        finally:
            ibacm_sim("down", "--dir", str(sim))
