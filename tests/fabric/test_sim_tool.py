"""``ibacm-sim up/status/down`` end to end, with real processes (a daemon stand-in).

``fake_ibacm.py`` takes the daemon's command line, joins the fabric through the hub, opens
the client and admin sockets and sends READY=1; the test with the real ``ibacm`` is added
once the daemon exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ibacm.tools.sim import main as sim_main
from tests.conftest import on_terminal, require_file
from tests.fabric.helpers import NET_EXAMPLES

FAKE_DAEMON = Path(__file__).parent / "fake_ibacm.py"


def sim(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ibacm.tools.sim", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def daemon_cmd() -> str:
    return f"{sys.executable} {FAKE_DAEMON}"


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def leftovers(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.suffix in (".sock", ".pid") or p.name == "pids.json"
    )


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """A command that starts no process, run in-process (fast): (exit status, stdout)."""
    code = sim_main(list(args))
    return code, capsys.readouterr().out


def status(capsys: pytest.CaptureFixture[str], root: Path) -> tuple[int, dict[str, Any]]:
    code, out = run(capsys, "status", "--dir", str(root), "--json")
    return code, json.loads(out)


def test_up_status_down(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "cluster"
    up = sim(
        "up",
        "--nodes",
        "3",
        "--dir",
        str(root),
        "--daemon-cmd",
        daemon_cmd(),
        "--route-prot",
        "acm",
        "--loss",
        "0.01",
    )
    assert up.returncode == 0, up.stderr
    assert "3 node(s) up" in up.stdout
    try:
        code, report = status(capsys, root)
        assert code == 0
        assert report["hub"]["state"] == "running" and alive(report["hub"]["pid"])
        nodes = {n["name"]: n for n in report["nodes"]}
        assert list(nodes) == ["node1", "node2", "node3"]
        node2 = nodes["node2"]
        assert (node2["lid"], node2["ipv4"], node2["ipv6"]) == (3, ["10.0.0.2"], ["fd00::2"])
        assert node2["gid"].startswith("fe80::")
        assert node2["socket"] == str(root / "node2" / "ibacm-unix.sock")
        assert node2["admin_socket"] == str(root / "node2" / "ibacm-admin.sock")
        assert all(n["state"] == "running" and alive(n["pid"]) for n in nodes.values())
        opts = (root / "node2" / "ibacm_opts.cfg").read_text()
        for line in (
            f"run_dir {root / 'node2'}",
            f"lock_file {root / 'node2' / 'ibacm.pid'}",
            f"log_file {root / 'node2' / 'ibacm.log'}",
            "route_prot acm",
            f"admin_socket {root / 'node2' / 'ibacm-admin.sock'}",
        ):
            assert line in opts.splitlines()
        assert "node2 mlx5_0 1 default" in (root / "node2" / "ibacm_addr.cfg").read_text()
        # The stand-in daemon really joined the fabric through the hub.
        assert "mlx5_0 port 1 ACTIVE lid 3" in (root / "node2" / "ibacm.log").read_text()
        code, table = run(capsys, "status", "--dir", str(root))
        assert code == 0 and "node3  sim   4 " in table
        hosts = run(capsys, "hosts", "--dir", str(root))[1]
        assert "10.0.0.3 " + nodes["node3"]["gid"] in hosts.splitlines()
        assert run(capsys, "fault", "--dir", str(root), "loss", "0.25")[1].startswith("loss 0.25")
        assert "SM LID 2" in run(capsys, "stats", "--dir", str(root))[1]
        again = sim("up", "--nodes", "3", "--dir", str(root), "--daemon-cmd", daemon_cmd())
        assert again.returncode == 1 and "already up" in again.stderr
    finally:
        down = sim("down", "--dir", str(root))
    assert down.returncode == 0, down.stderr
    assert not alive(report["hub"]["pid"])
    assert not any(alive(n["pid"]) for n in report["nodes"])
    assert leftovers(root) == []
    assert (root / "node1" / "ibacm.log").exists()  # logs and configuration stay
    code, after = status(capsys, root)
    assert code == 1 and {n["state"] for n in after["nodes"]} == {"down"}


def test_a_daemon_that_dies_fails_up_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topology = require_file(NET_EXAMPLES / "net.2sw2path4hca")
    root = tmp_path / "c"
    env = dict(os.environ, FAKE_IBACM_FAIL="Hca2")
    up = sim(
        "up", "--topology", str(topology), "--dir", str(root), "--daemon-cmd", daemon_cmd(), env=env
    )
    assert up.returncode == 1
    assert "Hca2 exited with status 3 before it was ready" in up.stderr
    assert "failing on purpose" in up.stderr  # the tail of its log
    pids = json.loads((root / "topology.json").read_text())  # the topology stays
    assert [h["name"] for h in pids["hosts"]] == ["Hca1", "Hca2", "Hca3", "Hca4"]
    assert leftovers(root) == []
    code, report = status(capsys, root)
    assert code == 1 and report["hub"]["state"] == "down"


def test_bad_arguments_are_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # These fail before anything is started, so they run in-process.
    def fails(*args: str) -> str:
        assert sim_main(list(args)) == 1
        return capsys.readouterr().err

    assert "--nodes N or --topology FILE" in fails("up", "--dir", str(tmp_path / "x"))
    assert "probability" in fails("up", "--nodes", "2", "--dir", str(tmp_path / "x"), "--loss", "3")
    assert "no simulated cluster" in fails("status", "--dir", str(tmp_path / "nothing"))
    assert "cannot reach the simulator hub" in fails(
        "fault", "--dir", str(tmp_path / "nothing"), "loss", "0.1"
    )
    deep = tmp_path / ("d" * 120)
    assert "longer than a unix socket path" in fails(
        "up", "--nodes", "1", "--dir", str(deep), "--daemon-cmd", daemon_cmd()
    )
    assert "cannot read topology" in fails(
        "up", "--topology", str(tmp_path / "missing.net"), "--dir", str(tmp_path / "y")
    )


def test_a_timeout_names_the_node_that_is_really_not_ready(tmp_path: Path) -> None:
    """node2 serves but its READY=1 is lost, node3 hangs: up blames node3 (it blamed the first
    pending node, which was serving)."""
    root = tmp_path / "t"
    env = dict(os.environ, FAKE_IBACM_SILENT="node2", FAKE_IBACM_HANG="node3")
    up = sim(
        "up", "--nodes", "4", "--dir", str(root), "--daemon-cmd", daemon_cmd(), "--timeout", "8",
        env=env,
    )  # fmt: skip
    assert up.returncode == 1
    assert "1 process(es) not ready after 8 s, first node3" in up.stderr, up.stderr
    assert "hanging on purpose" in up.stderr  # the tail of its log
    assert leftovers(root) == []


def test_up_shows_progress_on_a_terminal(tmp_path: Path) -> None:
    root = tmp_path / "p"
    try:
        up, shown = on_terminal(
            [sys.executable, "-m", "ibacm.tools.sim", "up", "--nodes", "5", "--dir", str(root),
             "--daemon-cmd", daemon_cmd()]
        )  # fmt: skip
    finally:
        sim("down", "--dir", str(root))
    assert up.returncode == 0, shown
    assert "5 node(s) up" in up.stdout
    text = shown.decode()
    assert "ibacm-sim: hub 1/1 ready" in text and "ibacm-sim: nodes 5/5 ready" in text
