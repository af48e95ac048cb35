"""Client connections over real unix and TCP sockets to a daemon on the simulated fabric."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import stat
from pathlib import Path

import pytest
import trio

from ibacm.config.option_values import ServerMode
from ibacm.core.listeners import ListenerError
from ibacm.provider.api import Counters
from ibacm.wire.client import (
    AcmHdr,
    AcmMessage,
    AcmOp,
    AcmStatus,
    EpAddr,
    EpFlag,
    decode_ep_reply,
    decode_perf_reply,
    encode_ep_request,
    encode_perf_request,
)
from tests.conftest import require
from tests.core.support import AcmClient, make_options, sim_daemon

PERF = encode_perf_request()
EP1 = encode_ep_request(1)


def resolve(*entries: EpAddr) -> bytes:
    return AcmMessage(AcmHdr(opcode=AcmOp.RESOLVE), list(entries)).encode()


SELF = resolve(EpAddr.from_ip("10.0.0.1", EpFlag.DEST))


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.trio
async def test_fragmented_request_one_byte_per_send(tmp_path: Path) -> None:
    async with sim_daemon(tmp_path) as run:
        client = await AcmClient.unix(run.unix_socket)
        for byte in SELF:
            await client.send(bytes([byte]))
            await trio.sleep(0.001)
        reply = AcmMessage.decode(await client.receive())
        assert (reply.hdr.status, reply.hdr.length) == (0, 160)
        await client.aclose()


@pytest.mark.trio
async def test_pipelined_requests_are_answered_in_order(tmp_path: Path) -> None:
    async with sim_daemon(tmp_path) as run:
        client = await AcmClient.unix(run.unix_socket)
        slow = resolve(EpAddr.from_name("slow-0.3", EpFlag.DEST), EpAddr.from_ip("10.0.0.1", 1))
        # One send: a slow RESOLVE, a PERF_QUERY, an EP_QUERY, a fast RESOLVE.
        await client.send(slow + PERF + EP1 + SELF)
        replies = [await client.receive() for _ in range(4)]
        assert [r[1] for r in replies] == [0x01, 0x82, 0x83, 0x01]
        assert AcmHdr.decode(replies[0]).status == AcmStatus.ENODATA
        assert AcmHdr.decode(replies[3]).status == AcmStatus.SUCCESS
        # The counters were read before the slow resolution finished: only the two
        # RESOLVEs count, and the PERF reply sits after the slow one all the same.
        assert decode_perf_reply(replies[1]).counters[1] == 1
        await client.aclose()


@pytest.mark.trio
async def test_answers_at_hand_never_overtake_a_waiting_one(tmp_path: Path) -> None:
    async with sim_daemon(tmp_path) as run:
        client = await AcmClient.unix(run.unix_socket)
        slow = resolve(EpAddr.from_name("slow-0.2", EpFlag.DEST), EpAddr.from_ip("10.0.0.1", 1))
        # Answered at once, then one that waits, then two more answered at once.
        await client.send(PERF + SELF + slow + EP1 + SELF)
        replies = [await client.receive() for _ in range(5)]
        assert [r[1] for r in replies] == [0x82, 0x01, 0x01, 0x83, 0x01]
        statuses = [AcmHdr.decode(replies[i]).status for i in (1, 2, 4)]
        assert statuses == [AcmStatus.SUCCESS, AcmStatus.ENODATA, AcmStatus.SUCCESS]
        await client.aclose()


@pytest.mark.trio
@pytest.mark.parametrize(
    ("bad", "reply_status"),
    [
        (bytes([2, 2, 0, 0, 0, 0, 0, 16]) + bytes(8), None),  # version 2
        (bytes([1, 5, 0, 0, 0, 0, 0, 16]) + bytes(8), None),  # opcode 5
        (bytes([1, 1, 0, 0, 0, 0, 0x60, 0x02]) + bytes(8), None),  # RESOLVE of 608 bytes
        (bytes([1, 3, 0, 0, 0, 2, 0x02, 0x58]) + bytes(592), None),  # EP_QUERY of 600 bytes
        (bytes([1, 1, 0, 0, 0, 0, 8, 0]), AcmStatus.EINVAL),  # RESOLVE shorter than 16
        # Opcode byte 0x81 on a request: framed big-endian (server rule), undecodable.
        (bytes([1, 0x81, 0, 0, 0, 0, 0, 88]) + bytes(80), None),
    ],
)
async def test_bad_request_closes_only_the_offender(
    tmp_path: Path, bad: bytes, reply_status: AcmStatus | None
) -> None:
    async with sim_daemon(tmp_path) as run:
        good = await AcmClient.unix(run.unix_socket)
        offender = await AcmClient.unix(run.unix_socket)
        # A good request first on the same connection is still answered.
        await offender.send(PERF + bad)
        assert (await offender.receive())[1] == 0x82
        if reply_status is not None:
            reply = AcmHdr.decode(await offender.receive())
            assert (reply.opcode, reply.status, reply.length) == (0x81, reply_status, 16)
        assert await offender.closed_by_peer()
        assert decode_ep_reply(await good.request(EP1))[0].status == 0
        await good.aclose()
        await offender.aclose()


@pytest.mark.trio
async def test_one_shot_clients_and_a_handling_bug_on_a_first_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ib_acme's way: connect, send at once, read, close. The request is usually there when
    the connection starts and is answered then; a bug in handling it costs only that client
    its connection (the poller's rule), never the server."""
    async with sim_daemon(tmp_path) as run:
        for _ in range(20):
            client = await AcmClient.unix(run.unix_socket)
            await client.send(SELF)
            assert AcmHdr.decode(await client.receive()).status == AcmStatus.SUCCESS
            await client.aclose()

        def broken(self: Counters) -> list[int]:
            raise RuntimeError("a bug in handling the request")

        # In a class the compiled variant leaves as written (a patched method of a compiled
        # class is not what its compiled callers call).
        monkeypatch.setattr(Counters, "snapshot", broken)
        for _ in range(5):
            offender = await AcmClient.unix(run.unix_socket)
            await offender.send(PERF)
            assert await offender.closed_by_peer()
            await offender.aclose()
        client = await AcmClient.unix(run.unix_socket)
        await client.send(SELF)
        assert AcmHdr.decode(await client.receive()).status == AcmStatus.SUCCESS
        await client.aclose()


