"""Parity with Debian's /usr/bin/ib_acme against real ibacm daemons on the simulated fabric.

One 4-node cluster (``ibacm-sim up``) serves the whole module. Both tools ask node1's daemon
the same question back to back; stdout and exit status must be identical. Resolutions fill
the daemon's cache, so each comparison is arranged to give both tools the same state: the
first run warms the cache where needed, counters are compared only while the daemon is idle
(PERF queries change no counter), and cache-only misses use two fresh destinations.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from ibacm.fabric.sim.topo_file import HcaPort, Topology, gid_of
from ibacm.wire.path_record import gid_to_text
from tests.conftest import require_peer
from tests.tools.conftest import Result, run_c, run_ours

pytestmark = [pytest.mark.peer, pytest.mark.slow]
NODES = 4


@dataclass(frozen=True)
class Cluster:
    directory: Path
    topology: Topology

    @property
    def socket(self) -> str:
        return str(self.directory / "node1" / "ibacm-unix.sock")

    def port(self, node: str) -> HcaPort:
        return self.topology.host(node).hcas[0].ports[0]

    def gid(self, node: str) -> str:
        return gid_to_text(gid_of(self.topology.subnet_prefix, self.port(node).guid))

    def lid(self, node: str) -> str:
        return str(self.port(node).lid)


def _sim(*args: str) -> subprocess.CompletedProcess[str]:
    # Our daemon, not a distribution's C ibacm that may come first on PATH.
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    command = [sys.executable, "-m", "ibacm.tools.sim", *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, check=False, env=env
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    require_peer("ib_acme")
    directory = Path(tempfile.mkdtemp(prefix="acmesim"))
    try:
        up = _sim("up", "--nodes", str(NODES), "--dir", str(directory))
        if up.returncode != 0:
            pytest.fail(f"ibacm-sim up failed ({up.returncode}):\n{up.stdout}{up.stderr}")
        topology = Topology.from_json((directory / "topology.json").read_text())
        yield Cluster(directory, topology)
    finally:
        _sim("down", "--dir", str(directory))
        shutil.rmtree(directory, ignore_errors=True)


async def both(cluster: Cluster, *args: str) -> tuple[Result, Result]:
    full = ["-S", cluster.socket, *args]
    theirs = await run_c(require_peer("ib_acme"), *full)
    ours = await run_ours(*full)
    return theirs, ours


def assert_same(theirs: Result, ours: Result) -> None:
    assert ours.stdout == theirs.stdout
    assert ours.status == theirs.status


@pytest.mark.trio
@pytest.mark.parametrize(
    "args",
    [
        ["-d", "10.0.0.2"],
        ["-d", "fd00::3"],
        ["-f", "i", "-s", "10.0.0.1", "-d", "10.0.0.[2-4]", "-v"],
        ["-f", "n", "-s", "node1", "-d", "node[2-4]"],
        ["-f", "n", "-s", "node1", "-d", "node3", "-v"],
        ["-d", "10.0.0.4", "-C", "3"],
        ["-f", "n", "-s", "node1", "-d", "node2", "-C", "3", "-v"],
    ],
    ids=" ".join,
)
async def test_resolutions(cluster: Cluster, args: list[str]) -> None:
    assert_same(*await both(cluster, *args))


@pytest.mark.trio
async def test_resolution_by_gid_and_lid(cluster: Cluster) -> None:
    assert_same(*await both(cluster, "-f", "g", "-d", cluster.gid("node3"), "-v"))
    assert_same(*await both(cluster, "-f", "l", "-d", cluster.lid("node4"), "-v"))
    gid_pair = ["-f", "g", "-s", cluster.gid("node1"), "-d", cluster.gid("node2")]
    assert_same(*await both(cluster, *gid_pair))
    assert_same(*await both(cluster, "-f", "l", "-s", cluster.lid("node1"), "-d", "2000"))


@pytest.mark.trio
async def test_cache_only(cluster: Cluster) -> None:
    await run_ours("-S", cluster.socket, "-f", "n", "-s", "node1", "-d", "node4")
    assert_same(*await both(cluster, "-f", "n", "-c", "-s", "node1", "-d", "node4"))


@pytest.mark.trio
async def test_cache_only_miss(cluster: Cluster) -> None:
    # A miss starts a background resolution, so each tool gets its own fresh destination.
    theirs = await run_c(require_peer("ib_acme"), "-S", cluster.socket, "-c", "-d", "fd00::2")
    ours = await run_ours("-S", cluster.socket, "-c", "-d", "fd00::4")
    assert "ib_acm_resolve_ip failed: No data available" in theirs.stdout
    assert ours.stdout.replace("fd00::4", "fd00::2") == theirs.stdout
    assert ours.status == theirs.status == 255


@pytest.mark.trio
@pytest.mark.parametrize("args", [["-e"], ["-e", "1"], ["-e", "9"]], ids=" ".join)
async def test_endpoints(cluster: Cluster, args: list[str]) -> None:
    assert_same(*await both(cluster, *args))


async def idle_counters(cluster: Cluster) -> None:
    """Wait until two global perf queries a little apart agree: no resolution in flight."""
    previous = None
    for _ in range(50):
        now = (await run_ours("-S", cluster.socket, "-P")).stdout
        if now == previous:
            return
        previous = now
        await trio.sleep(0.1)
    pytest.fail("the daemon's counters never settled")


@pytest.mark.trio
@pytest.mark.parametrize(
    "args", [["-P"], ["-P", "all"], ["-P", "col"], ["-P", "1"], ["-P", "5"]], ids=" ".join
)
async def test_counters(cluster: Cluster, args: list[str]) -> None:
    await idle_counters(cluster)
    theirs, ours = await both(cluster, *args)
    assert_same(theirs, ours)
    assert "Resolve Count" in ours.stdout or "Failed to query perf data" in ours.stdout


@pytest.mark.trio
async def test_counters_of_an_address(cluster: Cluster) -> None:
    await idle_counters(cluster)
    assert_same(*await both(cluster, "-P", "s", "-s", "10.0.0.1"))
    assert_same(*await both(cluster, "-P", "s", "-f", "n", "-s", "node1"))


def test_console_script_against_the_daemon(cluster: Cluster) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ibacm.tools.ib_acme", "-S", cluster.socket, "-e", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("svc,guid,port,pkey,ep_index,prov,addr_0,addresses\n")
    assert ",ibacmp," in done.stdout
