"""The option file ``ib_acme -O`` writes: explained settings, one ``key value`` per block.

The active (uncommented) lines are exactly those of the C tool, in its order, so both daemons
read the same settings from it. Every other key appears as a commented example, unless
``options`` sets it to a non-default value, in which case it is written active so that
``parse_options(render_opts_file(o))`` gives ``o`` back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ibacm.config.cnumbers import C_SPACE
from ibacm.config.options import (
    MTU_BYTES,
    RATE_GBPS,
    AddrPreload,
    LoopbackProt,
    Options,
    ProviderLine,
    RoutePreload,
    RouteProt,
)
from ibacm.config.paths import DEFAULT_LOG_FILE, RUNDIR, RunPaths

_HEADER = """\
# ibacm_opts.cfg: settings of the InfiniBand Communication Management Assistant (ibacm)
#
# Written by 'ib_acme -O'. Each setting is one line 'name value'; lines starting with '#'
# are comments. Names are not case sensitive, except route_timeout. A setting that is
# missing takes the default shown here. ibacm reads this file when it starts and
# when asked to reload its configuration.
"""


@dataclass(frozen=True)
class _Block:
    """One documented setting: the explanation, then examples, then the setting itself."""

    key: str
    text: tuple[str, ...]
    examples: tuple[str, ...] = ()
    active: bool = True  # False: written commented unless it differs from the default


def _word(value: bool | RouteProt | LoopbackProt | RoutePreload | AddrPreload) -> str:
    """A keyword setting as the file spells it."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, RoutePreload):
        return {RoutePreload.NONE: "none", RoutePreload.OPENSM_FULL_V1: "opensm_full_v1"}[value]
    if isinstance(value, AddrPreload):
        return {AddrPreload.NONE: "none", AddrPreload.ACM_HOSTS: "acm_hosts"}[value]
    return value.name.lower()


# Extensions whose value "" means "not set" (they follow another setting).
_UNSET_MEANS_DEFAULT = frozenset({"sa_timeout", "sa_retries", "admin_socket"})


def _values(options: Options) -> dict[str, str]:
    """Every key of the file with its value as text (None-valued extensions omitted)."""
    values = {
        "log_file": options.log_file,
        "log_level": str(options.log_level),
        "umad_debug_level": str(options.umad_debug_level),
        "lock_file": options.lock_file,
        "addr_prot": "acm",
        "addr_timeout": str(options.addr_timeout),
        "route_prot": _word(options.route_prot),
        "route_timeout": str(options.route_timeout),
        "loopback_prot": _word(options.loopback_prot),
        "server_port": str(options.server_port),
        "server_mode": options.server_mode.name.lower(),
        "acme_plus_kernel_only": _word(options.acme_plus_kernel_only),
        "timeout": str(options.timeout),
        "retries": str(options.retries),
        "resolve_depth": str(options.resolve_depth),
        "sa_depth": str(options.sa_depth),
        "send_depth": str(options.send_depth),
        "recv_depth": str(options.recv_depth),
        "min_mtu": str(MTU_BYTES.get(options.min_mtu, 2048)),
        "min_rate": str(RATE_GBPS.get(options.min_rate, 10)),
        "route_preload": _word(options.route_preload),
        "route_data_file": options.route_data_file,
        "addr_preload": _word(options.addr_preload),
        "addr_data_file": options.addr_data_file,
        "support_ips_in_addr_cfg": str(int(options.support_ips_in_addr_cfg)),
        "provider_lib_path": options.provider_lib_path,
        "sa_timeout": "" if options.sa_timeout is None else str(options.sa_timeout),
        "sa_retries": "" if options.sa_retries is None else str(options.sa_retries),
        "log_format": options.log_format.value,
        "run_dir": options.run_dir,
        "admin_socket": options.admin_socket or "",
        "cache_max_entries": str(options.cache_max_entries),
        "cache_file": options.cache_file or "none",
        "cache_save_interval": str(options.cache_save_interval),
        "join_retry_initial_ms": str(options.join_retry_initial_ms),
        "join_retry_max_ms": str(options.join_retry_max_ms),
        "route_bulk_preload": _word(options.route_bulk_preload),
        "metrics_port": str(options.metrics_port),
        "capture_file": options.capture_file or "none",
        "provider_prefer": options.provider_prefer.value,
        "max_clients": str(options.max_clients),
        "max_clients_per_user": str(options.max_clients_per_user),
        "client_request_timeout": str(options.client_request_timeout),
        "client_idle_timeout": str(options.client_idle_timeout),
    }
    for key, value in values.items():
        if any(char in C_SPACE or char == "\0" for char in value) or (
            value == "" and key not in _UNSET_MEANS_DEFAULT
        ):
            raise ValueError(f"{key} value {value!r} cannot be written in an option file")
    return values


