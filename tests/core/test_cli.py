"""The ``ibacm`` command as a process: arguments, lock file, no device, and full runs on the
simulated fabric (served by a hub in the test process) with signals, sd_notify, daemonizing
and systemd socket activation."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from ibacm.fabric.sim.hub import serve_hub
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire.client import EpConfig, decode_ep_reply, encode_ep_request
from tests.conftest import not_applicable_if
from tests.core.support import AcmClient

IBACM = [sys.executable, "-m", "ibacm.core.cli"]
START_TIMEOUT = 30


def write_opts(tmp_path: Path, *extra: str) -> Path:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    opts = tmp_path / "ibacm_opts.cfg"
    lines = [
        f"log_file {tmp_path / 'ibacm.log'}",
        f"lock_file {run / 'ibacm.pid'}",
        f"run_dir {run}",
        "log_level 2",
        *extra,
    ]
    opts.write_text("\n".join(lines) + "\n")
    return opts


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*IBACM, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_usage_errors_exit_1_with_usage_on_stdout() -> None:
    result = run_cli("-X")
    assert result.returncode == 1
    assert result.stdout.startswith("usage: ibacm")
    result = run_cli("--fabric", "sim")
    assert result.returncode == 1
    assert "--sim-hub" in result.stdout


def test_version() -> None:
    result = run_cli("--version")
    assert (result.returncode, result.stdout.strip()) == (0, "ibacm 0.1.0")


def _has_infiniband() -> bool:
    path = Path("/sys/class/infiniband")
    return path.is_dir() and any(path.iterdir())


@not_applicable_if(_has_infiniband(), "this machine has InfiniBand devices")
@pytest.mark.parametrize("foreground", [True, False])
def test_no_device_is_one_line_and_exit_1(tmp_path: Path, foreground: bool) -> None:
    opts = write_opts(tmp_path)
    result = run_cli(*(["-P"] if foreground else []), "-O", str(opts))
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ibacm: no InfiniBand device found")
    assert "ibacm-sim up --nodes 4 --dir /tmp/ibacm-sim" in lines[0]
    assert not (tmp_path / "run" / "ibacm.pid").exists()


def test_lock_file_held_exits_255(tmp_path: Path) -> None:
    opts = write_opts(tmp_path)
    lock = tmp_path / "run" / "ibacm.pid"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o640)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{os.getpid()}\n".encode())
        result = run_cli("-P", "-O", str(opts))
    finally:
        os.close(fd)
    assert result.returncode == 255
    assert "another ibacm is already running" in result.stderr
    assert f"pid {os.getpid()}" in result.stderr


# -- full runs on the simulated fabric ---------------------------------------------------------


@dataclass
class Sim:
    world: SimWorld
    hub: str
    notify: trio.socket.SocketType
    notify_name: str


@contextlib.asynccontextmanager
async def simulated(tmp_path: Path) -> AsyncIterator[Sim]:
    world = SimWorld(generate(2))
    notify = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"@ibacm-test-notify-{os.getpid()}-{id(notify)}"
    await notify.bind(b"\0" + name[1:].encode())
    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        hub = await nursery.start(serve_hub, world, str(tmp_path / "hub.sock"))
        try:
            with notify:
                yield Sim(world, hub, notify, name)
        finally:
            nursery.cancel_scope.cancel()


async def notified(sim: Sim, key: str) -> str:
    """Wait for an sd_notify datagram containing ``key`` (e.g. READY=1)."""
    with trio.fail_after(START_TIMEOUT):
        while True:
            message = (await sim.notify.recv(4096)).decode()
            if key in message.split("\n"):
                return message


def sim_args(sim: Sim, tmp_path: Path, opts: Path) -> list[str]:
    return [
        "--fabric",
        "sim",
        "--sim-hub",
        sim.hub,
        "--sim-node",
        "node1",
        "-O",
        str(opts),
        "-A",
        str(tmp_path / "ibacm_addr.cfg"),
    ]


async def ep_config(path: str) -> EpConfig:
    client = await AcmClient.unix(path)
    try:
        hdr, config = decode_ep_reply(await client.request(encode_ep_request(1)))
    finally:
        await client.aclose()
    assert hdr.status == 0 and config is not None
    return config


async def until(check: Callable[[], bool], timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        while not check():
            await trio.sleep(0.05)


async def until_addresses(path: str, wanted: Sequence[str], timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        while (await ep_config(path)).addrs != list(wanted):
            await trio.sleep(0.05)


def env_with(sim: Sim) -> dict[str, str]:
    env = dict(os.environ, NOTIFY_SOCKET=sim.notify_name)
    env.pop("LISTEN_FDS", None)
    env.pop("LISTEN_PID", None)
    return env


@pytest.mark.trio
async def test_foreground_run_reload_and_clean_stop(tmp_path: Path) -> None:
    opts = write_opts(tmp_path)
    addr = tmp_path / "ibacm_addr.cfg"
    addr.write_text("node1 mlx5_0 1 default\nold-name mlx5_0 1 default\n")
    run = tmp_path / "run"
    log = tmp_path / "ibacm.log"
    async with simulated(tmp_path) as sim:
        process = await trio.lowlevel.open_process(
            [*IBACM, "-P", *sim_args(sim, tmp_path, opts)],
            env=env_with(sim),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            ready = await notified(sim, "READY=1")
            assert f"MAINPID={process.pid}" in ready.split("\n")
            assert (run / "ibacm.pid").read_text() == f"{process.pid}\n"
            assert os.readlink(run / "ibacm.sock") == "ibacm-unix.sock"
            sock = str(run / "ibacm-unix.sock")
            config = await ep_config(sock)
            assert config.addrs == ["10.0.0.1/16", "fd00::1/64", "node1", "old-name"]
            # An address event travels from the fabric through the hub.
            sim.world.add_address("node1", "ib0", "10.0.9.1/16")
            wanted = ["10.0.0.1/16", "fd00::1/64", "node1", "old-name", "10.0.9.1"]
            await until_addresses(sock, wanted)
            # SIGHUP: the log is reopened, the address file re-read, clients stay connected.
            kept = await AcmClient.unix(sock)
            log.rename(tmp_path / "ibacm.log.1")
            addr.write_text("node1 mlx5_0 1 default\nnew-name mlx5_0 1 default\n")
            process.send_signal(signal.SIGHUP)
            wanted = ["10.0.0.1/16", "fd00::1/64", "node1", "new-name", "10.0.9.1"]
            await until_addresses(sock, wanted)
            await until(log.exists)
            assert decode_ep_reply(await kept.request(encode_ep_request(1)))[0].status == 0
            await kept.aclose()
            process.send_signal(signal.SIGTERM)
            await notified(sim, "STOPPING=1")
            with trio.fail_after(15):
                assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert sorted(p.name for p in run.iterdir()) == []
    text = log.read_text()
    assert '"event": "shutting down"' in text and "reloaded" in text


@pytest.mark.trio
async def test_daemonized_run(tmp_path: Path) -> None:
    opts = write_opts(tmp_path)
    (tmp_path / "ibacm_addr.cfg").write_text("node1 mlx5_0 1 default\n")
    run = tmp_path / "run"
    async with simulated(tmp_path) as sim:
        with trio.fail_after(START_TIMEOUT):
            result = await trio.run_process(
                [*IBACM, *sim_args(sim, tmp_path, opts)],
                env=env_with(sim),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        # The command returns once the daemon serves.
        assert (result.returncode, result.stderr) == (0, b"")
        pid = int((run / "ibacm.pid").read_text())
        try:
            assert (await ep_config(str(run / "ibacm-unix.sock"))).addrs[-1] == "node1"
            # A session of its own, whose leader (the first child) is gone: it can never
            # acquire a controlling terminal again.
            assert os.getsid(pid) not in (os.getsid(0), pid)
        finally:
            os.kill(pid, signal.SIGTERM)
        await until(lambda: not (run / "ibacm.pid").exists(), timeout=15)
    assert sorted(p.name for p in run.iterdir()) == []


# Like systemd: the socket becomes fd 3 and LISTEN_PID names the process that gets it.
ACTIVATE = """
import os, sys
fd = int(sys.argv[1])
if fd != 3:
    os.dup2(fd, 3)
    os.close(fd)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1", LISTEN_FDNAMES="ibacm.socket")
