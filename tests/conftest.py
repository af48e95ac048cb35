"""Shared test fixtures.

Real peers (Debian's ib_acme, OpenSM, tshark, ...) are used where the project talks to them.
A test that needs one calls ``require_peer``: locally a missing peer skips the test, under
CI (``CI=true``) it fails, so CI can never go green without exercising the real component.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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
