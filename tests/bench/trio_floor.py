"""The floor of any trio server on this machine: the C responder's job done in Python.

    python -m tests.bench.trio_floor SOCKET_PATH

One task per connection, non-blocking ``os.read``/``os.write`` and ``wait_readable`` (the same
I/O the daemon's connections use), stream framing by the 8-byte header prefix, and a fixed
88-byte reply per RESOLVE: no decoding, no cache, no counters. What separates ibacm from this
is the daemon's own work per request; what separates this from the C responder is the
interpreter and trio. Prints "ready" once it listens; runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import contextlib
import os
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


async def serve(sock: socket.socket) -> None:
    fd = sock.fileno()
    buffer = bytearray()
    with sock:
        while True:
            try:
                data = os.read(fd, 4096)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
                continue
            except OSError:
                return
            if not data:
                return
            buffer += data
            answer = replies(buffer)
            if answer:
                try:
                    os.write(fd, answer)
                except OSError:
                    return


async def main(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(socket.SOMAXCONN)
    listener.setblocking(False)
    print("ready", flush=True)
    async with trio.open_nursery() as nursery:
        while True:
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                await trio.lowlevel.wait_readable(listener)
                continue
            conn.setblocking(False)
            nursery.start_soon(serve, conn)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(main, sys.argv[1])
