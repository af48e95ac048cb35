"""The ibacm daemon: one root nursery that owns the fabric, the clients and the admin socket.

Start-up (options.md §8 order, minus the parts the CLI does first): providers, devices and
ports, client listeners and their files, admin socket, signals, then READY=1. Shutdown is
graceful: listeners close, replies already owed go out (for up to ``shutdown_grace``
seconds), ports are closed through the provider, ``provider.stop()`` runs, and every file the
daemon created is removed. SIGHUP reopens the log and reloads the option and address files
without dropping clients.

Under systemd (``Notifier`` enabled) the daemon announces READY=1 once it serves (retried
until the manager has it), RELOADING=1/READY=1 around every reload, STOPPING=1, and a
STATUS= line (``status_line``) while it runs.

``Daemon`` also implements the admin socket's ``DaemonControl``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import ipaddress
import logging
import os
import resource
import signal
import socket
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

import ibacm
from ibacm import __version__
from ibacm.config.addr_file import AddrEntry, parse_addr_file
from ibacm.config.address_literals import classify
from ibacm.config.errors import ConfigError, ConfigIssue, errors_in, invalid_settings
from ibacm.config.option_file import load_options
from ibacm.config.option_kinds import Reload
from ibacm.config.option_values import ProviderPrefer, ServerMode
from ibacm.config.options import Options, option_names
from ibacm.config.paths import DEFAULT_ADDR_FILE, RunPaths
from ibacm.core.admin import AdminSocketError, serve_admin
from ibacm.core.client_loop import ClientLimits
from ibacm.core.clients import ClientServer
from ibacm.core.dispatch import Dispatcher
from ibacm.core.events import EventBus
from ibacm.core.listeners import ClientListeners, ListenerError, open_client_listeners
from ibacm.core.local_topology import AddressFile, Topology, endpoint_summary, port_info
from ibacm.core.logging import CONFIG_LOGGER, LogControl, python_level
from ibacm.core.model import EndpointState, find_endpoint, iter_endpoints
from ibacm.core.netlink_ls import LsService, open_ls_socket, serve_netlink
from ibacm.core.services import DaemonServices
from ibacm.core.srcaddr import Probe, kernel_probe
from ibacm.fabric.api import Fabric, NoDevicesError
from ibacm.fabric.capture import CaptureControl, CaptureError, TapFabric
from ibacm.log import get_logger
from ibacm.provider.api import Counters
from ibacm.provider.registry import (
    PrefixRule,
    ProviderEntry,
    ProviderSet,
    discover_providers,
    merge_libraries,
)
from ibacm.sd_notify import Notifier
from ibacm.wire.client import AddrType

log = get_logger("ibacm.daemon")
config_log = get_logger(CONFIG_LOGGER)

SHUTDOWN_GRACE = 2.0
"""Seconds in-flight requests get to finish at shutdown."""
STATUS_INTERVAL = 5.0
"""Seconds between two looks at the daemon for systemd's STATUS= line."""
STATUS_SETTLE = 0.25
"""Seconds a change of state (an endpoint, a port) waits for the ones that come with it
before STATUS= tells it, so a burst of them is one line."""
STATUS_KINDS = ("endpoint", "port")
"""Bus events that change STATUS= at once (cache entries and clients wait for the next look)."""
BANNER = "Assistant to the InfiniBand Communication Manager"

# What a reload does with each option: each option's definition says (``OptionDef.reload``).
RESTART_OPTIONS = option_names(Reload.RESTART, Reload.ENDPOINT)
"""Options the running daemon cannot change, or that an endpoint is built with when it
opens: a reload reports them and keeps the running value."""
CORE_OPTIONS = option_names(Reload.DAEMON)
"""Options the daemon applies itself on reload."""
PROVIDER_OPTIONS = option_names(Reload.PROVIDER)
"""Options the providers apply (``Provider.options_changed``) to their open endpoints."""


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE := hard, so the number of clients is not capped (defect 2)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("cannot raise the open-file limit", soft=soft, hard=hard, error=str(exc))
        return soft
    return target


