"""Which daemon's admin socket an operator tool talks to: ``--admin PATH``, a node of an
``ibacm-sim`` cluster (``--dir SIMDIR --node NAME``), or the daemon's default.

Shared by ``ibacm-admin`` (tools) and the ``ibacm-tui`` dashboard so both read the same flags
the same way; it lives here, with the paths it derives from, where both can import it.
"""

from __future__ import annotations

from pathlib import Path

from ibacm.config.options import Options
from ibacm.config.paths import RunPaths


def default_admin_socket() -> str:
    """The admin socket of a daemon run with the default options."""
    return str(Options().admin_socket_path)


def admin_target(admin: str | None, sim_dir: str | None, node: str | None) -> tuple[str, str]:
    """(admin socket path, label for messages); ValueError with a message for the user."""
    if sim_dir is not None or node is not None:
        if admin is not None:
            raise ValueError("use either --admin PATH or --dir SIMDIR --node NAME, not both")
        if sim_dir is None or node is None:
            raise ValueError("--dir and --node go together (a node of an ibacm-sim cluster)")
        root = Path(sim_dir)
        if not root.is_dir():
            raise ValueError(f"--dir {root}: no such directory")
        node_dir = root / node
        if not node_dir.is_dir():
            nodes = sorted(p.name for p in root.iterdir() if p.is_dir())
            known = ", ".join(nodes) if nodes else "none"
            raise ValueError(f"no node {node!r} in {root} (nodes: {known})")
        # ibacm-sim runs each node's daemon with its directory as run_dir.
        return str(RunPaths(node_dir).admin_socket), node
    path = admin or default_admin_socket()
    return path, path
