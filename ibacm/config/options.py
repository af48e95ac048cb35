"""The option file ``ibacm_opts.cfg``: one flat ``key value`` file for the core and ibacmp.

Parsing follows the C daemon (``acm_set_options``, ``acmp_set_options``,
``acm_load_prov_config``) wherever its behaviour is not a known defect:

* a line whose first character is ``#`` is a comment; otherwise the first two white-space
  separated tokens are key and value (``sscanf("%31s%255s")``), the rest is ignored;
* keys are case-insensitive, except ``route_timeout`` which must be lowercase;
* numbers use C ``atoi`` (``12abc`` is 12, ``abc`` is 0), the last occurrence of a key wins;
* ``provider <name> default|<subnet prefix>`` lines choose providers.

Defects of the C parsers that are fixed (each fix is reported as an issue naming file:line):

* long lines are not cut every 119 characters (a warning says the C daemon would);
* an invalid ``min_mtu``/``min_rate`` still falls back to 2048/10, but with a warning;
* unknown ``*_prot``/``*_preload`` values keep the previous value, with a warning;
* ``route_preload full_opensm_v1`` (the man page's spelling) is accepted;
* ``provider_lib_path`` is never mistaken for a provider line;
* settings that would stall the daemon (a depth below 1, negative retries or timeouts) are
  raised to the smallest working value, with a warning.

Extensions (keys the C daemon ignores, so one file serves both daemons):

``sa_timeout`` / ``sa_retries``
    per-attempt timeout (ms) and retry count of SA queries. The C daemon uses ``timeout`` and
    ``retries`` for both ACM and SA MADs; unset, these follow ``timeout``/``retries``.
``log_format``
    ``auto`` (console on a terminal, JSON otherwise), ``json`` or ``console``.
``run_dir``
    directory of the client sockets and port files (default ``/run``).
``admin_socket``
    path of the administration socket (default ``<run_dir>/ibacm-admin.sock``).
``cache_max_entries``
    maximum destination-cache entries per endpoint; when full, entries unused lately go first
    (default 65536; 0 = unbounded, as in C).
``cache_file`` / ``cache_save_interval``
    where the destination cache is persisted (default: not persisted; ``none`` disables) and
    how often it is saved, in seconds (default 300; 0 = only at shutdown).
``join_retry_initial_ms`` / ``join_retry_max_ms``
    exponential backoff for failed multicast joins (default 1000 / 60000), each wait drawn
    between half and all of it. C never retries.
``route_bulk_preload``
    ``yes``: fill each endpoint's route cache with one SA GetTable(PathRecord) query at
    start-up (default ``no``).
``metrics_port``
    TCP port of the metrics endpoint on 127.0.0.1 (default 0 = off).
``capture_file``
    file that receives a capture of all MADs sent and received (default: none).
``provider_prefer``
    ``python`` (default) or ``library``: which provider is loaded when a library in
    ``provider_lib_path`` and a Python provider have the same name (rdma-core's
    ``libibacmp.so`` and ours are both ``ibacmp``).
``max_clients`` / ``max_clients_per_user``
    client connections at once, in total (default 16384; also kept below the open-file
    limit, with a reserve for the admin socket) and per local user other than root (peer
    uid of the unix socket, default 1024; 0 = no per-user limit). More are refused (closed
    at once, counted); the socket is 0666, so one user cannot lock the others out.
``client_request_timeout`` / ``client_idle_timeout``
    seconds a started request may stay incomplete (default 10), and a connection may stay
    without any request (default 0 = never: librdmacm keeps one connection per process and
    never reconnects); 0 = no limit. Such connections are closed and counted.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ibacm.config import cnumbers
from ibacm.config.errors import ConfigError, ConfigIssue, IssueSink, errors_in
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

# The C daemon reads lines into a 120-byte buffer: 119 characters plus the terminator.
C_MAX_LINE = 119
C_MAX_KEY = 31


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


@dataclass
class Options:
    """Every setting of the option file, with the C defaults.

    ``min_mtu`` and ``min_rate`` hold IBA enums, as the C provider does (``min_mtu_bytes``
    and ``min_rate_gbps`` give the configured numbers). Timeouts are in ms, cache lifetimes
    in minutes (any negative value = never, see ``lifetime_seconds``).
    """

    # Core (acm.c)
    log_file: str = DEFAULT_LOG_FILE
    log_level: int = 0
    umad_debug_level: int = 0
    lock_file: str = DEFAULT_LOCK_FILE
    server_port: int = 6125
    server_mode: ServerMode = ServerMode.UNIX
    acme_plus_kernel_only: bool = False
    provider_lib_path: str = DEFAULT_PROVIDER_LIB_PATH
    support_ips_in_addr_cfg: bool = False
    timeout: int = 2000
    retries: int = 2
    sa_depth: int = 1
    # Default provider (acmp.c)
    addr_prot: AddrProt = AddrProt.ACM
    addr_timeout: int = 1440
    route_prot: RouteProt = RouteProt.SA
    route_timeout: int = -1
    loopback_prot: LoopbackProt = LoopbackProt.LOCAL
    resolve_depth: int = 1
    send_depth: int = 1
    recv_depth: int = 1024
    min_mtu: int = DEFAULT_MTU_ENUM
    min_rate: int = DEFAULT_RATE_ENUM
    route_preload: RoutePreload = RoutePreload.NONE
    route_data_file: str = DEFAULT_ROUTE_DATA_FILE
    addr_preload: AddrPreload = AddrPreload.NONE
    addr_data_file: str = DEFAULT_ADDR_DATA_FILE
    # Provider assignment lines, in file order.
    providers: list[ProviderLine] = field(default_factory=list)
    # Extensions (see the module docstring).
    sa_timeout: int | None = None
    sa_retries: int | None = None
    log_format: LogFormat = LogFormat.AUTO
    run_dir: str = RUNDIR
    admin_socket: str | None = None
    cache_max_entries: int = 65536
    cache_file: str | None = None
    cache_save_interval: int = 300
    join_retry_initial_ms: int = 1000
    join_retry_max_ms: int = 60000
    route_bulk_preload: bool = False
    metrics_port: int = 0
    capture_file: str | None = None
    provider_prefer: ProviderPrefer = ProviderPrefer.PYTHON
    max_clients: int = 16384
    max_clients_per_user: int = 1024
    client_request_timeout: int = 10
    client_idle_timeout: int = 0

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
        """(label, value) pairs the daemon logs at start-up: core, provider, then extensions.

        Provider enums are shown as numbers, as the C provider logs them.
        """
        core = [
            ("log file", self.log_file),
            ("log level", str(self.log_level)),
            ("umad debug level", str(self.umad_debug_level)),
            ("lock file", self.lock_file),
            ("server_port", str(self.server_port)),
            ("server_mode", self.server_mode.name.lower()),
            ("acme_plus_kernel_only", _yes_no(self.acme_plus_kernel_only)),
            ("timeout", str(self.timeout)),
            ("retries", str(self.retries)),
            ("sa depth", str(self.sa_depth)),
            ("options file", options_file),
            ("addr file", addr_file),
            ("provider lib path", self.provider_lib_path),
            ("support IP's in ibacm_addr.cfg", str(int(self.support_ips_in_addr_cfg))),
        ]
        provider = [
            ("address resolution", str(self.addr_prot.value)),
            ("address timeout", str(self.addr_timeout)),
            ("route resolution", str(self.route_prot.value)),
            ("route timeout", str(self.route_timeout)),
            ("loopback resolution", str(self.loopback_prot.value)),
            ("timeout", str(self.timeout)),
            ("retries", str(self.retries)),
            ("resolve depth", str(self.resolve_depth)),
            ("send depth", str(self.send_depth)),
            ("receive depth", str(self.recv_depth)),
            ("minimum mtu", str(self.min_mtu)),
            ("minimum rate", str(self.min_rate)),
            ("route preload", str(self.route_preload.value)),
            ("route data file", self.route_data_file),
            ("address preload", str(self.addr_preload.value)),
            ("address data file", self.addr_data_file),
        ]
        providers = [
            ("provider", f"{p.name} {'default' if p.default else f'0x{p.prefix or 0:016x}'}")
            for p in self.providers
        ]
        extensions = [
            ("sa timeout", str(self.effective_sa_timeout)),
            ("sa retries", str(self.effective_sa_retries)),
            ("log format", self.log_format.value),
            ("run dir", self.run_dir),
            ("admin socket", str(self.admin_socket_path)),
            ("cache max entries", str(self.cache_max_entries)),
            ("cache file", self.cache_file or "none"),
            ("cache save interval", str(self.cache_save_interval)),
            ("join retry initial ms", str(self.join_retry_initial_ms)),
            ("join retry max ms", str(self.join_retry_max_ms)),
            ("route bulk preload", _yes_no(self.route_bulk_preload)),
            ("metrics port", str(self.metrics_port)),
            ("capture file", self.capture_file or "none"),
            ("provider prefer", self.provider_prefer.value),
            ("max clients", str(self.max_clients)),
            ("max clients per user", str(self.max_clients_per_user)),
            ("client request timeout", str(self.client_request_timeout)),
            ("client idle timeout", str(self.client_idle_timeout)),
        ]
        return core + provider + providers + extensions


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


# ---------------------------------------------------------------------------------------------
# Tokenising, as sscanf("%s") and stricmp() see text: ASCII white space, ASCII case folding.

_C_SPACE_RUN = re.compile(f"[{re.escape(cnumbers.C_SPACE)}]+")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def c_tokens(line: str) -> list[str]:
    """White-space separated tokens as ``sscanf("%s")`` finds them (ASCII white space only)."""
    return [token for token in _C_SPACE_RUN.split(line) if token]


def c_lower(text: str) -> str:
    """ASCII-only lowercase, like C's stricmp: non-ASCII letters are never folded."""
    return text.translate(_ASCII_LOWER)


