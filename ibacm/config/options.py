"""The option file ``ibacm_opts.cfg``: one flat ``key value`` file for the core and ibacmp.

Each option is defined once, as a field of ``Options`` made by ``option()``: its type,
default, kind of value (what is accepted, how it is written), which C parser reads it, what a
reload does with it, and its help text. ``OPTIONS`` lists the definitions; the parser here,
``Options.summary``, the generated option file (``ibacm.config.opts_template``) and the
daemon's reload groups (``ibacm.core.daemon``) are derived from them. Adding an option is one
field here, plus its entry in ibacm(8) (``tests/config/test_option_docs.py`` checks the page
against the definitions), the code that uses it, its probe in the reload test
(``tests/core/test_daemon_reload.py``) and ``contrib/ibacm_opts.cfg`` generated again.

Parsing follows the C daemon (``acm_set_options``, ``acmp_set_options``,
``acm_load_prov_config``) wherever its behaviour is not a known defect:

* a line whose first character is ``#`` is a comment; otherwise the first two white-space
  separated tokens are key and value (``sscanf("%31s%255s")``), the rest is ignored;
* keys are case-insensitive, except ``route_timeout`` which must be lowercase;
* numbers use C ``atoi`` (``12abc`` is 12, ``abc`` is 0), the last occurrence of a key wins;
* ``provider <name> default|<subnet prefix>`` lines choose providers.

Defects of the C parsers that are fixed (each fix is reported as an issue naming file:line):

* long lines are not cut every 119 characters (a warning says the C daemon would);
* an invalid ``min_mtu``/``min_rate`` still falls back to 2048/10, but is reported;
* unknown ``*_prot``/``*_preload`` values keep the previous value, and are reported;
* ``route_preload full_opensm_v1`` (the man page's spelling) is accepted;
* ``provider_lib_path`` is never mistaken for a provider line;
* settings that would stall the daemon (a depth below 1, negative retries or timeouts) are
  raised to the smallest working value, with a warning.

Extensions (``ReadBy.EXTENSION``: keys the C daemon ignores, so one file serves both daemons)
are defined after the C keys; their help says what each does.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from pathlib import Path

from ibacm.config import cnumbers
from ibacm.config.ctext import C_MAX_KEY, c_lines, c_lower, c_tokens
from ibacm.config.errors import ConfigError, ConfigIssue, IssueSink, errors_in
from ibacm.config.option_kinds import (
    CFlag,
    Coded,
    Integer,
    IntFlag,
    Keyword,
    Kind,
    Lifetime,
    LogFile,
    OptionalPath,
    OptionDef,
    Port,
    ReadBy,
    Reload,
    Setting,
    Text,
    Timeout,
    UnsetText,
    YesNo,
    definitions,
    option,
)
from ibacm.config.paths import (
    DEFAULT_ADDR_DATA_FILE,
    DEFAULT_ADDR_FILE,
    DEFAULT_LOCK_FILE,
    DEFAULT_LOG_FILE,
    DEFAULT_OPTS_FILE,
    DEFAULT_PROVIDER_LIB_PATH,
    DEFAULT_ROUTE_DATA_FILE,
    RUNDIR,
    RunPaths,
)


class ServerMode(enum.IntEnum):
    """Which client socket the daemon listens on (values as ``IBACM_SERVER_MODE_*``)."""

    UNIX = 0
    LOOP = 1
    OPEN = 2


class AddrProt(enum.Enum):
    """Address resolution protocol (ACM is the only one); values as the C enum."""

    ACM = 0


class RouteProt(enum.Enum):
    """How a path record is obtained once the address is known; values as the C enum."""

    ACM = 0
    SA = 1


class LoopbackProt(enum.Enum):
    """How local addresses are resolved; values as the C enum."""

    NONE = 0
    LOCAL = 1


class ProviderPrefer(enum.Enum):
    """Which of two providers of one name is loaded (``provider_prefer``)."""

    PYTHON = "python"
    LIBRARY = "library"


class RoutePreload(enum.Enum):
    """Route cache preloading; values as the C enum."""

    NONE = 0
    OPENSM_FULL_V1 = 1


class AddrPreload(enum.Enum):
    """Address cache preloading; values as the C enum."""

    NONE = 0
    ACM_HOSTS = 1


class LogFormat(enum.Enum):
    """Log record format (extension)."""

    AUTO = "auto"
    JSON = "json"
    CONSOLE = "console"


# min_mtu in bytes -> IBA MTU enum; anything else becomes 2048 (enum 4) as in C.
MTU_ENUM: dict[int, int] = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}
# min_rate in Gb/s (2 means 2.5) -> IBA rate enum; anything else becomes 10 (enum 3) as in C.
RATE_ENUM: dict[int, int] = {
    2: 2,
    5: 5,
    10: 3,
    14: 11,
    20: 6,
    25: 15,
    30: 4,
    40: 7,
    56: 12,
    60: 8,
    80: 9,
    100: 16,
    112: 13,
    120: 10,
    168: 14,
    200: 17,
    300: 18,
}
MTU_BYTES: dict[int, int] = {enum_: size for size, enum_ in MTU_ENUM.items()}
RATE_GBPS: dict[int, int] = {enum_: gbps for gbps, enum_ in RATE_ENUM.items()}
DEFAULT_MTU_ENUM = MTU_ENUM[2048]
DEFAULT_RATE_ENUM = RATE_ENUM[10]


def lifetime_seconds(minutes: int) -> float:
    """Seconds a cache entry lives for an ``addr_timeout``/``route_timeout`` value.

    C stores ``now + (unsigned) minutes``, so every negative value means "never" (inf).
    """
    return math.inf if minutes < 0 else minutes * 60.0


@dataclass
class ProviderLine:
    """``provider <name> default`` (default=True) or ``provider <name> <prefix>``."""

    name: str
    default: bool
    prefix: int | None
    line: int = field(compare=False)
    """Where it was read; not part of the setting (moving the line changes nothing)."""


class ProviderLines(Kind[list[ProviderLine]]):
    """``provider`` lines (acm_load_prov_config): each line adds one, in file order."""

    whole_line = True

    def parse(
        self, s: Setting, previous: list[ProviderLine], default: list[ProviderLine]
    ) -> list[ProviderLine]:
        line = _provider_line(list(s.tokens), s.line, s.sink)
        return previous if line is None else [*previous, line]

    def text(self, value: list[ProviderLine]) -> str:
        return "\n".join(self.lines("provider", value))

    def lines(self, key: str, value: list[ProviderLine]) -> list[str]:
        written = []
        for p in value:
            if not p.name or any(char in cnumbers.C_SPACE for char in p.name):
                raise ValueError(f"provider name {p.name!r} cannot be written in an option file")
            which = "default" if p.default else f"0x{p.prefix or 0:016X}"
            written.append(f"{key} {p.name} {which}")
        return written

    def entries(self, label: str, value: list[ProviderLine]) -> list[tuple[str, str]]:
        return [
            (label, f"{p.name} {'default' if p.default else f'0x{p.prefix or 0:016x}'}")
            for p in value
        ]


_CORE = ReadBy.CORE
_ACMP = ReadBy.PROVIDER
_EXT = ReadBy.EXTENSION
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
class Options:
    """Every setting of the option file, with the C defaults, in the order of the file
    ``ib_acme -O`` writes (the C keys, the provider lines, then the extensions).

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
        DEFAULT_MTU_ENUM,
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
        Coded(RATE_ENUM, fallback=10, sorted_list=True),
        DEFAULT_RATE_ENUM,
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
    # Extensions: the C daemon ignores these keys.
    sa_timeout: int | None = option(
        Timeout[int | None](),
        None,
        reload=Reload.DAEMON,  # read by every SA query
        read_by=_EXT,
        label="sa timeout",
        help="Milliseconds per SA query attempt (default: the value of timeout).",
        examples=("sa_timeout 2000",),
        follows="timeout",
    )
    sa_retries: int | None = option(
        Integer[int | None](minimum=0),
        None,
        reload=Reload.DAEMON,
        read_by=_EXT,
        label="sa retries",
        help="SA query retries (default: the value of retries).",
        examples=("sa_retries 2",),
        follows="retries",
    )
    log_format: LogFormat = option(
        Keyword({"auto": LogFormat.AUTO, "json": LogFormat.JSON, "console": LogFormat.CONSOLE}),
        LogFormat.AUTO,
        reload=Reload.DAEMON,
        read_by=_EXT,
        label="log format",
        help="'auto', 'json' or 'console'.",
    )
    run_dir: str = option(
        Text(),
        RUNDIR,
        reload=Reload.RESTART,
        read_by=_EXT,
        label="run dir",
        help="Directory of the client sockets and port files.",
    )
    admin_socket: str | None = option(
        UnsetText(),
        None,
        reload=Reload.RESTART,
        read_by=_EXT,
        label="admin socket",
        help="Administration socket (default: ibacm-admin.sock in run_dir).",
        examples=(f"admin_socket {RunPaths(Path(RUNDIR)).admin_socket}",),
        follows="admin_socket_path",
    )
    cache_max_entries: int = option(
        Integer[int](minimum=0, clamp=False),
        65536,
        reload=Reload.ENDPOINT,
        read_by=_EXT,
        label="cache max entries",
        help="Cached destinations per endpoint (full: unused ones go first); 0 = no limit.",
    )
    cache_file: str | None = option(
        OptionalPath(),
        None,
        reload=Reload.ENDPOINT,  # the cache file's saver starts with the endpoint
        read_by=_EXT,
        label="cache file",
        help="Where the destination cache is saved across restarts ('none' = not saved).",
    )
    cache_save_interval: int = option(
        Integer[int](minimum=0, clamp=False),
        300,
        reload=Reload.ENDPOINT,
        read_by=_EXT,
        label="cache save interval",
        help="Seconds between cache saves; 0 = only at shutdown.",
    )
    join_retry_initial_ms: int = option(
        Integer[int](minimum=1, clamp=False),
        1000,
        reload=Reload.PROVIDER,
        read_by=_EXT,
        label="join retry initial ms",
        help="First wait before a failed multicast join is tried again.",
    )
    join_retry_max_ms: int = option(
        Integer[int](minimum=1, clamp=False),
        60000,
        reload=Reload.PROVIDER,
        read_by=_EXT,
        label="join retry max ms",
        help="Longest wait between join attempts (the wait doubles each time).",
    )
    route_bulk_preload: bool = option(
        YesNo(),
        False,
        reload=Reload.ENDPOINT,
        read_by=_EXT,
        label="route bulk preload",
        help="'yes': fetch all paths of an endpoint with one SA table query at start-up.",
    )
    metrics_port: int = option(
        Integer[int](minimum=0, maximum=0xFFFF, clamp=False),
        0,
        reload=Reload.RESTART,
        read_by=_EXT,
        label="metrics port",
        help="TCP port of the metrics endpoint on 127.0.0.1; 0 = off.",
    )
    capture_file: str | None = option(
        OptionalPath(),
        None,
        reload=Reload.DAEMON,
        read_by=_EXT,
        label="capture file",
        help="File receiving a capture of every MAD ('none' = off).",
    )
    provider_prefer: ProviderPrefer = option(
        Keyword({"python": ProviderPrefer.PYTHON, "library": ProviderPrefer.LIBRARY}),
        ProviderPrefer.PYTHON,
        reload=Reload.RESTART,
        read_by=_EXT,
        label="provider prefer",
        help=(
            "'python' or 'library': which provider is loaded when a library in",
            "provider_lib_path has the name of a Python provider (rdma-core's libibacmp.so",
            "and this daemon's provider are both 'ibacmp').",
        ),
    )
    max_clients: int = option(
        Integer[int](minimum=1, clamp=False),
        16384,
        reload=Reload.DAEMON,  # the next connection and the next sweep see it
        read_by=_EXT,
        label="max clients",
        help=(
            "Client connections at once; more are refused. Kept below the open-file limit,",
            "with a reserve for the administration socket.",
        ),
    )
    max_clients_per_user: int = option(
        Integer[int](minimum=0, clamp=False),
        1024,
        reload=Reload.DAEMON,
        read_by=_EXT,
        label="max clients per user",
        help=(
            "Client connections at once of one local user other than root (the client",
            "socket is open to everybody); 0 = no per-user limit.",
        ),
    )
    client_request_timeout: int = option(
        Integer[int](minimum=0, clamp=False),
        10,
        reload=Reload.DAEMON,
        read_by=_EXT,
        label="client request timeout",
        help="Seconds a client may take to finish sending a request it began; 0 = no limit.",
    )
    client_idle_timeout: int = option(
        Integer[int](minimum=0, clamp=False),
        0,
        reload=Reload.DAEMON,
        read_by=_EXT,
        label="client idle timeout",
        help=(
            "Seconds a client connection may stay without a request; 0 = no limit (the",
            "default: an application's librdmacm connects once and never reconnects).",
        ),
    )

    @property
    def min_mtu_bytes(self) -> int:
        """The multicast group 0 MTU in bytes (e.g. 2048)."""
        return MTU_BYTES.get(self.min_mtu, 2048)

    @property
    def min_rate_gbps(self) -> int:
        """The multicast group 0 rate as written in the file (Gb/s; 2 means 2.5)."""
        return RATE_GBPS.get(self.min_rate, 10)

    @property
    def effective_sa_timeout(self) -> int:
        """Per-attempt SA MAD timeout in ms (``sa_timeout``, else ``timeout`` as in C)."""
        return self.timeout if self.sa_timeout is None else self.sa_timeout

    @property
    def effective_sa_retries(self) -> int:
        """SA MAD retry count (``sa_retries``, else ``retries`` as in C)."""
        return self.retries if self.sa_retries is None else self.sa_retries

    @property
    def run_paths(self) -> RunPaths:
        return RunPaths(Path(self.run_dir))

    @property
    def admin_socket_path(self) -> Path:
        """``admin_socket`` if set, else the admin socket inside ``run_dir``."""
        if self.admin_socket is not None:
            return Path(self.admin_socket)
        return self.run_paths.admin_socket

    @property
    def addr_lifetime(self) -> float:
        """Lifetime of a resolved address in seconds (inf = never expires)."""
        return lifetime_seconds(self.addr_timeout)

    @property
    def route_lifetime(self) -> float:
        """Lifetime of a resolved route in seconds (inf = never expires)."""
        return lifetime_seconds(self.route_timeout)

    def summary(
        self, options_file: str = DEFAULT_OPTS_FILE, addr_file: str = DEFAULT_ADDR_FILE
    ) -> list[tuple[str, str]]:
        """(label, value) pairs the daemon logs at start-up: what each C parser reads (core,
        with the file names, then provider, then provider lines), then the extensions.

        Provider enums are shown as numbers, as the C provider logs them.
        """
        pairs: list[tuple[str, str]] = []
        for section in ReadBy:
            for definition in OPTIONS:
                if section in definition.read_by:
                    pairs += self._entries(definition)
            if section is ReadBy.CORE:
                pairs += [("options file", options_file), ("addr file", addr_file)]
        return pairs

    def _entries(self, definition: OptionDef) -> list[tuple[str, str]]:
        value = getattr(self, definition.name)
        if value is None and definition.follows is not None:
            return [(definition.label, str(getattr(self, definition.follows)))]
        return definition.kind.entries(definition.label, value)


