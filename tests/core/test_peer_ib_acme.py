"""The real ``ib_acme`` (Debian's rdma-core build) against our daemons.

Three daemons with the real default provider (ibacmp) share one simulated fabric in this
process; ``/usr/bin/ib_acme`` talks to node1 over its unix socket (and over TCP in loop
mode). Its output formats are ib_acme.md §3-§6.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ibacm.config.option_values import ServerMode
from ibacm.config.options import Options
from tests.conftest import missing, require, require_peer
from tests.core.support import cluster

PERF_HEADER = (
    "svc,Error Count,Resolve Count,No Data,Addr Query Count,Addr Cache Count,"
    "Route Query Count,Route Cache Count"
)
RUN_PORT_FILE = Path("/run/ibacm-tcp.port")  # compiled into ib_acme, no override


async def ib_acme(*args: str, timeout: float = 30) -> tuple[int, list[str], str]:
    """Run the real ib_acme; (exit status, stdout lines, stderr)."""
    path = require_peer("ib_acme")
    with trio.fail_after(timeout):
        result = await trio.run_process(
            [path, *args], capture_stdout=True, capture_stderr=True, check=False
        )
    return result.returncode, result.stdout.decode().splitlines(), result.stderr.decode()


@pytest.mark.peer
@pytest.mark.trio
async def test_perf_global_all_and_columns(tmp_path: Path) -> None:
    async with cluster(tmp_path, ports=2) as run:
        svc = run.socket()
        status, lines, _ = await ib_acme("-S", svc, "-f", "n", "-s", "node1", "-d", "node2")
        assert status == 0, lines
        status, lines, _ = await ib_acme("-S", svc, "-P")
        assert status == 0
        assert lines[0] == PERF_HEADER
        assert lines[1].startswith(f"{svc},0,1,")
        assert lines[-1] == "return status 0x0"
        # "-P all" walks endpoint 1, 2, ... until an error: both ports' endpoints are listed
        # (the C server stopped after endpoint 1 on single-port HCAs).
        status, lines, _ = await ib_acme("-S", svc, "-P", "all")
        assert status == 0
        rows = [line for line in lines[1:-1] if line.startswith(svc)]
        assert len(rows) == 2
        assert rows[0].split(",")[2] == "1"  # endpoint 1 resolved once
        status, lines, _ = await ib_acme("-S", svc, "-P", "col")
        assert lines[:3] == [svc, "Error Count : 0", "Resolve Count : 1"]
        status, lines, _ = await ib_acme("-S", svc, "-P", "2")
        assert (status, lines[0]) == (0, PERF_HEADER)
        status, lines, _ = await ib_acme("-S", svc, "-P", "s", "-s", "10.1.0.1")
        assert lines[1] == f"{svc},0,0,0,0,0,0,0"


@pytest.mark.peer
@pytest.mark.trio
async def test_endpoint_listing(tmp_path: Path) -> None:
    async with cluster(tmp_path, ports=2) as run:
        svc = run.socket()
        guid = run.daemons["node1"].topology.devices[0].core.node_guid
        status, lines, _ = await ib_acme("-S", svc, "-e")
        assert status == 0
        assert lines == [
            "svc,guid,port,pkey,ep_index,prov,addr_0,addresses",
            f"{svc},0x{guid:016x},1,0xffff,1,ibacmp,10.0.0.1/16,fd00::1/64,node1",
            f"{svc},0x{guid:016x},2,0xffff,1,ibacmp,10.1.0.1/16,fd00:0:0:1::1/64",
            "return status 0x0",
        ]


@pytest.mark.peer
@pytest.mark.trio
async def test_resolution_end_to_end_with_verification(tmp_path: Path) -> None:
    async with cluster(tmp_path) as run:
        svc = run.socket()
        node3 = run.world.node("node3")
        status, lines, _ = await ib_acme("-S", svc, "-d", "10.0.0.3", "-v")
        assert status == 0, lines
        assert lines[:3] == [f"Service: {svc}", "Destination: 10.0.0.3", "Source: 10.0.0.1"]
        assert f"  dlid: {node3.lids[0]}" in lines
        assert "SA verification: success" in lines
        # Names are cached apart from IPs: with -c (NODELAY) a miss is ENODATA at once, and
        # the resolution it started answers the next -c from the cache.
        by_name = ("-S", svc, "-f", "n", "-s", "node1", "-d", "node3", "-c")
        status, lines, _ = await ib_acme(*by_name)
        assert status == 255
        assert "ib_acm_resolve_name failed: No data available" in lines
        with trio.fail_after(10):
            while status:
                await trio.sleep(0.05)
                status, lines, _ = await ib_acme(*by_name)
        assert f"  dgid: {node3.ports[0].gid_text}" in lines


@pytest.mark.peer
@pytest.mark.trio
async def test_errors_are_answered_never_hung_up_on(tmp_path: Path) -> None:
    """ib_acme dies of SIGABRT (-d) or SIGPIPE (-e) when the server hangs up: every one of
    these must end in a proper error reply instead."""
    async with cluster(tmp_path, nodes=2) as run:
        svc = run.socket()
        # Unknown endpoint: ib_acme asks ports 1..255 and gets 255 error replies.
        status, lines, _ = await ib_acme("-S", svc, "-e", "9")
        assert (status, lines) == (0, [" Endpoint 9 is not available", "return status 0x0"])
        status, lines, _ = await ib_acme("-S", svc, "-P", "9")
        assert lines[0] == f"{svc}: Failed to query perf data: Cannot assign requested address"
        status, lines, _ = await ib_acme("-S", svc, "-f", "n", "-s", "nosuch", "-d", "node2")
        assert status == 255
        assert "ib_acm_resolve_name failed: Cannot assign requested address" in lines
        # Nobody has this address: the ACM request times out after its retries.
        status, lines, _ = await ib_acme("-S", svc, "-d", "10.0.0.77", "-c")
        assert status == 255
        assert "ib_acm_resolve_ip failed: No data available" in lines
        status, lines, _ = await ib_acme("-S", str(tmp_path / "none.sock"), "-P")
        assert status == errno.ENOENT
        assert any("unable to contact service" in line for line in lines)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def run_port_file(port: int) -> Iterator[None]:
    """Point ib_acme's compiled-in /run/ibacm-tcp.port at ``port``; restore it afterwards."""
    previous = RUN_PORT_FILE.read_bytes() if RUN_PORT_FILE.exists() else None
    try:
        RUN_PORT_FILE.write_text(f"{port}\n")
    except OSError as exc:
        missing(f"{RUN_PORT_FILE} is not writable here: {exc.strerror}")
    try:
        yield
    finally:
        if previous is None:
            RUN_PORT_FILE.unlink(missing_ok=True)
        else:
            RUN_PORT_FILE.write_bytes(previous)


