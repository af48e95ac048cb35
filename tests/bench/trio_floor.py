"""The no-work loops: the C responder's job done in Python, in the daemon's two I/O styles.

    python -m tests.bench.trio_floor SOCKET_PATH [--kind thread|task]

Both frame the stream by the 8-byte header prefix and answer each RESOLVE with a fixed 88-byte
reply: no decoding, no cache, no counters. What separates ibacm from them is the daemon's own
work per request; what separates them from the C responder is the interpreter and the loop.

* ``thread`` (the default, "the no-work loop": the kind and the design of the daemon's client
  front end): one epoll loop in a worker thread started by ``trio.to_thread.run_sync``; the
  listener is in the same epoll set; connections are accepted in the loop's own round by
  ``accept4`` (non-blocking descriptors, no socket objects) until the backlog is empty, each
  read at once and only then registered (a one-shot client's request is there before it is
  accepted); each readable connection is read once per round; the round's replies are
  written at its end, one write per connection; a closed connection is closed without
  unregistering; the trio side cancels the loop through a wake-up pipe in the set, and the
  thread never outlives its nursery.
* ``task`` (the trio-task loop): one trio task reads every connection (an epoll set waited on
  through ``wait_readable``), one non-blocking ``os.read`` per readable connection per round,
  replies written at the end of the round; a second task accepts.

Prints "ready" once it listens; runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import select
import signal
import socket

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


_accept4 = ctypes.PyDLL(None, use_errno=True).accept4  # as the client loop calls it
_ACCEPT_FLAGS = socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC


class ThreadLoop:
    """The no-work loop of the thread kind: everything in one epoll set, run by one thread,
    connections as descriptors (the daemon's client loop's design)."""

    def __init__(self, listener: socket.socket, wake_fd: int) -> None:
        self.listener = listener
        self.wake_fd = wake_fd
        self.epoll = select.epoll()
        self.buffers: dict[int, bytearray] = {}
        self.epoll.register(listener.fileno(), select.EPOLLIN)
        self.epoll.register(wake_fd, select.EPOLLIN)

    def run(self) -> None:
        """Serve until the wake-up fd is readable (the trio side is being cancelled)."""
        listen_fd = self.listener.fileno()
        out: list[tuple[int, bytes]] = []
        try:
            while True:
                for fd, _ in self.epoll.poll():
                    if fd == self.wake_fd:
                        return
                    if fd == listen_fd:
                        self._accept(listen_fd, out)
                        continue
                    if fd in self.buffers:
                        self._serve(fd, out)
                for fd, answer in out:
                    try:
                        os.write(fd, answer)
                    except OSError:
                        self._drop(fd)
                out.clear()
        finally:
            for fd in self.buffers:
                os.close(fd)
            self.buffers.clear()
            self.epoll.close()

    def _accept(self, listen_fd: int, out: list[tuple[int, bytes]]) -> None:
        while True:
            fd = _accept4(listen_fd, None, None, _ACCEPT_FLAGS)
            if fd < 0:
                return  # the backlog is empty (or out of fds: the connect stays pending)
            self.buffers[fd] = bytearray()
            if self._serve(fd, out):  # its request is there already: answered, then watched
                self.epoll.register(fd, select.EPOLLIN)

    def _serve(self, fd: int, out: list[tuple[int, bytes]]) -> bool:
        """Read once, the answer into ``out``; False when the connection was closed."""
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            self._drop(fd)
            return False
        buffer = self.buffers[fd]
        buffer += data
        answer = replies(buffer)
        if answer:
            out.append((fd, answer))
        return True

    def _drop(self, fd: int) -> None:
        del self.buffers[fd]
        os.close(fd)  # epoll forgets a closed descriptor by itself


async def serve_in_thread(listener: socket.socket) -> None:
    """The thread kind: the loop runs in a worker thread until this task is cancelled."""
    wake_r, wake_w = os.pipe()
    loop = ThreadLoop(listener, wake_r)

    async def wake_on_cancel() -> None:
        try:
            await trio.sleep_forever()
        finally:
            os.write(wake_w, b"x")  # the thread leaves its round; run_sync then returns

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wake_on_cancel)
            await trio.to_thread.run_sync(loop.run)  # waits for the thread, even when cancelled
            nursery.cancel_scope.cancel()
    finally:
        os.close(wake_r)
        os.close(wake_w)


async def serve_in_task(listener: socket.socket) -> None:
    """The trio-task kind: one task reads and answers, another accepts."""
    floor = Floor()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(floor.serve)
        while True:
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                await trio.lowlevel.wait_readable(listener)
                continue
            floor.add(conn)


KINDS = {"thread": serve_in_thread, "task": serve_in_task}


async def main(path: str, kind: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(socket.SOMAXCONN)
    listener.setblocking(False)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)
            nursery.start_soon(KINDS[kind], listener)
            print("ready", flush=True)
    listener.close()
    os.unlink(path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="the unix socket to listen on")
    parser.add_argument("--kind", choices=sorted(KINDS), default="thread")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(main, args.path, args.kind)
