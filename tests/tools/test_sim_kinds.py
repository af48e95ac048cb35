"""``ibacm-sim up --c-ibacm/--hw``: node kinds, their errors, and ``down`` leaving nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ibacm.fabric.sim.topo_file import generate
from ibacm.tools import sim_kinds
from ibacm.tools.sim import main as sim_main
from ibacm.tools.sim_kinds import KindError, NodeKind, parse_kinds
from tests.conftest import require_file, require_peer, require_root

NODES = ["node1", "node2", "node3"]


def test_kinds_come_from_the_two_lists() -> None:
    kinds = parse_kinds(NODES, "node1, node3", "node2")
    assert kinds == {"node1": NodeKind.C, "node2": NodeKind.HW, "node3": NodeKind.C}
    assert parse_kinds(NODES, None, "") == dict.fromkeys(NODES, NodeKind.SIM)


@pytest.mark.parametrize(
    ("c_list", "hw_list", "message"),
    [
        ("node9", None, "--c-ibacm: no node 'node9' in this cluster"),
        ("node1", "node1", "--hw: node node1 is already of kind c"),
        (None, "node2,node2", "--hw: node node2 is already of kind hw"),
    ],
)
def test_bad_kind_lists_are_refused(c_list: str | None, hw_list: str | None, message: str) -> None:
    with pytest.raises(KindError, match=message):
        parse_kinds(NODES, c_list, hw_list)


def test_without_the_c_daemon_up_fails_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sim_kinds, "C_DAEMON", tmp_path / "no-such-ibacm")
    root = tmp_path / "cluster"
    code = sim_main(["up", "--nodes", "2", "--dir", str(root), "--c-ibacm", "node1"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and "install the Debian package ibacm" in err
    assert not root.exists()  # nothing was started or written


def test_emulated_nodes_list_their_ip_addresses() -> None:
    text = sim_kinds.addr_text_with_ips(generate(2), "node2")
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == [
        "node2 mlx5_0 1 default",
        "10.0.0.2 mlx5_0 1 default",
        "fd00::2 mlx5_0 1 default",
    ]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_down_stops_c_and_hw_nodes_and_their_devices(tmp_path: Path) -> None:
    require_file(sim_kinds.C_DAEMON)
    require_peer("/usr/bin/python3")
    require_root("C ibacm nodes need a private mount namespace")
    root = tmp_path / "c"
    command = [sys.executable, "-m", "ibacm.tools.sim"]
    up = subprocess.run(
        [*command, "up", "--nodes", "2", "--dir", str(root), "--c-ibacm", "node1", "--hw", "node2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert up.returncode == 0, up.stdout + up.stderr
    pids = json.loads((root / "pids.json").read_text())
    started = [*pids["nodes"].values(), *pids["devices"].values(), pids["hub"]]
    assert len(started) == 5 and all(alive(pid) for pid in started), (pids, up.stdout)
    for node in ("node1", "node2"):
        assert (root / node / "ibacm-unix.sock").exists()
        assert (root / node / "emu.sock").exists()
    # The C node's lock file is its /run/ibacm.pid: the node directory is its /run.
    lock = (root / "node1" / "ibacm.pid").read_text()
    assert int(lock.split()[0]) == pids["nodes"]["node1"], (lock, pids)
    down = subprocess.run(
        [*command, "down", "--dir", str(root)], capture_output=True, text=True, timeout=60
    )
    assert down.returncode == 0, down.stderr
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in started if alive(pid)], (pids, down.stdout)
    left = [*root.rglob("*.sock"), *root.rglob("*.pid")]
    assert not left, left
    # The devices outlive their daemons: ours closes its QPs on a live device, so its
    # shutdown logs no error (with the devices stopped alongside, destroying a QP failed).
    log_lines = (root / "node2" / "ibacm.log").read_text().splitlines()
    records = [json.loads(line) for line in log_lines if line.startswith("{")]
    assert any(record["event"] == "shutting down" for record in records), log_lines[-5:]
    errors = [record for record in records if record["level"] in ("error", "critical")]
    assert not errors, errors


def test_down_also_stops_a_daemon_restarted_by_hand(tmp_path: Path) -> None:
    root = tmp_path / "c"
    command = [sys.executable, "-m", "ibacm.tools.sim"]
    up = subprocess.run(
        [*command, "up", "--nodes", "2", "--dir", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert up.returncode == 0, up.stdout + up.stderr
    recorded = json.loads((root / "pids.json").read_text())["nodes"]["node2"]
    argv = Path(f"/proc/{recorded}/cmdline").read_bytes().split(b"\0")[:-1]
    os.kill(recorded, 15)
    deadline = time.monotonic() + 10
    while alive(recorded) and time.monotonic() < deadline:
        time.sleep(0.05)
    (root / "node2" / "ibacm.pid").unlink(missing_ok=True)
    by_hand = subprocess.Popen(
        [arg.decode() for arg in argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while not (root / "node2" / "ibacm-unix.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        down = subprocess.run(
            [*command, "down", "--dir", str(root)], capture_output=True, text=True, timeout=60
        )
        assert down.returncode == 0, down.stderr
        by_hand.wait(timeout=15)  # stopped by down, found by its run directory
    finally:
        if by_hand.poll() is None:
            by_hand.kill()
            by_hand.wait()
            pytest.fail("ibacm-sim down left the daemon started by hand running")
