"""A local user cannot lock others out: client connections are bounded in total and per
peer uid, half-sent requests and idle connections time out, and what was refused is counted.
Real unix sockets, a real other uid (a forked child that setuid()s), the real ib_acme."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog
import trio

from ibacm.core.client_loop import ClientLimits
from ibacm.core.clients import FD_RESERVE, ClientServer, descriptor_budget
from ibacm.core.dispatch import Dispatcher
from ibacm.core.metrics import DaemonMetrics
from ibacm.provider.api import Counters
from ibacm.wire import admin as wire
from ibacm.wire.client import encode_perf_request
from tests.conftest import require_peer
from tests.core.support import AcmClient, cluster, make_options, sim_daemon
from tests.core.test_daemon_control import AdminClient

NOBODY = 65534


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another uid can reach (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="ibacm-limits-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _hold(uid: int, path: str, count: int, report: int, release: int) -> None:
    """The child: become ``uid``, open ``count`` connections and hold them; on the first
    byte from the parent report how many the daemon closed at once, exit on the second."""
    os.setgid(uid)
    os.setuid(uid)
    held = []
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        held.append(sock)
    os.write(report, b"c")
    os.read(release, 1)
    closed = 0
    for sock in held:
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):  # still open: nothing to read
            closed += sock.recv(1) == b""
    os.write(report, closed.to_bytes(4, "big"))
    os.read(release, 1)


@contextlib.asynccontextmanager
async def connections_as(
    uid: int, path: str, count: int
) -> AsyncIterator[tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream]]:
    """A forked child holding ``count`` connections to ``path`` as ``uid``."""
    report_r, report_w = os.pipe()
    release_r, release_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no trio here, plain system calls, then _exit
        status = 1
        try:
            os.close(report_r)
            os.close(release_w)
            _hold(uid, path, count, report_w, release_r)
            status = 0
        finally:
            os._exit(status)
    os.close(report_w)
    os.close(release_r)
    report, release = trio.lowlevel.FdStream(report_r), trio.lowlevel.FdStream(release_w)
    try:
        with trio.fail_after(20):
            assert await report.receive_some(1) == b"c", "the child could not connect"
        yield report, release
    finally:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await release.send_all(b"xx")
        await release.aclose()
        await report.aclose()
        _, status = await trio.to_thread.run_sync(os.waitpid, pid, 0)
        assert status == 0


async def run_ib_acme(*args: str) -> tuple[int, str]:
    with trio.fail_after(30):
        result = await trio.run_process(
            [require_peer("ib_acme"), *args], capture_stdout=True, check=False
        )
    return result.returncode, result.stdout.decode()


@pytest.mark.trio
async def test_another_user_over_its_limit_locks_nobody_out(shared_dir: Path) -> None:
    options = make_options(shared_dir, max_clients=100, max_clients_per_user=20)
    async with sim_daemon(shared_dir, options=options, admin=True) as run:
        clients = run.daemon.clients
        async with connections_as(NOBODY, run.unix_socket, 50) as (report, release):
            with trio.fail_after(10):
                while clients.stats.refused_user + clients.active < 50:
                    await trio.sleep(0.01)
            # A normal client, the real ib_acme, is served as usual...
            status, out = await run_ib_acme("-S", run.unix_socket, "-P")
            assert status == 0 and f"{run.unix_socket},0," in out, out
            with trio.fail_after(10):  # the loop sees ib_acme's close in a round of its own
                while clients.active > 20:
                    await trio.sleep(0.01)
            # ... so is the admin socket, which shows what was refused.
            admin = await AdminClient.connect(run)
            reply = await admin.call(wire.Command.SNAPSHOT)
            await admin.stream.aclose()
            limits = reply.result["daemon"]["client_limits"]
            assert (limits["refused_user"], limits["refused_total"]) == (30, 0)
            assert limits["connected"] == 20 and limits["max_per_user"] == 20
            # The 30 refused connections were closed at once, the 20 others are held.
            await release.send_all(b"x")
            with trio.fail_after(10):
                closed = await report.receive_some(4)
            assert int.from_bytes(closed, "big") == 30
        with trio.fail_after(10):
            while clients.active:
                await trio.sleep(0.01)


@pytest.mark.trio
async def test_connections_let_in_before_the_bound_could_bite_count_toward_it(
    shared_dir: Path,
) -> None:
    """The loop asks a peer's uid only once as many connections are open as one user may
    hold: the ones let in before are asked then, and count toward their user's bound."""
    options = make_options(shared_dir, max_clients=100, max_clients_per_user=5)
    async with sim_daemon(shared_dir, options=options) as run:
        clients = run.daemon.clients
        async with connections_as(NOBODY, run.unix_socket, 3) as (first_report, first_release):
            with trio.fail_after(10):
                while clients.active < 3:
                    await trio.sleep(0.01)
            root = [await AcmClient.unix(run.unix_socket) for _ in range(10)]
            with trio.fail_after(10):
                while clients.active < 13:
                    await trio.sleep(0.01)
            async with connections_as(NOBODY, run.unix_socket, 4) as (report, release):
                with trio.fail_after(10):
                    while clients.stats.refused_user + clients.active < 17:
                        await trio.sleep(0.01)
                # nobody's first 3 were let in unasked; with them, 2 of the 4 fit.
                assert (clients.stats.refused_user, clients.active) == (2, 15)
                await release.send_all(b"x")
                with trio.fail_after(10):
                    closed = await report.receive_some(4)
                assert int.from_bytes(closed, "big") == 2
            await first_release.send_all(b"x")
            with trio.fail_after(10):
                closed = await first_report.receive_some(4)
            assert int.from_bytes(closed, "big") == 0  # let in, and held
            for client in root:
                await client.aclose()
        with trio.fail_after(10):
            while clients.active:
                await trio.sleep(0.01)


