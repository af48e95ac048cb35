"""What the core gives providers (``CoreServices``): TIDs, SA MADs, events, options, counters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ibacm.config.options import Options
from ibacm.core.logging import EventSink
from ibacm.core.sa import SaChannel, TidCounter
from ibacm.fabric.api import SaCall, SaSendError
from ibacm.provider.api import CorePort, CoreServices, Counters


class DaemonServices(CoreServices):
    """The daemon's ``CoreServices``; ``options`` is replaced on reload."""

    def __init__(self, options: Options, counters: Counters, bus: EventSink | None) -> None:
        self.options = options
        self.counters = counters
        self.bus = bus
        self.tids = TidCounter()
        self.sa_channels: dict[CorePort, SaChannel] = {}
        """The SA channel of every port that is up (the core adds and removes them)."""

    def next_tid(self) -> int:
        return self.tids.next()

    async def sa_request(self, port: CorePort, mad: bytes) -> bytes:
        return await self._channel(port).request(
            mad,
            timeout_ms=self.options.effective_sa_timeout,
            retries=self.options.effective_sa_retries,
        )

    def sa_start(self, port: CorePort, mad: bytes) -> SaCall | None:
        channel = self.sa_channels.get(port)
        if channel is None:
            return None  # ``sa_request`` says why
        return channel.start(
            mad,
            timeout_ms=self.options.effective_sa_timeout,
            retries=self.options.effective_sa_retries,
        )

    def _channel(self, port: CorePort) -> SaChannel:
        channel = self.sa_channels.get(port)
        if channel is None:
            raise SaSendError(f"port {port.device.name}/{port.port_num} is not up")
        return channel

    async def sa_report(self, port: CorePort) -> bytes:
        return await self._channel(port).report()

    async def sa_post(self, port: CorePort, mad: bytes) -> None:
        # The channel's destination follows SM changes; the port's attributes may not.
        await self._channel(port).post(mad)

    def publish(self, kind: str, data: Mapping[str, Any]) -> None:
        if self.bus is not None:
            self.bus.publish(kind, data)

    def wants(self, kind: str) -> bool:
        bus = self.bus
        if bus is None:
            return False
        has_subscribers = getattr(bus, "has_subscribers", None)
        # A sink that cannot tell is offered every event.
        return bool(has_subscribers(kind)) if callable(has_subscribers) else True