_HELD_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _hold_signals() -> None:
    """Ignore the signals the daemon handles (see ``Daemon._signals``)."""
    for signum in _HELD_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def parse_destination(text: str) -> tuple[AddrType, bytes]:
    """An admin ``flush`` destination: an IPv4/IPv6 literal or a name (64-byte info)."""
    text = text.strip()
    if not text:
        raise ValueError("destination is empty")
    addr_type, info = classify(text)
    return AddrType(addr_type), info


def client_limits(options: Options) -> ClientLimits:
    return ClientLimits(
        max_clients=options.max_clients,
        max_per_user=options.max_clients_per_user,
        request_timeout=float(options.client_request_timeout),
        idle_timeout=float(options.client_idle_timeout),
    )


def provider_choice(
    options: Options, loaded: Sequence[ProviderEntry]
) -> tuple[str | None, list[PrefixRule]]:
    """The default provider and the prefix rules from the ``provider`` lines (options.md §2)."""
    names = {entry.name.lower() for entry in loaded}
    default: str | None = None
    rules: list[PrefixRule] = []
    for line in options.providers:
        if line.default:
            # C changes the default only for a provider it loaded; the last such line wins.
            if line.name.lower() in names:
                default = line.name
        elif line.prefix is not None:
            rules.append(PrefixRule(line.prefix, line.name))
    return default, rules