OPTIONS: tuple[OptionDef, ...] = definitions(Options)
"""Every option, in the order of the generated file."""
BY_KEY: dict[str, OptionDef] = {definition.key: definition for definition in OPTIONS}
KNOWN_KEYS: frozenset[str] = frozenset(BY_KEY)
"""Every key this parser understands (lowercase), including our extensions."""


def option_names(*reloads: Reload) -> tuple[str, ...]:
    """The ``Options`` fields a reload treats as one of ``reloads``, in definition order."""
    return tuple(definition.name for definition in OPTIONS if definition.reload in reloads)


# ---------------------------------------------------------------------------------------------
# Provider lines (acm_load_prov_config)


def _provider_line(tokens: list[str], line: int, sink: IssueSink) -> ProviderLine | None:
    if len(tokens) < 3:
        sink.warn(line, "provider line needs a name and 'default' or a subnet prefix; ignored")
        return None
    name, which = tokens[1], tokens[2]
    if c_lower(which).startswith("default"):
        if c_lower(which) != "default":
            sink.warn(line, f"provider {name}: {which!r} read as 'default' (C checks 7 letters)")
        return ProviderLine(name=name, default=True, prefix=None, line=line)
    number = cnumbers.strtoul(which, 0)
    if not number.converted:
        sink.warn(line, f"provider {name}: {which!r} is neither 'default' nor a subnet prefix")
        return None
    if number.overflow or which[number.end :] or which.startswith("-"):
        sink.warn(
            line,
            f"provider {name}: subnet prefix {which!r} is not a plain 64-bit number; "
            f"using 0x{number.value:016x} (C strtoull)",
        )
    return ProviderLine(name=name, default=False, prefix=number.value, line=line)