def c_lines(text: str, sink: IssueSink, limit: int = C_MAX_LINE) -> list[tuple[int, str]]:
    """Split ``text`` as ``fgets`` would see it, numbered from 1, without C's line cutting.

    Warns about lines the C daemon would cut at ``limit`` characters, and cuts lines at an
    embedded NUL, where every C string function stops.
    """
    numbered = []
    for number, line in enumerate(text.split("\n"), start=1):
        if "\0" in line:
            sink.warn(number, "NUL character in line; the rest of the line is ignored")
            line = line[: line.index("\0")]
        # C counts bytes; a trailing CR only adds white space to what C reads next.
        length = len(line.rstrip("\r").encode("utf-8", "surrogateescape"))
        if length > limit:
            sink.warn(
                number,
                f"line is {length} bytes long; read as one line, but the C daemon reads at "
                f"most {limit} bytes per line and would split it",
            )
        numbered.append((number, line))
    return numbered


# ---------------------------------------------------------------------------------------------
# Per-key value handlers


@dataclass
class _Setting:
    """One ``key value`` line being applied."""

    key: str
    value: str
    line: int
    sink: IssueSink
    invalid: bool = False

    def warn(self, message: str) -> None:
        self.sink.warn(self.line, f"{self.key} {message}")

    def error(self, message: str) -> None:
        """An invalid value: the daemon does not start with it, a reload is refused.

        Only the first error of a line is kept: the checks after it judge the value the
        first one made up ("banana" read as 0), which the line never said."""
        if not self.invalid:
            self.invalid = True
            self.sink.error(self.line, f"{self.key} {message}")

    def c_int(self) -> int:
        """The value as C ``atoi`` reads it; an error when that is not the number written."""
        number = cnumbers.atoi(self.value)
        problem = cnumbers.atoi_problem(self.value)
        if problem is not None:
            self.error(
                f"value {self.value!r} {problem} (accepted: an integer); "
                f"the C daemon would silently use {number} (atoi)"
            )
        return number


