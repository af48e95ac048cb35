"""Which admin socket ``ibacm-admin`` and ``ibacm-tui`` talk to (ibacm.tools.admin_target)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibacm.config.options import Options
from ibacm.tools.admin_target import admin_target


def test_a_node_of_a_simulated_cluster_is_its_directorys_socket(tmp_path: Path) -> None:
    (tmp_path / "node2").mkdir()
    assert admin_target(None, str(tmp_path), "node2") == (
        str(tmp_path / "node2" / "ibacm-admin.sock"),
        "node2",
    )


def test_a_path_or_else_the_daemons_default() -> None:
    assert admin_target("/tmp/a.sock", None, None) == ("/tmp/a.sock", "/tmp/a.sock")
    default = str(Options().admin_socket_path)
    assert admin_target(None, None, None) == (default, default)


@pytest.mark.parametrize(
    ("admin", "node", "message"),
    [
        ("/tmp/a.sock", "node1", "use either --admin PATH or --dir SIMDIR --node NAME"),
        (None, None, "--dir and --node go together"),
        (None, "node9", r"no node 'node9' in .* \(nodes: node1, node2\)"),
    ],
)
def test_a_wrong_choice_says_what_to_give(
    tmp_path: Path, admin: str | None, node: str | None, message: str
) -> None:
    for name in ("node2", "node1"):
        (tmp_path / name).mkdir()
    with pytest.raises(ValueError, match=message):
        admin_target(admin, str(tmp_path), node)


def test_a_missing_cluster_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such directory"):
        admin_target(None, str(tmp_path / "gone"), "node1")
