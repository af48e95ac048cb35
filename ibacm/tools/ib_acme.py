"""``ib_acme``: query a running ibacm and generate its configuration files (ib_acme.md).

A drop-in for rdma-core's tool: the same flags with the same ``getopt`` quirks (§1), the same
output, final ``return status 0x%x`` line and exit status (``ret & 0xFF``, §4). Operators script
around that text, so every line a good run prints is byte-identical to the C tool's.

Where the C tool misbehaves this one does not (README defects 16, 52-55):

* a daemon that closes without answering, times out or answers garbage gives a clear error
  line and a non-zero exit, where C reported success, aborted or died of SIGPIPE;
* names longer than 63 bytes are rejected before anything is sent;
* ``-e N`` and ``-P N`` no longer share one variable;
* where the C tool prints a stale errno text (a name over 63 bytes), the message says what
  is wrong, with the same exit status;
* ``-D`` creates directories with mode 0755 (C: 0644, no search bit).

Extensions (long options, never used by the C tool): ``--json`` prints one JSON document
instead of the text, ``--run-dir`` replaces /run (default socket and TCP port file),
``--timeout`` bounds every wait, ``--fabric``/``--sim-dir``/``--sim-node`` choose where ``-A``
finds devices. ``-C`` shows a progress bar on stderr when stderr is a terminal.

Rooms: ``acme_cli`` reads the command line, ``acme_output`` writes the text or JSON,
``libacm`` talks to the daemon, ``expand`` expands brackets; this module runs the queries and
writes the configuration files.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import trio

from ibacm.config.addr_file import generate_addr_file
from ibacm.config.opts_template import render_opts_file
from ibacm.fabric.api import Fabric, FabricError, NoDevicesError, PortState
from ibacm.tools.acme_cli import (
    MAX_INDEX,
    PROG,
    PerfMode,
    Settings,
    UsageError,
    c_atoi,
    parse_args,
    usage,
)
from ibacm.tools.acme_output import JsonReporter, Progress, Reporter, TextReporter
from ibacm.tools.expand import ExpansionError, expand
from ibacm.tools.libacm import (
    DEFAULT_TCP_PORT,
    AcmClient,
    AcmConnectError,
    AcmError,
    AcmProtocolError,
    AcmStatusError,
    PortFileError,
    ResolveReply,
    read_server_port,
    tcp_port_file,
)
from ibacm.wire.client import AddrType, EpAddr, EpFlag, pad_address
from ibacm.wire.errors import WireError
from ibacm.wire.path_record import REVERSIBLE_BIT, PathRecord

DIR_MODE = 0o755
PortEntry = tuple[str, int, bool]
"""(verbs device name, port number, port is ACTIVE): what ``-A`` needs of a port."""

# -- addresses ----------------------------------------------------------------------------


def inet_pton(family: socket.AddressFamily, text: str) -> bytes | None:
    """The C library's ``inet_pton``: packed bytes, or None for anything else."""
    try:
        return socket.inet_pton(family, text)
    except (OSError, ValueError):
        return None


def inet_any_pton(text: str) -> bytes | None:
    """IPv4 first, then IPv6 (ib_acme's ``inet_any_pton``)."""
    return inet_pton(socket.AF_INET, text) or inet_pton(socket.AF_INET6, text)


