"""The floor of any trio server on this machine: the C responder's job done in Python.

    python -m tests.bench.trio_floor SOCKET_PATH

The daemon's I/O style: one task reads every connection (an epoll set waited on through
``wait_readable``), one non-blocking ``os.read`` per readable connection per round, replies
written with ``os.write`` at the end of the round; stream framing by the 8-byte header
prefix, and a fixed 88-byte reply per RESOLVE: no decoding, no cache, no counters. What
separates ibacm from this is the daemon's own work per request; what separates this from the
C responder is the interpreter and trio. Prints "ready" once it listens; runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import sys

import trio

HDR_LEN = 16
REPLY_LEN = 88
_REPLY_BODY = bytes([0x2B, 0, 0, 0, 0x10, 0, 0, 0]) + bytes(64)


def frame_length(head: bytes | bytearray) -> int:
    if head[1] == 0x01:
        return int.from_bytes(head[6:8], "little")
    return int.from_bytes(head[6:8], "big")


def replies(buffer: bytearray) -> bytes:
    """Fixed replies for every whole request in ``buffer`` (consumed from it)."""
    out = []
    while len(buffer) >= 8:
        length = frame_length(buffer)
        if length < HDR_LEN or len(buffer) < length:
            break
        head = bytes([1, buffer[1], 0, 0, 0, 0]) + REPLY_LEN.to_bytes(2, "little")
        out.append(head + bytes(buffer[8:16]) + _REPLY_BODY)
        del buffer[:length]
    return b"".join(out)


class Floor:
    """Every accepted connection in one epoll set, read and answered by one task."""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.conns: dict[int, tuple[socket.socket, bytearray]] = {}

    def add(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        self.conns[conn.fileno()] = (conn, bytearray())
        self.epoll.register(conn.fileno(), select.EPOLLIN)

    def drop(self, fd: int) -> None:
        conn, _ = self.conns.pop(fd)
        self.epoll.unregister(fd)
        conn.close()

    async def serve(self) -> None:
        while True:
            await trio.lowlevel.wait_readable(self.epoll.fileno())
            out = []
            for fd, _ in self.epoll.poll(0):
                if fd not in self.conns:
                    continue
                try:
                    data = os.read(fd, 4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self.drop(fd)
                    continue
                buffer = self.conns[fd][1]
                buffer += data
                answer = replies(buffer)
                if answer:
                    out.append((fd, answer))
            for fd, answer in out:
                try:
                    os.write(fd, answer)
                except OSError:
                    self.drop(fd)


async def main(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(socket.SOMAXCONN)
    listener.setblocking(False)
    floor = Floor()
    print("ready", flush=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(floor.serve)
        while True:
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                await trio.lowlevel.wait_readable(listener)
                continue
            floor.add(conn)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(main, sys.argv[1])
