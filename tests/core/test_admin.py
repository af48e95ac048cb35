"""The admin socket server, spoken to over a real unix socket as a client would."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from ibacm.core.admin import AdminSocketError, serve_admin
from ibacm.core.events import EventBus
from ibacm.wire import admin as wire
from tests.tui.lab import LabDaemon


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class Client:
    """A line-oriented admin client over a trio unix stream."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.lines = wire.LineBuffer(wire.MAX_SERVER_LINE)
        self.pending: list[bytes] = []
        self.next_id = 0

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def read_line(self) -> bytes:
        while not self.pending:
            data = await self.stream.receive_some(65536)
            if not data:
                raise EOFError("server closed the connection")
            for item in self.lines.feed(data):
                assert isinstance(item, bytes)
                self.pending.append(item)
        return self.pending.pop(0)

    async def read(self) -> wire.ServerMessage:
        return wire.parse_server_message(await self.read_line())

    async def read_reply(self) -> wire.Reply:
        """Next reply, skipping events."""
        while True:
            message = await self.read()
            if isinstance(message, wire.Reply):
                return message

    async def call(self, cmd: str, **args: Any) -> wire.Reply:
        self.next_id += 1
        line = {"v": 1, "id": self.next_id, "cmd": cmd, **args}
        await self.send_raw(json.dumps(line).encode() + b"\n")
        reply = await self.read_reply()
        assert reply.id == self.next_id
        return reply


@asynccontextmanager
async def admin_server(
    path: Path, **kwargs: Any
) -> AsyncIterator[tuple[LabDaemon, EventBus, trio.Nursery]]:
    bus = EventBus(clock=lambda: 1000.0)
    daemon = LabDaemon(bus)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: serve_admin(
                str(path), daemon, bus, task_status=task_status, **kwargs
            )
        )
        yield daemon, bus, nursery
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def connect(path: Path) -> AsyncIterator[Client]:
    stream = await trio.open_unix_socket(str(path))
    async with stream:
        yield Client(stream)


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "ibacm-admin.sock"


@pytest.mark.trio
async def test_socket_is_owner_only_and_removed_at_shutdown(sock: Path) -> None:
    async with admin_server(sock):
        mode = os.lstat(sock).st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600
        assert sorted(p.name for p in sock.parent.iterdir()) == ["ibacm-admin.sock"]
    assert not sock.exists()


@pytest.mark.trio
async def test_hello_negotiates_the_version(sock: Path) -> None:
    async with admin_server(sock), connect(sock) as client:
        reply = await client.call("hello", versions=[1, 2], client="test")
        assert reply.ok
        assert reply.result["version"] == 1
        assert reply.result["server"] == "ibacm"
        assert "flush" in reply.result["commands"]
        assert reply.result["max_line"] == 65536

        refused = await client.call("hello", versions=[2, 3])
        assert not refused.ok
        assert refused.code == "unsupported_version"
        assert "client offers [2, 3], server speaks [1]" in (refused.error or "")


@pytest.mark.trio
async def test_request_of_an_unknown_version_is_refused(sock: Path) -> None:
    async with admin_server(sock), connect(sock) as client:
        await client.send_raw(b'{"v": 9, "id": "x", "cmd": "snapshot"}\n')
        reply = await client.read_reply()
        assert (reply.ok, reply.id, reply.code) == (False, "x", "unsupported_version")


@pytest.mark.trio
async def test_snapshot_returns_the_daemon_state(sock: Path) -> None:
    async with admin_server(sock), connect(sock) as client:
        reply = await client.call("snapshot")
    assert reply.ok
    assert reply.result["counters"] == [0, 12, 1, 0, 0, 3, 9]
    endpoints = {ep["id"]: ep for ep in reply.result["endpoints"]}
    assert [e["dest"] for e in endpoints["mlx5_0/1/0xffff"]["cache"]] == ["10.0.0.3", "node4"]


@pytest.mark.trio
async def test_bad_input_gets_specific_errors_and_the_session_goes_on(sock: Path) -> None:
    async with admin_server(sock), connect(sock) as client:
        cases = [
            (b"this is not json\n", "bad_json", "line is not JSON"),
            (b"\xff\xfe\n", "bad_json", "not UTF-8"),
            (b"[1, 2]\n", "bad_request", "must be a JSON object"),
            (b'{"id": 1}\n', "bad_request", "'cmd' must be a string"),
            (b'{"id": 1.5, "cmd": "snapshot"}\n', "bad_request", "'id' must be"),
            (b'{"id": 2, "cmd": "selfdestruct"}\n', "unknown_command", "known: hello, snapshot"),
            (b'{"id": 3, "cmd": "set_log_level", "level": 7}\n', "bad_argument", "[0, 1, 2]"),
            (b'{"id": 4, "cmd": "set_log_level", "level": true}\n', "bad_argument", "got True"),
            (b'{"id": 5, "cmd": "flush", "dest": 42}\n', "bad_argument", "'dest' must be"),
            (b'{"id": 6, "cmd": "subscribe", "max_queue": 0}\n', "bad_argument", "max_queue"),
            (b'{"id": 7, "cmd": "subscribe", "kinds": "log"}\n', "bad_argument", "'kinds'"),
            (b'{"id": 7, "cmd": "subscribe", "replay": 5000}\n', "bad_argument", "0 to 1000"),
            (b'{"id": 8, "cmd": "snapshot", "x": NaN}\n', "bad_json", "NaN is not allowed"),
        ]
        for line, code, text in cases:
            await client.send_raw(line)
            reply = await client.read_reply()
            assert (reply.ok, reply.code) == (False, code), line
            assert text in (reply.error or ""), (line, reply.error)
        assert (await client.call("snapshot")).ok


