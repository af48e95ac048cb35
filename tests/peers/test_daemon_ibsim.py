"""Our daemon on the ibsim fabric, asked by the real ``ib_acme``, answers with OpenSM's path.

The daemon runs with ``--fabric hw-umad`` as simulated node Hca1 (the ACM multicast data path
cannot run on ibsim, so peers come from an acm_hosts preload): the ACM group is joined at the
real SA, and the route to each peer is a real PathRecord query answered by OpenSM. Debian's
``ib_acme -s A -d B -v`` must print exactly the path ``saquery PR`` reports, and the SA
verification must succeed.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ibacm.wire import admin
from tests.conftest import require_peer
from tests.peers.ibsim import SimFabric, saquery_path

pytestmark = pytest.mark.peer

PEERS = {"Hca2": "10.0.0.2", "Hca3": "10.0.0.3", "Hca4": "10.0.0.4"}
READY_TIMEOUT = 30


@dataclass
class RunningDaemon:
    socket_path: Path
    run_dir: Path
    log: Path


def write_config(directory: Path, fabric: SimFabric) -> tuple[Path, Path]:
    run = directory / "run"
    run.mkdir()
    hosts = directory / "ibacm_hosts.data"
    hosts.write_text(
        "".join(
            f"{ip} {fabric.nodes[host].gid}\n{host.lower()} {fabric.nodes[host].gid}\n"
            for host, ip in PEERS.items()
        )
    )
    opts = directory / "ibacm_opts.cfg"
    opts.write_text(
        f"log_file {directory / 'ibacm.log'}\nlog_level 2\nlock_file {directory / 'ibacm.pid'}\n"
        f"run_dir {run}\nserver_mode unix\naddr_prot acm\nroute_prot sa\n"
        f"addr_preload acm_hosts\naddr_data_file {hosts}\nsupport_ips_in_addr_cfg 1\n"
    )
    addr = directory / "ibacm_addr.cfg"
    addr.write_text("10.0.0.1 ibsim0 1 default\nhca1 ibsim0 1 default\n")
    return opts, addr


@pytest.fixture(scope="module")
def daemon(
    sim_fabric: SimFabric, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningDaemon]:
    with run_daemon(sim_fabric, tmp_path_factory.mktemp("daemon")) as running:
        yield running


@contextmanager
def run_daemon(
    fabric: SimFabric, directory: Path, *, env: Sequence[str] = ()
) -> Iterator[RunningDaemon]:
    """Our daemon as simulated node Hca1 (``env``: extra ``NAME=value`` for it), until the
    block ends; it must then stop cleanly."""
    opts, addr = write_config(directory, fabric)
    notify_path = directory / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(notify_path))
        notify.settimeout(READY_TIMEOUT)
        argv = [sys.executable, "-m", "ibacm.core.cli", "-P", "--fabric", "hw-umad",
                "-O", str(opts), "-A", str(addr)]  # fmt: skip
        command = fabric.command("Hca1", argv)
        command[command.index("env") + 1 : command.index("env") + 1] = [
            f"NOTIFY_SOCKET={notify_path}",
            *env,
        ]
        log = directory / "daemon.out"
        with log.open("w") as out:
            process = subprocess.Popen(
                command, cwd=fabric.workdir, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            _wait_ready(notify, process, directory)
            _wait_joined(directory / "run" / "ibacm-admin.sock")
            yield RunningDaemon(directory / "run" / "ibacm-unix.sock", directory / "run", log)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    assert process.returncode == 0, (directory / "ibacm.log").read_text()[-3000:]
    assert not (directory / "ibacm.pid").exists()
    assert not (directory / "run" / "ibacm-unix.sock").exists()


def _wait_ready(notify: socket.socket, process: subprocess.Popen[bytes], directory: Path) -> None:
    try:
        while b"READY=1" not in notify.recv(4096):
            pass
    except TimeoutError:
        process.kill()
        process.wait()
        log = directory / "ibacm.log"
        tail = log.read_text()[-3000:] if log.exists() else ""
        raise AssertionError(f"the daemon did not become ready:\n{tail}") from None


def _wait_joined(admin_path: Path) -> None:
    """READY=1 means the sockets serve; resolutions need the endpoints' multicast joins too
    (until then the daemon rightly answers ENODATA). Ask the admin socket until they are."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        endpoints = snapshot(admin_path)["endpoints"]
        if endpoints and all(ep["state"] == "ready" for ep in endpoints):
            return
        time.sleep(0.1)
    raise AssertionError(f"endpoints not joined after {READY_TIMEOUT} s: {endpoints}")


