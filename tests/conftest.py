"""Shared test fixtures.

Real peers (Debian's ib_acme, OpenSM, tshark, ...) are used where the project talks to them.
A test that needs one calls ``require_peer``: locally a missing peer skips the test, under
CI (``CI=true``) it fails, so CI can never go green without exercising the real component.
The same rule holds for every other requirement (a file, a module, root, a build, a resource
limit): the ``require_*`` helpers below. Only a test that does not apply to this host at all
(RDMA hardware present, a big-endian CPU: conditions CI never has) skips under CI too, through
``not_applicable``/``not_applicable_if``. These are the only places a test may skip
(tests/test_conftest.py checks it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn

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


def in_ci() -> bool:
    return os.environ.get("CI") == "true"


def missing(message: str) -> NoReturn:
    """An unmet requirement: the test skips here and fails under CI."""
    if in_ci():
        pytest.fail(message)
    pytest.skip(message)


def require(condition: bool, message: str) -> None:
    """A requirement of another kind (a build, a resource limit, a writable path)."""
    if not condition:
        missing(message)


def require_peer(executable: str) -> str:
    """Return the path of a real third-party executable, or skip/fail when it is missing."""
    path = _third_party(executable) or (executable if os.path.exists(executable) else None)
    if path is None:
        missing(f"real peer {executable!r} is not installed (run scripts/setup.sh as root)")
    return path


def require_file(path: Path) -> Path:
    """Like require_peer, for a data file shipped by a Debian package or beside the repo."""
    require(path.exists(), f"required file {path} is missing")
    return path


def require_module(name: str) -> None:
    """Like require_peer, for a Python module of the test extras."""
    require(importlib.util.find_spec(name) is not None, f"Python module {name!r} is missing")


def require_root(why: str) -> None:
    """Like require_peer, for root (CI runs as root, see scripts/setup.sh)."""
    require(os.geteuid() == 0, f"needs root: {why}")


def not_applicable(reason: str) -> NoReturn:
    """The test does not apply to this host (a condition CI never has): a skip, CI or not."""
    pytest.skip(f"not applicable here: {reason}")


def not_applicable_if(condition: bool, reason: str) -> pytest.MarkDecorator:
    """``not_applicable`` as a mark, decided at collection."""
    return pytest.mark.skipif(condition, reason=f"not applicable here: {reason}")


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
