"""Children that run a module of this installation (ibacm.tools.spawn): they find this ibacm
wherever it is installed, and no other ibacm on PYTHONPATH or in their directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ibacm import __version__
from ibacm.tools.spawn import PACKAGE_ROOT, module_command
from tests.conftest import REPO


def shadowed(tmp_path: Path) -> dict[str, str]:
    """An ``ibacm`` package that fails when imported, in ``tmp_path`` and on PYTHONPATH."""
    shadow = tmp_path / "ibacm"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise SystemExit('the shadow ibacm was imported')\n")
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def test_the_package_root_is_this_installations() -> None:
    assert REPO.resolve() == PACKAGE_ROOT


def test_a_child_runs_this_installations_module_past_a_shadowing_ibacm(tmp_path: Path) -> None:
    environ = shadowed(tmp_path)
    plain = [sys.executable, "-m", "ibacm.tools.sim", "--version"]
    naive = subprocess.run(plain, capture_output=True, text=True, env=environ, cwd=tmp_path)
    assert "the shadow ibacm was imported" in naive.stderr  # what the helper prevents
    command = [*module_command("ibacm.tools.sim"), "--version"]
    done = subprocess.run(command, capture_output=True, text=True, env=environ, cwd=tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, f"ibacm-sim {__version__}"), done.stderr