@pytest.mark.peer
@pytest.mark.trio
async def test_loop_mode_over_tcp(tmp_path: Path) -> None:
    require_peer("ib_acme")
    require(
        os.access(RUN_PORT_FILE.parent, os.W_OK),
        f"{RUN_PORT_FILE.parent} is not writable: ib_acme reads the port there",
    )
    home = tmp_path / "node1"
    options = Options(
        log_file="stderr",
        lock_file=str(tmp_path / "pid"),
        server_mode=ServerMode.LOOP,
        server_port=0,
    )
    async with cluster(tmp_path, nodes=2, node1=options) as run:
        port = int((home / "ibacm-tcp.port").read_text())
        assert _bindable(port) is False
        with run_port_file(port):
            status, lines, _ = await ib_acme("-S", "127.0.0.1", "-P")
            assert status == 0
            assert lines[1].startswith("127.0.0.1,")
            status, lines, _ = await ib_acme("-S", "127.0.0.1", "-d", "10.0.0.2")
        assert status == 0, lines
        assert run.daemons["node1"].listeners is not None


@pytest.mark.peer
@pytest.mark.trio
async def test_endpoint_with_an_ep_query_reply_over_592_bytes(tmp_path: Path) -> None:
    async with cluster(tmp_path, nodes=2) as run:
        names = [f"alias{n:02d}" for n in range(14)]
        addr_file = tmp_path / "node1" / "ibacm_addr.cfg"
        addr_file.write_text("".join(f"{name} mlx5_0 1 default\n" for name in names))
        await run.daemons["node1"].reload()
        # 16 + 80 + 16 x 64 = 1120 bytes: ib_acme reads the header, then the rest.
        status, lines, _ = await ib_acme("-S", run.socket(), "-e", "1")
        assert status == 0
        assert lines[1].split(",")[6:] == ["10.0.0.1/16", "fd00::1/64", *names]
