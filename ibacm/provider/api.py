"""The provider API: what a resolution provider implements and what the core gives it.

This is the Python form of rdma-core's ``acm_prov.h`` (ibacm_prov(7)), adapted to trio:

* The core owns devices, ports, endpoints and addresses and calls the provider's
  ``open_*``/``close_*``/``add_address``/``remove_address`` as they come and go.
* Each port has a nursery owned by the core (``CorePort.nursery``). A provider starts every
  background task of that port (receive loops, retry timers, credit queues) in it, so a port
  going down cancels exactly that port's work.
* ``resolve`` and ``query`` are awaited by the core for each client request: they return the
  result instead of calling back, so every request ends exactly once. A request that must wait
  (cache miss) simply waits; the provider keeps the resolution itself going in the port
  nursery, so a client that disconnects only cancels its own wait.
* The core turns results into wire replies (client protocol or kernel netlink).

Providers are found through the entry-point group ``ibacm.providers``; the entry point names
a ``Provider`` subclass whose ``api_version`` must equal ``PROVIDER_API_VERSION``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ibacm.fabric.api import SaCall, SaDestination
from ibacm.provider.route_table import RouteTable
from ibacm.wire.counters import COUNTER_MASK
from ibacm.wire.counters import Counter as Counter  # providers count with it (re-exported)

if TYPE_CHECKING:
    import trio

    from ibacm.config.options import Options
    from ibacm.fabric.api import Device, Port, PortAttributes, PortEventType
    from ibacm.wire.client import AcmStatus, AddrType, EpAddr
    from ibacm.wire.path_record import PathRecord

PROVIDER_API_VERSION = 1
ENTRY_POINT_GROUP = "ibacm.providers"


class Counters:
    """The ACM counters (``Counter``), unbounded (reported modulo 2**64); C used 32-bit signed
    ints."""

    __slots__ = ("tallies", "values")

    def __init__(self) -> None:
        self.values = [0] * len(Counter)
        self.tallies: tuple[Counters, ...] = ()
        """Counts kept by another writer (the client loop's thread counts its cache hits in
        its own set), added in every snapshot: each counter keeps one writer."""

    def increment(self, counter: Counter, amount: int = 1) -> None:
        self.values[counter] += amount

    def add_tally(self, tally: Counters) -> None:
        self.tallies = (*self.tallies, tally)  # replaced whole: read from another thread

    def snapshot(self) -> list[int]:
        values = list(self.values)
        for tally in self.tallies:
            values = [mine + theirs for mine, theirs in zip(values, tally.snapshot(), strict=True)]
        return [value & COUNTER_MASK for value in values]


class CoreServices(abc.ABC):
    """Services the core exports to providers (``acm_*`` functions of the C ABI)."""

    options: Options
    counters: Counters
    """Global counters (the global PERF_QUERY)."""

    @abc.abstractmethod
    def next_tid(self) -> int:
        """Next value of the daemon-wide 32-bit transaction counter (first value 1)."""

    @abc.abstractmethod
    async def sa_request(self, port: CorePort, mad: bytes) -> bytes:
        """Send an SA MAD on ``port`` to its SM with the core's credit limit (``sa_depth``,
        FIFO) and umad timeout/retries from the options. Returns the reply MAD; raises
        ``ibacm.fabric.api.SaTimeout`` / ``SaSendError``."""

    def sa_start(self, port: CorePort, mad: bytes) -> SaCall | None:
        """``sa_request`` without waiting, when it can go out now (a credit free, a port
        that can: ``Port.sa_start``): the call, ended in the round that reads its reply; its
        ``wait`` (retransmissions, time-out) is for the caller's task. None: use
        ``sa_request``."""
        return None

    async def sa_report(self, port: CorePort) -> bytes:
        """Wait for the next SubnAdmReport the SA sent to ``port`` (the events a provider
        subscribed to with InformInfo); raises ``SaSendError`` where none can arrive."""
        return await port.port.sa_report()

    async def sa_post(self, port: CorePort, mad: bytes) -> None:
        """Send an SA MAD that gets no answer (a ReportResp) to ``port``'s SM."""
        attrs = port.attrs
        await port.port.sa_post(mad, SaDestination(attrs.sm_lid, attrs.sm_sl, port.sa_pkey_index))

    @abc.abstractmethod
    def publish(self, kind: str, data: Mapping[str, Any]) -> None:
        """Tell admin-socket subscribers about a change (e.g. a cache entry or group)."""

    def wants(self, kind: str) -> bool:
        """Whether ``publish(kind, ...)`` would reach anyone (skip building costly events)."""
        return True


@dataclass(eq=False)
class CoreDevice:
    """A device as the core tracks it."""

    device: Device
    name: str
    node_guid: int
    phys_port_cnt: int


@dataclass(eq=False)
class CorePort:
    """An ACTIVE port as handed to a provider."""

    device: CoreDevice
    port: Port
    port_num: int
    attrs: PortAttributes
    nursery: trio.Nursery
    """Owned by the core; cancelled when the port goes down or changes."""

    @property
    def sa_pkey_index(self) -> int:
        return self.attrs.sa_pkey_index()


@dataclass(eq=False)
class CoreEndpoint:
    """An endpoint = (device, port, P_Key) with at least one address."""

    port: CorePort
    pkey: int
    """P_Key exactly as found in the port's table (membership bit included)."""
    addresses: list[CoreAddress] = field(default_factory=list)

    def same_partition(self, pkey: int) -> bool:
        return (self.pkey | 0x8000) == (pkey | 0x8000)


