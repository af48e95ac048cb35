"""Providers built for rdma-core's ibacm (``acm_prov.h``) inside our daemon.

Our daemon runs with ``--fabric hw`` on an emulated HCA (``ibacm-sim up --hw``): Debian's
unmodified ``libibacmp.so`` resolves for the real ``ib_acme``, and ``testprov.c`` (built here)
exercises every provider callback and core function, with a library of the wrong version and
one whose ``open_device`` fails beside it.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import socket
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ibacm.fabric.sim.topo_file import Topology
from ibacm.provider.cprov import abi
from tests.conftest import ibacm_sim, in_ci, require_file, require_peer, require_root

pytestmark = [pytest.mark.peer]

HERE = Path(__file__).resolve().parent
DEBIAN_PROVIDERS = Path("/usr/lib/x86_64-linux-gnu/ibacm")
PYVERBS = Path("/usr/lib/python3/dist-packages/pyverbs/device.cpython-311-x86_64-linux-gnu.so")


def test_the_ctypes_structures_are_acm_prov_h() -> None:
    cc = require_peer("cc")
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "layout.c"
        source.write_text(
            textwrap.dedent(
                """
                #include <stdio.h>
                #include <stddef.h>
                #include <infiniband/acm_prov.h>
                int main(void) {
                    printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\\n",
                        sizeof(struct acm_provider), offsetof(struct acm_provider, query_perf),
                        sizeof(struct acm_device), sizeof(struct acm_port),
                        sizeof(struct acm_endpoint), sizeof(struct acm_address),
                        offsetof(struct acm_address, id_string),
                        offsetof(struct acm_address, type), sizeof(struct acm_msg),
                        offsetof(struct acm_sa_mad, sa_mad));
                    return 0;
                }
                """
            )
        )
        binary = Path(scratch) / "layout"
        subprocess.run([cc, "-o", str(binary), str(source)], check=True)
        got = [
            int(n) for n in subprocess.run([binary], capture_output=True, text=True).stdout.split()
        ]
    assert got == [
        ctypes.sizeof(abi.AcmProvider),
        abi.AcmProvider.query_perf.offset,
        ctypes.sizeof(abi.AcmDevice),
        ctypes.sizeof(abi.AcmPort),
        ctypes.sizeof(abi.AcmEndpoint),
        ctypes.sizeof(abi.AcmAddress),
        abi.AcmAddress.id_string.offset,
        abi.AcmAddress.type.offset,
        abi.MSG_SIZE,
        72,
    ]


@dataclass(frozen=True)
class Cluster:
    root: Path
    topology: Topology

    def lid(self, node: str) -> int:
        return int(self.topology.host(node).hcas[0].ports[0].lid)

    def ipv4(self, node: str) -> str:
        return str(self.topology.host(node).hcas[0].ports[0].ipv4[0].ip)

    def acme(self, node: str, *args: str) -> subprocess.CompletedProcess[str]:
        socket_path = str(self.root / node / "ibacm-unix.sock")
        return subprocess.run(
            [require_peer("ib_acme"), "-S", socket_path, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def log(self, node: str) -> list[str]:
        events = []
        for line in (self.root / node / "ibacm.log").read_text().splitlines():
            try:
                events.append(str(json.loads(line).get("event", "")))
            except json.JSONDecodeError:
                events.append(line)
        return events

    def wait_log(self, node: str, text: str, timeout: float = 15) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in self.log(node) if text in line]
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.1)


def start(nodes: int, opts: str, *kinds: str) -> Cluster:
    require_peer("ib_acme")
    require_file(PYVERBS)
    root = Path(tempfile.mkdtemp(prefix="cprov"))
    (root / "extra.cfg").write_text(opts)
    up = ibacm_sim(
        "up", "--nodes", str(nodes), "--dir", str(root), "--opts", str(root / "extra.cfg"), *kinds
    )
    if up.returncode != 0:
        ibacm_sim("down", "--dir", str(root))
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"ibacm-sim up failed:\n{up.stdout}{up.stderr}")
    return Cluster(root, Topology.from_json((root / "topology.json").read_text()))


def stop(cluster: Cluster) -> None:
    ibacm_sim("down", "--dir", str(cluster.root))
    shutil.rmtree(cluster.root, ignore_errors=True)


def dlid(result: subprocess.CompletedProcess[str]) -> int | None:
    for line in result.stdout.splitlines():
        if line.strip().startswith("dlid:"):
            return int(line.split(":")[1])
    return None


def snapshot(path: Path) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        reader = sock.makefile("rb")
        commands: list[dict[str, object]] = [{"cmd": "hello", "versions": [1]}, {"cmd": "snapshot"}]
        for number, cmd in enumerate(commands):
            sock.sendall(json.dumps({"v": 1, "id": number, **cmd}).encode() + b"\n")
            reply = json.loads(reader.readline())
        result: dict[str, object] = reply["result"]
        return result


@pytest.fixture(scope="module")
def debian() -> Iterator[Cluster]:
    require_file(DEBIAN_PROVIDERS / "libibacmp.so")
    if in_ci():
        require_root("C ibacm nodes")
    opts = f"provider_lib_path {DEBIAN_PROVIDERS}\nprovider_prefer library\n"
    cluster = start(4, opts, "--hw", "node4", "--c-ibacm", "node2")
    try:
        yield cluster
    finally:
        stop(cluster)


def test_debian_libibacmp_resolves_inside_our_daemon(debian: Cluster) -> None:
    loaded = debian.wait_log("node4", "provider library loaded")
    assert loaded, "no provider library loaded"
    failures = []
    for peer in ("node1", "node2", "node3"):  # sim, C, sim
        for args in (
            ["-s", debian.ipv4("node4"), "-d", debian.ipv4(peer), "-v"],
            ["-f", "n", "-s", "node4", "-d", peer, "-v"],
        ):
            result = debian.acme("node4", *args)
            if dlid(result) != debian.lid(peer) or "SA verification: success" not in result.stdout:
                failures.append(f"node4 {args}: {result.stdout[-300:]}")
        back = debian.acme(peer, "-s", debian.ipv4(peer), "-d", debian.ipv4("node4"))
        if dlid(back) != debian.lid("node4"):
            failures.append(f"{peer} -> node4: {back.stdout[-300:]}")
    assert not failures, "\n".join(failures)
    # ib_acme -e shows the provider; the admin status says where it came from.
    endpoints = debian.acme("node4", "-e")
    assert endpoints.returncode == 0
    assert ",ibacmp,node4," in endpoints.stdout
    state = snapshot(debian.root / "node4" / "ibacm-admin.sock")
    infos = state["endpoints"]
    assert isinstance(infos, list) and infos
    assert infos[0]["provider"] == "ibacmp"
    assert infos[0]["provider_origin"] == str(DEBIAN_PROVIDERS / "libibacmp.so")
    # Its log lines arrive in our structured log.
    assert debian.wait_log("node4", "acmp_port_up:")


def build(source: Path, target: Path, *defines: str) -> None:
    cc = require_peer("cc")
    command = [cc, "-shared", "-fPIC", "-Wall", "-o", str(target), str(source), *defines]
    subprocess.run(command, check=True)


@pytest.fixture(scope="module")
def ours() -> Iterator[tuple[Cluster, Path]]:
    libs = Path(tempfile.mkdtemp(prefix="provlib"))
    build(HERE / "testprov.c", libs / "libtestprov.so")
    build(HERE / "testprov.c", libs / "libwrongver.so", "-DWRONG_VERSION", '-DPROV_NAME="wrongver"')
    build(
        HERE / "testprov.c", libs / "libfailopen.so", "-DFAIL_OPEN_DEVICE", '-DPROV_NAME="failopen"'
    )
    (libs / "liblink.so").symlink_to(libs / "libtestprov.so")  # skipped, as rdma-core does
    (libs / "notalib.so").write_text("not an ELF file\n")
    prefix = 0xFE80000000000000
    opts = (
        f"provider_lib_path {libs}\nprovider testprov default\nprovider failopen 0x{prefix:016x}\n"
    )
    cluster = start(3, opts, "--hw", "node3")
    try:
        yield cluster, libs
    finally:
        stop(cluster)
        shutil.rmtree(libs, ignore_errors=True)


def test_bad_libraries_are_reported_and_skipped(ours: tuple[Cluster, Path]) -> None:
    cluster, libs = ours
    skipped = cluster.wait_log("node3", "provider library skipped")
    # The JSON log keeps path and reason as fields: read the raw lines.
    raw = (cluster.root / "node3" / "ibacm.log").read_text()
    assert skipped
    assert f'"path": "{libs / "libwrongver.so"}"' in raw and "unmatched provider version" in raw
    assert f'"path": "{libs / "notalib.so"}"' in raw and "could not load" in raw
    assert str(libs / "liblink.so") not in raw
    # failopen was chosen for the port's subnet, failed open_device: the default serves it.
    assert cluster.wait_log("node3", "open_device verbs=yes")
    assert cluster.wait_log("node3", "port served by the default provider")


def test_every_callback_and_core_function(ours: tuple[Cluster, Path]) -> None:
    cluster, _ = ours
    assert cluster.wait_log("node3", "provider_query opts ")
    query = cluster.wait_log("node3", "provider_query opts ")[0]
    assert query.endswith("ibacm_opts.cfg mtu 4 rate 7 rate4xEDR 16")
    assert cluster.wait_log("node3", "open_port 1 gid0 fe80::")
    assert cluster.wait_log("node3", "index 0 gid1 none any 0")
    assert cluster.wait_log("node3", "open_endpoint pkey 0xffff")
    for text in ("add_address type 1 node3 id node3", "add_address type 2 10.0.0.3 id 10.0.0.3"):
        assert cluster.wait_log("node3", text), text

    before = cluster.acme("node3", "-P").stdout.splitlines()[1].split(",")
    result = cluster.acme(
        "node3", "-f", "l", "-s", str(cluster.lid("node3")), "-d", str(cluster.lid("node1")), "-v"
    )
    assert dlid(result) == cluster.lid("node1"), result.stdout
    assert "SA verification: success" in result.stdout  # the provider's query callback
    assert cluster.wait_log("node3", "comp_mask 0x0000000000000818")  # SGID|DLID|REVERSIBLE
    assert cluster.wait_log("node3", f"resolved dlid {cluster.lid('node1')}")
    assert cluster.wait_log("node3", "query id ")
    after = cluster.acme("node3", "-P").stdout.splitlines()[1].split(",")
    assert int(after[6]) == int(before[6]) + 1  # Route Query Count: acm_increment_counter

    per_endpoint = cluster.acme("node3", "-P", "1")
    assert per_endpoint.stdout.splitlines()[1].split(",")[1:] == [str(100 + i) for i in range(7)]
    assert ",testprov,node3," in cluster.acme("node3", "-e").stdout

    done = ibacm_sim("reregister", "--dir", str(cluster.root), "node3")
    assert done.returncode == 0, done.stderr
    assert cluster.wait_log("node3", "handle_event 17")  # IBV_EVENT_CLIENT_REREGISTER

    # The SA goes away: the provider's MAD comes back with ETIMEDOUT and the client hears it.
    assert ibacm_sim("fault", "--dir", str(cluster.root), "sa_down", "on").returncode == 0
    try:
        failed = cluster.acme(
            "node3", "-f", "l", "-s", str(cluster.lid("node3")), "-d", str(cluster.lid("node2"))
        )
        assert failed.returncode != 0
        assert cluster.wait_log("node3", "resolve failed umad status 110")
    finally:
        ibacm_sim("fault", "--dir", str(cluster.root), "sa_down", "off")
