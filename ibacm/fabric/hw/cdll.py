"""Loading libibverbs/libibumad through ctypes so calls resolve as a C program's calls do.

``ctypes.CDLL(name).f`` looks ``f`` up in that library alone, while a C program's call to ``f``
goes through the global scope, where an ``LD_PRELOAD`` library comes first. The emulated HCA
(``ibacm.fabric.emu``) and ibsim's ``libumad2sim.so`` are such preloads, so under a preload the
functions are taken from the global scope; the library is loaded ``RTLD_GLOBAL`` first so its own
definitions are there too.
"""

from __future__ import annotations

import ctypes
import os


def load_interposable(library: str) -> ctypes.CDLL:
    """The library's functions as a C caller would get them (raises OSError when missing)."""
    own = ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL, use_errno=True)
    if os.environ.get("LD_PRELOAD"):
        return ctypes.CDLL(None, use_errno=True)
    return own