_BLOCKS: tuple[_Block, ...] = (
    _Block(
        "log_file",
        ("Where ibacm writes its log: 'stdout', 'stderr' or a file name.",),
        ("log_file stdout", "log_file stderr", f"log_file {DEFAULT_LOG_FILE}"),
    ),
    _Block(
        "log_level",
        (
            "How much is logged: 0 = configuration summary and errors, 1 = also detailed",
            "configuration and events, 2 = also every request (busy).",
        ),
    ),
    _Block(
        "umad_debug_level",
        ("Debug level of the MAD library: 0 = off, 1 = basic, 2 = verbose.",),
    ),
    _Block(
        "lock_file",
        ("File holding the daemon's process id; it also stops a second ibacm from starting.",),
    ),
    _Block(
        "addr_prot",
        (
            "Protocol used to find the GID of a destination address. The only protocol is",
            "'acm': a multicast query answered by the node that owns the address.",
        ),
    ),
    _Block(
        "addr_timeout",
        (
            "Minutes a resolved address stays cached before it is resolved again; -1 keeps",
            "it forever. (60 = one hour, 1440 = one day, 10080 = one week.)",
        ),
    ),
    _Block(
        "route_prot",
        (
            "Protocol used to obtain the path to a destination once its GID is known:",
            "'sa' asks the subnet administrator for a path record and caches it,",
            "'acm' builds the path from the ACM multicast exchange.",
        ),
    ),
    _Block(
        "route_timeout",
        (
            "Minutes a resolved path stays cached; -1 keeps it until its address expires.",
            "This name must be written in lowercase.",
        ),
    ),
    _Block(
        "loopback_prot",
        (
            "How this node's own addresses are resolved: 'local' answers from local port",
            "data, 'none' resolves them like any other address.",
        ),
    ),
    _Block(
        "server_port",
        (
            "TCP port for clients in 'loop' and 'open' mode. Clients learn it from the",
            "port file ibacm writes.",
        ),
    ),
    _Block(
        "server_mode",
        (
            "How clients connect: 'unix' = a local unix socket only, 'loop' = TCP on",
            "127.0.0.1, 'open' = TCP on every address (no authentication!).",
        ),
    ),
    _Block(
        "acme_plus_kernel_only",
        (
            "'yes' (or 'true' or a non-zero number) serves only the kernel and ib_acme;",
            "other applications get no answers. Not applied when systemd starts ibacm",
            "through its socket unit.",
        ),
    ),
    _Block(
        "timeout",
        (
            "Milliseconds to wait for an answer from another ACM node or the subnet",
            "administrator, on top of the subnet timeout, before trying again.",
        ),
    ),
    _Block(
        "retries",
        ("How many times an unanswered ACM or SA request is sent again.",),
    ),
    _Block(
        "resolve_depth",
        (
            "Resolutions in progress at the same time per endpoint; more are queued.",
            "Higher values resolve faster in parallel but load the subnet more.",
        ),
    ),
    _Block(
        "sa_depth",
        (
            "Queries to the subnet administrator in progress at the same time per port;",
            "more are queued. Counted separately from resolve_depth.",
        ),
    ),
    _Block(
        "send_depth",
        ("Answers to other nodes in flight at the same time per endpoint; more are queued.",),
    ),
    _Block(
        "recv_depth",
        (
            "Receive buffers per endpoint. A job start brings every node one request from",
            "each other node at once: use at least the number of nodes, or part of that",
            "burst is dropped and every peer missed is asked for again by multicast.",
        ),
    ),
    _Block(
        "min_mtu",
        (
            "MTU in bytes of the multicast group every node joins: 256, 512, 1024, 2048 or",
            "4096. Use the largest MTU all nodes of the fabric support.",
        ),
    ),
    _Block(
        "min_rate",
        (
            "Link rate in Gb/s of the multicast group every node joins: 2 (for 2.5), 5, 10,",
            "14, 20, 25, 30, 40, 56, 60, 80, 100, 112, 120, 168, 200 or 300. Use the",
            "highest rate all nodes of the fabric support.",
        ),
    ),
    _Block(
        "route_preload",
        (
            "Fill the path cache at start-up: 'none' (default) or 'opensm_full_v1' to read",
            "OpenSM's full path record dump from route_data_file.",
        ),
    ),
    _Block(
        "route_data_file",
        ("The path record dump read when route_preload is 'opensm_full_v1'.",),
        active=False,
    ),
    _Block(
        "addr_preload",
        (
            "Fill the address cache at start-up: 'none' (default) or 'acm_hosts' to read",
            "'<address> <GID>' lines from addr_data_file.",
        ),
    ),
    _Block(
        "addr_data_file",
        ("The address list read when addr_preload is 'acm_hosts'.",),
        active=False,
    ),
    _Block(
        "support_ips_in_addr_cfg",
        ("1: also read IP addresses from ibacm_addr.cfg. Default 0.",),
        active=False,
    ),
    _Block(
        "provider_lib_path",
        (
            "Directory of provider libraries built for rdma-core (acm_prov.h): both daemons",
            "load them; this one with --fabric hw.",
        ),
        active=False,
    ),
)