def snapshot(admin_path: Path) -> dict[str, Any]:
    """The daemon's state as its admin socket gives it (docs/admin-protocol.md)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(admin_path))
        sock.sendall(admin.encode_request(admin.Request(admin.Command.SNAPSHOT, 1, {})))
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(1 << 20)
            assert chunk, "admin socket closed"
            data += chunk
    reply = admin.parse_server_message(data.splitlines()[0])
    assert isinstance(reply, admin.Reply) and reply.ok, reply
    return dict(reply.result)


def ib_acme(daemon: RunningDaemon, *args: str) -> str:
    result = subprocess.run(
        [require_peer("ib_acme"), "-S", str(daemon.socket_path), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def path_block(output: str) -> dict[str, str]:
    block = output.split("Path information", 1)[1]
    return dict(re.findall(r"^  ([a-z ]+): (\S+)$", block, re.M))


def expected_from_saquery(fabric: SimFabric, source: str, dest: str) -> dict[str, str]:
    """ib_acme's rendering (ib_acme.md §3.3) of the record OpenSM gives saquery."""
    path = saquery_path(fabric, source, dest)
    return {
        "dgid": str(ipaddress.IPv6Address(path.dgid)),
        "sgid": str(ipaddress.IPv6Address(path.sgid)),
        "dlid": str(path.dlid),
        "slid": str(path.slid),
        "flow label": hex(path.flowlabel_hoplimit >> 8 & 0xFFFFF),
        "hop limit": str(path.flowlabel_hoplimit & 0xFF),
        "tclass": str(path.tclass),
        "reversible": str(path.reversible_numpath >> 7),
        "pkey": hex(path.pkey),
        "sl": str(path.sl),
        "mtu": str(path.mtu_byte & 0x1F),
        "rate": str(path.rate_byte & 0x1F),
        "packet lifetime": str(path.packetlifetime_byte & 0x1F),
    }


@pytest.mark.parametrize("peer", sorted(PEERS))
def test_ib_acme_gets_opensms_path_by_ip(
    daemon: RunningDaemon, sim_fabric: SimFabric, peer: str
) -> None:
    output = ib_acme(daemon, "-s", "10.0.0.1", "-d", PEERS[peer], "-v")
    assert f"Destination: {PEERS[peer]}" in output and "Source: 10.0.0.1" in output
    assert path_block(output) == expected_from_saquery(sim_fabric, "Hca1", peer)
    assert "SA verification: success" in output
    assert output.rstrip().endswith("return status 0x0")


def test_ib_acme_by_name_and_counters(daemon: RunningDaemon, sim_fabric: SimFabric) -> None:
    output = ib_acme(daemon, "-f", "n", "-s", "hca1", "-d", "hca4")
    assert path_block(output) == expected_from_saquery(sim_fabric, "Hca1", "Hca4")
    perf = ib_acme(daemon, "-P").splitlines()
    counters = dict(zip(perf[0].split(",")[1:], map(int, perf[1].split(",")[1:]), strict=True))
    assert counters["Route Query Count"] >= 1 and counters["Error Count"] == 0
    endpoints = ib_acme(daemon, "-e")
    guid = f"0x{sim_fabric.nodes['Hca1'].port_guid - 1:016x}"  # ibsim: node GUID = port GUID - 1
    assert f"{daemon.socket_path},{guid},1,0xffff,1,ibacmp,10.0.0.1,hca1" in endpoints


def test_the_daemon_log_shows_the_real_join(daemon: RunningDaemon) -> None:
    log = (daemon.run_dir.parent / "ibacm.log").read_text()
    assert '"joined multicast group"' in log and "ff154001ffff00030400000000000000" in log
    assert os.path.exists(daemon.socket_path)
