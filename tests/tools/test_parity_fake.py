"""Parity with Debian's /usr/bin/ib_acme against one deterministic fake daemon.

Both tools run with the same arguments against the same fake (its cache-only state reset
before each run, so both see the same answers); stdout and exit status must be identical.
Cases where ours deliberately differs (fixed defects) are tested in test_ib_acme.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import not_applicable, require_peer
from tests.tools.conftest import Result, run_c, run_ours
from tests.tools.fake_acm import FakeAcm

pytestmark = pytest.mark.peer

SAME_ARGS = [
    ["-P"],
    ["-P", "all"],
    ["-P", "col"],
    ["-Pcol"],
    ["-P", "1"],
    ["-P", "2"],
    ["-P", "junk"],
    ["-P", "s", "-s", "10.0.0.1"],
    ["-P", "s", "-s", "10.0.0.9"],
    ["-V", "-P", "s", "-s", "fd00::1"],
    ["-P", "s", "-f", "n", "-s", "node1"],
    ["-e"],
    ["-e", "1"],
    ["-e2"],
    ["-e", "3"],
    ["-d", "10.0.0.2"],
    ["-d", "fd00::3"],
    ["-d", "10.0.0.2", "-v"],
    ["-s", "10.0.0.1", "-d", "10.0.0.2", "-v"],
    ["-d", "10.0.0.[1-3]"],
    ["-d", "10.0.0.9"],
    ["-d", "localhost"],
    ["-f", "i", "-d", "node2"],
    ["-f", "i", "-s", "fd00::1", "-d", "10.0.0.2"],
    ["-f", "n", "-d", "node2"],
    ["-f", "n", "-s", "node1", "-d", "node[2-3]", "-v"],
    ["-f", "n", "-c", "-s", "node1", "-d", "node3"],
    ["-f", "n", "-d", "nodeX"],
    ["-f", "l", "-d", "2"],
    ["-f", "l", "-s", "1", "-d", "3", "-v"],
    ["-f", "l", "-d", "9"],
    ["-f", "g", "-d", "fe80::2:c903:0:2"],
    ["-f", "g", "-s", "fe80::2:c903:0:1", "-d", "fe80::2:c903:0:3", "-v"],
    ["-f", "g", "-d", "zz"],
    ["-d", "10.0.0.2", "-C", "3"],
    ["-d", "10.0.0.2", "-C", "0"],
    ["-vc", "-d", "10.0.0.3"],
    ["-d", "10.0.0.2", "-P", "col", "-e"],
    ["stray", "-d", "10.0.0.2", "more"],
    ["-V", "-d", "10.0.0.2"],
]


async def both(fake: FakeAcm, args: list[str]) -> tuple[Result, Result]:
    theirs_exe = require_peer("ib_acme")
    full = ["-S", str(fake.path), *args]
    fake.cached.clear()
    theirs = await run_c(theirs_exe, *full)
    fake.cached.clear()
    ours = await run_ours(*full)
    return theirs, ours


@pytest.mark.trio
@pytest.mark.parametrize("args", SAME_ARGS, ids=" ".join)
async def test_same_stdout_and_status(fake: FakeAcm, args: list[str]) -> None:
    theirs, ours = await both(fake, args)
    assert ours.stdout == theirs.stdout
    assert ours.status == theirs.status


@pytest.mark.trio
async def test_same_for_an_unreachable_service(short_dir: Path) -> None:
    theirs_exe = require_peer("ib_acme")
    args = ["-S", str(short_dir / "none.sock"), "-P"]
    theirs, ours = await run_c(theirs_exe, *args), await run_ours(*args)
    assert (ours.stdout, ours.status) == (theirs.stdout, theirs.status)


@pytest.mark.trio
@pytest.mark.parametrize(
    "args",
    [[], ["-s", "10.0.0.1"], ["-P", "s"], ["-f", "x", "-d", "1"], ["-x"], ["-d"]],
    ids=" ".join,
)
async def test_same_usage_errors(short_dir: Path, args: list[str]) -> None:
    theirs = await run_c(require_peer("ib_acme"), *args)
    ours = await run_ours(*args)
    assert ours.status == theirs.status == 1
    # The usage text names the program and lists our extensions; its first block is C's.
    assert (
        ours.stdout.split("usage 2:")[0].split("\n", 1)[1]
        == (theirs.stdout.split("usage 2:")[0].split("\n", 1)[1])
    )


@pytest.mark.trio
async def test_same_address_file_failure_without_devices(tmp_path: Path) -> None:
    theirs_dir, ours_dir = tmp_path / "c", tmp_path / "py"
    theirs = await run_c(require_peer("ib_acme"), "-A", "-D", str(theirs_dir))
    if "no devices present" not in theirs.stdout:
        not_applicable("this machine has verbs devices")
    ours = await run_ours("-A", "-D", str(ours_dir))
    assert (ours.stdout, ours.status) == (theirs.stdout, theirs.status)
    # C leaves the empty file it created (then ibacm starts without an endpoint); we do not.
    assert (theirs_dir / "ibacm_addr.cfg").read_text() == ""
    assert not (ours_dir / "ibacm_addr.cfg").exists()


@pytest.mark.trio
async def test_same_option_file_output(tmp_path: Path) -> None:
    for flags in (["-O"], ["-V", "-O", "x.cfg"]):
        theirs = await run_c(require_peer("ib_acme"), *flags, "-D", str(tmp_path / "c"))
        ours = await run_ours(*flags, "-D", str(tmp_path / "py"))
        assert ours.stdout.replace("/py/", "/c/") == theirs.stdout
        assert ours.status == theirs.status == 0
