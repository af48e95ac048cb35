"""The servers the client-socket benchmarks measure, and how to reach them.

The no-work loops (``trio_floor.py``), simulated clusters of real daemons (``ibacm-sim up``:
ours, and rdma-core's C ibacm on an emulated HCA), the RESOLVE request ``ib_acme -f n`` sends,
and one exchange on a fresh connection (to fill a cache).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ibacm.wire.client import AcmHdr, AcmMessage, AcmOp, EpAddr, EpFlag
from tests.bench.common import VENV_BIN, BenchError, bench_env

LOOPS = {"noop_loop": "thread", "noop_task_loop": "task"}
"""The no-work loops and their ``trio_floor --kind``; the first is "the no-work loop"."""


def resolve_request(source: str = "node1", dest: str = "node2") -> bytes:
    """The bytes of ``ib_acme -f n -s SOURCE -d DEST`` (160 bytes)."""
    message = AcmMessage(
        hdr=AcmHdr(opcode=AcmOp.RESOLVE),
        entries=[EpAddr.from_name(source, EpFlag.SOURCE), EpAddr.from_name(dest, EpFlag.DEST)],
    )
    return message.encode()


def round_trip(sock: socket.socket, request: bytes, path: str) -> tuple[float, bytes]:
    """Send ``request`` on ``sock``; seconds from send to the whole reply, and the reply."""
    start = time.perf_counter()
    sock.sendall(request)
    reply = b""
    while len(reply) < 8 or len(reply) < int.from_bytes(reply[6:8], "little"):
        chunk = sock.recv(4096)
        if not chunk:
            raise BenchError(f"{path} closed the connection before answering")
        reply += chunk
    return time.perf_counter() - start, reply


def timed_exchange(path: str, request: bytes, timeout: float = 10.0) -> tuple[float, bytes]:
    """One request on a fresh connection (as ib_acme does); seconds from send to whole reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        return round_trip(sock, request, path)


def exchange_once(path: str, request: bytes, timeout: float = 10.0) -> bytes:
    """Send one request and read its whole reply (used to fill the cache)."""
    return timed_exchange(path, request, timeout)[1]


@contextlib.contextmanager
def noop_loop(work: Path, kind: str) -> Iterator[tuple[str, int]]:
    """``trio_floor.py --kind KIND``: the C responder's job in Python."""
    path = str(work / f"noop-{kind}.sock")
    command = [sys.executable, "-m", "tests.bench.trio_floor", path, "--kind", kind]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=bench_env())
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise BenchError(f"the no-work loop ({kind}) did not start")
        yield path, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _daemon_cmd(profile_out: Path | None) -> str:
    if profile_out is None:
        return str(VENV_BIN / "ibacm")
    return f"{VENV_BIN / 'python'} -m tests.bench.profiled_daemon {profile_out}"


@dataclass(frozen=True)
class Cluster:
    """A simulated cluster ``ibacm-sim up`` made in ``dir``."""

    dir: Path
    env: dict[str, str]

    def sock(self, node: str) -> str:
        return str(self.dir / node / "ibacm-unix.sock")

    def pid(self, node: str) -> int:
        return int(json.loads((self.dir / "pids.json").read_text())["nodes"][node])

    def restart(self, node: str) -> int:
        """``ibacm-sim restart`` of a node whose daemon died; its new pid."""
        command = [str(VENV_BIN / "ibacm-sim"), "restart", "--dir", str(self.dir), node]
        done = subprocess.run(command, capture_output=True, text=True, env=self.env, check=False)
        if done.returncode != 0:
            raise BenchError(f"ibacm-sim restart {node} failed:\n{done.stdout}{done.stderr}")
        return self.pid(node)


@contextlib.contextmanager
def sim_cluster(
    work: Path,
    profile_out: Path | None,
    c_nodes: list[str],
    env: dict[str, str] | None = None,
    nodes: int = 3,
    log_level: int | None = 0,
) -> Iterator[Cluster]:
    """A simulated cluster of real daemons: ours, and rdma-core's C daemon on ``c_nodes``.
    ``env``: the daemons' environment (``bench_env()`` by default); ``log_level`` None: the
    default one."""
    sim_dir = work / "sim"
    env = bench_env() if env is None else env
    up = [str(VENV_BIN / "ibacm-sim"), "up", "--dir", str(sim_dir)]
    if log_level is not None:
        up += ["--log-level", str(log_level)]
    up += ["--nodes", str(nodes), "--daemon-cmd", _daemon_cmd(profile_out)]
    if c_nodes:
        up += ["--c-ibacm", ",".join(c_nodes)]
    done = subprocess.run(up, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise BenchError(f"ibacm-sim up failed:\n{done.stdout}{done.stderr}")
    try:
        yield Cluster(sim_dir, env)
    finally:
        subprocess.run(
            [str(VENV_BIN / "ibacm-sim"), "down", "--dir", str(sim_dir)],
            capture_output=True,
            env=env,
            check=False,
        )