def classify(text: str, fmt: str) -> tuple[str, str]:
    """The address format of a destination, and its text to use (ib_acme.md §3.1), exactly
    as the C tool decides it, since scripts depend on its output and exit status.

    An explicit ``fmt`` (i, n, l, g) applies as given. Unspecified (``u``): an IP literal is
    ``i``; else what the system resolver makes of it, as the text of its first address (``i``;
    glibc reads ``5`` as 0.0.0.5); else a LID (``l``, ``atoi`` of the text, usually 0).
    """
    if fmt != "u":
        return text, fmt
    if inet_any_pton(text) is not None:
        return text, "i"
    try:
        infos = socket.getaddrinfo(text, None, socket.AF_UNSPEC, 0, socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return text, "l"
    family, _kind, _proto, _name, address = infos[0]
    raw = inet_pton(family, str(address[0]).split("%", 1)[0])
    if raw is None:
        return text, "l"
    return socket.inet_ntop(family, raw), "i"


def parse_lid(text: str) -> int:
    """A LID as the C tool reads it: ``(uint16_t) atoi(text)`` (``x`` is LID 0)."""
    return c_atoi(text) & 0xFFFF


# -- the tool -----------------------------------------------------------------------------


@dataclass(slots=True)
class Lists:
    """The expanded ``-S``, ``-d`` and ``-s`` lists."""

    services: list[str]
    dests: list[str] = field(default_factory=list)
    sources: list[str | None] = field(default_factory=lambda: [None])


@dataclass(slots=True)
class Attempt:
    """The outcome of one resolution: ``ret`` as C computes it and the path on success."""

    ret: int
    path: PathRecord | None = None


class Acme:
    """One run of the tool (queries, then configuration generation)."""

    def __init__(self, settings: Settings, out: Reporter, progress_stream: TextIO) -> None:
        self.s = settings
        self.out = out
        self._progress_stream = progress_stream

    def run(self) -> int:
        s = self.s
        ret = 0
        if s.dest_arg is not None or s.perf is not PerfMode.NONE or s.enum_ep:
            ret = self.query_services()
        if ret == 0 and s.make_addr:
            ret = self.gen_addr()
        if ret == 0 and s.make_opts:
            ret = self.gen_opts()
        show = s.verbose or not (s.make_addr or s.make_opts) or ret != 0
        self.out.finish(ret, show)
        return ret

    # -- services ---------------------------------------------------------------------

    def _lists(self) -> Lists | None:
        s = self.s
        steps = (
            ("service list", s.services),
            ("destination", s.dest_arg),
            ("source", s.src_arg if s.dest_arg is not None else None),
        )
        expanded: list[list[str]] = []
        for what, arg in steps:
            try:
                expanded.append(expand(arg) if arg is not None else [])
            except ExpansionError as exc:
                self.out.error(f"Unable to parse {what} argument: {exc}")
                return None
        services, dests, sources = expanded
        return Lists(services, dests, list(sources) if sources else [None])

    def _connect(self, service: str) -> AcmClient:
        port = DEFAULT_TCP_PORT
        if not service.startswith("/"):
            try:
                port = read_server_port(tcp_port_file(self.s.run_dir))
            except PortFileError:
                self.out.error("Failed to read server port")
        return AcmClient.connect(service, port=port, timeout=self.s.timeout)

    def query_services(self) -> int:
        """Contact each service in turn; ``ret`` is decided by the last one (§4)."""
        lists = self._lists()
        if lists is None:
            return -1
        ret = -1
        for service in lists.services:
            try:
                client = self._connect(service)
            except AcmConnectError as exc:
                self.out.contact_failed(service, exc.message)
                ret = exc.ret
                continue
            with client:
                ret = self.query_service(client, service, lists)
        return ret

    def query_service(self, client: AcmClient, service: str, lists: Lists) -> int:
        self.out.service_start(service)
        ret = 0
        if self.s.dest_arg is not None:
            ret = self.resolve_all(client, service, lists)
        if self.s.perf is not PerfMode.NONE and not self.query_perf(client, service):
            ret = -1
        if self.s.enum_ep and not self.enumerate_eps(client, service):
            ret = -1
        return ret

    # -- resolution -------------------------------------------------------------------

    def resolve_all(self, client: AcmClient, service: str, lists: Lists) -> int:
        self.out.resolve_start(service)
        ret = -1
        for dest_text in lists.dests:
            dest, fmt = classify(dest_text, self.s.fmt)
            for source in lists.sources:
                ret = self.resolve_pair(client, fmt, source, dest)
        return ret

    def resolve_pair(self, client: AcmClient, fmt: str, source: str | None, dest: str) -> int:
        self.out.pair_start(dest, source, fmt)
        attempt = Attempt(-1)
        progress = Progress(self._progress_stream, self.s.repetitions, f"{dest}:")
        try:
            for _ in range(self.s.repetitions):
                attempt = self.resolve_once(client, fmt, source, dest)
                progress.advance()
                if client.broken:
                    break  # the connection is gone: repeating would only repeat the error
        finally:
            progress.close()
        ret = attempt.ret
        if ret == 0 and attempt.path is not None:
            self.out.path(attempt.path)
            if self.s.verify:
                ret = self.verify(client, attempt.path)
        self.out.pair_end(ret)
        return ret

    def _flags(self) -> int:
        return int(EpFlag.NODELAY) if self.s.nodelay else 0

    def resolve_once(self, client: AcmClient, fmt: str, source: str | None, dest: str) -> Attempt:
        if fmt == "i":
            return self._resolve_ip(client, source, dest)
        if fmt == "n":
            return self._resolve_name(client, source, dest)
        if fmt == "l":
            return self._resolve_lid(client, source, dest)
        return self._resolve_gid(client, source, dest)

    def _address_reply(self, what: str, call: Callable[[], ResolveReply]) -> Attempt:
        try:
            reply = call()
        except AcmError as exc:
            self.out.error(f"{what} failed: {exc.message}")
            return Attempt(-1)
        if self.s.repetitions == 1:  # libacm prints chosen sources only when not repeating
            for address in reply.sources:
                self.out.server_source(address)
        return Attempt(0, reply.path)

    def _resolve_ip(self, client: AcmClient, source: str | None, dest: str) -> Attempt:
        src_raw = None
        if source is not None:
            src_raw = inet_any_pton(source)
            if src_raw is None:
                self.out.error(f"inet_pton error on source address ({source}): 0x0")
                return Attempt(-1)
        dest_raw = inet_any_pton(dest)
        if dest_raw is None:
            self.out.error(f"inet_pton error on destination address ({dest}): 0x0")
            return Attempt(-1)
        if src_raw is not None and len(src_raw) != len(dest_raw):
            self.out.error("source and destination address families don't match")
            return Attempt(-1)
        flags = self._flags()
        return self._address_reply(
            "ib_acm_resolve_ip", lambda: client.resolve_ip(src_raw, dest_raw, flags)
        )

    def _resolve_name(self, client: AcmClient, source: str | None, dest: str) -> Attempt:
        flags = self._flags()
        return self._address_reply(
            "ib_acm_resolve_name", lambda: client.resolve_name(source, dest, flags)
        )

    def _resolve_path(self, client: AcmClient, path: PathRecord) -> Attempt:
        try:
            answer = client.resolve_path(path, self._flags())
        except AcmError as exc:
            self.out.error(f"ib_acm_resolve_path failed: {exc.message}")
            return Attempt(-1)
        return Attempt(0, answer)

    def _resolve_lid(self, client: AcmClient, source: str | None, dest: str) -> Attempt:
        path = PathRecord()
        path.reversible_numpath = REVERSIBLE_BIT | 1
        if source is not None:
            path.slid = parse_lid(source)
        path.dlid = parse_lid(dest)
        return self._resolve_path(client, path)

    def _resolve_gid(self, client: AcmClient, source: str | None, dest: str) -> Attempt:
        path = PathRecord()
        path.reversible_numpath = REVERSIBLE_BIT | 1
        if source is not None:
            sgid = inet_pton(socket.AF_INET6, source)
            if sgid is None:
                self.out.error(f"inet_pton error on source address ({source}): 0x0")
                return Attempt(-1)
            path.sgid = sgid
        dgid = inet_pton(socket.AF_INET6, dest)
        if dgid is None:
            self.out.error(f"inet_pton error on dest address ({dest}): 0x0")
            return Attempt(-1)
        path.dgid = dgid
        return self._resolve_path(client, path)

    def verify(self, client: AcmClient, path: PathRecord) -> int:
        """``-v``: ask the SA for the record through the daemon; only the status counts."""
        try:
            client.resolve_path(path, EpFlag.QUERY_SA)
        except AcmError as exc:
            self.out.verified(False, exc.message)
            return -1
        self.out.verified(True, "")
        return 0

    # -- performance counters ---------------------------------------------------------

    def query_perf(self, client: AcmClient, service: str) -> bool:
        """``-P``; False only when the service stopped answering properly."""
        mode = self.s.perf
        if mode is PerfMode.ALL:
            index = 1
            while index <= MAX_INDEX:
                try:
                    counters = client.query_perf(index)
                except AcmStatusError:
                    return True  # the first missing endpoint ends the list, silently as in C
                except AcmError as exc:
                    self.out.perf_failed(service, exc.message)
                    return False
                self.out.perf(service, counters, f"endpoint {index}", False)
                index += 1
            return True
        try:
            if mode is PerfMode.ADDR:
                counters = self._perf_by_address(client)
                scope = f"address {self.s.src_arg}"
            else:
                counters = client.query_perf(self.s.perf_index)
                scope = f"endpoint {self.s.perf_index}" if self.s.perf_index else "global"
        except AcmError as exc:
            self.out.perf_failed(service, exc.message)
            return not isinstance(exc, AcmProtocolError)
        self.out.perf(service, counters, scope, mode is PerfMode.COL)
        return True

    def _perf_by_address(self, client: AcmClient) -> list[int]:
        src = self.s.src_arg or ""
        text, fmt = classify(src, self.s.fmt)
        if fmt == "i":
            self.out.verbose(f"query_perf_ip: src_addr {text}")
            entry = self._ip_entry(text)
        elif fmt == "n":
            self.out.verbose(f"query_perf_name: src_addr {text}")
            try:
                entry = EpAddr.from_name(text, EpFlag.SOURCE)
            except WireError as exc:
                raise self._perf_error(str(exc)) from exc
        else:
            self.out.error(f"Unsupported src_type {ord(fmt)}")
            raise AcmError(errno.EINVAL, f"-P s cannot query by {'LID' if fmt == 'l' else 'GID'}")
        try:
            return client.query_perf_ep_addr(entry)
        except AcmError as exc:
            self.out.error(f"ib_acm_query_perf failed: {exc.message}")
            raise

    def _ip_entry(self, text: str) -> EpAddr:
        raw = inet_pton(socket.AF_INET, text)
        addr_type = AddrType.IP
        if raw is None:
            raw = inet_pton(socket.AF_INET6, text)
            addr_type = AddrType.IP6
        if raw is None:
            self.out.error(f"inet_pton error on src address ({text}): 0x0")
            raise AcmError(errno.EINVAL, f"{text!r} is not an IP address")
        return EpAddr(EpFlag.SOURCE, addr_type, pad_address(addr_type, raw))

    def _perf_error(self, message: str) -> AcmError:
        self.out.error(f"ib_acm_query_perf failed: {message}")
        return AcmError(errno.EINVAL, message)

    # -- endpoints --------------------------------------------------------------------

    def enumerate_eps(self, client: AcmClient, service: str) -> bool:
        """``-e``; False only when the service stopped answering properly."""
        try:
            if self.s.ep_index > 0:
                if not self.enumerate_ep(client, service, self.s.ep_index):
                    self.out.endpoint_missing(self.s.ep_index)
                return True
            index = 1
            while index <= MAX_INDEX and self.enumerate_ep(client, service, index):
                index += 1
        except AcmProtocolError as exc:
            self.out.error(f"{service}: Failed to query endpoints: {exc.message}")
            return False
        return True

    def enumerate_ep(self, client: AcmClient, service: str, index: int) -> bool:
        """Ask every port for its endpoint ``index``; True if any port had one."""
        found = False
        port_count = MAX_INDEX
        port = 1
        while port <= port_count:
            try:
                config = client.enum_ep(index, port)
            except AcmStatusError:
                port += 1
                continue
            found = True
            self.out.endpoint(service, index, config)
            port_count = config.phys_port_cnt
            port += 1
        return found

    # -- configuration files ----------------------------------------------------------

    def _open_output(
        self, name: str, what: str, *, truncate: bool = True
    ) -> tuple[Path, TextIO, bool] | None:
        """Create the directory (0755), then open the file; C's messages on failure.

        Also says whether the file was created here. ``truncate=False`` opens an existing
        file without emptying it (the caller truncates once it has something to write)."""
        directory = self.s.dest_dir
        with contextlib.suppress(OSError):  # exists already, or the check below says why
            os.mkdir(directory, DIR_MODE)
        err = _directory_error(directory)
        if err:
            self.out.error(f"Failed to open directory {directory}: {os.strerror(err)}")
            self.out.error(f"Failed to open {what} configuration file: {os.strerror(err)}")
            return None
        path = Path(directory) / name
        existed = path.exists()
        try:
            # fopen(path, "w") as C does, minus O_TRUNC when asked: the same permission check,
            # and an existing file keeps its owner, mode and links.
            flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_TRUNC if truncate else 0)
            handle = os.fdopen(os.open(path, flags, 0o666), "w", encoding="utf-8")
        except OSError as exc:
            message = os.strerror(exc.errno) if exc.errno else str(exc)
            self.out.error(f"Failed to open {what} configuration file: {message}")
            return None
        return path, handle, not existed

    def gen_addr(self) -> int:
        s = self.s
        self.out.verbose(f"Generating {s.dest_dir}/{s.addr_file}")
        opened = self._open_output(s.addr_file, "address", truncate=False)
        if opened is None:
            return -1
        path, handle, created = opened
        with handle:
            text = self._addr_text()
            if text is not None:
                handle.truncate(0)
                handle.write(text)
        if text is None:
            # C leaves the file it created empty (ibacm then starts with no endpoint); a file
            # that was there stays as it was.
            if created:
                with contextlib.suppress(OSError):
                    path.unlink()
            return -1
        entries = [line for line in text.splitlines() if line and not line.startswith("#")]
        self.out.generated("address", str(path), entries)
        return 0

    def _addr_text(self) -> str | None:
        """The address file's text, or None after printing why there is none."""
        ports = self._device_ports()
        if ports is None:
            return None
        devices, hostname = ports
        try:
            return generate_addr_file(devices, hostname)
        except ValueError as exc:
            self.out.error(f"Failed to auto generate host names in config file: {exc}")
            return None

    def _device_ports(self) -> tuple[list[PortEntry], str] | None:
        """Every port of the chosen fabric's devices, or None after printing why not."""
        s = self.s
        if s.fabric == "sim" and s.sim_dir is not None and not (s.sim_dir / "hub.sock").exists():
            return self._topology_ports()
        try:
            return trio.run(fabric_ports, self._open_fabric)
        except NoDevicesError as exc:
            self.out.error("ibv_get_device_list - no devices present?")
            hint = "" if s.fabric == "sim" else "; for a simulated cluster use --fabric sim"
            _hint(self._progress_stream, f"{exc}{hint}")
        except PortQueryError as exc:
            self.out.error("Failed to auto generate host names in config file")
            _hint(self._progress_stream, str(exc))
        except (FabricError, OSError) as exc:
            self.out.error("ibv_open_device - failed to open device")
            _hint(self._progress_stream, str(exc))
        return None

    def _open_fabric(self) -> Fabric:
        if self.s.fabric == "sim":
            from ibacm.fabric.sim.hub import HubFabric

            assert self.s.sim_dir is not None and self.s.sim_node is not None
            return HubFabric(self.s.sim_dir / "hub.sock", self.s.sim_node)
        from ibacm.fabric.hw.fabric import HwFabric

        return HwFabric()

    def _topology_ports(self) -> tuple[list[PortEntry], str] | None:
        """A simulated node whose cluster is down: its ports as DIR/topology.json describes."""
        from ibacm.fabric.sim.topo_file import Topology, TopologyError

        assert self.s.sim_dir is not None and self.s.sim_node is not None
        topology_file = self.s.sim_dir / "topology.json"
        try:
            topology = Topology.from_json(topology_file.read_text(encoding="utf-8"))
            host = topology.host(self.s.sim_node)
        except (OSError, TopologyError) as exc:
            self.out.error("ibv_get_device_list - no devices present?")
            _hint(self._progress_stream, f"simulated node {self.s.sim_node}: {exc}")
            return None
        # A simulated port without a link (LID 0) stays DOWN, every other one is ACTIVE.
        ports = [(hca.name, port.num, port.lid != 0) for hca in host.hcas for port in hca.ports]
        return ports, host.name

    def gen_opts(self) -> int:
        s = self.s
        self.out.verbose(f"Generating {s.dest_dir}/{s.opts_file}")
        opened = self._open_output(s.opts_file, "option")
        if opened is None:
            return -1
        path, handle, _created = opened
        text = render_opts_file()
        with handle:
            handle.write(text)
        entries = [line for line in text.splitlines() if line and not line.startswith("#")]
        self.out.generated("option", str(path), entries)
        return 0


