"""Fixtures of the dashboard tests: a real simulated cluster and the in-test admin server."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tui.cluster import SimCluster, start_cluster
from tests.tui.lab import LabServer
from tests.tui.workload import resolve_when_ready


def _short_dir(prefix: str) -> Path:
    # Unix socket paths are limited to 107 bytes; pytest's tmp paths can be long.
    return Path(tempfile.mkdtemp(prefix=prefix))


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimCluster]:
    """Two real daemons on the simulated fabric; node1 has resolved node2 once."""
    directory = _short_dir("ibacm-tui-")
    sim = start_cluster(directory / "sim")
    try:
        status = resolve_when_ready(sim.client_socket("node1"), "node1", "node2")
        assert status == 0, f"node1 could not resolve node2 (ACM status {status})"
        yield sim
    finally:
        sim.down()
        _remove_tree(directory)


@pytest.fixture
def lab() -> Iterator[LabServer]:
    directory = _short_dir("ibacm-lab-")
    server = LabServer(directory / "admin.sock").start()
    try:
        yield server
    finally:
        server.stop()
        _remove_tree(directory)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
