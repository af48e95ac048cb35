"""Run an unmodified program as if it were on one simulated node: ``/run`` is the node's directory.

rdma-core's programs (the C ``ibacm``, ``ib_acme``, librdmacm) have their socket, pid and port
file paths compiled in under ``/run``. A private mount namespace in which the node's run
directory is bound on ``/run`` gives each of them its own node without changing a byte of them.
This needs root (``unshare -m``); the bind is private, so the host's ``/run`` is untouched.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path


class NamespaceError(Exception):
    """A private mount namespace cannot be made here; the message says why."""


def namespace_support() -> str | None:
    """None when private mount namespaces can be made, else the reason they cannot."""
    if os.geteuid() != 0:
        return "a private mount namespace needs root (unshare -m)"
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "unshare(1) and mount(8) (util-linux) are needed"
    return None


def private_run_argv(
    run_dir: Path,
    argv: Sequence[str],
    *,
    binds: Sequence[tuple[Path, str]] = (),
    ignore_sigpipe: bool = False,
) -> list[str]:
    """The command line that runs ``argv`` with ``run_dir`` bound on ``/run``.

    ``binds`` adds more (source, target) bind mounts made before ``argv`` starts (e.g. a fake
    device node). ``unshare`` (no ``--fork``) execs the shell, which only mounts and then
    ``exec``s ``argv``: the pid the caller gets is the program's own. ``ignore_sigpipe``
    starts it with SIGPIPE ignored, as systemd starts a service (``IgnoreSIGPIPE=yes``).
    """
    reason = namespace_support()
    if reason is not None:
        raise NamespaceError(reason)
    if not argv:
        raise NamespaceError("no command to run")
    mounts = [("mount", "--bind", str(run_dir), "/run")]
    mounts += [("mount", "--bind", str(src), dst) for src, dst in binds]
    script = " && ".join(shlex.join(m) for m in mounts) + ' && exec "$@"'
    if ignore_sigpipe:  # an ignored signal stays ignored across exec
        script = "trap '' PIPE && " + script
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        script,
        "ibacm-node",
        *argv,
    ]
