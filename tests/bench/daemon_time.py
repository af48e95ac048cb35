"""A daemon's own time in an uncached first resolution, on both sides of the fabric, from a trace.

    python -m tests.bench.daemon_time [--resolutions N] [--route-prot acm,sa]

The end-to-end latency of a first resolution (``first_resolution``) mixes the daemons' work
with the fabric's (link latency, the SA's service time). This benchmark separates them: it
attaches ``strace -f -ttt -T -yy`` to the requesting daemon and to the responding one for each of
a few first resolutions, and reads from the system calls:

* requester side: client request read -> first MAD posted ("to fabric"), and last MAD in ->
  reply written ("from fabric"); "own" adds the time from each MAD in to the MAD it caused
  (the SA query after the ACM answer, with ``route_prot sa``);
* responder side: from each MAD in to the MAD it caused (its answer, and any query it makes
  first), summed ("own").

A MAD is a send or receive of 256 bytes or more on a socket whose peer is the fabric: the
simulated hub (ours on ``--fabric sim``) or the emulated HCA's device process (C ibacm and ours
on pyverbs); the peer is found from the socket inodes ``strace -yy`` prints and the hub's and
devices' /proc/PID/fd. The client socket is the one named ``ibacm-unix.sock``.

Requesters: rdma-core's C ibacm (node1), ours on pyverbs (node2, ``--hw``) and ours on the
simulated fabric (node3), each resolving fresh destinations (ours on sim, the responders);
C ibacm is the responder when fresh nodes (ours on sim) resolve it. strace stops the traced
process at every system call, so every figure is inflated: the same kinds of first resolution
are also timed untraced, and the ratio of the traced to the untraced end-to-end p50 is reported
beside the figures as strace's inflation, and so is what strace adds to one cached RESOLVE
(a handful of system calls) at the p50: the own times are upper bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench.common import (
    BenchError,
    exit_on_sigterm,
    load_average,
    ratio,
    verdict,
    write_results,
)
from tests.bench.first_resolution import (
    MEASURED,
    checked_dlid,
    cluster,
    name_request,
)
from tests.bench.servers import round_trip, timed_exchange

TARGET_OWN_MS = 0.2
MAD_BYTES = 256
SENDS = frozenset({"sendto", "sendmsg", "write", "writev", "send"})
RECEIVES = frozenset({"recvfrom", "recvmsg", "read", "readv", "recv"})
CLIENT_SOCKET = "ibacm-unix.sock"
_LINE = re.compile(r"(\d+)\s+(\d+\.\d+)\s+(.*)$")
_CALL = re.compile(r"(\w+)\((\d+)<(.*?\])>")
_RESUMED = re.compile(r"<\.\.\. (\w+) resumed>")
_PAIR = re.compile(r"\[(\d+)->(\d+)")
_INSIDE = re.compile(r"<(\d+\.\d+)>$")
_STRACE_COST = "strace_per_cached_request_ms"


@dataclass(frozen=True)
class Event:
    """One system call that moved bytes: ``kind`` request, reply, mad_in or mad_out."""

    when: float
    kind: str


def parse_trace(text: str, fabric_inodes: set[int]) -> list[Event]:
    """The request/reply/MAD events of an ``strace -f -ttt -T -yy`` output, in time order.

    A send counts from its entry (the daemon posted it then: the emulated HCA's device process
    may keep a ``sendmsg`` waiting for milliseconds), a receive from its return (the bytes were
    there then). strace stamps a whole line with its entry and ``-T`` adds the time inside; a
    call split by other threads' lines is stamped at its entry ("unfinished") and at its
    return ("resumed")."""
    pending: dict[str, tuple[str, str, float]] = {}
    events: list[Event] = []
    for line in text.splitlines():
        matched = _LINE.match(line)
        if matched is None:
            continue
        tid, when, rest = matched[1], float(matched[2]), matched[3]
        resumed = _RESUMED.match(rest)
        if resumed is not None:
            if tid not in pending:
                continue
            name, target, entry = pending.pop(tid)
            exit_ = when
        else:
            call = _CALL.match(rest)
            if call is None:
                continue
            name, target, entry = call[1], call[3], when
            if rest.endswith("<unfinished ...>"):
                pending[tid] = (name, target, entry)
                continue
            inside = _INSIDE.search(rest)
            exit_ = entry + (float(inside[1]) if inside else 0.0)
        if name not in SENDS and name not in RECEIVES:
            continue
        result = _result(rest)
        if result is None or result <= 0:
            continue
        kind = _kind(name, target, result, fabric_inodes)
        if kind is not None:
            events.append(Event(entry if name in SENDS else exit_, kind))
    events.sort(key=lambda event: event.when)
    return events


def _result(rest: str) -> int | None:
    at = rest.rfind(" = ")
    if at < 0:
        return None
    found = re.match(r"-?\d+", rest[at + 3 :])
    return int(found[0]) if found else None


def _kind(name: str, target: str, result: int, fabric_inodes: set[int]) -> str | None:
    sending = name in SENDS
    if CLIENT_SOCKET in target:
        return "reply" if sending else "request"
    pair = _PAIR.search(target)
    if pair is None or int(pair[2]) not in fabric_inodes or result < MAD_BYTES:
        return None
    return "mad_out" if sending else "mad_in"


def own_time(events: list[Event], start: float, end: float, inputs: set[str]) -> float:
    """Seconds the daemon spent between what reached it and what it sent in [start, end]:
    from the last input before an output to it. An output with no input since the previous
    one is left out: a timer sent it (a retry), not the work on an input."""
    spent = 0.0
    last_in: float | None = None
    for event in events:
        if not start <= event.when <= end:
            continue
        if event.kind in inputs:
            last_in = event.when
        elif event.kind in ("mad_out", "reply") and last_in is not None:
            spent += event.when - last_in
            last_in = None
    return spent


def requester_times(events: list[Event]) -> dict[str, float]:
    """to_fabric, from_fabric and own seconds of one traced resolution (requester side)."""
    request = next(e.when for e in events if e.kind == "request")
    reply = next(e.when for e in events if e.kind == "reply" and e.when > request)
    outs = [e.when for e in events if e.kind == "mad_out" and request < e.when < reply]
    ins = [e.when for e in events if e.kind == "mad_in" and request < e.when < reply]
    if not outs or not ins:
        raise BenchError("the trace shows no MAD between the request and the reply")
    return {
        "to_fabric": outs[0] - request,
        "from_fabric": reply - ins[-1],
        "own": own_time(events, request, reply, {"request", "mad_in"}),
        "first_mad_out": outs[0],
        "reply": reply,
    }


def responder_times(events: list[Event], start: float, end: float) -> dict[str, float]:
    """first (MAD in -> next MAD out) and own seconds of the responder in [start, end]."""
    ins = [e.when for e in events if e.kind == "mad_in" and start <= e.when <= end]
    if not ins:
        raise BenchError("the responder's trace shows no MAD in")
    outs = [e.when for e in events if e.kind == "mad_out" and ins[0] < e.when <= end]
    if not outs:
        raise BenchError("the responder's trace shows no MAD out after its MAD in")
    return {"first": outs[0] - ins[0], "own": own_time(events, start, end, {"mad_in"})}


def socket_inodes(pid: int) -> set[int]:
    """The socket inodes a process holds (its /proc/PID/fd links ``socket:[N]``)."""
    found = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for entry in fd_dir.iterdir():
        with_link = os.readlink(entry) if entry.is_symlink() else ""
        if with_link.startswith("socket:["):
            found.add(int(with_link[8:-1]))
    return found


@dataclass
class Tracer:
    """``strace`` attached to one daemon until ``stop``."""

    pid: int
    out: Path
    proc: subprocess.Popen[str] | None = field(default=None)

    def start(self, timeout: float = 10.0) -> None:
        command = ["strace", "-f", "-ttt", "-T", "-yy", "-s", "32", "-o", str(self.out)]
        command += ["-e", "trace=%network,read,write,writev,readv", "-p", str(self.pid)]
        self.proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        # strace says "Process N attached" once every thread is stopped and traced.
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            if "attached" in line:
                return
        self.stop()
        raise BenchError(f"strace could not attach to pid {self.pid}")

    def stop(self) -> str:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)  # strace detaches and flushes its output
            self.proc.wait(timeout=10)
            self.proc = None
        return self.out.read_text() if self.out.exists() else ""


def cached_round_trips(path: str, request: bytes, count: int) -> list[float]:
    """Seconds of ``count`` cached RESOLVEs on one connection (send -> whole reply)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        return [round_trip(sock, request, path)[0] for _ in range(count)]