@dataclass(eq=False)
class CoreAddress:
    """A local address of an endpoint (name, IPv4 or IPv6)."""

    endpoint: CoreEndpoint
    type: AddrType
    info: bytes
    """64 bytes, zero padded (names as given; compare names case-insensitively)."""
    display: str
    """Text shown by EP_QUERY, e.g. ``192.168.1.10/24`` or ``node10``."""


@dataclass(frozen=True, slots=True)
class ResolveRequest:
    """A RESOLVE the core has validated and mapped to a local source address."""

    entries: Sequence[EpAddr]
    """The request's entries (address form: SOURCE and DEST among them; path form: entry 0)."""
    src_index: int
    dst_index: int
    client: str
    """Who asked (for logs): ``unix:3``, ``tcp:127.0.0.1:40000``, ``netlink:42``."""

    @property
    def source(self) -> EpAddr:
        return self.entries[self.src_index]

    @property
    def dest(self) -> EpAddr:
        return self.entries[self.dst_index]


@dataclass(frozen=True, slots=True)
class ResolveResult:
    """Outcome of a resolution: a status and, on success, the path record(s).

    The core writes ``paths`` as contiguous PATH entries from entry 0 (flags 0x2B for the
    first), followed by the SOURCE entry when the core chose the source.
    """

    status: AcmStatus
    paths: tuple[PathRecord, ...] = ()


class Provider(abc.ABC):
    """A resolution provider. One instance per daemon, created with the core's services."""

    name: ClassVar[str]
    api_version: ClassVar[int] = PROVIDER_API_VERSION
    origin: str = ""
    """Where it was loaded from: the entry point (``name = module:Class``) or the library path."""

    def __init__(self, core: CoreServices) -> None:
        self.core = core

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:  # noqa: B027 - optional hook
        """Called once after the provider is loaded (before any device is opened)."""

    async def stop(self) -> None:  # noqa: B027 - optional hook
        """Called once at shutdown, after every port was closed (e.g. to persist a cache)."""

    def options_changed(self, options: Options) -> bool:
        """The daemon reloaded its option file: ``core.options`` is now ``options``.

        Apply what can change while running (``ibacm.core.daemon.PROVIDER_OPTIONS``) and
        return True; the default returns False, and the daemon then reports every changed
        provider option as needing a restart (a reload never ignores an option silently)."""
        return False

    @abc.abstractmethod
    async def open_device(self, device: CoreDevice) -> object: ...

    @abc.abstractmethod
    async def close_device(self, dev_ctx: object) -> None: ...

    @abc.abstractmethod
    async def open_port(self, port: CorePort, dev_ctx: object) -> object: ...

    @abc.abstractmethod
    async def close_port(self, port_ctx: object) -> None: ...

    @abc.abstractmethod
    async def open_endpoint(self, endpoint: CoreEndpoint, port_ctx: object) -> object: ...

    @abc.abstractmethod
    async def close_endpoint(self, ep_ctx: object) -> None: ...

    @abc.abstractmethod
    def add_address(self, address: CoreAddress, ep_ctx: object) -> object: ...

    @abc.abstractmethod
    def remove_address(self, addr_ctx: object) -> None: ...

    # -- requests --------------------------------------------------------------------------
    @abc.abstractmethod
    async def resolve(self, addr_ctx: object, request: ResolveRequest) -> ResolveResult:
        """Address form or path form (entry 0 type PATH). Honour NODELAY on the DEST entry
        (path form: on entry 0): answer ENODATA at once on a miss and keep resolving."""

    def begin_resolve(
        self, addr_ctx: object, request: ResolveRequest, done: Callable[[ResolveResult], None]
    ) -> bool:
        """Optional: ``resolve`` without a task of the core's, for an address-form request.

        False: not taken (the core awaits ``resolve`` instead), with nothing counted or
        changed. True: the resolution was started here and now (its first MAD posted in
        this very round, when one is needed), and ``done`` is called exactly once, in
        trio's thread, with what ``resolve`` would have returned: at once when the answer
        is at hand, else from the round that ends the resolution (e.g. the MAD receive
        loop's). ``done`` must not raise; this method must not raise after calling it."""
        return False

    def route_table(self, addr_ctx: object) -> RouteTable | None:
        """The cache-hit fast path of address-form RESOLVEs from the source ``addr_ctx``: the
        routes the provider has at hand (see ``RouteTable``), or None when it has none. The
        core asks once per change of its address list (an address added or removed, a port
        up or down) and reads the table, from the client loop's thread, for every RESOLVE
        from that address; a request the table does not answer goes to ``resolve``."""
        return None

    @abc.abstractmethod
    async def query(self, addr_ctx: object, path: PathRecord) -> tuple[int, PathRecord | None]:
        """QUERY_SA: SA PathRecord GET with ``path`` verbatim. Returns (status, SA record);
        the record is returned whenever the SA answered, even with a non-zero status."""

    @abc.abstractmethod
    async def handle_event(self, port_ctx: object, event: PortEventType) -> None:
        """Port events the provider must see (CLIENT_REREGISTER, SM_CHANGE)."""

    @abc.abstractmethod
    def query_perf(self, ep_ctx: object) -> Sequence[int]:
        """The endpoint's counters, in wire order (``Counter``)."""

    # -- observability (admin socket) --------------------------------------------------------
    def describe_endpoint(self, ep_ctx: object) -> Mapping[str, Any]:
        """State for the admin snapshot: groups, cache entries, ... (JSON-able)."""
        return {}

    def flush(self, ep_ctx: object, dest: tuple[AddrType, bytes] | None = None) -> int:
        """Drop cache entries (all, or the one for ``dest``); returns how many."""
        return 0


ProviderFactory = Callable[[CoreServices], Provider]
