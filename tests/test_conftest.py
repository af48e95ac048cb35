"""The skip rule of tests/conftest.py: an unmet requirement skips here and fails under CI.

The helpers are run for real (pytest in a child process, with and without ``CI=true``), and
every test module is scanned so that a bare skip, which would let CI go green without the
real component, cannot come back.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO

TESTS = REPO / "tests"
# The helpers, and this file (which spells the patterns it looks for).
SANCTIONED = {TESTS / "conftest.py", Path(__file__).resolve()}
# Everything that skips or expects a failure; only conftest.py's helpers may use them.
SKIPS = {
    "pytest.skip",
    "pytest.importorskip",
    "pytest.xfail",
    "pytest.mark.skip",
    "pytest.mark.skipif",
    "pytest.mark.xfail",
    "unittest.skip",
    "unittest.skipIf",
    "unittest.skipUnless",
    "unittest.SkipTest",
}


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def bare_skips(source: str) -> list[str]:
    """The skips of ``source`` that bypass the helpers, and its own reads of ``CI``: as
    ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        what = None
        if isinstance(node, ast.Attribute) and _dotted(node) in SKIPS:
            what = _dotted(node)
        elif isinstance(node, ast.ImportFrom) and node.module in ("pytest", "unittest"):
            names = {f"{node.module}.{alias.name}" for alias in node.names}
            what = ", ".join(sorted(names & SKIPS)) or None
        elif isinstance(node, ast.Constant) and node.value == "CI":
            what = "its own CI check (use in_ci, require or missing)"
        if what:
            found.append(f"{getattr(node, 'lineno', 0)}: {what}")
    return found


def test_no_test_skips_outside_the_helpers() -> None:
    offenders = {
        str(path.relative_to(REPO)): found
        for path in sorted(TESTS.rglob("*.py"))
        if path not in SANCTIONED and (found := bare_skips(path.read_text()))
    }
    assert offenders == {}


@pytest.mark.parametrize(
    "source",
    [
        "import pytest\npytest.skip('no ib_acme')\n",
        "import pytest\nneeds = pytest.mark.skipif(True, reason='x')\n",
        "import pytest\nmod = pytest.importorskip('atheris')\n",
        "from pytest import skip\n",
        "import os\nci = os.environ.get('CI') == 'true'\n",
    ],
)
def test_the_scan_finds_each_kind_of_bare_skip(source: str) -> None:
    assert bare_skips(source)


CASES = """
from pathlib import Path

from tests.conftest import (
    missing, not_applicable, not_applicable_if, require, require_file, require_module,
    require_peer,
)

def test_peer():
    require_peer("no-such-peer-of-ibacm")

def test_file():
    require_file(Path("/no/such/file/of/ibacm"))

def test_module():
    require_module("no_such_module_of_ibacm")

def test_requirement():
    require(False, "a build that is not there")

def test_missing():
    missing("a path that is not writable")

def test_present():
    assert require_peer("sh") and require_file(Path(__file__))
    require_module("pytest")
    require(True, "never said")

def test_not_applicable():
    not_applicable("this host has RDMA devices")

@not_applicable_if(True, "a big-endian host")
def test_not_applicable_mark():
    pass
"""


@pytest.mark.parametrize(
    ("ci", "outcome"),
    [("true", "5 failed, 1 passed, 2 skipped"), ("", "1 passed, 7 skipped")],
)
def test_a_missing_requirement_skips_here_and_fails_under_ci(
    tmp_path: Path, ci: str, outcome: str
) -> None:
    (tmp_path / "test_cases.py").write_text(textwrap.dedent(CASES))
    environ = {k: v for k, v in os.environ.items() if k != "CI"} | {"PYTHONPATH": str(REPO)}
    if ci:
        environ["CI"] = ci
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "test_cases.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=environ,
        timeout=120,
    )
    assert done.stdout.strip().splitlines()[-1].startswith(outcome), done.stdout + done.stderr
    # Whatever the mode, a host a test does not apply to says so, and is never a failure.
    assert done.stdout.count("not applicable here: ") == 2, done.stdout