# ---------------------------------------------------------------------------------------------
# The parser


def parse_options(text: str, path: str = "<string>") -> tuple[Options, list[ConfigIssue]]:
    """Parse option-file text. Never raises for bad content: problems become issues."""
    opts = Options()
    sink = IssueSink(path)
    set_at: dict[str, int] = {}
    for number, line in c_lines(text, sink):
        if line.startswith("#"):
            continue
        tokens = c_tokens(line)
        if not tokens or tokens[0].startswith("#"):
            # An indented '#' is not a comment to C, but such a key is unknown and ignored.
            continue
        if "\t" in line and c_lower(tokens[0]) == "provider":
            sink.warn(
                number,
                "TAB in a provider line: read as a separator here, but the C daemon's "
                "provider parser splits only at spaces and would misread this line",
            )
        _apply_line(opts, tokens, number, sink, set_at)
    _check_together(opts, sink, set_at)
    return opts, sink.issues


def _apply_line(
    opts: Options, tokens: list[str], line: int, sink: IssueSink, set_at: dict[str, int]
) -> None:
    key = tokens[0]
    lowered = c_lower(key)
    definition = BY_KEY.get(lowered)
    if definition is not None and definition.kind.whole_line:
        value = tokens[1] if len(tokens) > 1 else ""
        _apply(opts, definition, Setting(lowered, value, line, sink, tokens=tuple(tokens)))
        return
    if len(tokens) < 2:
        sink.warn(line, f"key {key!r} has no value; line ignored")
        return
    if len(key) > C_MAX_KEY:
        sink.warn(line, f"key {key[:40]!r}... is longer than {C_MAX_KEY} characters; ignored")
        return
    if definition is not None and definition.case_sensitive and key != lowered:
        sink.warn(line, f"key {key!r} ignored: {lowered} must be written in lowercase (as in C)")
        return
    if definition is None:
        if lowered.startswith("provider"):
            # C's provider parser would have taken this line for a provider line.
            sink.warn(line, f"unknown key {key!r} ignored (C would read it as a provider line)")
        else:
            sink.warn(line, f"unknown key {key!r} ignored (it may belong to another provider)")
        return
    if len(tokens) > 2 and not tokens[2].startswith("#"):
        sink.warn(line, f"{key}: text after the value {tokens[1]!r} is ignored")
    _apply(opts, definition, Setting(lowered, tokens[1], line, sink))
    set_at[lowered] = line


