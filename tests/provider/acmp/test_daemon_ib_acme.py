"""ibacmp end to end: real ``ibacm`` daemons on the simulated fabric (``ibacm-sim up``),
asked by Debian's C ``/usr/bin/ib_acme``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ibacm.fabric.sim.topo_file import Topology
from ibacm.wire.counters import ACM_MAX_COUNTER, Counter
from tests.conftest import require_file, require_peer

pytestmark = [pytest.mark.peer]
PYVERBS = Path("/usr/lib/python3/dist-packages/pyverbs/device.cpython-311-x86_64-linux-gnu.so")
NODES = 4


@dataclass(frozen=True)
class Sim:
    directory: Path
    topology: Topology

    @property
    def socket(self) -> str:
        return str(self.directory / "node1" / "ibacm-unix.sock")

    def ip(self, node: str) -> str:
        port = self.topology.host(node).hcas[0].ports[0]
        return str(port.ipv4[0].ip)

    def lid(self, node: str) -> int:
        return self.topology.host(node).hcas[0].ports[0].lid


def _sim(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    # Our daemon, not a distribution's C ibacm that may come first on PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "ibacm.tools.sim", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )


@pytest.fixture(scope="module", params=["sim", "hw"])
def sim(request: pytest.FixtureRequest) -> Iterator[Sim]:
    """node1 (the one asked) runs on the simulated fabric, or with ``--fabric hw`` on the real
    pyverbs and libibumad through the emulated HCA: the same scenarios pass on both."""
    require_peer("ib_acme")
    kind_args = ["--hw", "node1"] if request.param == "hw" else []
    if kind_args:
        require_file(PYVERBS)
    directory = Path(tempfile.mkdtemp(prefix="acmpsim"))
    try:
        up = _sim("up", "--nodes", str(NODES), "--dir", str(directory), *kind_args)
        if up.returncode != 0:
            pytest.fail(f"ibacm-sim up failed ({up.returncode}):\n{up.stdout}{up.stderr}")
        yield Sim(directory, Topology.from_json((directory / "topology.json").read_text()))
    finally:
        _sim("down", "--dir", str(directory))
        shutil.rmtree(directory, ignore_errors=True)


def ib_acme(sim: Sim, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_peer("ib_acme"), "-S", sim.socket, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def counters(sim: Sim) -> dict[str, int]:
    result = ib_acme(sim, "-P")
    assert result.returncode == 0, result.stdout + result.stderr
    header, values = result.stdout.splitlines()[:2]
    # The C tool's own labels: our one definition of the counters must match them.
    labels = [counter.label for counter in Counter][:ACM_MAX_COUNTER]
    assert header.split(",")[1:] == labels
    return dict(zip(labels, (int(v) for v in values.split(",")[1:]), strict=True))


def test_resolve_and_verify_prints_the_peer_lid(sim: Sim) -> None:
    result = ib_acme(sim, "-s", sim.ip("node1"), "-d", sim.ip("node3"), "-v")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert f"dlid: {sim.lid('node3')}" in lines
    assert f"slid: {sim.lid('node1')}" in lines
    assert "SA verification: success" in lines
    assert "return status 0x0" in lines


def test_counters_move_as_resolutions_go(sim: Sim) -> None:
    before = counters(sim)
    first = ib_acme(sim, "-s", sim.ip("node1"), "-d", sim.ip("node2"))
    assert first.returncode == 0, first.stdout
    after_first = counters(sim)
    assert after_first["Resolve Count"] == before["Resolve Count"] + 1
    assert after_first["Addr Query Count"] == before["Addr Query Count"] + 1
    assert after_first["Route Query Count"] == before["Route Query Count"] + 1
    assert after_first["Route Cache Count"] == before["Route Cache Count"]
    again = ib_acme(sim, "-s", sim.ip("node1"), "-d", sim.ip("node2"))
    assert again.returncode == 0 and again.stdout == first.stdout
    after_again = counters(sim)
    assert after_again["Resolve Count"] == after_first["Resolve Count"] + 1
    assert after_again["Route Cache Count"] == after_first["Route Cache Count"] + 1
    assert after_again["Addr Query Count"] == after_first["Addr Query Count"]
    assert after_again["Error Count"] == before["Error Count"]


def test_cache_only_miss_then_hit(sim: Sim) -> None:
    before = counters(sim)
    miss = ib_acme(sim, "-c", "-s", sim.ip("node1"), "-d", sim.ip("node4"))
    assert "ib_acm_resolve_ip failed: No data available" in miss.stdout
    assert miss.returncode == 255
    assert counters(sim)["No Data"] == before["No Data"] + 1
    deadline = time.monotonic() + 20
    while True:  # the miss started the resolution in the background
        hit = ib_acme(sim, "-c", "-s", sim.ip("node1"), "-d", sim.ip("node4"))
        if hit.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert hit.returncode == 0, hit.stdout
    assert f"dlid: {sim.lid('node4')}" in [line.strip() for line in hit.stdout.splitlines()]


def test_names_and_path_forms(sim: Sim) -> None:
    by_name = ib_acme(sim, "-f", "n", "-s", "node1", "-d", "NODE2")
    assert by_name.returncode == 0, by_name.stdout
    assert f"dlid: {sim.lid('node2')}" in [line.strip() for line in by_name.stdout.splitlines()]
    by_lid = ib_acme(sim, "-f", "l", "-s", str(sim.lid("node1")), "-d", str(sim.lid("node4")))
    assert by_lid.returncode == 0, by_lid.stdout
    assert f"dlid: {sim.lid('node4')}" in [line.strip() for line in by_lid.stdout.splitlines()]


def ask_raw(sim: Sim, request: bytes) -> bytes:
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(sim.socket)
        sock.sendall(request)
        return sock.recv(65536)


@pytest.mark.parametrize(("op", "length"), [(2, 40), (3, 88)])
def test_queries_of_other_lengths_are_answered_as_rdma_core_answers_them(
    sim: Sim, op: int, length: int
) -> None:
    """A PERF_QUERY of 40 bytes is a global one (no SOURCE entry fits); an EP_QUERY of 88
    bytes is an EP_QUERY: the reply is the one to the 16-byte request."""
    index = 1 if op == 3 else 0

    def request(size: int) -> bytes:
        return bytes([1, op, 0, index, 0, 0]) + size.to_bytes(2, "big") + bytes(size - 8)

    reference = ask_raw(sim, request(16))
    answered = ask_raw(sim, request(length))
    assert answered and answered == reference
    assert answered[1] == 0x80 | op and answered[2] == 0  # ACK, status success
