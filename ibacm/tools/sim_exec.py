"""``ibacm-sim exec --dir DIR NODE -- CMD...``: an unmodified program, as if on NODE.

CMD runs in a private mount namespace (``sim_ns``) where ``/run`` is NODE's run directory, so
programs with compiled-in paths find that node's daemon: ``ib_acme`` without ``-S``
(``/run/ibacm-unix.sock``), ``ib_acme -S 127.0.0.1`` (``/run/ibacm-tcp.port``) and librdmacm
(``/run/ibacm.sock``, ``/run/ibacm.port``).

librdmacm gives up before it talks to ibacm when libibverbs finds no device. For a node of
the simulated fabric the namespace gets one fake verbs device with no code behind it: a sysfs
tree that libibverbs reads through ``SYSFS_PATH`` and a ``/dev`` holding an empty
``infiniband/uverbs0`` beside the usual character devices (real-peers.md §2). Enough for
address and route lookup; creating RDMA resources on it fails. A node with an emulated HCA
(``--c-ibacm``/``--hw``) gets that instead: the preload library and its device socket.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ibacm.tools import sim_kinds
from ibacm.tools.sim_layout import Layout, SimToolError, read_pids, read_topology
from ibacm.tools.sim_ns import NamespaceError, private_run_argv

DEV_NODES = ("null", "zero", "urandom", "random", "tty")


def fake_verbs_device(root: Path, node_guid: int) -> tuple[dict[str, str], list[tuple[Path, str]]]:
    """Write the fake sysfs tree and /dev under ``root``; the environment and binds to use."""
    sysfs, dev = root / "sysfs", root / "dev"
    files = {
        "class/infiniband_verbs/abi_version": "6",
        "class/infiniband_verbs/uverbs0/ibdev": "rxe0",
        "class/infiniband_verbs/uverbs0/dev": "231:192",
        # The rxe provider accepts kernel ABI 1 or 2.
        "class/infiniband_verbs/uverbs0/abi_version": "2",
        "class/infiniband/rxe0/node_type": "1: CA",
        "class/infiniband/rxe0/node_guid": _guid_text(node_guid),
        "class/misc/rdma_cm/abi_version": "4",
    }
    for name, text in files.items():
        path = sysfs / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    (sysfs / "class/infiniband/rxe0/ports/1").mkdir(parents=True, exist_ok=True)
    (dev / "infiniband").mkdir(parents=True, exist_ok=True)
    (dev / "infiniband" / "uverbs0").touch()
    binds: list[tuple[Path, str]] = []
    for name in DEV_NODES:
        if Path("/dev", name).exists():
            (dev / name).touch()
            binds.append((Path("/dev", name), str(dev / name)))
    binds.append((dev, "/dev"))
    return {"SYSFS_PATH": str(sysfs)}, binds


def _guid_text(guid: int) -> str:
    text = f"{guid:016x}"
    return ":".join(text[i : i + 4] for i in range(0, 16, 4))


def exec_command(
    node_dir: Path,
    kind: str,
    node_guid: int,
    argv: Sequence[str],
    base_env: dict[str, str],
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run ``argv`` as if on the node."""
    env = dict(base_env)
    binds: list[tuple[Path, str]] = []
    if kind in (sim_kinds.NodeKind.C.value, sim_kinds.NodeKind.HW.value):
        env = sim_kinds.emulated_env(env, sim_kinds.check_emulation_library(), node_dir)
    else:
        extra, binds = fake_verbs_device(node_dir / ".exec", node_guid)
        env.update(extra)
    return private_run_argv(node_dir, argv, binds=binds), env


def run_exec(argv: list[str], env: dict[str, str]) -> int:
    """Replace this process with the namespaced command (its exit status is ours)."""
    os.execvpe(argv[0], argv, env)
    return 127  # not reached


def exec_on_node(layout: Layout, node: str, argv: Sequence[str]) -> int:
    """``ibacm-sim exec``: run ``argv`` (after an optional ``--``) as if on ``node``."""
    command = list(argv[1:] if argv[:1] == ["--"] else argv)
    if not command:
        raise SimToolError("exec needs a command: ibacm-sim exec --dir DIR NODE -- CMD ...")
    host = read_topology(layout).host(node)
    kind = sim_kinds.kinds_of(read_pids(layout)).get(node, sim_kinds.NodeKind.SIM.value)
    try:
        namespaced, env = exec_command(
            layout.node_dir(node), kind, host.hcas[0].node_guid, command, dict(os.environ)
        )
    except (sim_kinds.KindError, NamespaceError) as exc:
        raise SimToolError(str(exc)) from exc
    sys.stdout.flush()
    return run_exec(namespaced, env)
