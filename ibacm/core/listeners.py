"""The client listening sockets and the well-known files around them (client-protocol.md §1).

``unix`` mode: the socket ``ibacm-unix.sock`` and the relative symlink ``ibacm.sock`` (the only
path librdmacm tries). The socket file gets mode 0666: connecting to a unix socket needs write
permission, and any local user may use ACM, as with C's 0777 (the execute bits mean nothing
on a socket). A symlink that cannot be made is a warning, not the end of serving (defect 13).

``loop``/``open`` mode: TCP on 127.0.0.1 and ::1 (loop) or 0.0.0.0 and :: (open), with
SO_REUSEADDR and a real backlog (defect 13), IPv6 only where the host has it; the port goes
into ``ibacm-tcp.port`` as ``"<port>\\n"`` with the relative symlink ``ibacm.port``. Port 0
binds an ephemeral port and the files carry the one the kernel chose.

``acme_plus_kernel_only`` suppresses the two well-known names (``ibacm.sock``/``ibacm.port``).
A socket inherited from systemd is used as it is; systemd owns its files.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path

import trio

from ibacm.config.option_values import ServerMode
from ibacm.config.paths import TCP_PORT_FILE_NAME, UNIX_SOCKET_NAME, RunPaths
from ibacm.log import get_logger

log = get_logger("ibacm.listeners")

UNIX_SOCKET_MODE = 0o666
_UNIX_PATH_MAX = 107


class ListenerError(Exception):
    """The client socket cannot be set up (the daemon cannot serve)."""


@dataclass
class ServerFiles:
    """Files the daemon created and removes again at shutdown."""

    sockets: list[tuple[Path, int, int]] = field(default_factory=list)
    """(path, st_dev, st_ino): removed only if still the file we bound."""
    others: list[Path] = field(default_factory=list)

    def cleanup(self) -> None:
        for path, dev, ino in self.sockets:
            with contextlib.suppress(OSError):
                info = os.lstat(path)
                if (info.st_dev, info.st_ino) == (dev, ino):
                    os.unlink(path)
        for path in self.others:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.sockets.clear()
        self.others.clear()


@dataclass
class ClientListeners:
    sockets: list[socket.socket]
    """Listening, non-blocking; from ``ClientServer.serve`` on, its loop owns them."""
    files: ServerFiles
    addresses: list[str]
    """What is being listened on, for logs and tests (paths or host:port)."""
    port: int | None = None


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _symlink(target: str, path: Path, files: ServerFiles) -> None:
    try:
        _unlink(path)
        os.symlink(target, path)
    except OSError as exc:
        log.warning("cannot create symlink", path=str(path), target=target, error=exc.strerror)
        return
    files.others.append(path)


async def _refuse_live_socket(path: Path) -> None:
    """Unlink a stale socket file, but never steal the socket of a running daemon."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(info.st_mode):
        probe = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with probe:
            try:
                with trio.fail_after(1.0):
                    await probe.connect(str(path))
            except (OSError, trio.TooSlowError):
                pass
            else:
                raise ListenerError(f"another daemon is serving {path}")
    _unlink(path)


async def open_unix(paths: RunPaths, *, well_known: bool, backlog: int) -> ClientListeners:
    files = ServerFiles()
    _unlink(paths.tcp_port_file)
    _unlink(paths.port_symlink)
    path = paths.unix_socket
    if len(os.fsencode(str(path))) > _UNIX_PATH_MAX:
        raise ListenerError(f"unix socket path {path} is longer than {_UNIX_PATH_MAX} bytes")
    await _refuse_live_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.bind(str(path))
        # Nobody can connect before listen(), so chmod after bind leaves no window.
        os.chmod(path, UNIX_SOCKET_MODE)
        info = os.lstat(path)
        files.sockets.append((path, info.st_dev, info.st_ino))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        files.cleanup()
        raise ListenerError(f"cannot listen on {path}: {exc.strerror}") from exc
    if well_known:
        _symlink(UNIX_SOCKET_NAME, paths.unix_symlink, files)
    else:
        _unlink(paths.unix_symlink)
    return ClientListeners([sock], files, [str(path)])


def _tcp_socket(family: int, host: str, port: int, backlog: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            # Separate v4 and v6 sockets on the same port.
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))  # numeric hosts only: nothing to look up
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


async def open_tcp(
    paths: RunPaths, mode: ServerMode, port: int, *, well_known: bool, backlog: int
) -> ClientListeners:
    files = ServerFiles()
    v4_host, v6_host = ("127.0.0.1", "::1") if mode == ServerMode.LOOP else ("0.0.0.0", "::")
    try:
        v4 = _tcp_socket(socket.AF_INET, v4_host, port, backlog)
    except OSError as exc:
        raise ListenerError(f"cannot listen on {v4_host}:{port}: {exc.strerror}") from exc
    bound = int(v4.getsockname()[1])
    sockets = [v4]
    addresses = [f"{v4_host}:{bound}"]
    try:
        sockets.append(_tcp_socket(socket.AF_INET6, v6_host, bound, backlog))
        addresses.append(f"[{v6_host}]:{bound}")
    except OSError as exc:
        if exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT):
            for sock in sockets:
                sock.close()
            raise ListenerError(f"cannot listen on [{v6_host}]:{bound}: {exc.strerror}") from exc
        log.info("no IPv6 on this host; listening on IPv4 only", error=exc.strerror)
    _write_port_file(paths.tcp_port_file, bound, files)
    if well_known:
        _symlink(TCP_PORT_FILE_NAME, paths.port_symlink, files)
    else:
        _unlink(paths.port_symlink)
    _unlink(paths.unix_socket)
    _unlink(paths.unix_symlink)
    return ClientListeners(sockets, files, addresses, bound)


def _write_port_file(path: Path, port: int, files: ServerFiles) -> None:
    try:
        path.write_text(f"{port}\n", encoding="ascii")
    except OSError as exc:
        # C only logs this: clients then fall back to port 6125.
        log.warning("cannot write port file", path=str(path), error=exc.strerror)
        return
    files.others.append(path)


def adopt_stream(sock: socket.socket) -> ClientListeners:
    """A listening socket handed over by systemd (its files belong to systemd)."""
    sock.setblocking(False)
    try:
        where = str(sock.getsockname())
    except OSError:
        where = f"fd {sock.fileno()}"
    return ClientListeners([sock], ServerFiles(), [where])


async def open_client_listeners(
    paths: RunPaths,
    mode: ServerMode,
    port: int,
    *,
    acme_plus_kernel_only: bool = False,
    inherited: socket.socket | None = None,
    backlog: int = socket.SOMAXCONN,
) -> ClientListeners:
    """Create (or adopt) the client listening socket(s) for ``mode``."""
    try:
        # Also with an inherited socket: the admin socket lives there too.
        os.makedirs(paths.rundir, exist_ok=True)
    except OSError as exc:
        raise ListenerError(f"cannot create run directory {paths.rundir}: {exc.strerror}") from exc
    if inherited is not None:
        return adopt_stream(inherited)
    well_known = not acme_plus_kernel_only
    if mode == ServerMode.UNIX:
        return await open_unix(paths, well_known=well_known, backlog=backlog)
    return await open_tcp(paths, mode, port, well_known=well_known, backlog=backlog)
