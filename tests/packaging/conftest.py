"""Fixtures of the packaging and operations tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.packaging.simfabric import Hub, running_hub


@pytest.fixture(scope="session")
def sim_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """One simulated fabric (node1..node6) for every test that runs real daemons."""
    with running_hub(tmp_path_factory.mktemp("hub"), nodes=6) as hub:
        yield hub
