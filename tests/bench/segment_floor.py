"""The floor of one segment of a first resolution: a MAD in -> the MAD it causes, no work between.

    python -m tests.bench.segment_floor [--events N] [--gap-ms MS]

``daemon_time`` measures a daemon's own time as the time from each MAD read to the MAD (or the
reply) that read causes, from an ``strace`` trace. This measures the same segment for a process
that does nothing between the two system calls, in the daemon's own I/O style, so the part of a
segment that the run loop and the interpreter take before any work can be told from the work:

* ``trio``: a trio task waits for the socket to be readable (``trio.lowlevel.wait_readable``,
  trio's epoll, as the hub client's reader does), reads what came, writes 256 bytes back;
* ``plain``: the same in plain Python, a blocking ``select.epoll`` loop without trio.

The parent sends a 256-byte MAD every ``--gap-ms`` (isolated events, as first resolutions are:
the process finds its caches cold), reads the answer, and traces the child with
``strace -f -ttt`` as ``daemon_time`` does. Reported per kind: the p50 of read -> write traced,
and the child's CPU per event untraced (``/proc/PID/schedstat``). The issue 28 target for a
daemon's own time is 0.2 ms per side of the fabric, and a requester's side has two segments
(request -> ACM request, answer -> reply) and a third with ``route_prot sa``.
"""

from __future__ import annotations

import argparse
import os
import re
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from tests.bench.common import load_average, write_results

MAD = bytes(256)
KINDS = ("trio", "plain")
_STAMP = re.compile(r"^(\d+)\s+(\d+\.\d+)\s+(read|write)\((\d+),.*= (\d+) <(\d+\.\d+)>$")


# -- the child -------------------------------------------------------------------------------


async def _trio_relay(fd: int) -> None:
    while True:
        await trio.lowlevel.wait_readable(fd)
        if not os.read(fd, 4096):
            return
        os.write(fd, MAD)


def _plain_relay(fd: int) -> None:
    epoll = select.epoll()
    epoll.register(fd, select.EPOLLIN)
    while True:
        epoll.poll()
        if not os.read(fd, 4096):
            return
        os.write(fd, MAD)


def relay(kind: str, fd: int) -> None:
    os.set_blocking(fd, False)
    if kind == "trio":
        trio.run(_trio_relay, fd)
    else:
        _plain_relay(fd)


# -- the parent ------------------------------------------------------------------------------


def _cpu_ns(pid: int) -> int:
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
            total += int(stat.read().split()[0])
    return total


def _exchange(sock: socket.socket, events: int, gap: float) -> None:
    for _ in range(events):
        sock.sendall(MAD)
        got = b""
        while len(got) < len(MAD):
            got += sock.recv(4096)
        time.sleep(gap)


def _segments(trace: str, fd: int) -> list[float]:
    """read of a MAD (when it returned) -> the next write (when it was issued), in seconds,
    from ``strace -f -ttt -T`` output, as ``daemon_time`` reads a daemon's segments."""
    found: list[float] = []
    start: float | None = None
    for line in trace.splitlines():
        match = _STAMP.match(line)
        if match is None or int(match.group(4)) != fd:
            continue
        when, call, size = float(match.group(2)), match.group(3), int(match.group(5))
        if call == "read" and size >= len(MAD):
            start = when + float(match.group(6))
        elif call == "write" and start is not None:
            found.append(when - start)
            start = None
    return found


def measure(kind: str, events: int, gap: float) -> dict[str, Any]:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    command = [sys.executable, "-m", "tests.bench.segment_floor", "--relay", kind]
    command += ["--fd", str(child.fileno())]
    proc = subprocess.Popen(command, pass_fds=(child.fileno(),))
    child.close()
    try:
        _exchange(parent, 5, gap)  # started and warmed up
        cpu = _cpu_ns(proc.pid)
        _exchange(parent, events, gap)
        cpu_per_event_us = (_cpu_ns(proc.pid) - cpu) / events / 1e3
        with tempfile.TemporaryDirectory() as work:
            out = Path(work) / "trace"
            strace = ["strace", "-f", "-qq", "-ttt", "-T", "-e", "trace=read,write"]
            strace += ["-o", str(out)]
            tracer = subprocess.Popen([*strace, "-p", str(proc.pid)])
            time.sleep(0.5)
            _exchange(parent, events, gap)
            tracer.send_signal(signal.SIGINT)
            tracer.wait()
            # The relay's end of the pair is the lowest descriptor it read from.
            text = out.read_text()
        fds = [int(m.group(4)) for m in map(_STAMP.match, text.splitlines()) if m]
        segments = _segments(text, min(fds)) if fds else []
    finally:
        parent.close()
        proc.wait(timeout=10)
    if not segments:
        raise RuntimeError(f"no segment found in the trace of the {kind} relay")
    return {
        "events": events,
        "segment_traced_p50_ms": round(statistics.median(segments) * 1e3, 3),
        "cpu_per_event_us": round(cpu_per_event_us, 1),
        "loadavg": load_average(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=40)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    parser.add_argument("--relay", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.relay:
        relay(args.relay, args.fd)
        return 0
    results: dict[str, Any] = {}
    for kind in KINDS:
        results[kind] = figures = measure(kind, args.events, args.gap_ms / 1e3)
        print(
            f"segment floor {kind:5}: read -> write {figures['segment_traced_p50_ms']:.3f} ms "
            f"traced (p50 of {args.events}), CPU {figures['cpu_per_event_us']:.1f} us per "
            f"event untraced, load {figures['loadavg']}"
        )
    write_results("segment_floor", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