@pytest.mark.trio
async def test_oversize_line_is_refused_and_framing_recovers(sock: Path) -> None:
    async with admin_server(sock), connect(sock) as client:
        huge = b'{"cmd": "snapshot", "pad": "' + b"x" * (70 * 1024) + b'"}\n'
        # Sent in pieces, with the next request glued to its end.
        for start in range(0, len(huge), 8192):
            await client.send_raw(huge[start : start + 8192])
        await client.send_raw(b'{"v": 1, "id": 9, "cmd": "hello"}\n')
        too_long = await client.read_reply()
        assert (too_long.ok, too_long.code, too_long.id) == (False, "line_too_long", None)
        assert "exceeds the 65536-byte limit" in (too_long.error or "")
        hello = await client.read_reply()
        assert (hello.ok, hello.id) == (True, 9)


@pytest.mark.trio
async def test_requests_split_and_coalesced_are_each_answered(sock: Path) -> None:
    async with admin_server(sock), connect(sock) as client:
        await client.send_raw(b'{"v":1,"id":1,"cmd":"hel')
        await client.send_raw(b'lo"}\n\n{"v":1,"id":2,"cmd":"snapshot"}\n{"v":1,"id":3,')
        await client.send_raw(b'"cmd":"reload"}\n')
        ids = [(await client.read_reply()).id for _ in range(3)]
        assert ids == [1, 2, 3]


@pytest.mark.trio
async def test_flush_all_one_endpoint_one_destination(sock: Path) -> None:
    async with admin_server(sock) as (daemon, _bus, _), connect(sock) as client:
        one = await client.call("flush", dest="10.0.0.3")
        assert one.result == {"flushed": 1}
        assert "10.0.0.3" not in daemon.caches["mlx5_0/1/0xffff"]
        ep = await client.call("flush", endpoint="mlx5_0/2/0xffff")
        assert ep.result == {"flushed": 1}
        unknown = await client.call("flush", endpoint="mlx5_9/1/0xffff")
        assert (unknown.ok, unknown.code) == (False, "bad_argument")
        assert unknown.error == "flush: unknown endpoint 'mlx5_9/1/0xffff'"
        rest = await client.call("flush")
        assert rest.result == {"flushed": 1}
        snapshot = await client.call("snapshot")
        assert all(ep["cache"] == [] for ep in snapshot.result["endpoints"])


@pytest.mark.trio
async def test_reload_and_set_log_level_act_on_the_daemon(sock: Path) -> None:
    async with admin_server(sock) as (daemon, _bus, _), connect(sock) as client:
        reply = await client.call("reload")
        assert reply.result == {"reloaded": True, "restart_needed": []}
        assert daemon.reloads == 1
        assert (await client.call("set_log_level", level=2)).result == {"level": 2}
        assert daemon.log_level == 2
        daemon.fail_reload = True
        failed = await client.call("reload")
        assert (failed.ok, failed.code) == (False, "failed")
        assert failed.error == "reload failed: ibacm_opts.cfg: permission denied"
        assert (await client.call("snapshot")).ok


@pytest.mark.trio
async def test_subscription_streams_events_after_its_reply(sock: Path) -> None:
    async with admin_server(sock) as (_daemon, bus, _), connect(sock) as client:
        bus.publish("log", {"event": "too early"})  # before subscribing: not seen
        first = await client.call("subscribe", kinds=["log", "cache"])
        assert first.result == {
            "subscribed": True,
            "kinds": ["log", "cache"],
            "max_queue": 1000,
            "replayed": 0,
        }
        bus.publish("log", {"event": "hello", "level": "info"})
        event = await client.read()
        assert isinstance(event, wire.EventMessage)
        assert (event.event, dict(event.data), event.ts) == (
            "log",
            {"event": "hello", "level": "info"},
            1000.0,
        )
        bus.publish("group", {"mgid": "ff15::"})  # not asked for
        await client.call("flush", dest="node4")  # the daemon publishes a cache removal
        removal = await client.read()
        assert isinstance(removal, wire.EventMessage)
        assert removal.event == "cache" and removal.data["removed"] is True
        off = await client.call("unsubscribe")
        assert off.result == {"subscribed": False, "was_subscribed": True}
        bus.publish("log", {"event": "after"})
        assert (await client.call("snapshot")).ok  # no event line in between
        assert bus.subscriber_count == 0