@pytest.mark.trio
async def test_the_total_limit_refuses_and_counts(tmp_path: Path) -> None:
    # Root is bounded by max_clients only (no per-user limit applies to it).
    options = make_options(tmp_path, max_clients=10, max_clients_per_user=2)
    async with sim_daemon(tmp_path, options=options) as run:
        held = [await AcmClient.unix(run.unix_socket) for _ in range(15)]
        with trio.fail_after(10):
            while run.daemon.clients.stats.refused_total < 5:
                await trio.sleep(0.01)
        # Refused ones were closed at once: their EOF is there already.
        closed = [client for client in held if await client.closed_by_peer(timeout=0.05)]
        assert len(closed) == 5
        assert run.daemon.clients.stats.refused_total == 5
        assert run.daemon.clients.stats.refused_user == 0
        # ... and the metrics endpoint exports the counts.
        text = DaemonMetrics(run.daemon.snapshot).render()[0].decode()
        assert 'ibacm_clients_refused_total{reason="max_clients"} 5.0' in text, text
        assert 'ibacm_clients_refused_total{reason="max_clients_per_user"} 0.0' in text
        for client in held:
            await client.aclose()
        with trio.fail_after(10):
            while run.daemon.clients.active:
                await trio.sleep(0.01)
        status, _ = await run_ib_acme("-S", run.unix_socket, "-P")
        assert status == 0


@pytest.mark.trio
async def test_half_sent_requests_and_idle_connections_time_out(tmp_path: Path) -> None:
    options = make_options(tmp_path, client_request_timeout=1, client_idle_timeout=3)
    async with sim_daemon(tmp_path, options=options) as run:
        stats = run.daemon.clients.stats
        trickle = await AcmClient.unix(run.unix_socket)
        silent = await AcmClient.unix(run.unix_socket)
        # A request sent one byte every 0.25 s is still half-sent after a second: the
        # connection is closed while it trickles (12 bytes would take 3 s).
        sent = 0
        with contextlib.suppress(trio.BrokenResourceError):
            for byte in encode_perf_request()[:12]:
                await trickle.send(bytes([byte]))
                sent += 1
                await trio.sleep(0.25)
        assert sent < 12 or await trickle.closed_by_peer(timeout=5)
        assert stats.request_timeouts == 1 and stats.idle_timeouts == 0
        # A connection that never asks anything is idle; closed after client_idle_timeout.
        assert await silent.closed_by_peer(timeout=10)
        assert (stats.request_timeouts, stats.idle_timeouts) == (1, 1)
        for client in (trickle, silent):
            await client.aclose()


