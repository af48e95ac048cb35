"""Find and import pyverbs, rdma-core's own Python binding, lazily.

pyverbs is an optional dependency that comes from the distribution (Debian/Ubuntu
``python3-pyverbs``, Fedora ``python3-pyverbs``), not from PyPI: the PyPI source build needs
all of rdma-core and its wheel does not load against the distribution's libibverbs. The
distribution installs it in the system interpreter's ``dist-packages``, which a virtualenv
does not see.

``load_pyverbs()`` therefore first tries a plain ``import pyverbs``; when that fails it looks
for the ``pyverbs`` package in the distribution directories and imports *only that package*
from there (the directory is not added to ``sys.path``, so nothing else installed for the
system Python leaks into the environment). pyverbs' extension modules are built for one
CPython version, so this works when the distribution's Python and ours have the same version
(Debian 12: 3.11); otherwise the error names the mismatch.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ibacm.fabric.api import NoDevicesError

DISTRO_DIRS: tuple[Path, ...] = (
    Path("/usr/lib/python3/dist-packages"),  # Debian, Ubuntu
    Path(f"/usr/lib64/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"),
    Path(f"/usr/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"),
)
"""Where distributions install pyverbs for their system Python."""

INSTALL_HINT = "install the distribution package python3-pyverbs (rdma-core)"


SUBMODULES = ("base", "device", "enums", "addr", "cq", "pd", "mr", "qp", "wr", "pyverbs_error")


class PyverbsUnavailable(NoDevicesError):
    """pyverbs cannot be imported, so no verbs device can be opened."""


@dataclass(frozen=True, slots=True)
class Pyverbs:
    """The pyverbs submodules the backend uses (pyverbs ships no type information)."""

    base: Any
    device: Any
    enums: Any
    addr: Any
    cq: Any
    pd: Any
    mr: Any
    qp: Any
    wr: Any
    pyverbs_error: Any

    @property
    def Error(self) -> type[Exception]:
        error: type[Exception] = self.pyverbs_error.PyverbsError
        return error


def load_pyverbs(search: Sequence[Path] = DISTRO_DIRS) -> Pyverbs:
    """Import pyverbs (from a distribution directory if needed) and its submodules."""
    package = _find_package(search)
    modules = {name: importlib.import_module(f"{package.__name__}.{name}") for name in SUBMODULES}
    return Pyverbs(**modules)


def _find_package(search: Sequence[Path]) -> ModuleType:
    try:
        return importlib.import_module("pyverbs")
    except ImportError as first:
        failure: Exception = first
    for directory in search:
        spec = importlib.machinery.PathFinder.find_spec("pyverbs", [str(directory)])
        if spec is None or spec.loader is None:
            continue
        try:
            return _import_from_spec(spec)
        except ImportError as exc:  # e.g. built for another CPython version
            failure = exc
    where = ", ".join(str(path) for path in search)
    raise PyverbsUnavailable(
        f"pyverbs is not importable ({failure}; looked in {where}): {INSTALL_HINT}"
    )


def _import_from_spec(spec: importlib.machinery.ModuleSpec) -> ModuleType:
    module = importlib.util.module_from_spec(spec)
    # Registered before executing so pyverbs' own "import pyverbs.x" finds the package.
    sys.modules["pyverbs"] = module
    try:
        assert spec.loader is not None
        spec.loader.exec_module(module)
        for name in SUBMODULES:
            importlib.import_module(f"pyverbs.{name}")
    except BaseException:
        for name in [key for key in sys.modules if key == "pyverbs" or key.startswith("pyverbs.")]:
            del sys.modules[name]
        raise
    return module