def strace_cost(path: str, pid: int, request: bytes, out: Path, count: int = 300) -> float:
    """What strace adds to one cached RESOLVE (a few system calls), in seconds at the p50."""
    plain = statistics.median(cached_round_trips(path, request, count))
    tracer = Tracer(pid, out)
    tracer.start()
    try:
        traced = statistics.median(cached_round_trips(path, request, count))
    finally:
        tracer.stop()
    return traced - plain


def _check(reply: bytes, lid: int, who: str, target: str) -> None:
    dlid = checked_dlid(reply)
    if dlid != lid:
        raise BenchError(f"{who} resolved {target} to LID {dlid}, not {lid}")


def measure(work: Path, resolutions: int, route_prot: str) -> dict[str, Any]:
    """One cluster: each requester kind resolves ``resolutions`` fresh destinations traced
    and as many untraced; fresh nodes resolve C ibacm traced (its responder side)."""
    kinds = list(MEASURED.items())  # (who, node): node1 C, node2 pyverbs, node3 sim
    fresh = iter(range(len(kinds) + 1, len(kinds) + 1 + resolutions * (2 * len(kinds) + 1)))
    nodes = len(kinds) + resolutions * (2 * len(kinds) + 1)
    samples: dict[str, dict[str, list[float]]] = {}
    target_of: dict[str, str] = {}
    with cluster(work, nodes, route_prot) as status:
        sim_dir = Path(status["dir"])
        lids = {node["name"]: node["lid"] for node in status["nodes"]}
        pids = json.loads((sim_dir / "pids.json").read_text())
        fabric = socket_inodes(int(pids["hub"]))
        for device in pids.get("devices", {}).values():
            fabric |= socket_inodes(int(device))
        node_pid = {name: int(pid) for name, pid in pids["nodes"].items()}

        def add(who: str, what: str, seconds: float) -> None:
            samples.setdefault(who, {}).setdefault(what, []).append(seconds)

        def traced(requester: str, responder: str) -> tuple[list[Event], list[Event], float]:
            tracers = [
                Tracer(node_pid[node], work / f"{route_prot}-{node}-{time.monotonic_ns()}.trace")
                for node in (requester, responder)
            ]
            for tracer in tracers:
                tracer.start()
            try:
                sock = str(sim_dir / requester / CLIENT_SOCKET)
                seconds, reply = timed_exchange(sock, name_request(requester, responder))
            finally:
                # The client has its reply before strace has seen the send return: let the
                # tracers catch up, or the reply's line ends "<detached ...>".
                time.sleep(0.2)
                texts = [tracer.stop() for tracer in tracers]
            _check(reply, lids[responder], requester, responder)
            return parse_trace(texts[0], fabric), parse_trace(texts[1], fabric), seconds

        # C ibacm as the responder first: once it has multicast a request of its own, every
        # node knows its address and would answer a resolution of it from the cache.
        for _ in range(resolutions):
            requester = f"node{next(fresh)}"  # ours on sim, resolving C ibacm
            mine, theirs, _seconds = traced(requester, MEASURED["c_ibacm"])
            side = requester_times(mine)
            found = responder_times(theirs, side["first_mad_out"], side["reply"])
            add("c_ibacm", "responder_first_s", found["first"])
            add("c_ibacm", "responder_own_s", found["own"])
        for _ in range(resolutions):
            for who, node in kinds:
                target = f"node{next(fresh)}"
                seconds, reply = timed_exchange(
                    str(sim_dir / node / CLIENT_SOCKET), name_request(node, target)
                )
                _check(reply, lids[target], who, target)
                add(who, "untraced_s", seconds)
                target = target_of[who] = f"node{next(fresh)}"
                mine, theirs, seconds = traced(node, target)
                add(who, "traced_s", seconds)
                side = requester_times(mine)
                for what in ("to_fabric", "from_fabric", "own"):
                    add(who, f"requester_{what}_s", side[what])
                if who == "ibacm":  # the responders are ours on sim
                    found = responder_times(theirs, side["first_mad_out"], side["reply"])
                    add(who, "responder_first_s", found["first"])
                    add(who, "responder_own_s", found["own"])
        for who, node in kinds:  # the last target of each is cached now
            sock = str(sim_dir / node / CLIENT_SOCKET)
            out = work / f"{route_prot}-{node}-cached.trace"
            add(
                who,
                "strace_per_cached_request_s",
                strace_cost(sock, node_pid[node], name_request(node, target_of[who]), out),
            )
    return {who: _medians(values) for who, values in samples.items()}


