"""Builds ``libibacm_emu.so``, the emulated HCA's preload library (``python -m`` prints it)."""

from __future__ import annotations

import sys
from pathlib import Path

from ibacm.compiled.clib import CBuildError
from ibacm.compiled.clib import ensure_library as _ensure

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "libibacm_emu.c", HERE / "emu_protocol.h")
EmuBuildError = CBuildError


def ensure_library() -> Path:
    return _ensure("libibacm_emu", SOURCES)


def main() -> int:
    try:
        print(ensure_library())
    except CBuildError as exc:
        print(f"ibacm-emu-build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
