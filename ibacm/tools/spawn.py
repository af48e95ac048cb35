"""Command lines that run a module of this installation in a new interpreter.

``python -m ibacm...`` finds the package only where the interpreter looks by default. The
Debian package keeps ibacm in a private directory that only its launchers add to
``sys.path``, so children started that way failed ("No module named 'ibacm'"). A child is
told where this installation's package lives instead, and runs isolated (``-I``) like the
launchers: the environment's PYTHONPATH cannot put another ibacm in its place.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ibacm

PACKAGE_ROOT = Path(ibacm.__file__).resolve().parent.parent
"""The directory that holds this installation's ``ibacm`` package."""

_BOOT = (
    "import runpy, sys; root, module = sys.argv[1:3]; sys.path.insert(0, root); "
    "sys.argv = [module, *sys.argv[3:]]; runpy.run_module(module, run_name='__main__', "
    "alter_sys=True)"
)


def module_command(module: str) -> list[str]:
    """``python -m module`` for this installation, wherever it is installed."""
    return [sys.executable, "-I", "-c", _BOOT, str(PACKAGE_ROOT), module]
