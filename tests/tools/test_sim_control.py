"""``ibacm-sim`` against real clusters of real ``ibacm`` daemons (2 to 4 nodes, in tmp dirs).

Stopping (``down`` counts exactly what it killed and waits while daemons keep stopping), one
node's ``stop``/``start``/``restart``, ``status`` with each daemon's command and a daemon
started by hand, progress lines on stderr with or without a terminal, ``--json`` everywhere,
``--version`` and a closed pipe.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ibacm import __version__
from ibacm.fabric.sim.faults import Faults
from ibacm.tools import sim_procs
from tests.conftest import ibacm_sim, on_terminal, require_file, require_peer, require_root

FAKE_DAEMON = Path(__file__).resolve().parent.parent / "fabric" / "fake_ibacm.py"
C_DAEMON = Path("/usr/sbin/ibacm")


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def wait_for(check: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@dataclass
class Cluster:
    directory: Path

    def sim(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = ibacm_sim(*args, "--dir", str(self.directory))
        if check:
            assert done.returncode == 0, done.stdout + done.stderr
        return done

    def status(self) -> dict[str, Any]:
        report: dict[str, Any] = json.loads(self.sim("status", "--json", check=False).stdout)
        return report

    def node(self, name: str) -> dict[str, Any]:
        return next(n for n in self.status()["nodes"] if n["name"] == name)

    def pid(self, name: str) -> int:
        return int(self.node(name)["pid"])

    def socket(self, name: str) -> str:
        return str(self.directory / name / "ibacm-unix.sock")


@contextlib.contextmanager
def cluster(nodes: int, *extra: str) -> Iterator[Cluster]:
    # A short directory: unix socket paths must fit in 108 bytes.
    directory = Path(tempfile.mkdtemp(prefix="simc"))
    up = ibacm_sim("up", "--nodes", str(nodes), "--dir", str(directory / "c"), *extra)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield Cluster(directory / "c")
    finally:
        ibacm_sim("down", "--dir", str(directory / "c"), "--grace", "2")
        shutil.rmtree(directory, ignore_errors=True)


def stopped_cleanly(cluster: Cluster, node: str) -> bool:
    """The daemon logged the end of its shutdown (a SIGKILLed one cannot)."""
    return '"event": "ibacm stopped"' in (cluster.directory / node / "ibacm.log").read_text()


def resolve(
    ib_acme: str, cluster: Cluster, source: str, dest: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ib_acme, "-S", cluster.socket(source), "-f", "n", "-s", source, "-d", dest, "-v"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_version() -> None:
    done = ibacm_sim("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"ibacm-sim {__version__}"


# -- down ---------------------------------------------------------------------------------


def test_down_kills_only_the_daemon_that_ignores_sigterm_and_says_so() -> None:
    """node2's daemon is SIGSTOPped (SIGTERM stays pending), the others stop cleanly: down
    reports "killed 1" naming node2 (it reported every daemon still alive at one instant),
    and without a terminal prints a progress line every few seconds."""
    with cluster(3) as c:
        pids = {name: c.pid(name) for name in ("node1", "node2", "node3")}
        os.kill(pids["node2"], signal.SIGSTOP)
        down = c.sim("down", "--grace", "4")
        assert "stopped 3 node(s)" in down.stdout
        assert "killed 1 " in down.stdout and down.stdout.rstrip().endswith(": node2"), down.stdout
        lines = down.stderr.splitlines()
        assert "ibacm-sim: nodes 2/3 stopped" in lines, down.stderr
        assert lines[-1] == "ibacm-sim: nodes 3/3 stopped", down.stderr
        assert not any(running(pid) for pid in pids.values())
        for name in ("node1", "node3"):  # they shut down by themselves
            assert stopped_cleanly(c, name)
        assert not stopped_cleanly(c, "node2")


def test_down_waits_while_daemons_keep_stopping() -> None:
    """Together the daemons take longer than --grace to stop after SIGTERM, but one stops
    every 1.5 s: none is killed (a cluster stopping together shares the CPU; down SIGKILLed
    daemons in the middle of a clean shutdown)."""
    with cluster(3) as c:
        pids = [c.pid(name) for name in ("node1", "node2", "node3")]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)

        def resume_one_by_one() -> None:
            for pid in pids:
                time.sleep(1.5)
                os.kill(pid, signal.SIGCONT)

        resumer = threading.Thread(target=resume_one_by_one)
        resumer.start()
        try:
            down = c.sim("down", "--grace", "3")
        finally:
            resumer.join()
        assert "stopped 3 node(s)" in down.stdout and "killed" not in down.stdout, down.stdout
        assert not any(running(pid) for pid in pids)
        assert all(stopped_cleanly(c, name) for name in ("node1", "node2", "node3"))


def test_down_shows_progress_on_a_terminal() -> None:
    with cluster(2) as c:
        os.kill(c.pid("node1"), signal.SIGSTOP)
        down, shown = on_terminal(
            [sys.executable, "-m", "ibacm.tools.sim", "down", "--dir", str(c.directory),
             "--grace", "3"]
        )  # fmt: skip
        assert down.returncode == 0 and "killed 1 " in down.stdout, down.stdout
        text = shown.decode()
        assert "ibacm-sim: nodes 1/2 stopped" in text and "nodes 2/2 stopped" in text, text


# -- one node -----------------------------------------------------------------------------


@pytest.mark.peer
def test_stop_start_restart_a_node() -> None:
    ib_acme = require_peer("ib_acme")
    with cluster(3) as c:
        first = c.pid("node2")
        assert "return status 0x0" in resolve(ib_acme, c, "node2", "node3").stdout
        stop = c.sim("stop", "node2")
        assert stop.stdout.strip() == f"ibacm-sim: stopped node2 (pid {first})"
        assert not running(first)
        assert c.node("node2")["state"] == "stopped"
        assert c.sim("status", check=False).returncode == 1
        assert resolve(ib_acme, c, "node2", "node3").returncode != 0
        assert "node2 was not running" in c.sim("stop", "node2").stdout

        start = c.sim("start", "node2")
        second = c.pid("node2")
        assert start.stdout.strip() == f"ibacm-sim: started node2 (pid {second})"
        assert second != first and c.node("node2")["state"] == "running"
        assert "return status 0x0" in resolve(ib_acme, c, "node2", "node3").stdout
        again = c.sim("start", "node2", check=False)
        assert again.returncode == 1
        assert f"node2 is already running (pid {second})" in again.stderr

        restart = c.sim("restart", "node2")
        third = c.pid("node2")
        assert restart.stdout.splitlines() == [
            f"ibacm-sim: stopped node2 (pid {second})",
            f"ibacm-sim: started node2 (pid {third})",
        ]
        assert third != second and not running(second)
        assert "return status 0x0" in resolve(ib_acme, c, "node2", "node3").stdout
        # And the others still find node2 at its address.
        assert "return status 0x0" in resolve(ib_acme, c, "node1", "node2").stdout
        unknown = c.sim("restart", "node9", check=False)
        assert unknown.returncode == 1 and "node9" in unknown.stderr


@pytest.mark.peer
def test_status_shows_commands_and_a_daemon_started_by_hand() -> None:
    ib_acme = require_peer("ib_acme")
    with cluster(2) as c:
        before = c.node("node2")
        command = before["command"]
        assert "--sim-node" in command and "node2" in command
        assert str(c.directory / "node2" / "ibacm_opts.cfg") in command
        assert before["started_by_sim"] is True
        # An operator stops the daemon and starts it by hand, with the command status shows.
        os.kill(before["pid"], signal.SIGTERM)
        wait_for(lambda: not running(before["pid"]), "node2's daemon to stop")
        stopped = c.node("node2")
        assert stopped["state"] == "stopped" and stopped["command"] == command
        by_hand = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            wait_for(lambda: c.node("node2")["state"] == "running", "node2 to serve")
            node = c.node("node2")
            assert node["pid"] == by_hand.pid and node["started_by_sim"] is False
            assert node["command"] == command
            table = c.sim("status")  # exit status 0: every node runs
            assert f" {by_hand.pid} " in table.stdout and "running" in table.stdout
            assert "node2  runs (started by hand): " in table.stdout
            assert "return status 0x0" in resolve(ib_acme, c, "node1", "node2").stdout
            down = c.sim("down")
            assert "stopped 2 node(s)" in down.stdout and "killed" not in down.stdout
            assert by_hand.wait(timeout=30) == 0
        finally:
            if by_hand.poll() is None:
                by_hand.kill()
                by_hand.wait()


# -- up -----------------------------------------------------------------------------------


def test_up_prints_progress_lines_without_a_terminal(tmp_path: Path) -> None:
    """node3 hangs: every few seconds a line says how many are ready."""
    env = dict(os.environ, FAKE_IBACM_HANG="node3")
    up = subprocess.run(
        [sys.executable, "-m", "ibacm.tools.sim", "up", "--nodes", "4", "--dir",
         str(tmp_path / "p"), "--daemon-cmd", f"{sys.executable} {FAKE_DAEMON}",
         "--timeout", "8"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert up.returncode == 1
    progress = [line for line in up.stderr.splitlines() if "ready" in line and "/4" in line]
    assert progress and set(progress) == {"ibacm-sim: nodes 3/4 ready"}, up.stderr
    assert len(progress) >= 2  # 8 s: a line every 3 s


def test_up_help_says_c_nodes_run_with_systemd() -> None:
    text = " ".join(ibacm_sim("up", "--help").stdout.split())
    assert "--c-ibacm" in text and "--systemd" in text and "server_mode unix" in text


@pytest.mark.peer
def test_a_c_node_ignores_server_mode_and_restarts(tmp_path: Path) -> None:
    """node1 runs rdma-core's C ibacm: up warns that server_mode loop does not reach it, and
    it indeed listens on its unix socket only while our node2 has its TCP port. Restarted,
    it finds its emulated HCA again (stop removed the device's socket)."""
    ib_acme = require_peer("ib_acme")
    require_file(C_DAEMON)
    require_root("C ibacm nodes need a private mount namespace")
    opts = tmp_path / "opts"
    opts.write_text("server_mode loop\n")
    directory = Path(tempfile.mkdtemp(prefix="simw"))
    try:
        up = ibacm_sim(
            "up", "--nodes", "2", "--dir", str(directory), "--c-ibacm", "node1",
            "--opts", str(opts),
        )  # fmt: skip
        assert up.returncode == 0, up.stderr
        assert (
            "warning: server_mode loop (--opts) does not reach the --c-ibacm node(s) node1"
            in up.stderr
        )
        report = json.loads(ibacm_sim("status", "--dir", str(directory), "--json").stdout)
        listening = {n["name"]: n["listening"] for n in report["nodes"]}
        assert not any(item.startswith("127.0.0.1:") for item in listening["node1"])
        assert any(item.startswith("127.0.0.1:") for item in listening["node2"])
        restart = ibacm_sim("restart", "--dir", str(directory), "node1")
        assert restart.returncode == 0, restart.stderr
        c = Cluster(directory)
        assert c.node("node1")["state"] == "running"
        assert "return status 0x0" in resolve(ib_acme, c, "node1", "node2").stdout
    finally:
        ibacm_sim("down", "--dir", str(directory), "--grace", "2")
        shutil.rmtree(directory, ignore_errors=True)


# -- JSON ---------------------------------------------------------------------------------


@pytest.mark.peer
def test_hosts_routes_fault_and_stats_as_json() -> None:
    ib_acme = require_peer("ib_acme")
    with cluster(3) as c:
        status = {n["name"]: n for n in c.status()["nodes"]}
        hosts = json.loads(c.sim("hosts", "--json").stdout)
        assert {"address": "10.0.0.2", "type": "IP", "gid": status["node2"]["gid"]} in hosts
        assert {"address": "node3", "type": "NAME", "gid": status["node3"]["gid"]} in hosts
        assert {"address": "fd00::1", "type": "IP6", "gid": status["node1"]["gid"]} in hosts

        routes = json.loads(c.sim("routes", "--json").stdout)
        lids = sorted(n["lid"] for n in status.values())
        node2 = next(r for r in routes if r["lid"] == status["node2"]["lid"])
        assert node2["node_type"] == "Channel Adapter" and node2["port"] == 1
        assert node2["guid"].startswith("0x") and len(node2["guid"]) == 18
        assert set(lids) <= {path["dlid"] for path in node2["paths"]}
        assert set(node2["paths"][0]) == {"dlid", "sl", "mtu", "rate"}

        faults = json.loads(c.sim("fault", "--json").stdout)
        assert set(faults) == set(Faults().as_dict())
        changed = json.loads(c.sim("fault", "--json", "loss", "0.25").stdout)
        assert changed["loss"] == 0.25
        assert json.loads(c.sim("fault", "--json").stdout)["loss"] == 0.25
        c.sim("fault", "loss", "0")

        assert "return status 0x0" in resolve(ib_acme, c, "node1", "node3").stdout
        stats = json.loads(c.sim("stats", "--json").stdout)
        assert stats["counters"], stats
        for counter in stats["counters"]:
            assert set(counter) == {"class", "method", "attribute", "count"}
        # The resolution went through the SA (path record GET) or the ACM class.
        assert any(k["class"] in (0x03, 0x2C) and k["count"] > 0 for k in stats["counters"])
        text = c.sim("stats").stdout
        first = stats["counters"][0]
        assert f"class 0x{first['class']:02x} method 0x{first['method']:02x}" in text
        # Without a hub, hosts and routes come from the topology.
        c.sim("down")
        assert json.loads(c.sim("hosts", "--json").stdout) == hosts
        assert json.loads(c.sim("routes", "--json").stdout) == routes


@pytest.mark.parametrize("buffered", [True, False])
def test_output_into_a_closed_pipe_ends_quietly(buffered: bool) -> None:
    """``ibacm-sim stats --json | head``: the reader goes away, nothing is printed on stderr,
    whether the output fails as it is written or when the buffer is flushed at the end."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    with cluster(2) as c:
        for args in (("stats", "--json"), ("routes", "--json"), ("status",), ("fault",)):
            reader, writer = os.pipe()
            os.close(reader)  # the reader is gone before anything is written
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "ibacm.tools.sim", *args, "--dir", str(c.directory)],
                    stdout=writer, stderr=subprocess.PIPE, text=True, timeout=60, env=env,
                )  # fmt: skip
            finally:
                os.close(writer)
            assert done.stderr == "", (args, done.stderr)
            assert done.returncode == 141, args


def test_a_lock_file_names_its_holder_not_a_stale_pid(tmp_path: Path) -> None:
    """status, stop and down take a node's daemon from the lock it holds on ibacm.pid; the
    pid written in a file no one holds may belong to anything by now."""
    lock = tmp_path / "ibacm.pid"
    lock.write_text(f"{os.getpid()}\n")  # stale: a live pid, but no lock
    assert sim_procs.lock_holder(lock) is None
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
         "fcntl.lockf(fd, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()",
         str(lock)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        assert sim_procs.lock_holder(lock) == holder.pid
    finally:
        holder.kill()
        holder.wait()
    assert sim_procs.lock_holder(lock) is None
    assert sim_procs.lock_holder(tmp_path / "missing.pid") is None