_Handler = Callable[[Options, _Setting], None]


def _string(name: str) -> _Handler:
    def handle(opts: Options, s: _Setting) -> None:
        setattr(opts, name, s.value)

    return handle


def _optional_path(name: str) -> _Handler:
    """A path extension where ``none`` (any case) means "not configured"."""

    def handle(opts: Options, s: _Setting) -> None:
        setattr(opts, name, None if c_lower(s.value) == "none" else s.value)

    return handle


def _integer(
    name: str, minimum: int | None = None, fallback: int | None = None, maximum: int | None = None
) -> _Handler:
    """An atoi integer; outside [minimum, maximum] it warns and uses ``fallback`` (default:
    the nearest limit)."""

    def handle(opts: Options, s: _Setting) -> None:
        number = s.c_int()
        accepted = f"{'' if minimum is None else minimum}..{'' if maximum is None else maximum}"
        if minimum is not None and number < minimum:
            used = minimum if fallback is None else fallback
            s.error(
                f"value {number} is below {minimum} and would not work (accepted: {accepted}); "
                f"the C daemon would use {number}"
            )
            number = used
        elif maximum is not None and number > maximum:
            used = maximum if fallback is None else fallback
            s.error(f"value {number} is above {maximum} (accepted: {accepted})")
            number = used
        setattr(opts, name, number)

    return handle