os.execv(sys.argv[2], sys.argv[2:])
"""


def activated(fd: int, command: list[str]) -> list[str]:
    return [sys.executable, "-c", ACTIVATE, str(fd), *command]


@pytest.mark.trio
async def test_systemd_socket_activation(tmp_path: Path) -> None:
    opts = write_opts(tmp_path, "server_mode loop")  # --systemd forces unix mode anyway
    (tmp_path / "ibacm_addr.cfg").write_text("node1 mlx5_0 1 default\n")
    run = tmp_path / "run"
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = str(run / "activated.sock")
    listening.bind(path)
    listening.listen(16)
    fd = listening.fileno()
    async with simulated(tmp_path) as sim:
        process = await trio.lowlevel.open_process(
            activated(fd, [*IBACM, "--systemd", *sim_args(sim, tmp_path, opts)]),
            env=env_with(sim),
            pass_fds=(fd,),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        listening.close()
        try:
            ready = await notified(sim, "READY=1")
            assert f"MAINPID={process.pid}" in ready.split("\n")
            assert (await ep_config(path)).addrs[-1] == "node1"
            # systemd owns the socket's names: no symlink, no socket of our own, no port file.
            names = sorted(p.name for p in run.iterdir())
            assert names == ["activated.sock", "ibacm-admin.sock", "ibacm.pid"]
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(15):
                assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert sorted(p.name for p in run.iterdir()) == ["activated.sock"]


def test_systemd_rejects_a_socket_that_is_not_listening(tmp_path: Path) -> None:
    opts = write_opts(tmp_path)
    left, right = socket.socketpair()
    with left, right:
        fd = left.fileno()
        result = subprocess.run(
            activated(fd, [*IBACM, "--systemd", "-O", str(opts)]),
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1
    assert "neither a listening stream socket nor a netlink socket" in result.stderr


@pytest.mark.parametrize("foreground", [True, False])
def test_invalid_values_stop_the_daemon_at_start_with_each_line(
    tmp_path: Path, foreground: bool
) -> None:
    opts = write_opts(tmp_path, "mystery_key 1", "timeout banana", "retries -5")
    result = run_cli(*(["-P"] if foreground else []), "-O", str(opts))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"ibacm: {opts}:6: timeout value 'banana' is not a number (accepted: an integer); "
        "the C daemon would silently use 0 (atoi)",
        f"ibacm: {opts}:7: retries value -5 is below 0 and would not work (accepted: 0..); "
        "the C daemon would use -5",
        "ibacm: 2 invalid settings; not started",  # two lines, two settings
    ]
    assert not (tmp_path / "run" / "ibacm.pid").exists()


def test_an_unknown_key_alone_does_not_stop_the_daemon(tmp_path: Path) -> None:
    # It may belong to another provider: the daemon goes on (here to find no device).
    result = run_cli("-P", "-O", str(write_opts(tmp_path, "mystery_key 1")))
    assert "invalid setting" not in result.stderr
