"""A simulated fabric hub in its own process, and private files for real ibacm daemons on it.

The operations tests run the real ``ibacm`` command (the console script of the test
environment) the way systemd, init scripts and logrotate run it, so they need a fabric with
ports: the simulator's hub (``python -m ibacm.fabric.sim.hub``), shared by every test of a
module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent
IBACM = BIN / "ibacm"
HUB_START_TIMEOUT = 30.0


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


@dataclass(frozen=True)
class Hub:
    directory: Path
    process: subprocess.Popen[bytes]

    @property
    def socket(self) -> Path:
        return self.directory / "hub.sock"


@contextlib.contextmanager
def running_hub(directory: Path, nodes: int) -> Iterator[Hub]:
    """Start a hub for ``node1..nodeN`` and stop it (SIGTERM) afterwards."""
    log = (directory / "hub.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ibacm.fabric.sim.hub",
            "--dir",
            str(directory),
            "--nodes",
            str(nodes),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    hub = Hub(directory, process)
    try:

        def up() -> bool:
            if process.poll() is not None:
                raise AssertionError(
                    f"the simulator hub exited with {process.returncode}: "
                    f"{(directory / 'hub.log').read_text(errors='replace')}"
                )
            return hub.socket.exists()

        wait_for(up, HUB_START_TIMEOUT, "the simulator hub socket")
        yield hub
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@dataclass(frozen=True)
class NodeFiles:
    """Everything one daemon writes or reads, inside one directory."""

    node: str
    directory: Path
    hub: Hub

    @property
    def options(self) -> Path:
        return self.directory / "ibacm_opts.cfg"

    @property
    def addresses(self) -> Path:
        return self.directory / "ibacm_addr.cfg"

    @property
    def run_dir(self) -> Path:
        return self.directory / "run"

    @property
    def pid_file(self) -> Path:
        return self.directory / "ibacm.pid"

    @property
    def log_file(self) -> Path:
        return self.directory / "ibacm.log"

    @property
    def unix_socket(self) -> Path:
        return self.run_dir / "ibacm-unix.sock"

    def daemon_args(self) -> list[str]:
        """The command-line options that put a daemon on this node with these files."""
        return [
            "--fabric",
            "sim",
            "--sim-hub",
            str(self.hub.socket),
            "--sim-node",
            self.node,
            "-A",
            str(self.addresses),
            "--run-dir",
            str(self.run_dir),
        ]

    def command(self, *extra: str) -> list[str]:
        return [str(IBACM), "-O", str(self.options), *self.daemon_args(), *extra]


def node_files(directory: Path, hub: Hub, node: str, *, log_level: int = 2) -> NodeFiles:
    """Write an option file and an address file for ``node`` into ``directory``."""
    files = NodeFiles(node, directory, hub)
    files.run_dir.mkdir(parents=True, exist_ok=True)
    files.options.write_text(
        f"log_file {files.log_file}\n"
        f"log_level {log_level}\n"
        "log_format json\n"
        f"lock_file {files.pid_file}\n"
        f"run_dir {files.run_dir}\n"
    )
    files.addresses.write_text(f"{node} mlx5_0 1 default\n")
    return files


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie nobody reaps counts as exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"
