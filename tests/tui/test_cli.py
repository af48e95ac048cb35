"""The ``ibacm-tui`` command line: which admin socket, and clear errors for bad arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from tui.app import main, parse_args, target_from_args


def target(*argv: str) -> tuple[str, str]:
    chosen = target_from_args(parse_args(list(argv)))
    return chosen.admin_socket, chosen.label


def test_admin_path_and_simulated_node(tmp_path: Path) -> None:
    assert target("--admin", "/x/admin.sock") == ("/x/admin.sock", "/x/admin.sock")
    (tmp_path / "node3").mkdir()
    assert target("--dir", str(tmp_path), "--node", "node3") == (
        str(tmp_path / "node3" / "ibacm-admin.sock"),
        "node3",
    )


def test_default_is_the_daemons_default_admin_socket() -> None:
    path, _ = target()
    assert path.endswith("ibacm-admin.sock")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--admin", "/a", "--dir", "sim", "--node", "n"], "either --admin PATH or --dir"),
        (["--dir", "sim"], "--dir and --node go together"),
        (["--node", "node1"], "--dir and --node go together"),
        (["--dir", "/nonexistent/sim", "--node", "node1"], "no such directory"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_unknown_node_lists_the_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("node1", "node2"):
        (tmp_path / name).mkdir()
    assert main(["--dir", str(tmp_path), "--node", "node9"]) == 2
    err = capsys.readouterr().err
    assert "no node 'node9'" in err and "(nodes: node1, node2)" in err