def _timeout(name: str) -> _Handler:
    """A timeout in ms, at least 1: with 0 or less no request could ever be answered."""

    def handle(opts: Options, s: _Setting) -> None:
        number = s.c_int()
        if number < 1:
            previous = getattr(opts, name)
            shown = "following timeout" if previous is None else str(previous)
            s.error(
                f"value {number} makes every request time out (accepted: 1.. milliseconds); "
                f"the C daemon would use {number}; keeping {shown}"
            )
            return
        setattr(opts, name, number)

    return handle


def _lifetime(name: str) -> _Handler:
    def handle(opts: Options, s: _Setting) -> None:
        number = s.c_int()
        if number < -1:
            s.error(
                f"value {number} is below -1 (accepted: -1 = never expire, or 0.. minutes); "
                "the C daemon would never expire entries"
            )
        setattr(opts, name, number)

    return handle


def _keyword(name: str, table: dict[str, enum.Enum]) -> _Handler:
    """A keyword value; an unknown keyword keeps the previous value, as in C."""

    def handle(opts: Options, s: _Setting) -> None:
        chosen = table.get(c_lower(s.value))
        if chosen is None:
            previous = getattr(opts, name)
            allowed = ", ".join(sorted(table))
            s.error(
                f"value {s.value!r} is not one of {allowed}; the C daemon would keep "
                f"{_keyword_of(table, previous)}"
            )
            return
        setattr(opts, name, chosen)

    return handle


def _keyword_of(table: dict[str, enum.Enum], value: enum.Enum) -> str:
    return next(word for word, member in table.items() if member is value)


def _server_port(opts: Options, s: _Setting) -> None:
    number = s.c_int()
    port = number & 0xFFFF  # C: (short) atoi(), later bound as an unsigned 16-bit port
    if not 0 <= number <= 0xFFFF:
        s.error(
            f"value {number} is not a TCP port (accepted: 0..65535, 0 = any free port); "
            f"the C daemon would use {port}"
        )
    opts.server_port = port


def _server_mode(opts: Options, s: _Setting) -> None:
    word = c_lower(s.value)
    modes = {"open": ServerMode.OPEN, "loop": ServerMode.LOOP, "unix": ServerMode.UNIX}
    if word not in modes:
        s.error(f"value {s.value!r} is not one of unix, loop, open; the C daemon would use unix")
    opts.server_mode = modes.get(word, ServerMode.UNIX)