def test_clients_stay_below_the_open_file_limit_with_a_reserve() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_RESERVE + 100, hard))
    try:
        assert descriptor_budget() == 100
        server = ClientServer(Dispatcher([], Counters()))
        server.limits = ClientLimits(max_clients=16384)
        assert server.status()["capacity"] == 100
        server.limits = ClientLimits(max_clients=40)
        assert server.status()["capacity"] == 40
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _churn(uid: int, path: str, rounds: int, per_round: int, report: int) -> None:
    """The child: become ``uid``; ``rounds`` x ``per_round`` one-shot connections, each
    sending a malformed request (version 2) and closing at once; report how many it made."""
    os.setgid(uid)
    os.setuid(uid)
    made = 0
    for _ in range(rounds):
        for _ in range(per_round):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                try:
                    sock.connect(path)
                    sock.send(bytes([2, 1, 0, 0, 0, 0, 0, 16]) + bytes(8))
                except OSError:
                    continue  # refused or reset: the daemon is allowed to be busy
                made += 1
    os.write(report, made.to_bytes(4, "big"))


@pytest.mark.peer
@pytest.mark.trio
async def test_a_churn_of_malformed_connections_by_another_user_delays_root_little(
    shared_dir: Path,
) -> None:
    """3 x 6000 malformed one-shot connections by ``nobody``: meanwhile root's real ib_acme
    gets every answer within the bound, and the daemon writes a few rate-limited lines about
    them, not one each (their count is in ``client_limits``)."""
    require_peer("ib_acme")
    async with cluster(shared_dir) as run:
        svc = run.socket()
        resolve = ("-S", svc, "-f", "n", "-s", "node1", "-d", "node2")
        assert (await run_ib_acme(*resolve))[0] == 0  # cached from now on
        report_r, report_w = os.pipe()
        with structlog.testing.capture_logs() as logs:
            pid = os.fork()
            if pid == 0:
                status = 1
                try:
                    os.close(report_r)
                    _churn(NOBODY, svc, 3, 6000, report_w)
                    status = 0
                finally:
                    os._exit(status)
            os.close(report_w)
            slowest = 0.0
            answers = 0
            report = trio.lowlevel.FdStream(report_r)
            async with report:
                done = trio.Event()

                made = 0

                async def wait_child() -> None:
                    nonlocal made
                    made = int.from_bytes(await report.receive_some(4), "big")
                    done.set()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(wait_child)
                    with trio.fail_after(300):
                        while not done.is_set():
                            started = trio.current_time()
                            status, out = await run_ib_acme(*resolve)
                            slowest = max(slowest, trio.current_time() - started)
                            assert status == 0, out
                            answers += 1
            _, status = await trio.to_thread.run_sync(os.waitpid, pid, 0)
            assert status == 0
            assert made > 15000, made
            stats = run.daemons["node1"].clients.stats
            with trio.fail_after(60):  # the last ones may still wait in the backlog
                while stats.malformed < made:
                    await trio.sleep(0.05)
        # Generous against a loaded machine; the figure is the churn benchmark's.
        assert answers >= 1 and slowest < 3.0, (answers, slowest)
        lines = [entry for entry in logs if entry["event"] == "client request rejected; closing"]
        assert 1 <= len(lines) <= 40, len(lines)  # one per 10 s at most, each with a count
        assert sum(int(entry["count"]) for entry in lines) <= stats.malformed
        text = DaemonMetrics(run.daemons["node1"].snapshot).render()[0].decode()
        closed = f'ibacm_clients_closed_total{{reason="malformed_request"}} {stats.malformed}.0'
        assert closed in text, text
