"""What the simulated subnet manager does when the fabric changes, and the events it causes.

A port going down or up is reported to the SA's subscribers (trap 65 or 64: GID out of / in
service) and to the node as PORT_ERR / PORT_ACTIVE; a port that leaves the subnet loses its
multicast memberships and subscriptions. A new LID is a LID_CHANGE; the master SM moving is
an SM_CHANGE on every active port, then CLIENT_REREGISTER (what OpenSM sends when the master
SM LID changes), and the new SM starts with only the IPoIB broadcast groups.
"""

from __future__ import annotations

import trio

from ibacm.fabric.api import FabricError, PortEvent, PortEventType, PortState
from ibacm.fabric.sim.runtime import PortRuntime
from ibacm.fabric.sim.sa_transport import SaTransport
from ibacm.wire.notice import Trap


class SubnetManager:
    """See the module docstring."""

    def __init__(self, sa_transport: SaTransport) -> None:
        self.sa_transport = sa_transport
        # The world's, as the SA transport holds them.
        self.directory = sa_transport.directory
        self.sa = sa_transport.sa
        self.stats = sa_transport.stats

    def emit(self, port: PortRuntime, kind: PortEventType) -> None:
        """The port event ``kind`` to everyone listening to the port's device."""
        event = PortEvent(port.num, kind)
        self.stats[f"event_{kind.value}"] += 1
        for sink in list(port.device.event_sinks):
            sink.deliver_event(event)

    def set_port_state(self, node: str, device: str, port: int, active: bool) -> None:
        """Take a port down (PORT_ERR; the SM forgets its memberships) or up (PORT_ACTIVE)."""
        directory = self.directory
        runtime = directory.port(node, device, port)
        if directory.router.link(runtime.guid) is None or not runtime.lid:
            raise FabricError(f"{runtime.name} has no link; it cannot change state")
        if active == runtime.active:
            return
        if active:
            directory.set_state(runtime, PortState.ACTIVE)
            self.emit(runtime, PortEventType.PORT_ACTIVE)
            self.sa_transport.report(Trap.GID_IN_SERVICE, runtime)
        else:
            self.sa_transport.report(Trap.GID_OUT_OF_SERVICE, runtime)
            directory.set_state(runtime, PortState.DOWN)
            self.sa.groups.remove_port(runtime.guid)
            self.sa.forget_port(runtime.guid)
            self.emit(runtime, PortEventType.PORT_ERR)

    async def port_flap(
        self, node: str, device: str, port: int, down_for: float, *, reregister: bool = True
    ) -> None:
        """Port down for ``down_for`` seconds, then up; OpenSM then asks it to re-register."""
        if down_for < 0:
            raise ValueError(f"down_for must be >= 0, got {down_for}")
        self.set_port_state(node, device, port, False)
        await trio.sleep(down_for)
        self.set_port_state(node, device, port, True)
        if reregister:
            self.emit(self.directory.port(node, device, port), PortEventType.CLIENT_REREGISTER)

    def set_lid(self, node: str, device: str, port: int, lid: int) -> None:
        """Give a port a new LID (LID_CHANGE); moving the SM's LID also tells everyone."""
        runtime = self.directory.port(node, device, port)
        self.directory.move_lid(runtime, lid)
        if runtime.active:
            self.emit(runtime, PortEventType.LID_CHANGE)
        if runtime.guid == self.directory.sm_guid:
            self._announce_sm(reregister=True)

    def move_sm(self, node: str, *, reregister: bool = True) -> None:
        """The master SM moves behind ``node`` (a host's first active port, or a switch).

        The new SM starts with no multicast groups but the IPoIB broadcast groups; every
        active port gets SM_CHANGE, then CLIENT_REREGISTER (what OpenSM sends when the master
        SM LID changes) unless ``reregister`` is False.
        """
        guid = self._sm_guid_for(node)
        if guid == self.directory.sm_guid:
            return
        self.directory.sm_guid = guid
        self.sa.groups.clear()
        self.sa.forget_subscriptions()
        self._announce_sm(reregister=reregister)

    def _sm_guid_for(self, node: str) -> int:
        switch = self.directory.switch_named(node)
        if switch is not None:
            return switch.guid
        for port in self.directory.all_ports(node):
            if port.active:
                return port.guid
        raise FabricError(f"node {node!r} has no active port to run the SM")

    def _announce_sm(self, *, reregister: bool) -> None:
        ports = [p for p in self.directory.all_ports() if p.active]
        for port in ports:
            self.emit(port, PortEventType.SM_CHANGE)
        if reregister:
            for port in ports:
                self.emit(port, PortEventType.CLIENT_REREGISTER)

    def client_reregister(self, node: str | None = None) -> None:
        """CLIENT_REREGISTER on every active port of ``node`` (default: every node)."""
        for port in self.directory.all_ports(node):
            if port.active:
                self.emit(port, PortEventType.CLIENT_REREGISTER)
