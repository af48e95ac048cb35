"""The simulated fabric's runtime records: hosts, devices, ports and UD QPs as they are now.

A topology says what is cabled; these records say what a running world holds: each port's
state and LID (both change at run time), the QPs on it, the SA agents registered on it, and
who listens to a device's port events and a host's address events. They are plain data; the
objects that change them are ``directory.py`` (lookups, addresses), ``delivery.py`` (QPs) and
``sm.py`` (port state, LIDs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

from ibacm.fabric.api import (
    FabricError,
    InterfaceAddress,
    IpEvent,
    PortEvent,
    PortState,
    ReceivedMad,
)

FIRST_QPN = 0x100
MAX_QPN = 0xFFFFFF


class QpSink(Protocol):
    def deliver(self, received: ReceivedMad) -> bool:
        """Queue a received MAD; False when the receive queue is full (the MAD is dropped)."""
        ...


class EventSink(Protocol):
    def deliver_event(self, event: PortEvent) -> None: ...


class IpSink(Protocol):
    def deliver_ip(self, event: IpEvent) -> None: ...


@dataclass(eq=False, slots=True)
class SwitchEndpoint:
    """A switch's management port (port 0): it has a LID and can host the SM."""

    name: str
    guid: int
    lid: int
    lmc: int
    mtu_cap: int
    rate: int
    pkeys: tuple[int, ...] = (0xFFFF,)
    description: str = ""

    @property
    def active(self) -> bool:
        return True


@dataclass(eq=False, slots=True)
class PortRuntime:
    """One HCA port as it is now (state and LID change at run time)."""

    device: DeviceRuntime
    num: int
    guid: int
    lid: int
    lmc: int
    state: PortState
    pkeys: tuple[int, ...]
    mtu_cap: int
    mtu: int
    width: int
    speed: int
    rate: int
    gid0: bytes
    switch: int | None = None
    """GUID of the switch the port is cabled to (None: no cable or HCA-to-HCA)."""
    qps: dict[int, WorldQp] = field(default_factory=dict)
    agents: dict[int, Callable[[bytes], None]] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.state == PortState.ACTIVE

    @property
    def name(self) -> str:
        return f"{self.device.host.name}/{self.device.name}/{self.num}"


Endpoint: TypeAlias = PortRuntime | SwitchEndpoint
"""Whatever a LID or a port GUID can name: an HCA port or a switch's port 0."""


@dataclass(eq=False, slots=True)
class DeviceRuntime:
    host: HostRuntime
    name: str
    node_guid: int
    description: str
    ports: list[PortRuntime] = field(default_factory=list)
    event_sinks: list[EventSink] = field(default_factory=list)
    next_qpn: int = FIRST_QPN

    def port(self, num: int) -> PortRuntime:
        for port in self.ports:
            if port.num == num:
                return port
        raise FabricError(f"{self.host.name}/{self.name} has no port {num}")

    def subscribe(self, sink: EventSink) -> None:
        """``sink`` gets this device's port events from now on."""
        self.event_sinks.append(sink)

    def unsubscribe(self, sink: EventSink) -> None:
        if sink in self.event_sinks:
            self.event_sinks.remove(sink)


@dataclass(eq=False, slots=True)
class HostRuntime:
    name: str
    devices: list[DeviceRuntime] = field(default_factory=list)
    addresses: list[InterfaceAddress] = field(default_factory=list)
    ip_sinks: list[IpSink] = field(default_factory=list)
    interfaces: dict[str, PortRuntime] = field(default_factory=dict)

    def device(self, name: str) -> DeviceRuntime:
        for device in self.devices:
            if device.name == name:
                return device
        raise FabricError(f"host {self.name} has no device {name!r}")

    def subscribe_ip(self, sink: IpSink) -> None:
        """``sink`` gets this host's address events from now on."""
        self.ip_sinks.append(sink)

    def unsubscribe_ip(self, sink: IpSink) -> None:
        if sink in self.ip_sinks:
            self.ip_sinks.remove(sink)


@dataclass(eq=False, slots=True)
class WorldQp:
    """The fabric's view of one UD QP."""

    qpn: int
    port: PortRuntime
    pkey_index: int
    qkey: int
    sink: QpSink
    attachments: set[tuple[bytes, int]] = field(default_factory=set)
    closed: bool = False
    pkey: int = 0
    pkey_base: int = 0
    """Partition (low 15 bits), precomputed for the delivery hot path."""
    pkey_full: bool = False

    def __post_init__(self) -> None:
        self.pkey = self.port.pkeys[self.pkey_index]
        self.pkey_base = self.pkey & 0x7FFF
        self.pkey_full = bool(self.pkey & 0x8000)
