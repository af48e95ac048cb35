"""Fuzzing the client protocol against live daemons: any bytes, no crash, good clients served.

Two real daemons (ibacmp) on a simulated fabric serve unix sockets in the test's trio loop;
hypothesis runs in a worker thread (``trio.to_thread``) and throws byte streams at node1:
random bytes, headers with random bodies, mutated real client requests (the captures of
``ib_acme`` and librdmacm), and runs of valid frames. After each input a well-behaved client,
connected the whole time, resolves node2 and must get the path. Whatever node1 sends back to
the fuzzer must frame as replies. At the end no error was logged and both daemons still run.

``make soak`` runs 10^5 inputs instead of a few hundred.
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ibacm.wire.client import MSG_MAX, ClientFramer, FramingError
from tests.conftest import CAPTURES
from tests.reliability.errors import logged_errors
from tests.reliability.live import Client, blocking_request, live_cluster, resolve_frame, soak
from tests.wire.strategies import acm_messages

EXAMPLES = soak(150, 100_000)
GOOD = resolve_frame("node1", "node2")
READ_WINDOW = 0.05
"""Seconds the fuzzer waits for the daemon's answers before it hangs up."""


def captured_requests() -> list[bytes]:
    found = [path.read_bytes() for path in sorted(CAPTURES.glob("*.bin"))]
    return [data for data in found if data] or [GOOD]


SEEDS = [*captured_requests(), GOOD]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A real request with a few bytes changed, cut short or extended."""
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 6))):
        index = draw(st.integers(0, len(data) - 1))
        data[index] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(data)))
    tail = draw(st.binary(max_size=40))
    return bytes(data[: cut or len(data)]) + tail


@st.composite
def headed(draw: st.DrawFn) -> bytes:
    """A plausible 16-byte header (any opcode, any length field) and a random body."""
    head = bytes(
        [
            draw(st.sampled_from([1, 1, 1, 0, 2, 255])),
            draw(st.sampled_from([0x01, 0x02, 0x03, 0x81, 0x11, 0x00, 0xFF])),
            *draw(st.binary(min_size=4, max_size=4)),
        ]
    )
    length = draw(st.sampled_from([0, 8, 15, 16, 88, 160, 592, 593, 0xFFFF]))
    little = draw(st.booleans())
    field = length.to_bytes(2, "little") if little else length.to_bytes(2, "big")
    return head + field + bytes(8) + draw(st.binary(max_size=600))


streams = st.one_of(
    st.binary(max_size=1500),
    headed(),
    mutated(),
    st.lists(acm_messages.map(lambda m: m.encode()), min_size=1, max_size=4).map(b"".join),
    st.lists(st.sampled_from(SEEDS), min_size=2, max_size=6).map(b"".join),
)


def throw(path: str, data: bytes, chunks: list[int]) -> bytes:
    """Send ``data`` in pieces, hang up our side, read what comes back for a moment."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(READ_WINDOW)
        sock.connect(path)
        sent = 0
        for size in [*chunks, len(data)]:
            piece = data[sent : sent + max(1, size)]
            if not piece:
                break
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(piece)
            sent += len(piece)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        received = b""
        deadline = time.monotonic() + READ_WINDOW
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(MSG_MAX * 4)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            received += chunk
        return received


def check_replies(received: bytes) -> None:
    """Every whole frame the daemon sent is a reply a client can frame."""
    framer = ClientFramer(replies=True)
    framer.feed(received)
    try:
        while framer.next_frame() is not None:
            pass
    except FramingError as exc:  # pragma: no cover - a failure message
        raise AssertionError(f"malformed reply: {exc}; {received[:64].hex()}") from exc


def fuzz(path: str) -> int:
    """The hypothesis run (in a worker thread); returns how many inputs were thrown."""
    thrown = 0

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=streams, chunks=st.lists(st.integers(1, 200), max_size=4))
    def one_input(data: bytes, chunks: list[int]) -> None:
        nonlocal thrown
        thrown += 1
        check_replies(throw(path, data, chunks))
        reply = blocking_request(path, GOOD, timeout=5.0)
        assert (reply[2], len(reply)) == (0, 88), reply.hex()

    one_input()
    return thrown


@pytest.mark.trio
async def test_any_client_bytes_leave_the_daemon_serving(tmp_path: Path) -> None:
    with logged_errors() as errors:
        async with live_cluster(tmp_path, 2, timeout=100, retries=1) as cluster:
            node1 = cluster["node1"]
            first = await Client.connect(node1.socket_path)
            assert (await first.request(GOOD))[2] == 0
            await first.aclose()
            thrown = await trio.to_thread.run_sync(fuzz, node1.socket_path)
            assert thrown >= min(EXAMPLES, 100)
            assert node1.alive and cluster["node2"].alive
            assert not node1.crashed
    assert errors == []