def _c_flag(opts: Options, s: _Setting) -> None:
    """acme_plus_kernel_only: "true", "yes" or strtol(value, 0) != 0, exactly as C."""
    word = c_lower(s.value)
    number = cnumbers.strtol(s.value, 0)
    flag = word in ("true", "yes") or number.value != 0
    if word not in ("true", "yes", "false", "no") and (
        not number.converted or s.value[number.end :]
    ):
        s.error(
            f"value {s.value!r} is not yes/no/true/false or a number; "
            f"the C daemon would use {_yes_no(flag)}"
        )
    opts.acme_plus_kernel_only = flag


def _int_flag(name: str) -> _Handler:
    def handle(opts: Options, s: _Setting) -> None:
        setattr(opts, name, s.c_int() != 0)

    return handle


def _yes_no_flag(name: str) -> _Handler:
    """A boolean extension: yes/true/on/1 or no/false/off/0."""

    def handle(opts: Options, s: _Setting) -> None:
        word = c_lower(s.value)
        if word in ("yes", "true", "on", "1"):
            setattr(opts, name, True)
        elif word in ("no", "false", "off", "0"):
            setattr(opts, name, False)
        else:
            s.error(f"value {s.value!r} is not yes or no (accepted: yes, no, true, false, on, off)")

    return handle


def _min_mtu(opts: Options, s: _Setting) -> None:
    number = s.c_int()
    if number not in MTU_ENUM:
        allowed = ", ".join(str(size) for size in MTU_ENUM)
        s.error(f"value {s.value!r} is not one of {allowed}; the C daemon would use 2048")
    opts.min_mtu = MTU_ENUM.get(number, DEFAULT_MTU_ENUM)


def _min_rate(opts: Options, s: _Setting) -> None:
    number = s.c_int()
    if number not in RATE_ENUM:
        allowed = ", ".join(str(rate) for rate in sorted(RATE_ENUM))
        s.error(f"value {s.value!r} is not one of {allowed}; the C daemon would use 10")
    opts.min_rate = RATE_ENUM.get(number, DEFAULT_RATE_ENUM)


def _route_preload(opts: Options, s: _Setting) -> None:
    if c_lower(s.value) == "full_opensm_v1":
        s.warn(
            "value 'full_opensm_v1' (the man page's spelling) accepted as opensm_full_v1; "
            "the C daemon accepts only opensm_full_v1 and would ignore it"
        )
        opts.route_preload = RoutePreload.OPENSM_FULL_V1
        return
    _route_preload_keyword(opts, s)


def _log_file(opts: Options, s: _Setting) -> None:
    # stdout/stderr are matched case-insensitively by C; store them in one spelling.
    word = c_lower(s.value)
    opts.log_file = word if word in ("stdout", "stderr") else s.value


_ROUTE_PRELOADS: dict[str, enum.Enum] = {
    "none": RoutePreload.NONE,
    "no": RoutePreload.NONE,
    "opensm_full_v1": RoutePreload.OPENSM_FULL_V1,
}

_route_preload_keyword = _keyword("route_preload", _ROUTE_PRELOADS)

