"""Builds ``libibacm_emu.so`` from the C source beside this file with the system compiler.

The library is built once per source version into a cache directory (``IBACM_EMU_LIB_DIR``, or
``$XDG_CACHE_HOME/ibacm``, or ``~/.cache/ibacm``), named by a hash of the source and header so
a changed source is rebuilt and concurrent builds never hand out a half-written file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "libibacm_emu.c", HERE / "emu_protocol.h")
CFLAGS = ("-O2", "-g", "-Wall", "-Wextra", "-Wno-format-truncation", "-Wno-array-parameter",
          "-shared", "-fPIC", "-fvisibility=hidden")  # fmt: skip


class EmuBuildError(RuntimeError):
    """The emulated device library cannot be built here; the message says why."""


def cache_dir() -> Path:
    explicit = os.environ.get("IBACM_EMU_LIB_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ibacm"


def library_path() -> Path:
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in SOURCES)).hexdigest()[:16]
    return cache_dir() / f"libibacm_emu-{digest}.so"


def ensure_library() -> Path:
    """The built library, compiling it first when this source version was never built."""
    target = library_path()
    if target.exists():
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise EmuBuildError("no C compiler (cc/gcc) to build the emulated HCA library")
    if not Path("/usr/include/infiniband/verbs.h").exists():
        raise EmuBuildError(
            "the verbs and umad headers are missing: install libibverbs-dev and libibumad-dev"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        command = [compiler, *CFLAGS, "-o", str(built), str(SOURCES[0]), "-lpthread"]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise EmuBuildError(f"building the emulated HCA library failed:\n{result.stderr}")
        os.replace(built, target)  # atomic: a concurrent build ends with the same file
    return target


def main() -> int:
    try:
        print(ensure_library())
    except EmuBuildError as exc:
        print(f"ibacm-emu-build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
