"""Fixtures of the real-peer tests: one ibsim + OpenSM fabric shared by the tests that ask."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.peers.ibsim import SimFabric, opensm_on_ibsim


@pytest.fixture(scope="package")
def sim_fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFabric]:
    with opensm_on_ibsim(tmp_path_factory.mktemp("ibsim")) as fabric:
        yield fabric
