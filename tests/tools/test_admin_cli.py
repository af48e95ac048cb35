"""``ibacm-admin`` against real daemons of a simulated cluster, as an operator runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import ibacm
from ibacm.wire.counters import Counter
from tests.conftest import sim_cluster

ADMIN = [sys.executable, "-m", "ibacm.tools.admin_cli"]
ACME = [sys.executable, "-m", "ibacm.tools.ib_acme"]


@pytest.fixture(scope="module")
def sim() -> Iterator[Path]:
    with sim_cluster("admin-cli", "--nodes", "3") as directory:
        yield directory


def admin(sim: Path, *args: str, node: str = "node1") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ADMIN, "--dir", str(sim), "--node", node, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def resolve(sim: Path, src: str, dst: str) -> None:
    sock = str(sim / src / "ibacm-unix.sock")
    done = subprocess.run(
        [*ACME, "-S", sock, "-f", "n", "-s", src, "-d", dst],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def snapshot(sim: Path, node: str = "node1") -> dict[str, object]:
    done = admin(sim, "--json", "status", node=node)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def learned(sim: Path, node: str, dest: str) -> bool:
    endpoints = snapshot(sim, node)["endpoints"]
    assert isinstance(endpoints, list)
    return any(entry["dest"] == dest for ep in endpoints for entry in ep["cache"])


def test_status_summarises_the_daemon(sim: Path) -> None:
    done = admin(sim, "status")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ibacm ") and " on node1," in lines[0]
    # The daemon runs the variant this test process runs (it inherits IBACM_COMPILED).
    assert f"modules: {ibacm.variant.describe()}" in lines
    assert any(line.startswith("counters: error 0, resolve ") for line in lines)
    assert any(line.startswith("endpoint mlx5_0/1/0xffff: ready") for line in lines)
    assert "node1" in done.stdout and "10.0.0.1/16" in done.stdout


def test_json_status_names_the_counters(sim: Path) -> None:
    resolve(sim, "node1", "node2")
    status = snapshot(sim)
    counters = status["counters"]
    assert isinstance(counters, dict)
    assert list(counters) == sorted(counter.key for counter in Counter)  # printed with sorted keys
    assert all(isinstance(value, int) for value in counters.values())
    assert counters["resolve"] >= 1
    endpoints = status["endpoints"]
    assert isinstance(endpoints, list) and endpoints
    for endpoint in endpoints:
        assert set(endpoint["counters"]) == {counter.key for counter in Counter}
    # The same figures as the text form, which reads the daemon's arrays.
    text = next(line for line in admin(sim, "status").stdout.splitlines() if "counters:" in line)
    assert f"resolve {counters['resolve']}," in text


def test_json_before_or_after_the_command(sim: Path) -> None:
    before = admin(sim, "--json", "status")
    after = admin(sim, "status", "--json")
    assert before.returncode == after.returncode == 0, before.stderr + after.stderr
    for done in (before, after):
        assert json.loads(done.stdout)["daemon"]["node"] == "node1"
    capture = admin(sim, "capture", "status", "--json")
    assert capture.returncode == 0 and json.loads(capture.stdout)["active"] is False


def test_flush_drops_what_was_learned(sim: Path) -> None:
    resolve(sim, "node2", "node3")
    assert learned(sim, "node2", "node3")
    done = admin(sim, "flush", "--dest", "node3", node="node2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("flushed 1 ")
    assert not learned(sim, "node2", "node3")
    resolve(sim, "node2", "node3")  # learned again on demand
    assert learned(sim, "node2", "node3")


def test_log_level_is_shown_and_set(sim: Path) -> None:
    assert admin(sim, "log-level", "2").stdout.strip() == "log_level 2"
    assert admin(sim, "log-level").stdout.strip() == "log_level 2"
    assert admin(sim, "log-level", "1").returncode == 0
    assert (
        admin(sim, "--json", "log-level").stdout.strip().replace(" ", "").replace("\n", "")
        == '{"level":1}'
    )


def test_reload_reports_what_needs_a_restart(sim: Path) -> None:
    assert admin(sim, "reload").stdout.strip() == "configuration reloaded"
    opts = sim / "node1" / "ibacm_opts.cfg"
    original = opts.read_text()
    try:
        opts.write_text(original + "\nserver_port 7777\n")
        done = admin(sim, "reload")
        assert done.returncode == 0, done.stderr
        assert "need a restart" in done.stdout and "server_port" in done.stdout
    finally:
        opts.write_text(original)
        admin(sim, "reload")


def test_a_refused_reload_says_so_once_and_lists_each_line(sim: Path) -> None:
    opts = sim / "node2" / "ibacm_opts.cfg"
    original = opts.read_text()
    try:
        opts.write_text(original + "timeout banana\nretries -5\n")
        done = admin(sim, "reload", node="node2")
        assert done.returncode == 1 and done.stdout == ""
        lines = done.stderr.splitlines()
        assert lines[0] == (
            "ibacm-admin: reload refused (2 invalid settings); configuration unchanged "
            "[invalid_config]"
        )
        assert [line.split(": ", 1)[1] for line in lines[1:]] == [
            "timeout value 'banana' is not a number (accepted: an integer); the C daemon "
            "would silently use 0 (atoi)",
            "retries value -5 is below 0 and would not work (accepted: 0..); the C daemon "
            "would use -5",
        ]
        assert done.stderr.count("refused") == 1
    finally:
        opts.write_text(original)
    assert admin(sim, "reload", node="node2").returncode == 0


def test_capture_records_a_resolution_then_stops(sim: Path, tmp_path: Path) -> None:
    capture = tmp_path / "mads.pcap"
    started = admin(sim, "capture", "start", str(capture), node="node3")
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith(f"capturing to {capture}")
    resolve(sim, "node3", "node1")
    status = json.loads(admin(sim, "--json", "capture", "status", node="node3").stdout)
    assert status["active"] and status["records"] >= 2  # a request and its answer at least
    stopped = admin(sim, "capture", "stop", node="node3")
    assert stopped.returncode == 0 and stopped.stdout.startswith("capture off")
    size = capture.stat().st_size
    resolve(sim, "node3", "node2")
    assert capture.stat().st_size == size  # nothing written once stopped


def test_a_refused_command_says_why_and_exits_1(sim: Path) -> None:
    done = admin(sim, "flush", "--endpoint", "mlx5_9/1/0xffff")
    assert done.returncode == 1
    assert "unknown endpoint 'mlx5_9/1/0xffff'" in done.stderr and done.stdout == ""


def test_no_daemon_is_a_clear_message_and_exit_3(tmp_path: Path) -> None:
    done = subprocess.run(
        [*ADMIN, "--admin", str(tmp_path / "gone.sock"), "status"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3
    assert f"no admin socket at {tmp_path / 'gone.sock'}" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_socket_that_is_not_the_daemon_is_exit_3(tmp_path: Path) -> None:
    """Something else listening there (another service) sends garbage or nothing."""
    import socket
    import threading

    path = str(tmp_path / "other.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def answer_nonsense() -> None:
        conn, _ = server.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.0 400 Bad Request\n")
        conn.close()

    thread = threading.Thread(target=answer_nonsense, daemon=True)
    thread.start()
    done = subprocess.run(
        [*ADMIN, "--admin", path, "--timeout", "5", "status"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    thread.join(5)
    server.close()
    assert done.returncode == 3
    assert "not an ibacm admin reply" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["log-level", "7"], "invalid choice"),
        (["--dir", "/nonexistent-sim", "--node", "node1", "status"], "no such directory"),
        (["--node", "node1", "status"], "--dir and --node go together"),
        (["capture"], "ACTION"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    done = subprocess.run([*ADMIN, *args], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and message in done.stderr
