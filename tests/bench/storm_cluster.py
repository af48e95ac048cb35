"""The all-to-all storm on real processes: ``c_real``, rdma-core's C ibacm on every node.

    python -m tests.bench.storm --nodes 16,64 --configs c_real,c_baseline

``ibacm-sim up --nodes N --c-ibacm node1,...,nodeN`` starts the hub and, per node, the emulated
HCA's device process and Debian's unmodified ``/usr/sbin/ibacm`` (default C options). Then
every node's client socket gets the storm: node i resolves every other node by name, in ring
order, one request at a time per node, all nodes at once; every answer's DLID is checked.
Figures come from the hub's MAD counters (multicast requests, SA PathRecord queries), real wall
time (there is no simulated clock across processes) and each C daemon's peak RSS (VmHWM).

``c_baseline`` (storm.py) is the in-process model of the same C behaviour, used for large N;
running both at one N shows how far the model is from the real daemon.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from ibacm.fabric.sim.topo_file import Topology
from ibacm.wire.client import HDR_LEN, AcmHdr, AcmOp, AddrType, EpAddr, EpFlag

SA_CLASS, ACM_CLASS, PATH_RECORD_ATTR = 0x03, 0x2C, 0x0035


def _sim(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ibacm.tools.sim", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def _entry(name: str, flag: int) -> bytes:
    return flag.to_bytes(4, "little") + EpAddr.from_name(name).encode()[4:]


async def _receive_reply(stream: trio.SocketStream) -> bytes:
    data = b""
    while len(data) < HDR_LEN:
        chunk = await stream.receive_some(4096)
        if not chunk:
            raise ConnectionError("the daemon closed the connection")
        data += chunk
    length = int.from_bytes(data[2:4], sys.byteorder)  # RESOLVE: host byte order
    while len(data) < length:
        chunk = await stream.receive_some(4096)
        if not chunk:
            raise ConnectionError("the daemon closed the connection mid-reply")
        data += chunk
    return data


async def _storm(root: Path, names: list[str], lids: dict[str, int]) -> dict[str, int]:
    outcome = {"resolutions": 0, "succeeded": 0, "wrong_paths": 0, "errors": 0}
    header = AcmHdr(opcode=AcmOp.RESOLVE, length=160).encode()
    dlid_at = HDR_LEN + 8 + 40

    async def node(index: int) -> None:
        source = names[index]
        stream = await trio.open_unix_socket(str(root / source / "ibacm-unix.sock"))
        async with stream:
            for step in range(1, len(names)):
                target = names[(index + step) % len(names)]
                frame = header + _entry(source, EpFlag.SOURCE) + _entry(target, EpFlag.DEST)
                await stream.send_all(frame)
                reply = await _receive_reply(stream)
                outcome["resolutions"] += 1
                if reply[2] != 0:
                    outcome["errors"] += 1
                elif (
                    reply[HDR_LEN + 4] != AddrType.PATH
                    or int.from_bytes(reply[dlid_at : dlid_at + 2], "big") != lids[target]
                ):
                    outcome["wrong_paths"] += 1
                else:
                    outcome["succeeded"] += 1

    async with trio.open_nursery() as nursery:
        for index in range(len(names)):
            nursery.start_soon(node, index)
    return outcome


def _counters(root: Path) -> dict[tuple[int, int, int], int]:
    done = _sim("stats", "--dir", str(root), "--json")
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return {
        (k["class"], k["method"], k["attribute"]): k["count"]
        for k in json.loads(done.stdout)["counters"]
    }


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def c_real_point(nodes_count: int) -> dict[str, Any]:
    """One c_real point: start the cluster, storm it, read the counters, stop it."""
    root = Path(tempfile.mkdtemp(prefix="storm-c-"))
    names = [f"node{i}" for i in range(1, nodes_count + 1)]
    started = time.perf_counter()
    up = _sim("up", "--nodes", str(nodes_count), "--dir", str(root), "--c-ibacm", ",".join(names))
    startup_wall = time.perf_counter() - started
    try:
        if up.returncode != 0:
            return {"nodes": nodes_count, "config": "c_real", "error": up.stderr.strip()[-2000:]}
        topology = Topology.from_json((root / "topology.json").read_text())
        lids = {name: topology.host(name).hcas[0].ports[0].lid for name in names}
        before = _counters(root)
        began = time.perf_counter()
        outcome = trio.run(_storm, root, names, lids)
        wall = time.perf_counter() - began
        after = _counters(root)
        pids = json.loads((root / "pids.json").read_text())
        daemon_rss = [_peak_rss_mb(int(pid)) for pid in pids["nodes"].values()]
        device_rss = [_peak_rss_mb(int(pid)) for pid in pids["devices"].values()]
    finally:
        _sim("down", "--dir", str(root))
        shutil.rmtree(root, ignore_errors=True)

    def delta(mgmt_class: int, method: int | None = None, attr: int | None = None) -> int:
        return sum(
            count - before.get(key, 0)
            for key, count in after.items()
            if key[0] == mgmt_class
            and (method is None or key[1] == method)
            and (attr is None or key[2] == attr)
        )

    return {
        "nodes": nodes_count,
        "config": "c_real",
        **outcome,
        "multicast_requests": delta(ACM_CLASS, 0x01),
        "unicast_replies": delta(ACM_CLASS, 0x81),
        "sa_path_queries": delta(SA_CLASS, 0x01, PATH_RECORD_ATTR),
        "wall_s": round(wall, 2),
        "us_per_resolution": round(wall / max(outcome["resolutions"], 1) * 1e6, 1),
        "startup": {"wall_s": round(startup_wall, 1)},
        "daemon_peak_rss_mb": {
            "median": round(statistics.median(daemon_rss), 1),
            "max": round(max(daemon_rss), 1),
        },
        "device_process_peak_rss_mb": round(statistics.median(device_rss), 1),
    }


def print_c_real(figures: dict[str, Any]) -> None:
    if "error" in figures:
        print(f"N={figures['nodes']:5} c_real     FAILED: {figures['error']}")
        return
    print(
        f"N={figures['nodes']:5} c_real     ok {figures['succeeded']}/{figures['resolutions']}  "
        f"mcast {figures['multicast_requests']}  ucast {figures['unicast_replies']}  "
        f"SA PR {figures['sa_path_queries']}  wall {figures['wall_s']}s "
        f"({figures['us_per_resolution']} us/resolution, start-up "
        f"{figures['startup']['wall_s']}s)  C daemon peak RSS "
        f"{figures['daemon_peak_rss_mb']['median']} MB (max {figures['daemon_peak_rss_mb']['max']})"
    )


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    figures = c_real_point(count)
    print_c_real(figures)
    print(json.dumps(figures))
    sys.exit(0 if "error" not in figures else 1)
