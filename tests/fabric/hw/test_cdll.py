"""ctypes calls that resolve as a C program's calls do (ibacm.fabric.hw.cdll): under an
``LD_PRELOAD`` library (the emulated HCA) its definitions win, else the library's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ibacm.fabric.emu.build import ensure_library
from ibacm.fabric.hw.cdll import load_interposable
from tests.conftest import REPO, require_file

LIBIBUMAD = Path("/usr/lib/x86_64-linux-gnu/libibumad.so.3")

# Where umad_size/umad_init resolve: in the preload, in libibumad itself, and as loaded.
WHERE = """
import ctypes, json, os, sys
from ibacm.fabric.hw.cdll import load_interposable
def at(lib, name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
library, preload = sys.argv[1], os.environ.get("LD_PRELOAD")
loaded = load_interposable(library)
own = ctypes.CDLL(library)
emu = ctypes.CDLL(preload) if preload else None
print(json.dumps({
    name: {"loaded": at(loaded, name), "own": at(own, name), "emu": emu and at(emu, name)}
    for name in ("umad_size", "umad_init")
}))
"""


@pytest.mark.parametrize("preloaded", [True, False])
def test_the_functions_are_the_ones_a_c_caller_gets(preloaded: bool) -> None:
    library = require_file(LIBIBUMAD)
    environ = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preloaded:
        environ["LD_PRELOAD"] = str(ensure_library())
    done = subprocess.run(
        [sys.executable, "-c", WHERE, str(library)],
        capture_output=True,
        text=True,
        env=environ | {"PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    for name, where in json.loads(done.stdout).items():
        assert where["own"] != where["emu"], name
        assert where["loaded"] == (where["emu"] if preloaded else where["own"]), name


def test_a_missing_library_is_an_oserror() -> None:
    with pytest.raises(OSError, match="libibacm-no-such"):
        load_interposable("libibacm-no-such.so.1")
