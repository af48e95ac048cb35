"""Fixtures of the ib_acme tests: a fake daemon on a short unix path, and ways to run the tools.

Ours runs in-process (``ib_acme.run`` in a worker thread, so the trio fake keeps serving); the
real C tool runs as a subprocess. Socket paths live in a short temporary directory because a
unix socket path must fit in 108 bytes.
"""

from __future__ import annotations

import io
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from ibacm.tools import ib_acme
from tests.tools.fake_acm import FakeAcm


@dataclass(frozen=True)
class Result:
    status: int
    stdout: str
    stderr: str


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="acme"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def fake(short_dir: Path) -> AsyncIterator[FakeAcm]:
    server = FakeAcm(short_dir / "acm.sock")
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield server
        nursery.cancel_scope.cancel()


async def run_ours(*args: str) -> Result:
    out, err = io.StringIO(), io.StringIO()
    status = await trio.to_thread.run_sync(ib_acme.run, list(args), out, err)
    return Result(status, out.getvalue(), err.getvalue())


async def run_c(executable: str, *args: str) -> Result:
    done = await trio.run_process(
        [executable, *args], capture_stdout=True, capture_stderr=True, check=False
    )
    status = done.returncode if done.returncode >= 0 else 128 - done.returncode
    return Result(status, done.stdout.decode(errors="replace"), done.stderr.decode("latin-1"))
