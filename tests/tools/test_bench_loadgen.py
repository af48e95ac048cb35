"""The benchmarks' load generator (tests/bench/loadgen.c), built with the system compiler and
run briefly: every mode gets its answers from the C responder and counts them, and what a bad
server does (never answers, hangs up, is not there) is counted, never a crash of the run."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bench import load
from tests.bench.servers import resolve_request
from tests.conftest import REPO, require_peer


@pytest.fixture(scope="module")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    require_peer("gcc")
    return load.build(tmp_path_factory.mktemp("loadgen"))


@pytest.fixture
def request_file(tmp_path: Path) -> Path:
    path = tmp_path / "request.bin"
    path.write_bytes(resolve_request())
    return path


def accounted(figures: dict[str, Any]) -> None:
    """Every request sent is answered, lost on a reset or still owed at the end."""
    assert figures["sent"] == (
        figures["answered"] + figures["lost_on_reset"] + figures["unanswered"]
    ), figures


@pytest.mark.parametrize(
    ("mode", "depth", "clients"),
    [("closed", 1, 1), ("closed", 1, 40), ("oneshot", 1, 4), ("pipeline", 8, 1)],
)
def test_every_mode_counts_the_answers(
    binaries: tuple[Path, Path],
    request_file: Path,
    tmp_path: Path,
    mode: load.Mode,
    depth: int,
    clients: int,
) -> None:
    loadgen, responder = binaries
    with load.c_responder(responder, tmp_path) as (sock, pid):
        figures = load.run(
            loadgen, sock, request_file, clients, 0.3, mode=mode, depth=depth, server_pid=pid
        )
    accounted(figures)
    assert figures["answered"] > 0
    assert figures["requests"] > 0 and figures["p50_us"] > 0
    assert figures["errors"] == figures["resets"] == figures["unanswered"] == 0
    assert figures["never_answered"] == 0
    assert figures["server_cpu_us_per_request"] is not None
    if mode == "oneshot":
        assert figures["connections"] == figures["answered"]  # one request per connection
    else:
        assert figures["connections"] == clients


@contextlib.contextmanager
def listener(path: Path, behaviour: str) -> Iterator[None]:
    """A unix server that never accepts ("silent") or hangs up on every client ("hangup")."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(64)
    stop = threading.Event()

    def hang_up() -> None:
        server.settimeout(0.05)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = server.accept()
                conn.recv(4096)  # the request arrived; answer nothing
                conn.close()

    thread = threading.Thread(target=hang_up) if behaviour == "hangup" else None
    if thread is not None:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if thread is not None:
            thread.join()
        server.close()


def test_a_silent_server_leaves_every_client_unanswered(
    binaries: tuple[Path, Path], request_file: Path, tmp_path: Path
) -> None:
    sock = tmp_path / "silent.sock"
    with listener(sock, "silent"):
        figures = load.run(binaries[0], str(sock), request_file, 3, 0.2, grace=0.2)
    accounted(figures)
    assert figures["sent"] == 3 and figures["unanswered"] == 3
    assert figures["answered"] == 0 and figures["never_answered"] == 3


def test_hang_ups_are_counted_and_clients_reconnect(
    binaries: tuple[Path, Path], request_file: Path, tmp_path: Path
) -> None:
    sock = tmp_path / "hangup.sock"
    with listener(sock, "hangup"):
        figures = load.run(binaries[0], str(sock), request_file, 2, 0.3, grace=0.2)
    accounted(figures)
    assert figures["answered"] == 0 and figures["never_answered"] == 2
    assert figures["resets"] >= 2 and figures["lost_on_reset"] >= 2
    assert figures["connections"] > 2  # each client came back after its hang-up


def test_nobody_listening_is_refused_not_fatal(
    binaries: tuple[Path, Path], request_file: Path, tmp_path: Path
) -> None:
    figures = load.run(binaries[0], str(tmp_path / "none.sock"), request_file, 2, 0.1)
    accounted(figures)
    assert figures["sent"] == 0 and figures["refused"] > 0
    assert figures["never_answered"] == 2


def test_churn_makes_its_connections_and_counts_refusals(
    binaries: tuple[Path, Path], request_file: Path, tmp_path: Path
) -> None:
    loadgen, responder = binaries
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(range(0xD0, 0xF8)))
    with load.c_responder(responder, tmp_path) as (sock, _pid):
        done = load.churn(loadgen, sock, garbage, processes=2, connections=300)
    assert done["connections"] == 600 and done["sent"] == 600  # 2 x 300
    assert done["refused"] == 0
    done = load.churn(
        loadgen, str(tmp_path / "none.sock"), garbage, processes=1, connections=5, seconds=0.2
    )
    assert done["connections"] == 0 and done["refused"] > 0


@pytest.mark.parametrize("kind", ["thread", "task"])
def test_the_no_work_loops_answer_and_stop_on_sigterm(
    binaries: tuple[Path, Path], request_file: Path, tmp_path: Path, kind: str
) -> None:
    sock = tmp_path / f"{kind}.sock"
    command = [sys.executable, "-m", "tests.bench.trio_floor", str(sock), "--kind", kind]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        modes: list[tuple[load.Mode, int]] = [("closed", 8), ("oneshot", 2)]
        for mode, clients in modes:
            figures = load.run(
                binaries[0], str(sock), request_file, clients, 0.2, mode=mode, server_pid=proc.pid
            )
            accounted(figures)
            assert figures["answered"] > 0 and figures["never_answered"] == 0
    finally:
        proc.terminate()
        # The thread kind's loop leaves through its wake-up pipe: the process exits cleanly.
        try:
            status = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"the {kind} loop did not stop on SIGTERM")
        assert status == 0
    assert not sock.exists()