class Daemon:
    """One ibacm instance on one fabric."""

    def __init__(
        self,
        options: Options,
        fabric: Fabric,
        *,
        opts_file: str | None = None,
        addr_file: str = DEFAULT_ADDR_FILE,
        providers: Sequence[ProviderEntry] | None = None,
        inherited_stream: socket.socket | None = None,
        inherited_netlink: socket.socket | None = None,
        kernel_service: bool = True,
        systemd: bool = False,
        run_dir: str | None = None,
        capture_file: str | None = None,
        log_control: LogControl | None = None,
        notifier: Notifier | None = None,
        probe: Probe = kernel_probe,
        handle_signals: bool = False,
        shutdown_grace: float = SHUTDOWN_GRACE,
        admin: bool = True,
    ) -> None:
        # Every MAD passes the tap: capture files and metrics observe it there.
        self.tap = fabric if isinstance(fabric, TapFabric) else TapFabric(fabric)
        self.fabric: Fabric = self.tap
        self.mad_capture = CaptureControl(self.tap)
        self.opts_file = opts_file
        self.systemd = systemd
        self.run_dir = run_dir
        self.capture_file = capture_file
        """``--capture``: outranks ``capture_file`` in the option file, also after a reload."""
        self.options = self._with_overrides(options)
        self.inherited_stream = inherited_stream
        self.inherited_netlink = inherited_netlink
        self.kernel_service = kernel_service
        self.ls_service: LsService | None = None
        self.log_control = log_control
        self.notifier = notifier or Notifier(None)
        self.handle_signals = handle_signals
        self.shutdown_grace = shutdown_grace
        self.admin = admin
        self.counters = Counters()
        self.bus = EventBus()
        self.services = DaemonServices(self.options, self.counters, self.bus)
        self.provider_entries = list(providers) if providers is not None else None
        self.c_bridge: object | None = None
        """The core of provider libraries (ibacm.provider.cprov), when any is loaded."""
        self.providers = ProviderSet({})
        self.addr_file = AddressFile(addr_file, support_ips=self.options.support_ips_in_addr_cfg)
        self.topology = Topology(self.tap, self.providers, self.services, self.addr_file)
        self.dispatcher = Dispatcher(self.topology.devices, self.counters, probe)
        self.clients = ClientServer(self.dispatcher, limits=client_limits(self.options))
        self.listeners: ClientListeners | None = None
        self.admin_path: str | None = None
        self.ready = trio.Event()
        """Set once the daemon serves."""
        self.stopped = trio.Event()
        """Set when ``run`` has finished (cleanly or not)."""
        self._stop = trio.Event()
        self._started_wall = time.time()
        self._started = 0.0
        self._reload_lock = trio.Lock()
        self._refused: str | None = None
        """Why the last reload was refused, until one is applied (for STATUS=)."""

    # -- options -------------------------------------------------------------------------------
    def _with_overrides(self, options: Options) -> Options:
        """Command-line overrides that outrank the option file (also after a reload)."""
        if self.run_dir is not None:
            options.run_dir = self.run_dir
        if self.capture_file is not None:
            options.capture_file = self.capture_file
        if self.systemd:
            options.server_mode = ServerMode.UNIX
        return options

    @property
    def paths(self) -> RunPaths:
        return self.options.run_paths

    def _log_banner(self) -> None:
        config_log.info(
            BANNER, version=__version__, pid=os.getpid(), modules=ibacm.variant.describe()
        )
        for label, value in self.options.summary(
            self.opts_file or "(defaults)", self.addr_file.path
        ):
            config_log.info("option", name=label, value=value)

    # -- running -------------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[Daemon] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until ``request_shutdown`` (or SIGTERM/SIGINT with ``handle_signals``).

        Raises ``NoDevicesError`` when the fabric has no device, ``ListenerError`` when the
        client socket cannot be created; both before ``started``.
        """
        self._started = trio.current_time()
        raise_fd_limit()
        if self.log_control is not None:
            self.log_control.bus = self.bus
        self._log_banner()
        await self._load_providers()
        try:
            async with _startup_errors_unwrapped(), trio.open_nursery() as root:
                if self.handle_signals:
                    # First, so a SIGTERM during start-up still ends in a clean stop.
                    await root.start(self._signals)
                if self.notifier.enabled:
                    await root.start(self.notifier.run)
                await root.start(self.mad_capture.run)
                await self._start_capture()
                if self.options.metrics_port:
                    await self._start_metrics(root)
                await root.start(self.topology.run)
                self.listeners = await open_client_listeners(
                    self.paths,
                    self.options.server_mode,
                    self.options.server_port,
                    acme_plus_kernel_only=self.options.acme_plus_kernel_only,
                    inherited=self.inherited_stream,
                )
                await root.start(self.clients.serve, self.listeners.sockets)
                log.info("serving clients", on=self.listeners.addresses)
                if self.admin:
                    await self._start_admin(root)
                if self.kernel_service or self.inherited_netlink is not None:
                    await self._start_kernel_service(root)
                self.ready.set()
                if self.notifier.enabled:
                    self.notifier.announce(
                        ready="1", status=self.status_line(), mainpid=str(os.getpid())
                    )
                    await root.start(self._report_status)
                task_status.started(self)
                await self._stop.wait()
                await self._graceful_stop()
                root.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self._release()
            self.stopped.set()

    # -- systemd STATUS= ------------------------------------------------------------------------
    def status_line(self) -> str:
        """What ``systemctl status`` shows: endpoints ready, cache entries, clients."""
        total = ready = entries = 0
        for endpoint in iter_endpoints(self.topology.devices):
            total += 1
            provider = endpoint.port.provider
            info: Mapping[str, Any] = {}
            if provider is not None and endpoint.ctx is not None:
                try:
                    info = provider.describe_endpoint(endpoint.ctx)
                except Exception:
                    log.debug("provider could not describe endpoint", endpoint=endpoint.id)
            # A provider that does not say (a provider library) has the endpoint open.
            ready += info.get("state", "ready") == "ready"
            count = info.get("cache_entries", info.get("cache", ()))
            entries += count if isinstance(count, int) else len(count)
        clients = self.clients.active
        line = (
            f"serving: {ready}/{total} endpoint{_s(total)} ready, {entries} cache "
            f"entr{'y' if entries == 1 else 'ies'}, {clients} client{_s(clients)}"
        )
        return f"{line}; {self._refused}" if self._refused else line

    async def _report_status(self, *, task_status: trio.TaskStatus[None]) -> None:
        """STATUS= every ``STATUS_INTERVAL`` seconds when it changed, and soon after an
        endpoint or port changes state; until the manager is gone (``ibacm-sim up`` stops
        listening once all nodes are up)."""
        with self.bus.subscribe(kinds=STATUS_KINDS) as changes:
            task_status.started()
            while not self.notifier.gone:
                with trio.move_on_after(STATUS_INTERVAL):
                    await changes.receive()
                    await trio.sleep(STATUS_SETTLE)
                while True:  # the burst is told in one line
                    try:
                        changes.receive_nowait()
                    except trio.WouldBlock:
                        break
                line = self.status_line()
                if line != self.notifier.last_status:  # READY=1 may have told it already
                    await self.notifier.status(line)

    async def _load_providers(self) -> None:
        entries = self.provider_entries
        if entries is None:
            entries, _ = discover_providers()
            prefer_library = self.options.provider_prefer is ProviderPrefer.LIBRARY
            libraries = await self._provider_libraries_if_devices()
            entries = merge_libraries(entries, libraries, prefer_library=prefer_library)
        default, rules = provider_choice(self.options, entries)
        self.providers = ProviderSet.create(entries, self.services, default=default, rules=rules)
        self.topology.providers = self.providers
        await self.providers.start()
        names = [provider.name for provider in self.providers.providers]
        config_log.info(
            "providers",
            loaded=names,
            origins={provider.name: provider.origin for provider in self.providers.providers},
            default=self.providers.default.name if self.providers.default else None,
        )
        if not names:
            log.error("no provider loaded: ports will have no endpoints")

    async def _provider_libraries_if_devices(self) -> list[ProviderEntry]:
        """A library's constructor runs at load time (rdma-core's opens umad, starts a
        thread): with no device the daemon stops anyway, so nothing is loaded then."""
        if self.tap.offers_verbs:
            try:
                await self.tap.open()
            except NoDevicesError:
                return []  # the topology reports it, as before
        return self._provider_libraries()

    def _provider_libraries(self) -> list[ProviderEntry]:
        """The providers built for rdma-core's ibacm in ``provider_lib_path``
        (ibacm/provider/cprov)."""
        directory = Path(self.options.provider_lib_path)
        if not directory.is_dir() or not any(directory.glob("*.so")):
            return []
        if not self.tap.offers_verbs:
            log.info(
                "provider libraries not loaded: they need libibverbs devices (--fabric hw)",
                path=str(directory),
            )
            return []
        from ibacm.provider.cprov.provider import CoreBridge, CProviderError, discover_c_providers

        try:
            token = trio.lowlevel.current_trio_token()
            # Kept for the daemon's life: the libraries' threads call its callbacks until exit.
            self.c_bridge = CoreBridge(self.services, token, self.opts_file or "")
        except (CProviderError, OSError) as exc:
            log.error("provider libraries not loaded", path=str(directory), reason=str(exc))
            return []
        loaded, _ = discover_c_providers(directory, self.c_bridge)
        return [ProviderEntry(lib.name, lib.cls, str(lib.path)) for lib in loaded]

    async def _start_admin(self, root: trio.Nursery) -> None:
        path = str(self.options.admin_socket_path)
        try:
            self.admin_path = await root.start(serve_admin, path, self, self.bus)
        except AdminSocketError as exc:
            log.error("admin socket disabled", error=str(exc))

    async def _start_capture(self) -> None:
        """Start the MAD capture at start-up when ``capture_file`` (or ``--capture``) asks."""
        if not self.options.capture_file:
            return
        try:
            await self.mad_capture.start(os.path.abspath(self.options.capture_file))
        except CaptureError as exc:
            log.error("MAD capture disabled", error=str(exc))

    async def _start_metrics(self, root: trio.Nursery) -> None:
        """The optional Prometheus endpoint (needs the ``metrics`` extra)."""
        try:
            from ibacm.core.metrics import DaemonMetrics, MetricsError, serve_metrics
        except ImportError as exc:
            log.error("metrics disabled: prometheus_client is not installed", error=str(exc))
            return
        metrics = DaemonMetrics(self.snapshot)
        self.tap.add_observer(metrics.mads)
        try:
            await root.start(serve_metrics, self.options.metrics_port, metrics)
        except MetricsError as exc:
            log.error("metrics disabled", error=str(exc))
            return
        log.info("serving metrics", port=self.options.metrics_port)

    async def capture(self, action: str, path: str | None) -> dict[str, Any]:
        """Admin ``capture`` command: start, stop or report the MAD capture."""
        return await self.mad_capture.command({"action": action, "path": path})

    async def _start_kernel_service(self, root: trio.Nursery) -> None:
        """Serve the kernel's local SA requests (RDMA_NL_LS) when the kernel has them."""
        try:
            sock = open_ls_socket(self.inherited_netlink)
        except OSError as exc:
            # No NETLINK_RDMA in this kernel (or no permission): the kernel asks the SA itself.
            log.warning("kernel local SA service unavailable", error=str(exc))
            return
        self.ls_service = LsService(
            self.dispatcher.kernel_path, resolve_ip=self.dispatcher.kernel_ip
        )
        await root.start(serve_netlink, sock, self.ls_service)
        log.info("serving the kernel local SA service")

    async def _signals(self, *, task_status: trio.TaskStatus[None]) -> None:
        # The receiver restores on closing the handlers it found: SIG_IGN, kept to the
        # process's end, so a second SIGTERM or a logrotate SIGHUP (or one the receiver still
        # held) never kills a daemon saving its cache and releasing its lock on the way out.
        _hold_signals()
        with trio.open_signal_receiver(*_HELD_SIGNALS) as signals:
            task_status.started()
            async for signum in signals:
                if self._stop.is_set():  # stopping: no reload, no second warning
                    log.debug("signal ignored: shutting down", signal=signal.Signals(signum).name)
                elif signum == signal.SIGHUP:
                    log.info("SIGHUP: reopening the log and reloading the configuration")
                    if self.log_control is not None:
                        self.log_control.reopen()
                    try:
                        await self.reload()
                    except ConfigError:
                        pass  # each problem was logged; the running configuration stays
                    except Exception:
                        log.exception("reload failed; configuration unchanged")
                else:
                    log.warning(
                        "signal received; shutting down", signal=signal.Signals(signum).name
                    )
                    self.request_shutdown()

    def request_shutdown(self) -> None:
        self._stop.set()

    async def _graceful_stop(self) -> None:
        log.warning("shutting down")
        await self.notifier.stopping()
        if self.mad_capture.active:
            await self.mad_capture.stop()
        with trio.move_on_after(self.shutdown_grace + 1.0):
            await self.clients.drain(self.shutdown_grace)
        with trio.move_on_after(self.shutdown_grace):
            await self.topology.close()
        await self.providers.stop()

    async def _release(self) -> None:
        if self.listeners is not None:
            self.listeners.files.cleanup()
        with trio.move_on_after(self.shutdown_grace):
            try:
                await self.fabric.aclose()
            except Exception:
                log.exception("closing the fabric failed")
        self.bus.close()
        if self.log_control is not None:
            self.log_control.bus = None

    # -- DaemonControl -------------------------------------------------------------------------
    async def reload(self) -> list[str]:
        """Re-read the option and address files (SIGHUP / admin ``reload``).

        Both files are parsed and checked first; any invalid value, unparsable address line,
        or an address file that would leave no endpoint refuses the whole reload
        (``ConfigError`` with every problem) and the running configuration stays.
        Otherwise every changed option is applied, or reported (log, and the returned
        names) as needing a restart. systemd hears RELOADING=1 before and READY=1 after,
        whatever the outcome (``Type=notify-reload`` waits for them)."""
        async with self._reload_lock:
            self.notifier.reloading("reloading the configuration")
            try:
                return await self._reload()
            finally:
                if self.notifier.enabled:
                    self.notifier.reloaded(self.status_line())

    async def _reload(self) -> list[str]:
        new, problems = self._read_options()
        entries, address_problems = self._read_addresses(new)
        problems += address_problems
        if not problems and entries is not None:
            path = self.addr_file.path
            problems += await self.topology.would_leave_no_endpoint(entries, path)
        if problems:
            # One line for one refusal, whatever the number of problems.
            log.error(
                "reload refused; configuration unchanged",
                invalid=invalid_settings(problems),
                problems=[str(problem) for problem in problems],
            )
            self._refused = f"last reload refused ({invalid_settings(problems)})"
            raise ConfigError(problems)
        self._refused = None
        restart = self._keep_restart_options(new)
        old, self.options = self.options, new
        self.services.options = new
        self._apply_logging(old, new)
        self.topology.apply_sa_depth(new.sa_depth)
        self.addr_file.support_ips = new.support_ips_in_addr_cfg
        self.clients.limits = client_limits(new)
        restart += self._apply_provider_options(old, new)
        await self._apply_capture(old, new)
        await self.topology.reload_addresses(entries)
        log.info(
            "configuration reloaded",
            opts_file=self.opts_file,
            addr_file=self.addr_file.path,
            restart_needed=restart,
        )
        return restart

    def _read_options(self) -> tuple[Options, list[ConfigIssue]]:
        if self.opts_file is None:
            return dataclasses.replace(self.options), []
        options, issues = load_options(self.opts_file)
        for issue in issues:
            if issue.severity != "error":
                log.warning("option file", problem=str(issue))
        return self._with_overrides(options), errors_in(issues)

    def _read_addresses(self, options: Options) -> tuple[list[AddrEntry] | None, list[ConfigIssue]]:
        """The address file's entries as the new options read it (None: the file is gone,
        and the topology handles that as it always did), and its errors."""
        path = self.addr_file.path
        try:
            text = Path(path).read_bytes().decode("utf-8", "surrogateescape")
        except FileNotFoundError:
            return None, []
        except OSError as exc:
            return None, [ConfigIssue(path, 0, f"cannot read: {exc.strerror or exc}", "error")]
        entries, issues = parse_addr_file(text, path, options.support_ips_in_addr_cfg)
        for issue in issues:
            if issue.severity != "error":
                log.warning("address file", problem=str(issue))
        return entries, errors_in(issues)

    def _keep_restart_options(self, new: Options) -> list[str]:
        """Keep the running value of every changed restart-only option; their names."""
        kept = []
        for name in RESTART_OPTIONS:
            before, after = getattr(self.options, name), getattr(new, name)
            if before != after:
                log.warning(
                    "option changed in the file but needs a restart; keeping the running value",
                    option=name,
                    running=str(before),
                    file=str(after),
                )
                setattr(new, name, before)
                kept.append(name)
        return kept

    def _apply_provider_options(self, old: Options, new: Options) -> list[str]:
        """Give the providers the new options; the changed provider options that one of
        them cannot apply while running (a provider library) need a restart."""
        changed = [name for name in PROVIDER_OPTIONS if getattr(old, name) != getattr(new, name)]
        unapplied: list[str] = []
        for provider in self.providers.providers:
            try:
                applied = provider.options_changed(new)
            except Exception:
                log.exception("provider failed to apply the options", provider=provider.name)
                applied = False
            if not applied and changed:
                log.warning(
                    "options changed in the file but the provider applies them only when it "
                    "starts; restart to apply them",
                    provider=provider.name,
                    options=changed,
                )
                unapplied = changed
        return unapplied

    async def _apply_capture(self, old: Options, new: Options) -> None:
        """``capture_file`` changed: stop the capture the old value started, start the new.
        A capture started through the admin socket is left alone (and reported)."""
        before = os.path.abspath(old.capture_file) if old.capture_file else None
        after = os.path.abspath(new.capture_file) if new.capture_file else None
        if before == after:
            return
        running = self.mad_capture.status().get("path") if self.mad_capture.active else None
        if running is not None and running == before:
            await self.mad_capture.stop()
        if after is None:
            return
        try:
            await self.mad_capture.start(after)
        except CaptureError as exc:
            log.error("capture_file not applied", path=after, error=str(exc))

    def _apply_logging(self, old: Options, new: Options) -> None:
        control = self.log_control
        if control is None:
            return
        if (old.log_file, old.log_format) != (new.log_file, new.log_format):
            control.configure(
                destination=new.log_file, level=new.log_level, log_format=new.log_format.value
            )
        elif old.log_level != new.log_level:
            control.set_level(new.log_level)

    def set_log_level(self, level: int) -> None:
        self.options.log_level = level
        if self.log_control is not None:
            self.log_control.set_level(level)
        else:
            logging.getLogger().setLevel(python_level(level))

    async def flush(self, endpoint: str | None, dest: str | None) -> int:
        targets: list[EndpointState]
        if endpoint is None:
            targets = list(iter_endpoints(self.topology.devices))
        else:
            found = find_endpoint(self.topology.devices, endpoint)
            if found is None:
                raise LookupError(f"unknown endpoint {endpoint!r}")
            targets = [found]
        key = parse_destination(dest) if dest is not None else None
        total = 0
        for target in targets:
            provider = target.port.provider
            if provider is not None and target.ctx is not None:
                total += provider.flush(target.ctx, key)
        await trio.lowlevel.checkpoint()
        return total

    def snapshot(self) -> dict[str, Any]:
        return {
            "daemon": {
                "version": __version__,
                "modules": ibacm.variant.describe(),
                "pid": os.getpid(),
                "node": self.fabric.hostname,
                "started": self._started_wall,
                "uptime": trio.current_time() - self._started,
                "log_level": self.options.log_level,
                "clients": self.clients.active,
                "client_limits": self.clients.status(),
                "providers": [provider.name for provider in self.providers.providers],
                "listening": self.listeners.addresses if self.listeners else [],
                "admin_socket": self.admin_path,
                "log": self.log_control.status() if self.log_control is not None else None,
                "capture": self.mad_capture.status(),
            },
            "options": _jsonable(dataclasses.asdict(self.options)),
            "counters": self.counters.snapshot(),
            "ports": [port_info(port) for device in self.topology.devices for port in device.ports],
            "endpoints": [self._endpoint_info(ep) for ep in iter_endpoints(self.topology.devices)],
        }

    def _endpoint_info(self, endpoint: EndpointState) -> dict[str, Any]:
        info = endpoint_summary(endpoint)
        provider = endpoint.port.provider
        if provider is not None:
            info["provider"], info["provider_origin"] = provider.name, provider.origin
        if provider is not None and endpoint.ctx is not None:
            try:
                info.update(provider.describe_endpoint(endpoint.ctx))
                info["counters"] = [int(v) for v in provider.query_perf(endpoint.ctx)]
            except Exception:
                log.exception("provider could not describe endpoint", endpoint=endpoint.id)
        return info


STARTUP_ERRORS = (NoDevicesError, ListenerError)


@contextlib.asynccontextmanager
async def _startup_errors_unwrapped() -> AsyncIterator[None]:
    """Let a start-up failure leave ``run`` as itself, not inside the root nursery's group."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) == 1 and isinstance(leaves[0], STARTUP_ERRORS):
            raise leaves[0] from None
        raise


def _s(count: int) -> str:
    return "" if count == 1 else "s"


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _jsonable(value: Any) -> Any:
    """Options as plain JSON values (enums by name)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, ipaddress.IPv4Address | ipaddress.IPv6Address):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.name.lower()
    return value
