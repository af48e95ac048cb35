"""Which admin socket an operator tool talks to (``ibacm.config.admin_target``)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ibacm.config.admin_target import admin_target, default_admin_socket
from ibacm.config.option_file import parse_options
from ibacm.config.options import Options
from ibacm.tools.sim_layout import Layout
from ibacm.tools.sim_node_files import opts_text


def test_admin_path_is_taken_as_given() -> None:
    assert admin_target("/tmp/x.sock", None, None) == ("/tmp/x.sock", "/tmp/x.sock")


def test_default_is_where_a_daemon_with_default_options_listens() -> None:
    assert admin_target(None, None, None) == (default_admin_socket(),) * 2
    assert default_admin_socket() == str(Options().admin_socket_path)
    assert default_admin_socket() == "/run/ibacm-admin.sock"  # docs/admin-protocol.md


def test_a_sim_node_is_where_ibacm_sim_has_its_daemon_listen(tmp_path: Path) -> None:
    (tmp_path / "node2").mkdir()
    # The options ibacm-sim up writes for node2's daemon, read as that daemon reads them.
    text = opts_text(
        Layout(tmp_path), "node2", argparse.Namespace(log_level=0, route_prot=None), ""
    )
    options, issues = parse_options(text)
    assert issues == []
    assert admin_target(None, str(tmp_path), "node2") == (
        str(options.admin_socket_path),
        "node2",
    )


@pytest.mark.parametrize(
    ("admin", "sim_dir", "node", "message"),
    [
        ("/a.sock", "sim", "node1", "use either --admin PATH or --dir SIMDIR --node NAME"),
        (None, "sim", None, "--dir and --node go together"),
        (None, None, "node1", "--dir and --node go together"),
        (None, "/nonexistent/sim", "node1", "--dir /nonexistent/sim: no such directory"),
    ],
)
def test_bad_flags_say_what_is_wrong(
    admin: str | None, sim_dir: str | None, node: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        admin_target(admin, sim_dir, node)


def test_an_unknown_node_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no node 'node9' in .* \(nodes: none\)"):
        admin_target(None, str(tmp_path), "node9")
    for name in ("node2", "node1"):
        (tmp_path / name).mkdir()
    (tmp_path / "hub.log").write_text("")  # a file is no node
    with pytest.raises(ValueError, match=r"\(nodes: node1, node2\)"):
        admin_target(None, str(tmp_path), "node9")