def _apply(opts: Options, definition: OptionDef, setting: Setting) -> None:
    previous = getattr(opts, definition.name)
    setattr(opts, definition.name, definition.kind.parse(setting, previous, definition.default))


def _check_together(opts: Options, sink: IssueSink, set_at: dict[str, int]) -> None:
    """Checks that involve more than one key."""
    if opts.join_retry_max_ms < opts.join_retry_initial_ms:
        line = max(set_at.get("join_retry_max_ms", 0), set_at.get("join_retry_initial_ms", 0))
        sink.warn(
            line,
            f"join_retry_max_ms {opts.join_retry_max_ms} is below join_retry_initial_ms "
            f"{opts.join_retry_initial_ms}; using {opts.join_retry_initial_ms} for both",
        )
        opts.join_retry_max_ms = opts.join_retry_initial_ms


def load_options(
    path: str | Path | None = None, *, strict: bool = False
) -> tuple[Options, list[ConfigIssue]]:
    """Read and parse an option file (``None`` = the default location).

    A missing file gives the defaults and no issue, as in C. A file that exists but cannot be
    read gives the defaults plus an error issue, or ``ConfigError`` when ``strict``.
    """
    where = str(DEFAULT_OPTS_FILE if path is None else path)
    try:
        data = Path(where).read_bytes()
    except FileNotFoundError:
        return Options(), []
    except OSError as exc:
        issue = ConfigIssue(where, 0, f"cannot read option file: {exc.strerror or exc}", "error")
        if strict:
            raise ConfigError([issue]) from exc
        return Options(), [issue]
    # Bytes that are not UTF-8 survive as surrogates, so paths round-trip like os.fsdecode.
    opts, issues = parse_options(data.decode("utf-8", "surrogateescape"), where)
    if strict and errors_in(issues):
        raise ConfigError(errors_in(issues))
    return opts, issues