@pytest.mark.trio
async def test_2000_pipelined_uncached_requests_on_one_reading_connection(tmp_path: Path) -> None:
    """A client that reads is never dropped, however far ahead it sends: the daemon stops
    reading it while 256 replies are owed, and every answer comes back in request order."""
    async with sim_daemon(tmp_path) as run:
        client = await AcmClient.unix(run.unix_socket)
        requests = []
        for number in range(2000):
            # Different delays: the resolutions finish out of order, never from a cache.
            dest = EpAddr.from_name(f"slow-{(number % 7) / 200:.3f}", EpFlag.DEST)
            message = AcmMessage(
                AcmHdr(opcode=AcmOp.RESOLVE, tid=number), [dest, EpAddr.from_ip("10.0.0.1", 1)]
            )
            requests.append(message.encode())
        replies: list[AcmHdr] = []

        async def read_all() -> None:
            while len(replies) < len(requests):
                replies.append(AcmHdr.decode(await client.receive()))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_all)
                await client.send(b"".join(requests))
        assert [reply.tid for reply in replies] == list(range(2000))
        assert all(reply.status == AcmStatus.ENODATA for reply in replies)
        assert run.daemon.clients.active == 1  # still connected
        await client.aclose()


@pytest.mark.trio
async def test_2000_connections_held_and_served(tmp_path: Path) -> None:
    # Both ends live in this process: 4000 descriptors (the daemon raises soft to hard).
    require(resource.getrlimit(resource.RLIMIT_NOFILE)[1] >= 4200, "hard open-file limit < 4200")
    async with sim_daemon(tmp_path) as run:
        clients = []
        for _ in range(2000):
            clients.append(await AcmClient.unix(run.unix_socket))
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for client in clients:
                    nursery.start_soon(client.send, EP1)
            replies = []
            for client in clients:
                replies.append(await client.receive())
        assert all(decode_ep_reply(r)[0].status == 0 for r in replies)
        assert run.daemon.clients.active == 2000
        for client in clients:
            await client.aclose()


@pytest.mark.trio
async def test_a_client_that_never_reads_delays_no_one(tmp_path: Path) -> None:
    async with sim_daemon(tmp_path) as run:
        stuck = await AcmClient.unix(run.unix_socket)
        good = await AcmClient.unix(run.unix_socket)
        flood = EP1 * 4000  # 4000 replies of 288 bytes: far more than any socket buffer

        async def push() -> None:
            # The daemon drops this client, as it should: the send then fails.
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stuck.send(flood)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(push)
            for _ in range(20):
                with trio.fail_after(2):
                    assert decode_ep_reply(await good.request(EP1))[0].status == 0
            with trio.fail_after(20):
                while run.daemon.clients.active != 1:
                    await trio.sleep(0.05)
        assert decode_perf_reply(await good.request(PERF)).hdr.status == 0
        await good.aclose()
        await stuck.aclose()


@pytest.mark.trio
async def test_disconnect_with_a_request_pending(tmp_path: Path) -> None:
    async with sim_daemon(tmp_path) as run:
        leaving = await AcmClient.unix(run.unix_socket)
        await leaving.send(resolve(EpAddr.from_name("slow-0.2", 2), EpAddr.from_ip("10.0.0.1", 1)))
        await leaving.aclose()
        await trio.sleep(0.4)
        client = await AcmClient.unix(run.unix_socket)
        assert decode_ep_reply(await client.request(EP1))[0].status == 0
        await client.aclose()
        with trio.fail_after(5):
            while run.daemon.clients.active:
                await trio.sleep(0.01)


# -- sockets and files -------------------------------------------------------------------------


