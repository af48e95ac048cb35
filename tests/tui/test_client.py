"""The dashboard's asyncio admin client against the real admin server (lab daemon)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest

from ibacm.wire.admin import EventMessage
from tests.tui.lab import EP1, LabServer
from tui.client import AdminClient, AdminCommandError, AdminConnectionError


@pytest.mark.asyncio
async def test_hello_calls_and_events(lab: LabServer) -> None:
    events: list[EventMessage] = []
    client = await AdminClient.connect(str(lab.path), events.append)
    try:
        assert client.server["version"] == 1 and client.server["server"] == "ibacm"
        await client.call("subscribe", kinds=["cache"])
        assert await client.call("flush", endpoint=EP1, dest="node4") == {"flushed": 1}
        for _ in range(100):
            if events:
                break
            await asyncio.sleep(0.01)
        assert [(e.event, e.data["dest"]) for e in events] == [("cache", "node4")]
        with pytest.raises(AdminCommandError) as caught:
            await client.call("flush", endpoint="mlx5_7/1/0xffff")
        assert caught.value.code == "bad_argument"
        assert str(caught.value) == "flush: unknown endpoint 'mlx5_7/1/0xffff'"
    finally:
        await client.aclose()
    assert client.closed


@pytest.mark.asyncio
async def test_server_going_away_ends_the_connection(lab: LabServer) -> None:
    client = await AdminClient.connect(str(lab.path))
    try:
        await asyncio.to_thread(lab.stop)
        reason = await asyncio.wait_for(client.wait_closed(), 10)
        assert reason == "the daemon closed the connection"
        with pytest.raises(AdminConnectionError, match="connection closed"):
            await client.call("snapshot")
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_busy_server_is_reported() -> None:
    directory = Path(tempfile.mkdtemp(prefix="ibacm-busy-"))
    server = LabServer(directory / "a.sock", max_clients=1).start()
    try:
        first = await AdminClient.connect(str(server.path))
        with pytest.raises(AdminConnectionError, match=r"too many admin clients \(limit 1\)"):
            await AdminClient.connect(str(server.path))
        await first.aclose()
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.asyncio
async def test_connection_failures_say_why(tmp_path: Path) -> None:
    with pytest.raises(AdminConnectionError, match="no admin socket at"):
        await AdminClient.connect(str(tmp_path / "missing.sock"))
    plain = tmp_path / "plain-file"
    plain.write_text("")
    with pytest.raises(AdminConnectionError, match=r"cannot connect to .*plain-file"):
        await AdminClient.connect(str(plain))


@pytest.mark.asyncio
async def test_a_peer_that_is_not_an_admin_server(tmp_path: Path) -> None:
    async def talk_nonsense(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"HTTP/1.1 400 Bad Request\n")
        await writer.drain()
        writer.close()

    path = tmp_path / "nonsense.sock"
    server = await asyncio.start_unix_server(talk_nonsense, str(path))
    async with server:
        with pytest.raises(AdminConnectionError, match="bad message: line is not JSON"):
            await AdminClient.connect(str(path))