# Extensions of this implementation; the C daemon ignores them.
_EXTENSION_BLOCKS: tuple[_Block, ...] = (
    _Block(
        "sa_timeout",
        ("Milliseconds per SA query attempt (default: the value of timeout).",),
        ("sa_timeout 2000",),
        active=False,
    ),
    _Block(
        "sa_retries",
        ("SA query retries (default: the value of retries).",),
        ("sa_retries 2",),
        active=False,
    ),
    _Block("log_format", ("'auto', 'json' or 'console'.",), active=False),
    _Block("run_dir", ("Directory of the client sockets and port files.",), active=False),
    _Block(
        "admin_socket",
        ("Administration socket (default: ibacm-admin.sock in run_dir).",),
        (f"admin_socket {RunPaths(Path(RUNDIR)).admin_socket}",),
        active=False,
    ),
    _Block(
        "cache_max_entries",
        ("Cached destinations per endpoint (full: unused ones go first); 0 = no limit.",),
        active=False,
    ),
    _Block(
        "cache_file",
        ("Where the destination cache is saved across restarts ('none' = not saved).",),
        active=False,
    ),
    _Block(
        "cache_save_interval",
        ("Seconds between cache saves; 0 = only at shutdown.",),
        active=False,
    ),
    _Block(
        "join_retry_initial_ms",
        ("First wait before a failed multicast join is tried again.",),
        active=False,
    ),
    _Block(
        "join_retry_max_ms",
        ("Longest wait between join attempts (the wait doubles each time).",),
        active=False,
    ),
    _Block(
        "route_bulk_preload",
        ("'yes': fetch all paths of an endpoint with one SA table query at start-up.",),
        active=False,
    ),
    _Block(
        "metrics_port", ("TCP port of the metrics endpoint on 127.0.0.1; 0 = off.",), active=False
    ),
    _Block(
        "capture_file", ("File receiving a capture of every MAD ('none' = off).",), active=False
    ),
    _Block(
        "provider_prefer",
        (
            "'python' or 'library': which provider is loaded when a library in",
            "provider_lib_path has the name of a Python provider (rdma-core's libibacmp.so",
            "and this daemon's provider are both 'ibacmp').",
        ),
        active=False,
    ),
    _Block(
        "max_clients",
        (
            "Client connections at once; more are refused. Kept below the open-file limit,",
            "with a reserve for the administration socket.",
        ),
        active=False,
    ),
    _Block(
        "max_clients_per_user",
        (
            "Client connections at once of one local user other than root (the client",
            "socket is open to everybody); 0 = no per-user limit.",
        ),
        active=False,
    ),
    _Block(
        "client_request_timeout",
        ("Seconds a client may take to finish sending a request it began; 0 = no limit.",),
        active=False,
    ),
    _Block(
        "client_idle_timeout",
        (
            "Seconds a client connection may stay without a request; 0 = no limit (the",
            "default: an application's librdmacm connects once and never reconnects).",
        ),
        active=False,
    ),
)


def _render_block(block: _Block, value: str, default_value: str) -> list[str]:
    lines = [f"# {block.key}:", *(f"# {text}" for text in block.text)]
    if block.examples:
        lines += ["# Examples:", *(f"# {example}" for example in block.examples)]
    if value == "":
        pass  # an unset extension that follows another setting; the examples show it
    elif block.active or value != default_value:
        lines.append(f"{block.key} {value}")
    else:
        lines.append(f"# {block.key} {value}")
    return [*lines, ""]


def _provider_lines(providers: list[ProviderLine]) -> list[str]:
    lines = [
        "# provider:",
        "# Which provider serves the ports of a subnet: 'provider <name> <subnet prefix>',",
        "# or 'provider <name> default' for every other port. This daemon has one",
        "# built-in provider, ibacmp, and loads the libraries in provider_lib_path.",
        "# Examples:",
        "# provider ibacmp 0xFE80000000000000",
        "# provider ibacmp default",
    ]
    for p in providers:
        if not p.name or any(char in C_SPACE for char in p.name):
            raise ValueError(f"provider name {p.name!r} cannot be written in an option file")
        which = "default" if p.default else f"0x{p.prefix or 0:016X}"
        lines.append(f"provider {p.name} {which}")
    return [*lines, ""]


def render_opts_file(options: Options | None = None) -> str:
    """The option file for ``options`` (default: all defaults, as ``ib_acme -O`` writes)."""
    chosen = Options() if options is None else options
    values, defaults = _values(chosen), _values(Options())
    out = [_HEADER]
    for block in _BLOCKS:
        out.extend(_render_block(block, values[block.key], defaults[block.key]))
    out.extend(_provider_lines(chosen.providers))
    out.append("# Settings of this implementation only (the C ibacm ignores them):")
    out.append("")
    for block in _EXTENSION_BLOCKS:
        out.extend(_render_block(block, values[block.key], defaults[block.key]))
    return "\n".join(out).rstrip("\n") + "\n"