def _medians(values: dict[str, list[float]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for what, seconds in values.items():
        name = what.removesuffix("_s")
        found[f"{name}_ms"] = round(statistics.median(seconds) * 1e3, 3)
        found[f"{name}_ms_all"] = [round(value * 1e3, 3) for value in seconds]
    found["strace_inflation"] = ratio(found.get("traced_ms", 0), found.get("untraced_ms", 0))
    found["loadavg"] = load_average()
    return found


def summarize(results: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Issue 28's target: ours spends <= 0.2 ms of its own on each side of the fabric."""
    targets: dict[str, str] = {}
    for prot, figures in results.items():
        for who in ("ibacm_hw", "ibacm"):
            mine = figures.get(who, {})
            c_side = figures.get("c_ibacm", {})
            for side in ("requester", "responder"):
                value = mine.get(f"{side}_own_ms")
                if value is None:
                    continue
                inflation = mine.get("strace_inflation")
                targets[f"daemon_time_{prot}_{who}_{side}<={TARGET_OWN_MS}ms"] = (
                    f"{verdict(value <= TARGET_OWN_MS)}: {value} ms traced (C ibacm "
                    f"{c_side.get(f'{side}_own_ms')} ms; strace inflates end to end "
                    f"{inflation}x, a cached RESOLVE by {mine.get(_STRACE_COST)} ms)"
                )
    return targets


def run(work: Path, resolutions: int, protocols: list[str] | None = None) -> dict[str, Any]:
    """Measure and print; the figures and verdicts for a caller's result file."""
    if shutil.which("strace") is None:
        raise BenchError("strace is needed (apt-get install strace; scripts/setup.sh does)")
    results = {}
    for prot in protocols or ["acm", "sa"]:
        (work / prot).mkdir()
        results[prot] = measure(work / prot, resolutions, prot)
    for prot, figures in results.items():
        for who, values in figures.items():
            parts = [
                f"{name.removesuffix('_ms')} {values[name]} ms"
                for name in sorted(values)
                if name.endswith("_ms")
            ]
            print(f"daemon time ({prot:3}) {who:9} " + ", ".join(parts), flush=True)
            print(
                f"  strace inflation (traced / untraced p50): {values['strace_inflation']}x; "
                f"load {values['loadavg']:.1f}"
            )
    targets = summarize(results)
    for target, outcome in targets.items():
        print(f"target {target}: {outcome}")
    return {"resolutions": resolutions, **results, "targets": targets}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolutions", type=int, default=5, help="traced per daemon kind")
    parser.add_argument("--route-prot", default="acm,sa", help="comma-separated: acm, sa")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    protocols = [p.strip() for p in args.route_prot.split(",") if p.strip()]
    with tempfile.TemporaryDirectory(prefix="ibacm-bench-") as tmp:
        figures = run(Path(tmp), args.resolutions, protocols)
    write_results("daemon_time", figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