@pytest.mark.trio
async def test_unix_mode_files(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "ibacm-tcp.port").write_text("6125\n")
    os.symlink("ibacm-tcp.port", run_dir / "ibacm.port")
    async with sim_daemon(tmp_path):
        sock = run_dir / "ibacm-unix.sock"
        assert stat.S_ISSOCK(sock.lstat().st_mode)
        assert stat.S_IMODE(sock.lstat().st_mode) == 0o666
        assert os.readlink(run_dir / "ibacm.sock") == "ibacm-unix.sock"
        assert not (run_dir / "ibacm-tcp.port").exists()
        assert not os.path.lexists(run_dir / "ibacm.port")
        client = await AcmClient.unix(str(run_dir / "ibacm.sock"))
        assert decode_perf_reply(await client.request(PERF)).hdr.status == 0
        await client.aclose()
    assert sorted(p.name for p in run_dir.iterdir()) == []


@pytest.mark.trio
async def test_acme_plus_kernel_only_hides_the_well_known_name(tmp_path: Path) -> None:
    options = make_options(tmp_path, acme_plus_kernel_only=True)
    async with sim_daemon(tmp_path, options=options) as run:
        assert (run.run_dir / "ibacm-unix.sock").exists()
        assert not os.path.lexists(run.run_dir / "ibacm.sock")


@pytest.mark.trio
async def test_symlink_failure_is_not_fatal(tmp_path: Path) -> None:
    blocker = tmp_path / "run" / "ibacm.sock"
    blocker.mkdir(parents=True)
    (blocker / "keep").write_text("a directory where the symlink should go\n")
    async with sim_daemon(tmp_path) as run:
        client = await AcmClient.unix(run.unix_socket)
        assert decode_perf_reply(await client.request(PERF)).hdr.status == 0
        await client.aclose()
    assert (blocker / "keep").exists()


@pytest.mark.trio
async def test_a_live_socket_is_not_stolen(tmp_path: Path) -> None:
    async with sim_daemon(tmp_path) as run:
        refused = pytest.RaisesExc(ListenerError, match="another daemon")
        with pytest.RaisesGroup(refused, flatten_subgroups=True):
            async with sim_daemon(tmp_path / "second", options=run.daemon.options):
                pass
        client = await AcmClient.unix(run.unix_socket)
        assert decode_perf_reply(await client.request(PERF)).hdr.status == 0
        await client.aclose()


@pytest.mark.trio
@pytest.mark.parametrize("mode", [ServerMode.LOOP, ServerMode.OPEN])
async def test_tcp_modes(tmp_path: Path, mode: ServerMode) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "ibacm-unix.sock").write_text("stale")
    options = make_options(tmp_path, server_mode=mode, server_port=0)
    async with sim_daemon(tmp_path, options=options) as run:
        text = (run_dir / "ibacm-tcp.port").read_text()
        port = int(text)
        assert text == f"{port}\n" and port > 0
        assert os.readlink(run_dir / "ibacm.port") == "ibacm-tcp.port"
        assert not os.path.lexists(run_dir / "ibacm-unix.sock")
        hosts = ["127.0.0.1"] + (["::1"] if has_ipv6_loopback() else [])
        for host in hosts:
            client = await AcmClient.tcp(host, port)
            assert AcmMessage.decode(await client.request(SELF)).hdr.status == 0
            await client.aclose()
        listeners = run.daemon.listeners
        assert listeners is not None
        if mode == ServerMode.LOOP:
            assert all(a.startswith(("127.0.0.1:", "[::1]:")) for a in listeners.addresses)
    assert list(run_dir.iterdir()) == []


@pytest.mark.trio
async def test_tcp_restart_reuses_the_port(tmp_path: Path) -> None:
    """SO_REUSEADDR: a restart right after clients were connected binds the same port."""
    options = make_options(tmp_path, server_mode=ServerMode.LOOP, server_port=0)
    async with sim_daemon(tmp_path, options=options) as run:
        port = int((run.run_dir / "ibacm-tcp.port").read_text())
        client = await AcmClient.tcp("127.0.0.1", port)
        assert decode_perf_reply(await client.request(PERF)).hdr.status == 0
        # The daemon shuts down first, so its side of the connection ends in TIME_WAIT.
    await client.aclose()
    options = make_options(tmp_path, server_mode=ServerMode.LOOP, server_port=port)
    async with sim_daemon(tmp_path, options=options):
        client = await AcmClient.tcp("127.0.0.1", port)
        assert decode_perf_reply(await client.request(PERF)).hdr.status == 0
        await client.aclose()


@pytest.mark.trio
async def test_shutdown_lets_in_flight_requests_finish(tmp_path: Path) -> None:
    async with sim_daemon(tmp_path) as run:
        client = await AcmClient.unix(run.unix_socket)
        await client.send(resolve(EpAddr.from_name("slow-0.3", 2), EpAddr.from_ip("10.0.0.1", 1)))
        await trio.sleep(0.05)
        run.daemon.request_shutdown()
        reply = AcmHdr.decode(await client.receive())
        assert reply.status == AcmStatus.ENODATA
        assert await client.closed_by_peer()
        await client.aclose()
    assert not (run.run_dir / "ibacm-unix.sock").exists()
