"""The settings of the C daemon's option file: each one defined once, as a field of
``COptions`` made by ``option()``, in the order ``ib_acme -O`` writes them (options.md
§3-§5: the core's keys, the default provider's, then the ``provider`` lines).

These keys are fixed by the C daemon; ``ibacm.config.options.Options`` adds the keys of this
implementation only (extensions) and is what the daemon and the tools use.
"""

from __future__ import annotations

from dataclasses import dataclass

from ibacm.config.option_kinds import (
    CFlag,
    Coded,
    Integer,
    IntFlag,
    Keyword,
    Lifetime,
    LogFile,
    Port,
    ReadBy,
    Reload,
    Text,
    Timeout,
    option,
)
from ibacm.config.option_values import (
    MTU_ENUM,
    RATE_ENUM,
    RATE_GBPS,
    AddrPreload,
    AddrProt,
    LoopbackProt,
    ProviderLine,
    ProviderLines,
    RoutePreload,
    RouteProt,
    ServerMode,
    lifetime_seconds,
)
from ibacm.config.paths import (
    DEFAULT_ADDR_DATA_FILE,
    DEFAULT_LOCK_FILE,
    DEFAULT_LOG_FILE,
    DEFAULT_PROVIDER_LIB_PATH,
    DEFAULT_ROUTE_DATA_FILE,
)
from ibacm.wire.rates import DEFAULT_MIN_MTU, DEFAULT_MIN_RATE, MTU_BYTES

_CORE = ReadBy.CORE
_ACMP = ReadBy.PROVIDER
_ROUTE_PRELOADS = {
    "none": RoutePreload.NONE,
    "no": RoutePreload.NONE,
    "opensm_full_v1": RoutePreload.OPENSM_FULL_V1,
}
_ADDR_PRELOADS = {
    "none": AddrPreload.NONE,
    "no": AddrPreload.NONE,
    "acm_hosts": AddrPreload.ACM_HOSTS,
}


