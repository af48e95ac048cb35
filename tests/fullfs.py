"""A really full file system for the tests of what a full disk costs: a small tmpfs (root)
filled with one file. Where no tmpfs can be mounted the test skips, and fails under CI
(``CI=true``), like ``require_peer``."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import missing, require_root

SIZE = 64 * 1024
FILLER = "filler"


@contextlib.contextmanager
def full_tmpfs(directory: Path, *, room: int = 0) -> Iterator[Path]:
    """Mount a 64 KiB tmpfs on ``directory``, fill it but for ``room`` bytes (rounded to
    pages by tmpfs), yield it, unmount it. ``free(directory)`` empties it again, ``fill``
    fills it up."""
    directory.mkdir(parents=True, exist_ok=True)
    require_root("mounting a full tmpfs")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        missing(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        fill(directory, SIZE - room)
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def fill(directory: Path, size: int = SIZE) -> None:
    """Take up to ``size`` more bytes of the tmpfs (by default all that is left)."""
    fd = os.open(directory / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        with contextlib.suppress(OSError):  # ENOSPC: full, as wanted
            os.write(fd, b"\0" * size)
    finally:
        os.close(fd)


def free(directory: Path) -> None:
    """Make room again on a full tmpfs."""
    (directory / FILLER).unlink()
