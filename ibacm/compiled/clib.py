"""Builds the project's small C libraries from their sources with the system compiler.

A library is built once per source version into a cache directory (``IBACM_LIB_DIR``, or
``$XDG_CACHE_HOME/ibacm``, or ``~/.cache/ibacm``), named by a hash of its sources, so a changed
source is rebuilt and concurrent builds never hand out a half-written file. The sources ship
inside the package, so an installed ibacm builds them the same way.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

CFLAGS = (
    "-O2",
    "-g",
    "-Wall",
    "-Wextra",
    "-Wno-format-truncation",
    "-Wno-array-parameter",
    "-shared",
    "-fPIC",
    "-fvisibility=hidden",
)
HEADERS = (Path("/usr/include/infiniband/verbs.h"), Path("/usr/include/infiniband/umad.h"))


class CBuildError(RuntimeError):
    """A library cannot be built here; the message says why."""


def cache_dir() -> Path:
    explicit = os.environ.get("IBACM_LIB_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ibacm"


def library_path(name: str, sources: Sequence[Path]) -> Path:
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in sources)).hexdigest()[:16]
    return cache_dir() / f"{name}-{digest}.so"


def ensure_library(name: str, sources: Sequence[Path], libs: Sequence[str] = ()) -> Path:
    """``name``'s shared library, compiled first when this version of ``sources`` never was.
    The first source is compiled; the others (headers) only count for the version."""
    target = library_path(name, sources)
    if target.exists():
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise CBuildError(f"no C compiler (cc/gcc) to build {name}")
    missing = [str(header) for header in HEADERS if not header.exists()]
    if missing:
        raise CBuildError(
            f"{name} needs {', '.join(missing)}: install libibverbs-dev and libibumad-dev"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        command = [compiler, *CFLAGS, "-o", str(built), str(sources[0]), "-lpthread", *libs]
        try:
            result = subprocess.run(command, capture_output=True, text=True, check=False)
        except OSError as exc:  # CC names a compiler that is not there, or cannot run
            raise CBuildError(
                f"cannot run the C compiler {compiler!r} to build {name}: {exc}"
            ) from exc
        if result.returncode != 0:
            raise CBuildError(f"building {name} failed:\n{result.stderr}")
        os.replace(built, target)  # atomic: a concurrent build ends with the same file
    return target
