"""The daemon as the admin socket's ``DaemonControl``: snapshot, flush, reload, log level,
and the events it publishes, all through the real admin socket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import ibacm
from ibacm.config.option_values import ServerMode
from ibacm.wire import admin as wire
from ibacm.wire.client import AddrType
from ibacm.wire.counters import Counter
from tests.core.support import Running, make_options, sim_daemon


class AdminClient:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.lines = wire.LineBuffer(wire.MAX_SERVER_LINE)
        self.pending: list[bytes] = []
        self.next_id = 0

    @classmethod
    async def connect(cls, run: Running) -> AdminClient:
        assert run.daemon.admin_path is not None
        return cls(await trio.open_unix_socket(run.daemon.admin_path))

    async def message(self) -> wire.ServerMessage:
        while not self.pending:
            data = await self.stream.receive_some(65536)
            assert data, "admin socket closed"
            self.pending.extend(line for line in self.lines.feed(data) if isinstance(line, bytes))
        return wire.parse_server_message(self.pending.pop(0))

    async def call(self, cmd: wire.Command, **args: Any) -> wire.Reply:
        self.next_id += 1
        await self.stream.send_all(wire.encode_request(wire.Request(cmd, self.next_id, args)))
        while True:
            message = await self.message()
            if isinstance(message, wire.Reply) and message.id == self.next_id:
                return message

    async def event(self, kind: str) -> wire.EventMessage:
        with trio.fail_after(5):
            while True:
                message = await self.message()
                if isinstance(message, wire.EventMessage) and message.event == kind:
                    return message


@pytest.mark.trio
async def test_snapshot(tmp_path: Path) -> None:
    async with sim_daemon(tmp_path, addr_lines=["node1 mlx5_0 1 default"], admin=True) as run:
        admin = await AdminClient.connect(run)
        reply = await admin.call(wire.Command.SNAPSHOT)
        assert reply.ok
        snap = reply.result
        assert snap["daemon"]["node"] == "node1"
        assert snap["daemon"]["providers"] == ["testprov"]
        assert snap["daemon"]["modules"] == ibacm.variant.describe()  # compiled or as written
        assert snap["options"]["server_mode"] == "unix"
        assert snap["counters"] == [0] * len(Counter)
        [port] = snap["ports"]
        assert (port["id"], port["state"], port["lid"]) == ("mlx5_0/1", "ACTIVE", 2)
        assert port["sa"]["depth"] == 1
        [endpoint] = snap["endpoints"]
        assert endpoint["id"] == "mlx5_0/1/0xffff"
        assert endpoint["state"] == "ready"  # the provider's description wins
        assert endpoint["addresses"] == [
            {"type": "ip", "address": "10.0.0.1/16"},
            {"type": "ip6", "address": "fd00::1/64"},
            {"type": "name", "address": "node1"},
        ]
        assert endpoint["counters"] == [0] * len(Counter)
        await admin.stream.aclose()


@pytest.mark.trio
async def test_flush_and_log_level(tmp_path: Path) -> None:
    async with sim_daemon(tmp_path, admin=True) as run:
        admin = await AdminClient.connect(run)
        reply = await admin.call(wire.Command.FLUSH, endpoint="mlx5_0/1/0xFFFF", dest="10.0.0.2")
        assert (reply.ok, reply.result) == (True, {"flushed": 1})
        assert run.provider.events[-1] == ("flush", (AddrType.IP, bytes([10, 0, 0, 2]) + bytes(60)))
        reply = await admin.call(wire.Command.FLUSH, endpoint="mlx5_9/1/0xffff")
        assert not reply.ok and reply.code == "bad_argument"
        assert "unknown endpoint" in (reply.error or "")
        reply = await admin.call(wire.Command.SET_LOG_LEVEL, level=2)
        assert reply.ok and run.daemon.options.log_level == 2
        await admin.stream.aclose()


@pytest.mark.trio
async def test_reload_keeps_restart_only_options(tmp_path: Path) -> None:
    opts = tmp_path / "ibacm_opts.cfg"
    options = make_options(tmp_path)
    opts.write_text(f"run_dir {options.run_dir}\nprovider testprov default\nsa_depth 1\n")
    async with sim_daemon(tmp_path, options=options, opts_file=str(opts), admin=True) as run:
        opts.write_text(
            f"run_dir {options.run_dir}\nprovider testprov default\n"
            "sa_depth 4\nserver_mode open\nlog_level 1\n"
        )
        admin = await AdminClient.connect(run)
        reply = await admin.call(wire.Command.RELOAD)
        assert reply.ok
        daemon = run.daemon
        assert daemon.options.server_mode == ServerMode.UNIX  # needs a restart
        assert daemon.options.log_level == 1
        port = daemon.topology.devices[0].ports[0]
        assert port.sa is not None and port.sa.depth == 4
        assert daemon.services.options is daemon.options
        await admin.stream.aclose()


@pytest.mark.trio
async def test_changes_are_published(tmp_path: Path) -> None:
    async with sim_daemon(tmp_path, admin=True) as run:
        admin = await AdminClient.connect(run)
        reply = await admin.call(wire.Command.SUBSCRIBE, kinds=["endpoint", "port"])
        assert reply.ok
        run.world.add_address("node1", "ib0", "10.0.3.3/16")
        event = await admin.event("endpoint")
        assert event.data["id"] == "mlx5_0/1/0xffff"
        assert {"type": "ip", "address": "10.0.3.3"} in event.data["addresses"]
        run.world.set_port_state("node1", "mlx5_0", 1, False)
        event = await admin.event("port")
        assert (event.data["id"], event.data["state"]) == ("mlx5_0/1", "DOWN")
        await admin.stream.aclose()


@pytest.mark.trio
async def test_capture_started_and_stopped_through_the_admin_socket(tmp_path: Path) -> None:
    from ibacm.provider.acmp.provider import AcmpProvider
    from ibacm.provider.registry import ProviderEntry
    from ibacm.wire.erf import parse_pcap

    capture = tmp_path / "live.pcap"
    ibacmp = ProviderEntry("ibacmp", AcmpProvider, "ibacm.provider.acmp.provider:AcmpProvider")
    async with sim_daemon(
        tmp_path,
        addr_lines=["node1 mlx5_0 1 default"],
        admin=True,
        options=make_options(tmp_path, providers=[]),
        providers=[ibacmp],
    ) as run:
        admin = await AdminClient.connect(run)
        idle = await admin.call(wire.Command.CAPTURE, action="status")
        assert idle.ok and not idle.result["active"]
        relative = await admin.call(wire.Command.CAPTURE, action="start", path="rel.pcap")
        assert not relative.ok and relative.code == wire.ErrorCode.BAD_ARGUMENT
        bad_action = await admin.call(wire.Command.CAPTURE, action="pause")
        assert not bad_action.ok and bad_action.code == wire.ErrorCode.BAD_ARGUMENT

        started = await admin.call(wire.Command.CAPTURE, action="start", path=str(capture))
        assert started.ok and started.result["active"]
        # Traffic while capturing: a client re-registration makes the provider re-join.
        run.world.client_reregister("node1")
        with trio.fail_after(10):
            while not parse_pcap(capture.read_bytes()).packets:
                await trio.sleep(0.05)
        stopped = await admin.call(wire.Command.CAPTURE, action="stop")
        assert stopped.ok and not stopped.result["active"]
        await admin.stream.aclose()
    assert parse_pcap(capture.read_bytes()).packets


@pytest.mark.trio
async def test_a_broken_option_file_never_replaces_a_working_one(tmp_path: Path) -> None:
    """The reported case: 'timeout banana' and 'retries -5' appended, then a reload. The
    reload is refused as a whole, with every problem (file:line, key, accepted range, what C
    would have done), and the running configuration stays."""
    opts = tmp_path / "ibacm_opts.cfg"
    options = make_options(tmp_path)
    good = f"run_dir {options.run_dir}\nprovider testprov default\ntimeout 700\nlog_level 1\n"
    opts.write_text(good)
    async with sim_daemon(tmp_path, options=options, opts_file=str(opts), admin=True) as run:
        daemon = run.daemon
        admin = await AdminClient.connect(run)
        assert (await admin.call(wire.Command.RELOAD)).ok
        assert daemon.options.timeout == 700
        opts.write_text(good + "log_level 2\nmystery_key 1\ntimeout banana\nretries -5\n")
        reply = await admin.call(wire.Command.RELOAD)
        assert not reply.ok and reply.code == wire.ErrorCode.INVALID_CONFIG
        problems = reply.result["problems"]
        assert problems == [
            # One problem per line: not also the 0 that 'banana' was read as.
            f"{opts}:7: timeout value 'banana' is not a number (accepted: an integer); "
            "the C daemon would silently use 0 (atoi)",
            f"{opts}:8: retries value -5 is below 0 and would not work (accepted: 0..); "
            "the C daemon would use -5",
        ]
        summary = "reload refused (2 invalid settings); configuration unchanged"
        assert reply.result["summary"] == summary
        assert reply.error == f"{summary}: {'; '.join(problems)}"
        # Nothing of the file was taken, not even its valid lines.
        assert (daemon.options.timeout, daemon.options.retries) == (700, options.retries)
        assert daemon.options.log_level == 1
        # An unknown key alone is a warning (it may belong to another provider).
        opts.write_text(good + "mystery_key 1\n")
        assert (await admin.call(wire.Command.RELOAD)).ok
        await admin.stream.aclose()


@pytest.mark.trio
async def test_an_address_file_that_breaks_or_empties_every_endpoint_is_refused(
    tmp_path: Path,
) -> None:
    async with sim_daemon(tmp_path, addr_lines=["node1 mlx5_0 1 default"], admin=True) as run:
        admin = await AdminClient.connect(run)
        addr = tmp_path / "ibacm_addr.cfg"
        endpoint = run.daemon.topology.devices[0].ports[0].endpoints[0]
        before = [slot.core.display for slot in endpoint.addresses()]
        addr.write_text("node1 mlx5_0\n")  # does not parse
        reply = await admin.call(wire.Command.RELOAD)
        assert reply.code == wire.ErrorCode.INVALID_CONFIG
        assert "expected 4 fields" in reply.result["problems"][0]
        # Without its IPoIB addresses the node's one endpoint lives on the file's name only.
        for address in (*run.world.node("node1").ipv4, *run.world.node("node1").ipv6):
            run.world.remove_address("node1", address)
        with trio.fail_after(5):
            while any(slot.core.type != AddrType.NAME for slot in endpoint.addresses()):
                await trio.sleep(0.01)
        before = [slot.core.display for slot in endpoint.addresses()]
        addr.write_text("othernode mlx5_9 1 default\n")  # parses, matches no port here
        reply = await admin.call(wire.Command.RELOAD)
        assert reply.code == wire.ErrorCode.INVALID_CONFIG
        assert "every endpoint would go" in reply.result["problems"][0]
        assert [slot.core.display for slot in endpoint.addresses()] == before
        await admin.stream.aclose()
