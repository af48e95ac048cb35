"""A client process for the client loop's tests: pipelines RESOLVEs and checks every reply.

    python -m tests.core.pipelined_client SOCKET SOURCE DEST=DGIDHEX [DEST=DGIDHEX ...]

Keeps ``WINDOW`` requests in flight on one connection, cycling over the destinations, each
with its own tid, until a line arrives on stdin; then prints one JSON line: requests answered,
statuses counted, and the wrong answers (a tid out of order, a reply that does not frame, a
path whose DGID is not the destination's). Its own process: the daemon's trio side and its
client loop thread share the test's interpreter, the client must not.
"""

from __future__ import annotations

import collections
import json
import os
import select
import socket
import sys

from ibacm.wire.client import AcmHdr, AcmMessage, AcmOp, ClientFramer, EpAddr, EpFlag, FramingError

WINDOW = 64
_DGID = slice(32, 48)  # reply header 16 + entry head 8 + the path's service id 8


def request(source: str, dest: str) -> bytes:
    entries = [EpAddr.from_name(source, EpFlag.SOURCE), EpAddr.from_name(dest, EpFlag.DEST)]
    return AcmMessage(hdr=AcmHdr(opcode=AcmOp.RESOLVE), entries=entries).encode()


def main(argv: list[str]) -> int:
    path, source, *pairs = argv
    dests = [(name, bytes.fromhex(gid)) for name, gid in (pair.split("=") for pair in pairs)]
    frames = [request(source, name) for name, _ in dests]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    framer = ClientFramer(replies=True)
    statuses: collections.Counter[int] = collections.Counter()
    wrong: list[str] = []
    in_flight: collections.deque[tuple[int, int]] = collections.deque()  # (tid, dest index)
    sent = 0
    stop = False
    while not stop or in_flight:
        if not stop and len(in_flight) < WINDOW:
            batch = []
            while len(in_flight) < WINDOW:
                sent += 1
                which = sent % len(frames)
                frame = frames[which]
                batch.append(frame[:8] + sent.to_bytes(8, "little") + frame[16:])
                in_flight.append((sent, which))
            sock.sendall(b"".join(batch))
        if not stop and select.select([sys.stdin], [], [], 0)[0]:
            stop = True
        data = sock.recv(65536)
        if not data:
            wrong.append("the daemon closed the connection")
            break
        try:
            framer.feed(data)
            while (reply := framer.next_frame()) is not None:
                tid, which = in_flight.popleft()
                if int.from_bytes(reply[8:16], "little") != tid:
                    wrong.append(f"tid {tid}: reply for another request")
                status = reply[2]
                statuses[status] += 1
                if status == 0 and reply[_DGID] != dests[which][1]:
                    wrong.append(f"tid {tid}: a path to {reply[_DGID].hex()} for {dests[which][0]}")
        except (FramingError, IndexError) as exc:
            wrong.append(f"a reply that does not frame: {exc}")
            break
    print(
        json.dumps({"answered": sum(statuses.values()), "statuses": statuses, "wrong": wrong[:20]})
    )
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