def _hint(stream: TextIO, text: str) -> None:
    stream.write(f"{PROG}: {text}\n")
    stream.flush()


def _directory_error(directory: str) -> int:
    """The errno ``chdir(directory)`` would fail with, 0 if it would succeed."""
    try:
        mode = os.stat(directory).st_mode
    except OSError as exc:
        return exc.errno or errno.ENOENT
    if not stat.S_ISDIR(mode):
        return errno.ENOTDIR
    if not os.access(directory, os.X_OK):
        return errno.EACCES
    return 0


class PortQueryError(FabricError):
    """A port of an opened device could not be queried."""


async def fabric_ports(open_fabric: Callable[[], Fabric]) -> tuple[list[PortEntry], str]:
    """(device, port, active) of every port in enumeration order, and the host name."""
    fabric = open_fabric()
    try:
        devices = await fabric.open()
        ports: list[PortEntry] = []
        for device in devices:
            for number in range(1, device.phys_port_cnt + 1):
                try:
                    attrs = await device.port(number).query()
                except FabricError as exc:
                    raise PortQueryError(f"{device.name} port {number}: {exc}") from exc
                ports.append((device.name, number, attrs.state == PortState.ACTIVE))
        return ports, fabric.hostname
    finally:
        await fabric.aclose()


# -- entry points -------------------------------------------------------------------------


def run(
    argv: Sequence[str],
    stdout: TextIO,
    stderr: TextIO,
    prog: str = PROG,
) -> int:
    """Run the tool with ``argv`` (without the program name); returns the exit status."""
    try:
        settings = parse_args(argv)
    except UsageError as exc:
        if str(exc):
            stderr.write(f"{prog}: {exc}\n")
        # stdout as the C tool writes it (scripts compare it); the extensions on stderr.
        stdout.write(usage(prog, extensions=False))
        stdout.flush()
        stderr.write(usage(prog)[len(usage(prog, extensions=False)) :])
        return 1
    if settings.help:
        stdout.write(usage(prog))
        return 0
    reporter: Reporter
    if settings.json:
        reporter = JsonReporter(stdout)
    else:
        reporter = TextReporter(stdout, verbose=settings.verbose)
    ret = Acme(settings, reporter, stderr).run()
    return ret & 0xFF


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``ib_acme``)."""
    if argv is None:
        prog, args = sys.argv[0], sys.argv[1:]
    else:
        prog, args = PROG, list(argv)
    try:
        return run(args, sys.stdout, sys.stderr, prog)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Our reader went away (ib_acme ... | head): exit quietly, as `head` intended.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
