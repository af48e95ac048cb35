"""Entry-point targets the registry must refuse, each for a different reason."""

from __future__ import annotations

from typing import ClassVar

from tests.core.provider_pkg.testprov import TestProvider


class OldApiProvider(TestProvider):
    """Built against another provider API version."""

    name = "oldapi"
    api_version: ClassVar[int] = 0


class NamelessProvider(TestProvider):
    name = ""


class OtherProvider(TestProvider):
    """A valid second provider with its own name (for prefix mapping tests)."""

    name = "otherprov"


class FailingStartProvider(TestProvider):
    name = "failstart"

    async def start(self) -> None:
        raise RuntimeError("cannot start: missing resource")


class NotAProvider:
    name = "plain"
