"""Scripts see the same tool: Debian's ``/usr/bin/ib_acme`` and ours, over a table of argument
sets against one real daemon, must print the same stdout and exit with the same status.

The only difference allowed is where the C tool prints a stale errno text (``strerror`` of an
errno no call of this request set): ours may say what is wrong there, with the same status.
Destinations are resolved once before the table so that both tools see the same cache.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from ibacm.fabric.sim.topo_file import Topology, gid_of
from ibacm.wire.path_record import gid_to_text
from tests.conftest import ibacm_sim, require_peer
from tests.tools.conftest import Result, run_c, run_ours

pytestmark = [pytest.mark.peer]

STALE_ERRNO = "No such file or directory"
NAME70 = "n" * 70


@dataclass(frozen=True)
class Cluster:
    directory: Path
    topology: Topology

    @property
    def socket(self) -> str:
        return str(self.directory / "node1" / "ibacm-unix.sock")

    def gid(self, node: str) -> str:
        port = self.topology.host(node).hcas[0].ports[0]
        return gid_to_text(gid_of(self.topology.subnet_prefix, port.guid))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    ib_acme = require_peer("ib_acme")
    directory = Path(tempfile.mkdtemp(prefix="acmetable"))
    try:
        # An unknown destination costs both tools the daemon's ACM timeout: 300 ms once,
        # not 2 s three times (the same answer, ENODATA; the table has a dozen such cases).
        opts = directory / "opts"
        opts.write_text("timeout 300\nretries 0\n")
        up = ibacm_sim("up", "--nodes", "4", "--dir", str(directory), "--opts", str(opts))
        assert up.returncode == 0, up.stdout + up.stderr
        found = Cluster(directory, Topology.from_json((directory / "topology.json").read_text()))
        # Warm the cache with every destination of the table, by every form.
        for warm in (
            ["-s", "10.0.0.1", "-d", "10.0.0.[2-4]"],
            ["-s", "fd00::1", "-d", "fd00::[2-4]"],
            ["-f", "n", "-s", "node1", "-d", "node[2-4]"],
        ):
            subprocess.run(
                [ib_acme, "-S", found.socket, *warm], capture_output=True, timeout=60, check=False
            )
        yield found
    finally:
        ibacm_sim("down", "--dir", str(directory))
        shutil.rmtree(directory, ignore_errors=True)


def table(cluster: Cluster | None = None) -> list[list[str]]:
    """At least 150 argument sets: every form, good and bad, and the reported cases."""
    gids = [cluster.gid(f"node{n}") for n in (1, 2, 3)] if cluster else ["g1", "g2", "g3"]
    cases: list[list[str]] = [
        # The reported cases.
        ["-d", "4"],
        ["-f", "l", "-s", "x", "-d", "2"],
        ["-d", "node3"],
        ["-P", "s", "-s", "node2"],
        ["-f", "l", "-d", "abc"],
        ["-f", "n", "-s", "node1", "-d", NAME70],
        # Usage errors: the usage text on stdout, exit 1.
        [],
        ["-X"],
        ["-f", "z", "-d", "1"],
        ["-f", "u", "-d", "1"],
        ["-s", "10.0.0.1"],
        ["-P", "s"],
        ["-f"],
        ["-d"],
        ["-C"],
        ["-S"],
        ["-v"],
        ["-c"],
    ]
    for dest in ("10.0.0.2", "10.0.0.3", "10.0.0.4", "fd00::2", "fd00::4", "10.0.0.[2-4]"):
        for extra in ([], ["-v"], ["-C", "2"], ["-c"]):
            cases.append(["-d", dest, *extra])
        cases.append(["-s", "10.0.0.1" if "." in dest else "fd00::1", "-d", dest])
        cases.append(["-f", "i", "-d", dest])
    for source, dest in (
        ("10.0.0.1", "fd00::2"),
        ("fd00::1", "10.0.0.2"),
        ("10.0.0.9", "10.0.0.2"),
        ("node1", "10.0.0.2"),
    ):
        cases.append(["-s", source, "-d", dest])
        cases.append(["-f", "i", "-s", source, "-d", dest, "-v"])
    for dest in ("node2", "node3", "NODE4", "node[2-4]", "nodeX", "10.0.0.2"):
        for src in (None, "node1", "NODE1", "node2"):
            args = ["-f", "n", "-d", dest]
            cases.append(args if src is None else [*args, "-s", src])
        cases.append(["-f", "n", "-s", "node1", "-d", dest, "-v", "-c"])
    for dest in ("2", "3", "4", "[2-4]", "0", "9999", "-1", "65538", "abc", "3x"):
        cases.append(["-f", "l", "-d", dest])
        cases.append(["-f", "l", "-s", "2", "-d", dest, "-v"])
    for dest in (*gids, "fe80::dead", "zz", "10.0.0.2"):
        cases.append(["-f", "g", "-d", dest])
        cases.append(["-f", "g", "-s", gids[0], "-d", dest, "-v"])
    for perf in (
        ["-P"],
        ["-P", "col"],
        ["-Pcol"],
        ["-P", "COLUMN"],
        ["-P", "all"],
        ["-P", "1"],
        ["-P", "2"],
        ["-P", "0"],
        ["-P", "junk"],
        ["-P", "s", "-s", "10.0.0.1"],
        ["-P", "s", "-s", "fd00::1"],
        ["-P", "s", "-s", "10.0.0.9"],
        ["-P", "s", "-f", "n", "-s", "node1"],
        ["-P", "s", "-f", "n", "-s", "nodeX"],
        ["-P", "s", "-f", "l", "-s", "2"],
        ["-P", "s", "-f", "g", "-s", gids[0]],
        ["-P", "s", "-s", "node1"],
    ):
        cases.append(perf)
    for ep in (["-e"], ["-e", "1"], ["-e1"], ["-e", "2"], ["-e", "0"], ["-e", "9"], ["-e", "x"]):
        cases.append(ep)
    cases += [
        ["-P", "col", "-e"],
        ["-V", "-d", "10.0.0.2"],
        ["-vc", "-d", "10.0.0.3"],
        ["stray", "-d", "10.0.0.2", "more"],
        ["-d", "10.0.0.2", "-C", "0"],
        ["-d", "10.0.0.2", "-C", "x"],
        ["-d", "10.0.0.[2"],
        ["-f", "n", "-d", "node[02-03]"],
    ]
    return cases


def same_except_stale_errno(theirs: Result, ours: Result) -> bool:
    c_lines, our_lines = theirs.stdout.splitlines(), ours.stdout.splitlines()
    if len(c_lines) != len(our_lines):
        return False
    for c_line, our_line in zip(c_lines, our_lines, strict=True):
        if c_line == our_line:
            continue
        if not c_line.endswith(STALE_ERRNO):
            return False
        prefix = c_line[: -len(STALE_ERRNO)]
        if not our_line.startswith(prefix):
            return False
    return True


def test_the_table_is_big_enough() -> None:
    assert len(table()) >= 150


@pytest.mark.trio
@pytest.mark.parametrize(
    ("args", "c_status", "message"),
    [
        # C dies of SIGSEGV on an empty destination; ours says so and fails.
        (["-f", "n", "-d", ""], 139, "Unable to parse destination argument: the argument is empty"),
        # C expands a descending range to one empty destination and asks the daemon for it.
        (["-d", "10.0.0.[3-2]"], 255, "range '3-2' counts down; write it as 2-3"),
    ],
    ids=["empty destination", "descending range"],
)
async def test_deliberate_differences_on_malformed_arguments(
    cluster: Cluster, args: list[str], c_status: int, message: str
) -> None:
    """Outside the table: where the C tool crashes or asks a meaningless question."""
    full = ["-S", cluster.socket, *args]
    theirs, ours = await run_c(require_peer("ib_acme"), *full), await run_ours(*full)
    assert theirs.status == c_status
    assert ours.status == 255 and message in ours.stdout


@pytest.mark.trio
async def test_same_stdout_and_exit_status_as_the_real_tool(cluster: Cluster) -> None:
    ib_acme = require_peer("ib_acme")
    differences = []
    for args in table(cluster):
        full = ["-S", cluster.socket, *args] if "-S" not in args else args
        raw = await run_c(ib_acme, *full)
        # The usage text names the program as invoked.
        named = raw.stdout.replace(f": {ib_acme}\n", ": ib_acme\n")
        theirs = Result(raw.status, named, raw.stderr)
        ours = await run_ours(*full)
        if ours.status != theirs.status or not same_except_stale_errno(theirs, ours):
            differences.append(
                f"{args}: status {theirs.status} vs ours {ours.status}\n"
                f"--- real\n{theirs.stdout}--- ours\n{ours.stdout}"
            )
        await trio.sleep(0)
    assert not differences, f"{len(differences)} differ:\n" + "\n".join(differences[:10])
