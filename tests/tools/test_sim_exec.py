"""``ibacm-sim exec`` and clusters in TCP mode, with unmodified programs: Debian's ``ib_acme``
(compiled-in ``/run`` paths) and librdmacm's ``rdma_getaddrinfo``."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ibacm.tools.sim import main as sim_main
from tests.conftest import REPO, ibacm_sim, require_file, require_peer, require_root

pytestmark = [pytest.mark.peer]
PROBE = REPO / "tests" / "peers" / "rdmacm_probe.py"
LIBRDMACM = Path("/usr/lib/x86_64-linux-gnu/librdmacm.so.1")


def cluster(*extra: str) -> Iterator[Path]:
    require_peer("ib_acme")
    require_root("ibacm-sim exec needs a private mount namespace")
    root = Path(tempfile.mkdtemp(prefix="exec"))
    up = ibacm_sim("up", "--nodes", "3", "--dir", str(root), *extra)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield root
    finally:
        ibacm_sim("down", "--dir", str(root))
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def unix_cluster() -> Iterator[Path]:
    yield from cluster("--c-ibacm", "node3")


@pytest.fixture(scope="module")
def tcp_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    opts = tmp_path_factory.mktemp("opts") / "loop.cfg"
    opts.write_text("server_mode loop\n")
    yield from cluster("--opts", str(opts))


def on_node(root: Path, node: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return ibacm_sim("exec", "--dir", str(root), node, "--", *argv)


def test_ib_acme_without_s_reaches_the_node_of_its_namespace(unix_cluster: Path) -> None:
    for node, lid in (("node1", 2), ("node2", 3)):
        result = on_node(unix_cluster, node, "ib_acme", "-d", "10.0.0.3", "-v")
        assert "Service: /run/ibacm-unix.sock" in result.stdout, result.stdout + result.stderr
        assert "dlid: 4" in result.stdout and f"slid: {lid}" in result.stdout
    # The C daemon's compiled-in paths too; it picks no source itself here (no IPoIB route).
    c_node = on_node(unix_cluster, "node3", "ib_acme", "-s", "10.0.0.3", "-d", "10.0.0.1")
    assert "dlid: 2" in c_node.stdout, c_node.stdout + c_node.stderr


def test_librdmacm_gets_the_route_from_the_node(unix_cluster: Path) -> None:
    require_file(LIBRDMACM)
    require_peer("/usr/bin/python3")
    result = on_node(unix_cluster, "node1", "/usr/bin/python3", str(PROBE), "10.0.0.2")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["rc"] == 0 and answer["route_len"] == 72
    path = bytes.fromhex(answer["paths"][0])
    assert path[8 + 40 : 8 + 42] == (3).to_bytes(2, "big")  # DLID of node2


def test_tcp_mode_nodes_each_serve_their_own_port(tcp_cluster: Path) -> None:
    report = json.loads(ibacm_sim("status", "--dir", str(tcp_cluster), "--json").stdout)
    ports = []
    for node in report["nodes"]:
        assert node["state"] == "running", node
        assert len(node["listening"]) == 1 and node["listening"][0].startswith("127.0.0.1:")
        ports.append(node["listening"][0])
        written = (tcp_cluster / node["name"] / "ibacm-tcp.port").read_text().strip()
        assert node["listening"][0] == f"127.0.0.1:{written}"
    assert len(set(ports)) == 3
    result = on_node(tcp_cluster, "node2", "ib_acme", "-S", "127.0.0.1", "-d", "10.0.0.3")
    assert "dlid: 4" in result.stdout, result.stdout + result.stderr
    require_file(LIBRDMACM)
    probe = on_node(tcp_cluster, "node1", "/usr/bin/python3", str(PROBE), "10.0.0.3")
    assert json.loads(probe.stdout)["route_len"] == 72, probe.stdout + probe.stderr


def test_exec_errors_are_one_line(unix_cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main(["exec", "--dir", str(unix_cluster), "node1"]) == 1
    assert "exec needs a command" in capsys.readouterr().err
    assert sim_main(["exec", "--dir", str(unix_cluster), "node9", "--", "true"]) == 1
    assert "node9" in capsys.readouterr().err