@dataclass
class COptions:
    """Every setting the C daemon reads, with its defaults, in the order of the file
    ``ib_acme -O`` writes.

    ``min_mtu`` and ``min_rate`` hold IBA enums, as the C provider does (``min_mtu_bytes``
    and ``min_rate_gbps`` give the configured numbers). Timeouts are in ms, cache lifetimes
    in minutes (any negative value = never, see ``lifetime_seconds``).
    """

    log_file: str = option(
        LogFile(),
        DEFAULT_LOG_FILE,
        reload=Reload.DAEMON,
        read_by=_CORE,
        label="log file",
        help="Where ibacm writes its log: 'stdout', 'stderr' or a file name.",
        examples=("log_file stdout", "log_file stderr", f"log_file {DEFAULT_LOG_FILE}"),
        active=True,
    )
    log_level: int = option(
        Integer[int](),
        0,
        reload=Reload.DAEMON,
        read_by=_CORE,
        label="log level",
        help=(
            "How much is logged: 0 = configuration summary and errors, 1 = also detailed",
            "configuration and events, 2 = also every request (busy).",
        ),
        active=True,
    )
    umad_debug_level: int = option(
        Integer[int](),
        0,
        reload=Reload.RESTART,
        read_by=_CORE,
        label="umad debug level",
        help="Debug level of the MAD library: 0 = off, 1 = basic, 2 = verbose.",
        active=True,
    )
    lock_file: str = option(
        Text(),
        DEFAULT_LOCK_FILE,
        reload=Reload.RESTART,
        read_by=_CORE,
        label="lock file",
        help="File holding the daemon's process id; it also stops a second ibacm from starting.",
        active=True,
    )
    addr_prot: AddrProt = option(
        Keyword({"acm": AddrProt.ACM}, numbered=True),
        AddrProt.ACM,
        reload=Reload.PROVIDER,  # one value only (acm)
        read_by=_ACMP,
        label="address resolution",
        help=(
            "Protocol used to find the GID of a destination address. The only protocol is",
            "'acm': a multicast query answered by the node that owns the address.",
        ),
        active=True,
    )
    addr_timeout: int = option(
        Lifetime(),
        1440,
        reload=Reload.PROVIDER,
        read_by=_ACMP,
        label="address timeout",
        help=(
            "Minutes a resolved address stays cached before it is resolved again; -1 keeps",
            "it forever. (60 = one hour, 1440 = one day, 10080 = one week.)",
        ),
        active=True,
    )
    route_prot: RouteProt = option(
        Keyword({"acm": RouteProt.ACM, "sa": RouteProt.SA}, numbered=True),
        RouteProt.SA,
        reload=Reload.ENDPOINT,
        read_by=_ACMP,
        label="route resolution",
        help=(
            "Protocol used to obtain the path to a destination once its GID is known:",
            "'sa' asks the subnet administrator for a path record and caches it,",
            "'acm' builds the path from the ACM multicast exchange.",
        ),
        active=True,
    )
    route_timeout: int = option(
        Lifetime(),
        -1,
        reload=Reload.PROVIDER,
        read_by=_ACMP,
        label="route timeout",
        help=(
            "Minutes a resolved path stays cached; -1 keeps it until its address expires.",
            "This name must be written in lowercase.",
        ),
        active=True,
        case_sensitive=True,
    )
    loopback_prot: LoopbackProt = option(
        Keyword({"none": LoopbackProt.NONE, "local": LoopbackProt.LOCAL}, numbered=True),
        LoopbackProt.LOCAL,
        reload=Reload.PROVIDER,
        read_by=_ACMP,
        label="loopback resolution",
        help=(
            "How this node's own addresses are resolved: 'local' answers from local port",
            "data, 'none' resolves them like any other address.",
        ),
        active=True,
    )
    server_port: int = option(
        Port(),
        6125,
        reload=Reload.RESTART,
        read_by=_CORE,
        label="server_port",
        help=(
            "TCP port for clients in 'loop' and 'open' mode. Clients learn it from the",
            "port file ibacm writes.",
        ),
        active=True,
    )
    server_mode: ServerMode = option(
        Keyword(
            {"unix": ServerMode.UNIX, "loop": ServerMode.LOOP, "open": ServerMode.OPEN},
            fallback=ServerMode.UNIX,
        ),
        ServerMode.UNIX,
        reload=Reload.RESTART,
        read_by=_CORE,
        label="server_mode",
        help=(
            "How clients connect: 'unix' = a local unix socket only, 'loop' = TCP on",
            "127.0.0.1, 'open' = TCP on every address (no authentication!).",
        ),
        active=True,
    )
    acme_plus_kernel_only: bool = option(
        CFlag(),
        False,
        reload=Reload.RESTART,
        read_by=_CORE,
        label="acme_plus_kernel_only",
        help=(
            "'yes' (or 'true' or a non-zero number) serves only the kernel and ib_acme;",
            "other applications get no answers. Not applied when systemd starts ibacm",
            "through its socket unit.",
        ),
        active=True,
    )
    timeout: int = option(
        Timeout[int](),
        2000,
        reload=Reload.PROVIDER,
        read_by=_CORE | _ACMP,
        label="timeout",
        help=(
            "Milliseconds to wait for an answer from another ACM node or the subnet",
            "administrator, on top of the subnet timeout, before trying again.",
        ),
        active=True,
    )
    retries: int = option(
        Integer[int](minimum=0),
        2,
        reload=Reload.PROVIDER,
        read_by=_CORE | _ACMP,
        label="retries",
        help="How many times an unanswered ACM or SA request is sent again.",
        active=True,
    )
    resolve_depth: int = option(
        Integer[int](minimum=1),
        1,
        reload=Reload.PROVIDER,
        read_by=_ACMP,
        label="resolve depth",
        help=(
            "Resolutions in progress at the same time per endpoint; more are queued.",
            "Higher values resolve faster in parallel but load the subnet more.",
        ),
        active=True,
    )
    sa_depth: int = option(
        Integer[int](minimum=1),
        1,
        reload=Reload.DAEMON,
        read_by=_CORE,
        label="sa depth",
        help=(
            "Queries to the subnet administrator in progress at the same time per port;",
            "more are queued. Counted separately from resolve_depth.",
        ),
        active=True,
    )
    send_depth: int = option(
        Integer[int](minimum=1),
        1,
        reload=Reload.ENDPOINT,
        read_by=_ACMP,
        label="send depth",
        help="Answers to other nodes in flight at the same time per endpoint; more are queued.",
        active=True,
    )
    recv_depth: int = option(
        Integer[int](minimum=1),
        1024,
        reload=Reload.ENDPOINT,
        read_by=_ACMP,
        label="receive depth",
        help=(
            "Receive buffers per endpoint. A job start brings every node one request from",
            "each other node at once: use at least the number of nodes, or part of that",
            "burst is dropped and every peer missed is asked for again by multicast.",
        ),
        active=True,
    )
    min_mtu: int = option(
        Coded(MTU_ENUM, fallback=2048),
        DEFAULT_MIN_MTU,
        reload=Reload.ENDPOINT,
        read_by=_ACMP,
        label="minimum mtu",
        help=(
            "MTU in bytes of the multicast group every node joins: 256, 512, 1024, 2048 or",
            "4096. Use the largest MTU all nodes of the fabric support.",
        ),
        active=True,
    )
    min_rate: int = option(
        Coded(RATE_ENUM, fallback=10),
        DEFAULT_MIN_RATE,
        reload=Reload.ENDPOINT,
        read_by=_ACMP,
        label="minimum rate",
        help=(
            "Link rate in Gb/s of the multicast group every node joins: 2 (for 2.5), 5, 10,",
            "14, 20, 25, 30, 40, 56, 60, 80, 100, 112, 120, 168, 200 or 300. Use the",
            "highest rate all nodes of the fabric support.",
        ),
        active=True,
    )
    route_preload: RoutePreload = option(
        Keyword(
            _ROUTE_PRELOADS,
            numbered=True,
            aliases={"full_opensm_v1": (RoutePreload.OPENSM_FULL_V1, "the man page's spelling")},
        ),
        RoutePreload.NONE,
        reload=Reload.ENDPOINT,
        read_by=_ACMP,
        label="route preload",
        help=(
            "Fill the path cache at start-up: 'none' (default) or 'opensm_full_v1' to read",
            "OpenSM's full path record dump from route_data_file.",
        ),
        active=True,
    )
    route_data_file: str = option(
        Text(),
        DEFAULT_ROUTE_DATA_FILE,
        reload=Reload.ENDPOINT,
        read_by=_ACMP,
        label="route data file",
        help="The path record dump read when route_preload is 'opensm_full_v1'.",
    )
    addr_preload: AddrPreload = option(
        Keyword(_ADDR_PRELOADS, numbered=True),
        AddrPreload.NONE,
        reload=Reload.ENDPOINT,
        read_by=_ACMP,
        label="address preload",
        help=(
            "Fill the address cache at start-up: 'none' (default) or 'acm_hosts' to read",
            "'<address> <GID>' lines from addr_data_file.",
        ),
        active=True,
    )
    addr_data_file: str = option(
        Text(),
        DEFAULT_ADDR_DATA_FILE,
        reload=Reload.ENDPOINT,
        read_by=_ACMP,
        label="address data file",
        help="The address list read when addr_preload is 'acm_hosts'.",
    )
    support_ips_in_addr_cfg: bool = option(
        IntFlag(),
        False,
        reload=Reload.DAEMON,
        read_by=_CORE,
        label="support IP's in ibacm_addr.cfg",
        help="1: also read IP addresses from ibacm_addr.cfg. Default 0.",
    )
    provider_lib_path: str = option(
        Text(),
        DEFAULT_PROVIDER_LIB_PATH,
        reload=Reload.RESTART,
        read_by=_CORE,
        label="provider lib path",
        help=(
            "Directory of provider libraries built for rdma-core (acm_prov.h): both daemons",
            "load them; this one with --fabric hw.",
        ),
    )
    providers: list[ProviderLine] = option(
        ProviderLines(),
        [],
        reload=Reload.RESTART,
        read_by=ReadBy.PROVIDER_LINES,
        label="provider",
        help=(
            "Which provider serves the ports of a subnet: 'provider <name> <subnet prefix>',",
            "or 'provider <name> default' for every other port. This daemon has one",
            "built-in provider, ibacmp, and loads the libraries in provider_lib_path.",
        ),
        examples=("provider ibacmp 0xFE80000000000000", "provider ibacmp default"),
        key="provider",
    )

    @property
    def min_mtu_bytes(self) -> int:
        """The multicast group 0 MTU in bytes (e.g. 2048)."""
        return MTU_BYTES.get(self.min_mtu, MTU_BYTES[DEFAULT_MIN_MTU])

    @property
    def min_rate_gbps(self) -> int:
        """The multicast group 0 rate as written in the file (Gb/s; 2 means 2.5)."""
        return RATE_GBPS.get(self.min_rate, RATE_GBPS[DEFAULT_MIN_RATE])

    @property
    def addr_lifetime(self) -> float:
        """Lifetime of a resolved address in seconds (inf = never expires)."""
        return lifetime_seconds(self.addr_timeout)

    @property
    def route_lifetime(self) -> float:
        """Lifetime of a resolved route in seconds (inf = never expires)."""
        return lifetime_seconds(self.route_timeout)