@pytest.mark.trio
async def test_subscribe_can_replay_recent_log_records(sock: Path) -> None:
    async with admin_server(sock) as (_daemon, bus, _), connect(sock) as client:
        for n in range(5):
            bus.publish("log", {"event": f"before {n}"})
        bus.publish("cache", {"dest": "x"})  # not a history kind: never replayed
        reply = await client.call("subscribe", replay=3)
        assert reply.result["replayed"] == 3
        bus.publish("log", {"event": "live"})
        events = [await client.read() for _ in range(4)]
    texts = [m.data["event"] for m in events if isinstance(m, wire.EventMessage)]
    assert texts == ["before 2", "before 3", "before 4", "live"]


@pytest.mark.trio
async def test_stats_events_carry_counters(sock: Path, autojump_clock: object) -> None:
    async with (
        admin_server(sock, stats_interval=1.0) as (daemon, _bus, _),
        connect(sock) as client,
    ):
        await client.call("subscribe", kinds=["stats"])
        daemon.counters[1] = 40
        event = await client.read()
    assert isinstance(event, wire.EventMessage) and event.event == "stats"
    assert event.data["counters"][1] == 40
    assert event.data["endpoints"]["mlx5_0/1/0xffff"][1] == 40


@pytest.mark.trio
async def test_slow_subscriber_gets_dropped_marker(sock: Path) -> None:
    async with admin_server(sock) as (_daemon, bus, _), connect(sock) as client:
        await client.call("subscribe", kinds=["log"], max_queue=5)
        # The forwarder has not run yet: the queue of 5 takes the first events only.
        for n in range(50):
            bus.publish("log", {"n": n})
        bus_time = [(await client.read()) for _ in range(6)]
        kinds = [m.event for m in bus_time if isinstance(m, wire.EventMessage)]
        assert kinds == ["log"] * 5 + ["dropped"]
        marker = bus_time[-1]
        assert isinstance(marker, wire.EventMessage) and marker.data == {"count": 45}


@pytest.mark.trio
async def test_stuck_client_is_cut_off_and_others_are_served(
    sock: Path, autojump_clock: object
) -> None:
    async with (
        admin_server(sock, send_timeout=5.0) as (_daemon, bus, _),
        connect(sock) as stuck,
        connect(sock) as other,
    ):
        await stuck.call("subscribe", max_queue=100)
        big = {"event": "x" * 16384}
        # Publishing stays instant although nobody reads the stuck client's socket.
        with trio.fail_after(0.01):
            for _ in range(2000):
                bus.publish("log", big)
                await trio.sleep(0)
        assert (await other.call("snapshot")).ok
        await trio.sleep(10)  # past the send timeout: the stuck session is closed
        assert bus.subscriber_count == 0
        assert (await other.call("hello")).ok


@pytest.mark.trio
async def test_client_limit_answers_busy(sock: Path) -> None:
    async with admin_server(sock, max_clients=1), connect(sock) as first:
        assert (await first.call("hello")).ok
        async with connect(sock) as second:
            busy = await second.read_reply()
            assert (busy.ok, busy.code) == (False, "busy")
            with pytest.raises(EOFError):
                await second.read_line()
        assert (await first.call("snapshot")).ok


@pytest.mark.trio
async def test_stale_socket_is_replaced(sock: Path) -> None:
    async with admin_server(sock):
        pass
    stale = trio.socket.socket(trio.socket.AF_UNIX)
    await stale.bind(str(sock))
    stale.close()  # a socket file with nobody behind it, as after a crash
    async with admin_server(sock), connect(sock) as client:
        assert (await client.call("hello")).ok


@pytest.mark.trio
async def test_refuses_to_replace_a_live_server_or_a_regular_file(sock: Path) -> None:
    async with admin_server(sock):
        with pytest.raises(AdminSocketError, match="another process is serving"):
            await serve_admin(str(sock), LabDaemon(EventBus()), EventBus())
    sock.write_text("precious")
    with pytest.raises(AdminSocketError, match="is not a socket"):
        await serve_admin(str(sock), LabDaemon(EventBus()), EventBus())
    assert sock.read_text() == "precious"


@pytest.mark.trio
async def test_bad_paths_are_reported(tmp_path: Path) -> None:
    with pytest.raises(AdminSocketError, match="does not exist"):
        await serve_admin(str(tmp_path / "missing" / "a.sock"), LabDaemon(EventBus()), EventBus())
    long = tmp_path / ("d" * 120) / "a.sock"
    with pytest.raises(AdminSocketError, match="longer than 107 bytes"):
        await serve_admin(str(long), LabDaemon(EventBus()), EventBus())
