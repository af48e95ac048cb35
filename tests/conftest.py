"""Shared test fixtures.

Real peers (Debian's ib_acme, OpenSM, tshark, ...) are used where the project talks to them.
A test that needs one calls ``require_peer``: locally a missing peer skips the test, under
CI (``CI=true``) it fails, so CI can never go green without exercising the real component.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
CAPTURES = SHARED / "captures" / "client-requests"
SPEC = SHARED / "spec"


def _third_party(executable: str) -> str | None:
    """The executable on PATH that is not ours: with the venv activated its bin directory
    comes first and holds our own ``ib_acme``, which must never stand in for the real one."""
    ours = (Path(sys.prefix).resolve(), REPO.resolve())
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        found = shutil.which(executable, path=directory or ".")
        if found and not any(Path(found).resolve().is_relative_to(mine) for mine in ours):
            return found
    return None


def require_peer(executable: str) -> str:
    """Return the path of a real third-party executable, or skip/fail when it is missing."""
    path = _third_party(executable) or (executable if os.path.exists(executable) else None)
    if path is None:
        message = f"real peer {executable!r} is not installed (run scripts/setup.sh as root)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def require_file(path: Path) -> Path:
    """Like require_peer, for a data file shipped by a Debian package or beside the repo."""
    if not path.exists():
        message = f"required file {path} is missing"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def ibacm_sim(*args: str) -> subprocess.CompletedProcess[str]:
    """Run this installation's ``ibacm-sim`` (never a daemon found on PATH), captured."""
    return subprocess.run(
        [sys.executable, "-m", "ibacm.tools.sim", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@contextlib.contextmanager
def sim_cluster(prefix: str, *up_args: str) -> Iterator[Path]:
    """The directory of an ``ibacm-sim up`` cluster (``up_args``: ``--nodes 3`` ...), brought
    down and removed on the way out."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        up = ibacm_sim("up", "--dir", str(directory), *up_args)
        assert up.returncode == 0, up.stdout + up.stderr
        yield directory
    finally:
        ibacm_sim("down", "--dir", str(directory))
        shutil.rmtree(directory, ignore_errors=True)


def on_terminal(
    argv: Sequence[str], timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], bytes]:
    """Run ``argv`` with its stderr on a pseudo-terminal: its result (stdout captured) and
    every byte it showed on the terminal."""
    master, slave = os.openpty()
    try:
        done = subprocess.run(
            list(argv), stdout=subprocess.PIPE, stderr=slave, text=True, timeout=timeout
        )
        os.close(slave)
        shown = b""
        with contextlib.suppress(OSError):  # EIO once everything written is read
            while chunk := os.read(master, 4096):
                shown += chunk
    finally:
        os.close(master)
    return done, shown
