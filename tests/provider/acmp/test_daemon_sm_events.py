"""SM events end to end: real daemons on the simulated fabric (``ibacm-sim up``), Debian's
``ib_acme`` asking node1, and ``ibacm-sim port-down node3`` making node1 drop node3 without
a flush: the SA reports trap 65 to every subscribed daemon, which acks it and drops its
entries for node3's GID, so a cache-only question misses and a resolution fails clearly
instead of answering the dead path; when node3 is back, it resolves again.
"""

from __future__ import annotations

import json
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
from tests.conftest import ibacm_sim, require_file, require_peer

pytestmark = [pytest.mark.peer]
NODES = 4
PYVERBS = Path("/usr/lib/python3/dist-packages/pyverbs/device.cpython-311-x86_64-linux-gnu.so")
WAIT = 20.0
"""Seconds to wait for something the fabric makes happen in milliseconds (load is shared)."""


@dataclass(frozen=True)
class Sim:
    directory: Path
    topology: Topology

    def ip(self, node: str) -> str:
        return str(self.topology.host(node).hcas[0].ports[0].ipv4[0].ip)

    def lid(self, node: str) -> int:
        return int(self.topology.host(node).hcas[0].ports[0].lid)

    def sim(self, *args: str) -> None:
        done = ibacm_sim(*args, "--dir", str(self.directory))
        assert done.returncode == 0, done.stdout + done.stderr

    def ib_acme(self, node: str, *args: str) -> subprocess.CompletedProcess[str]:
        socket = str(self.directory / node / "ibacm-unix.sock")
        return subprocess.run(
            [require_peer("ib_acme"), "-S", socket, *args],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )

    def sm_events(self, node: str) -> dict[str, object]:
        done = subprocess.run(
            [sys.executable, "-m", "ibacm.tools.admin_cli", "--dir", str(self.directory),
             "--node", node, "--json", "status"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        endpoints = json.loads(done.stdout)["endpoints"]
        return dict(endpoints[0]["sm_events"])


@pytest.fixture(params=["sim", "hw"])
def sim(request: pytest.FixtureRequest) -> Iterator[Sim]:
    """node1 runs on the simulated fabric, or with ``--fabric hw`` on the real pyverbs and
    libibumad through the emulated HCA (its umad SA agent, as on hardware)."""
    require_peer("ib_acme")
    kind_args = ["--hw", "node1"] if request.param == "hw" else []
    if kind_args:
        require_file(PYVERBS)
    directory = Path(tempfile.mkdtemp(prefix="smevents"))
    try:
        up = ibacm_sim("up", "--nodes", str(NODES), "--dir", str(directory), *kind_args)
        if up.returncode != 0:
            pytest.fail(f"ibacm-sim up failed ({up.returncode}):\n{up.stdout}{up.stderr}")
        yield Sim(directory, Topology.from_json((directory / "topology.json").read_text()))
    finally:
        ibacm_sim("down", "--dir", str(directory))
        shutil.rmtree(directory, ignore_errors=True)


def dlid_in(result: subprocess.CompletedProcess[str]) -> int | None:
    for line in result.stdout.splitlines():
        if line.strip().startswith("dlid:"):
            return int(line.split(":")[1])
    return None


def wait_until(what: str, check: object) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if callable(check) and check():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {WAIT} s")


def test_port_down_makes_the_others_drop_the_node(sim: Sim) -> None:
    wait_until("node1 subscribed", lambda: sim.sm_events("node1").get("subscribed") is True)
    src, dead = sim.ip("node1"), sim.ip("node3")
    first = sim.ib_acme("node1", "-s", src, "-d", dead)
    assert dlid_in(first) == sim.lid("node3"), first.stdout
    cached = sim.ib_acme("node1", "-c", "-s", src, "-d", dead)
    assert dlid_in(cached) == sim.lid("node3"), cached.stdout
    sim.sim("port-down", "node3")
    wait_until("node1 heard trap 65", lambda: sim.sm_events("node1").get("gid_out") == 1)
    events = sim.sm_events("node1")
    assert events["dropped"] == 1 and events["acked"] == events["reports"]
    # No flush: the entry is gone, so the cache has nothing and a resolution fails clearly.
    miss = sim.ib_acme("node1", "-c", "-s", src, "-d", dead)
    assert "No data available" in miss.stdout and dlid_in(miss) is None, miss.stdout
    failed = sim.ib_acme("node1", "-s", src, "-d", dead)
    assert failed.returncode != 0 and dlid_in(failed) is None, failed.stdout
    assert sim.sm_events("node2")["gid_out"] == 1  # every subscriber heard it
    sim.sim("port-up", "node3")
    wait_until("node1 heard trap 64", lambda: sim.sm_events("node1").get("gid_in") == 1)

    def resolves() -> bool:
        return dlid_in(sim.ib_acme("node1", "-s", src, "-d", dead)) == sim.lid("node3")

    wait_until("node3 resolved again", resolves)
