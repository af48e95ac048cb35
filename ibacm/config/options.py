"""The option file ``ibacm_opts.cfg``: one flat ``key value`` file for the core and ibacmp.

Each option is defined once, as a field made by ``option()``: its type, default, kind of value
(what is accepted, how it is written), which C parser reads it, what a reload does with it,
and its help text. The C daemon's keys are the fields of ``COptions``
(``ibacm.config.c_options``); ``Options`` adds the extensions (``ReadBy.EXTENSION``: keys the
C daemon ignores, so one file serves both daemons), whose help says what each does.
``OPTIONS`` lists the definitions; the parser (``ibacm.config.option_file``),
``Options.summary``, the generated option file (``ibacm.config.opts_template``) and the
daemon's reload groups (``ibacm.core.daemon``) are derived from them.

Adding an option is one field of ``Options``, plus its entry in ibacm(8)
(``tests/config/test_option_docs.py`` checks the page against the definitions), the code that
uses it, its probe in the reload test (``tests/core/test_daemon_reload.py``) and
``contrib/ibacm_opts.cfg`` generated again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ibacm.config.c_options import COptions
from ibacm.config.option_kinds import (
    Integer,
    Keyword,
    OptionalPath,
    OptionDef,
    ReadBy,
    Reload,
    Text,
    Timeout,
    UnsetText,
    YesNo,
    definitions,
    option,
)
from ibacm.config.option_values import LogFormat, ProviderPrefer
from ibacm.config.paths import DEFAULT_ADDR_FILE, DEFAULT_OPTS_FILE, RUNDIR, RunPaths

_EXT = ReadBy.EXTENSION


@dataclass
class Options(COptions):
    """Every setting of the option file: the C daemon's (``COptions``), then the extensions,
    in the order of the file ``ib_acme -O`` writes."""

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

    def summary(
        self, options_file: str = DEFAULT_OPTS_FILE, addr_file: str = DEFAULT_ADDR_FILE
    ) -> list[tuple[str, str]]:
        """(label, value) pairs the daemon logs at start-up: what each C parser reads (core,
        with the file names, then provider, then provider lines), then the extensions.

        Provider enums are shown as numbers, as the C provider logs them.
        """
        pairs: list[tuple[str, str]] = []
        for section in ReadBy:
            last: dict[str, list[tuple[str, str]]] = {}
            for definition in OPTIONS:
                if section not in definition.read_by:
                    continue
                if definition.key in _C_LOGGED_AFTER_FILES:
                    last[definition.key] = self._entries(definition)
                else:
                    pairs += self._entries(definition)
            if section is ReadBy.CORE:
                pairs += [("options file", options_file), ("addr file", addr_file)]
            for key in _C_LOGGED_AFTER_FILES:
                pairs += last.get(key, [])
        return pairs

    def _entries(self, definition: OptionDef) -> list[tuple[str, str]]:
        value = getattr(self, definition.name)
        if value is None and definition.follows is not None:
            return [(definition.label, str(getattr(self, definition.follows)))]
        return definition.kind.entries(definition.label, value)


_C_LOGGED_AFTER_FILES = ("provider_lib_path", "support_ips_in_addr_cfg")
"""Core keys C logs after the two file names (options.md §3); the file writes them before."""

OPTIONS: tuple[OptionDef, ...] = definitions(Options)
"""Every option, in the order of the generated file."""
BY_KEY: dict[str, OptionDef] = {definition.key: definition for definition in OPTIONS}
KNOWN_KEYS: frozenset[str] = frozenset(BY_KEY)
"""Every key this parser understands (lowercase), including our extensions."""


def option_names(*reloads: Reload) -> tuple[str, ...]:
    """The ``Options`` fields a reload treats as one of ``reloads``, in definition order."""
    return tuple(definition.name for definition in OPTIONS if definition.reload in reloads)