_HANDLERS: dict[str, _Handler] = {
    # core
    "log_file": _log_file,
    "log_level": _integer("log_level"),
    "umad_debug_level": _integer("umad_debug_level"),
    "lock_file": _string("lock_file"),
    "server_port": _server_port,
    "server_mode": _server_mode,
    "acme_plus_kernel_only": _c_flag,
    "provider_lib_path": _string("provider_lib_path"),
    "support_ips_in_addr_cfg": _int_flag("support_ips_in_addr_cfg"),
    "timeout": _timeout("timeout"),
    "retries": _integer("retries", minimum=0),
    "sa_depth": _integer("sa_depth", minimum=1),
    # ibacmp
    "addr_prot": _keyword("addr_prot", {"acm": AddrProt.ACM}),
    "addr_timeout": _lifetime("addr_timeout"),
    "route_prot": _keyword("route_prot", {"acm": RouteProt.ACM, "sa": RouteProt.SA}),
    "route_timeout": _lifetime("route_timeout"),
    "loopback_prot": _keyword(
        "loopback_prot", {"none": LoopbackProt.NONE, "local": LoopbackProt.LOCAL}
    ),
    "resolve_depth": _integer("resolve_depth", minimum=1),
    "send_depth": _integer("send_depth", minimum=1),
    "recv_depth": _integer("recv_depth", minimum=1),
    "min_mtu": _min_mtu,
    "min_rate": _min_rate,
    "route_preload": _route_preload,
    "route_data_file": _string("route_data_file"),
    "addr_preload": _keyword(
        "addr_preload",
        {"none": AddrPreload.NONE, "no": AddrPreload.NONE, "acm_hosts": AddrPreload.ACM_HOSTS},
    ),
    "addr_data_file": _string("addr_data_file"),
    # extensions
    "sa_timeout": _timeout("sa_timeout"),
    "sa_retries": _integer("sa_retries", minimum=0),
    "log_format": _keyword(
        "log_format",
        {"auto": LogFormat.AUTO, "json": LogFormat.JSON, "console": LogFormat.CONSOLE},
    ),
    "run_dir": _string("run_dir"),
    "admin_socket": _string("admin_socket"),
    "cache_max_entries": _integer("cache_max_entries", minimum=0, fallback=65536),
    "cache_file": _optional_path("cache_file"),
    "cache_save_interval": _integer("cache_save_interval", minimum=0, fallback=300),
    "join_retry_initial_ms": _integer("join_retry_initial_ms", minimum=1, fallback=1000),
    "join_retry_max_ms": _integer("join_retry_max_ms", minimum=1, fallback=60000),
    "route_bulk_preload": _yes_no_flag("route_bulk_preload"),
    "metrics_port": _integer("metrics_port", minimum=0, fallback=0, maximum=0xFFFF),
    "capture_file": _optional_path("capture_file"),
    "provider_prefer": _keyword(
        "provider_prefer", {"python": ProviderPrefer.PYTHON, "library": ProviderPrefer.LIBRARY}
    ),
    "max_clients": _integer("max_clients", minimum=1, fallback=16384),
    "max_clients_per_user": _integer("max_clients_per_user", minimum=0, fallback=1024),
    "client_request_timeout": _integer("client_request_timeout", minimum=0, fallback=10),
    "client_idle_timeout": _integer("client_idle_timeout", minimum=0, fallback=0),
}
# The one key the C provider compares case-sensitively.
_CASE_SENSITIVE_KEYS = frozenset({"route_timeout"})

KNOWN_KEYS: frozenset[str] = frozenset(_HANDLERS) | {"provider"}
"""Every key this parser understands (lowercase), including our extensions."""


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
    if lowered == "provider":
        provider = _provider_line(tokens, line, sink)
        if provider is not None:
            opts.providers.append(provider)
        return
    if len(tokens) < 2:
        sink.warn(line, f"key {key!r} has no value; line ignored")
        return
    if len(key) > C_MAX_KEY:
        sink.warn(line, f"key {key[:40]!r}... is longer than {C_MAX_KEY} characters; ignored")
        return
    if lowered in _CASE_SENSITIVE_KEYS and key != lowered:
        sink.warn(line, f"key {key!r} ignored: {lowered} must be written in lowercase (as in C)")
        return
    handler = _HANDLERS.get(lowered)
    if handler is None:
        if lowered.startswith("provider"):
            # C's provider parser would have taken this line for a provider line.
            sink.warn(line, f"unknown key {key!r} ignored (C would read it as a provider line)")
        else:
            sink.warn(line, f"unknown key {key!r} ignored (it may belong to another provider)")
        return
    if len(tokens) > 2 and not tokens[2].startswith("#"):
        sink.warn(line, f"{key}: text after the value {tokens[1]!r} is ignored")
    handler(opts, _Setting(key=lowered, value=tokens[1], line=line, sink=sink))
    set_at[lowered] = line


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
