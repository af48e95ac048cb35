"""The files ``ibacm-sim up`` writes per node (``ibacm.tools.sim_node_files``), read as the
daemon reads them."""

from __future__ import annotations

import argparse
from pathlib import Path

from ibacm.config.addr_file import parse_addr_file
from ibacm.config.option_file import parse_options
from ibacm.config.option_values import RouteProt
from ibacm.fabric.sim.topo_file import generate
from ibacm.tools.sim_kinds import NodeKind
from ibacm.tools.sim_layout import ADDR_FILE, OPTS_FILE, Layout
from ibacm.tools.sim_node_files import addr_text, opts_text, write_node_files

ARGS = argparse.Namespace(log_level=1, route_prot=None)


def test_a_node_keeps_everything_in_its_directory(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    args = argparse.Namespace(log_level=2, route_prot="acm")
    options, issues = parse_options(opts_text(layout, "node3", args, "timeout 500\n"))
    assert issues == []
    node_dir = layout.node_dir("node3")
    assert Path(options.run_dir) == node_dir and options.admin_socket_path == (
        layout.admin_socket("node3")
    )
    assert Path(options.lock_file).parent == node_dir == Path(options.log_file).parent
    assert (options.log_level, options.route_prot, options.timeout) == (2, RouteProt.ACM, 500)


def test_the_address_file_names_the_node_as_ib_acme_would(tmp_path: Path) -> None:
    topology = generate(2, hcas_per_node=1, ports_per_hca=2)
    text = addr_text(topology, "node2")
    entries, issues = parse_addr_file(text, ADDR_FILE)
    assert issues == []
    names = [entry.address for entry in entries]
    assert names[0] == "node2" and names[1:] == ["node2-1", "node2-2"]


def test_each_node_gets_its_own_metrics_port(tmp_path: Path) -> None:
    """--opts with metrics_port N: node i gets N + i - 1 (one port cannot serve them all)."""
    layout = Layout(tmp_path)
    topology = generate(3)
    ports = []
    for node in topology.host_names:
        layout.node_dir(node).mkdir()
        write_node_files(layout, topology, node, NodeKind.SIM, ARGS, "metrics_port 9400\n")
        text = (layout.node_dir(node) / OPTS_FILE).read_text()
        options, issues = parse_options(text)
        assert [issue for issue in issues if issue.severity == "error"] == []
        ports.append(options.metrics_port)
    assert ports == [9400, 9401, 9402]


def test_a_hw_node_reads_ip_addresses_from_its_address_file(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    topology = generate(1)
    layout.node_dir("node1").mkdir()
    write_node_files(layout, topology, "node1", NodeKind.HW, ARGS, "")
    options, issues = parse_options((layout.node_dir("node1") / OPTS_FILE).read_text())
    assert issues == [] and options.support_ips_in_addr_cfg
    text = (layout.node_dir("node1") / ADDR_FILE).read_text()
    entries, issues = parse_addr_file(text, ADDR_FILE, support_ips=True)
    assert issues == [] and any("." in entry.address for entry in entries)
