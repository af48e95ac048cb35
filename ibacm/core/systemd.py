"""systemd socket activation with the standard library only (sd_notify is ``ibacm.sd_notify``).

Socket activation follows sd_listen_fds(3): ``LISTEN_PID`` must be our pid, ``LISTEN_FDS``
counts the inherited descriptors starting at fd 3, ``LISTEN_FDNAMES`` names them. ibacm accepts
at most one listening stream socket (the client socket) and one AF_NETLINK socket (the kernel
local SA service); anything else is a start-up error, as in C.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

SD_LISTEN_FDS_START = 3


class SocketActivationError(Exception):
    """The inherited descriptors are not what ibacm can use."""


@dataclass(frozen=True, slots=True)
class InheritedSockets:
    """What systemd handed over; either may be absent."""

    stream: socket.socket | None = None
    """A listening SOCK_STREAM socket (unix or TCP) for clients."""
    netlink: socket.socket | None = None
    """An AF_NETLINK socket for the kernel local SA service (kept for a later issue)."""
    names: tuple[str, ...] = ()

    def close(self) -> None:
        for sock in (self.stream, self.netlink):
            if sock is not None:
                sock.close()


def _listen_fd_count(env: Mapping[str, str], pid: int) -> int:
    raw_pid = env.get("LISTEN_PID")
    raw_fds = env.get("LISTEN_FDS")
    if raw_pid is None or raw_fds is None:
        return 0
    try:
        if int(raw_pid) != pid:
            # The variables were meant for another process (e.g. our parent).
            return 0
        count = int(raw_fds)
    except ValueError as exc:
        raise SocketActivationError(
            f"LISTEN_PID={raw_pid!r} / LISTEN_FDS={raw_fds!r} are not numbers"
        ) from exc
    if count < 0:
        raise SocketActivationError(f"LISTEN_FDS={count} is negative")
    return count


def _is_listening(sock: socket.socket) -> bool:
    try:
        return bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    except OSError:
        return False


def _classify(fd: int) -> tuple[str, socket.socket]:
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise SocketActivationError(f"inherited fd {fd} is not a socket: {exc}") from exc
    if sock.family == socket.AF_NETLINK and sock.type == socket.SOCK_RAW:
        return "netlink", sock
    if sock.type == socket.SOCK_STREAM and _is_listening(sock):
        return "stream", sock
    kind = f"family {sock.family!r}, type {sock.type!r}"
    sock.detach()
    raise SocketActivationError(
        f"inherited fd {fd} ({kind}) is neither a listening stream socket nor a netlink socket"
    )


def take_listen_fds(
    env: MutableMapping[str, str] | None = None, pid: int | None = None
) -> InheritedSockets:
    """Adopt the sockets systemd passed (none when not socket-activated).

    The LISTEN_* variables are removed afterwards so children do not adopt them again.
    """
    env = os.environ if env is None else env
    pid = os.getpid() if pid is None else pid
    count = _listen_fd_count(env, pid)
    names = tuple(n for n in env.get("LISTEN_FDNAMES", "").split(":") if n)
    for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env.pop(key, None)
    if count == 0:
        return InheritedSockets(names=names)
    if count > 2:
        raise SocketActivationError(
            f"systemd passed {count} sockets; ibacm takes at most one listening stream socket "
            "and one netlink socket"
        )
    found: dict[str, socket.socket] = {}
    try:
        for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + count):
            kind, sock = _classify(fd)
            if kind in found:
                sock.detach()
                raise SocketActivationError(f"systemd passed two {kind} sockets")
            found[kind] = sock
    except SocketActivationError:
        for sock in found.values():
            sock.close()
        raise
    netlink = found.get("netlink")
    if netlink is not None:
        # C switches it back to blocking; we keep the blocking flag as systemd set it and only
        # hold the socket until the kernel local SA service is implemented.
        netlink.setblocking(True)
    return InheritedSockets(stream=found.get("stream"), netlink=netlink, names=names)
