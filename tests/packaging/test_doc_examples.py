"""Every command example of the README and the man pages runs as written on a simulated
cluster (a new or edited example is picked up from the files themselves).

ib_acme examples without ``-S`` run as on node1 (``ibacm-sim exec``: its ``/run``); the
cluster lives where the examples say (``/tmp/sim``), moved to a scratch directory.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, ibacm_sim, in_ci, require_peer, require_root

pytestmark = [pytest.mark.peer]

MAN = REPO / "packaging" / "man"
BIN = Path(sys.executable).parent
NODES = 9  # ib_acme(1) resolves up to node9
EXCLUDED = {
    "ib_acme -S localhost -P all": "needs a daemon in loop mode on this host",
    "ib_acme -A -O -D .": "-A needs InfiniBand devices on this host",
    "ibacm-tui": "interactive (the dashboard has its own tests)",
    "ibacm -P": "starts a daemon in the foreground (ibacm-sim starts the same command)",
    "ibacm-sim up": "the cluster is up already (the test starts it the same way)",
    "ibacm-sim down": "run by the test at the end",
    "sudo .venv/bin/ibacm-sim up": "the cluster is up already",
}


def man_examples(page: Path) -> list[str]:
    text = page.read_text()
    lines = []
    for block in re.findall(r"^\.EX\n(.*?)^\.EE", text, re.S | re.M):
        joined = block.replace("\\e\n", " ")
        for line in joined.splitlines():
            command = line.replace("\\-", "-").replace("\\e", "\\").strip()
            if re.match(r"^(ib_acme|ibacm-sim|ibacm-tui|ibacm)\b", command):
                lines.append(command)
    return lines


def readme_examples() -> list[str]:
    section = (REPO / "README.md").read_text().split("## Running it by hand", 1)[1]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def all_examples() -> list[str]:
    found = readme_examples()
    for page in sorted(MAN.glob("*.[178]")):
        found += man_examples(page)
    return found


def excluded(command: str) -> str | None:
    plain = command.removeprefix(".venv/bin/").removeprefix("sudo ")
    plain = plain.replace(".venv/bin/", "")
    for prefix, reason in EXCLUDED.items():
        if plain.startswith(prefix.replace(".venv/bin/", "")):
            return reason
    return None


@pytest.fixture(scope="module")
def cluster() -> Iterator[Path]:
    require_peer("ib_acme")
    if in_ci():
        require_root("examples without -S run in a private mount namespace")
    root = Path(tempfile.mkdtemp(prefix="docs"))
    up = ibacm_sim("up", "--nodes", str(NODES), "--dir", str(root))
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield root
    finally:
        ibacm_sim("down", "--dir", str(root))
        shutil.rmtree(root, ignore_errors=True)


def test_the_examples_are_found() -> None:
    found = all_examples()
    assert any(c.startswith("ib_acme -f n -d node2") for c in found), found
    assert any("ibacm-sim exec" in c for c in found), found
    assert len(found) >= 12


def test_readme_by_hand_block_runs_as_root_without_sudo() -> None:
    # A root shell (the test command's, a container's) has no sudo to run.
    section = (REPO / "README.md").read_text().split("## Running it by hand", 1)[1]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    assert "sudo" not in block
    assert any("ibacm-sim exec" in line and "# as root" in line for line in block.splitlines())


@pytest.mark.parametrize("command", [c for c in all_examples() if excluded(c) is None])
def test_example_runs_as_written(cluster: Path, command: str) -> None:
    words = shlex.split(command.replace("/tmp/sim", str(cluster)))
    if words[0] == "sudo":
        words = words[1:]  # the tests run as root
    words[0] = str(BIN / Path(words[0]).name)
    on_the_node = words[0].endswith("ib_acme") and "-S" not in words
    on_the_node |= words[0].endswith("ibacm-admin") and not {"--dir", "--admin"} & set(words)
    if on_the_node:
        words = [str(BIN / "ibacm-sim"), "exec", "--dir", str(cluster), "node1", "--", *words]
    done = subprocess.run(words, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
    if "ib_acme" in command and "-d" in words:
        assert "Path information" in done.stdout and "return status 0x0" in done.stdout
