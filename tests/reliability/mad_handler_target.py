"""A fuzz target that reaches the provider's MAD handler, not only the decoder.

Each input is one MAD as it arrives on node1's endpoint QP, handed to the function the
endpoint's receive loop calls (``PeerProtocol.handle``) of a real ``AcmpProvider`` on a
3-node ``SimWorld`` (the acmp test harness). So requests are matched against node1's
addresses, senders are learned into its cache (and a peer's LID change noticed), answers
are queued and sent, route queries go to the simulated SA and responses are matched against
what is outstanding. The world runs on trio in a thread of its own; every input is handled,
and every task it started has run until it blocks, before the next input.

Input layout: bytes 0..255 are the MAD (shorter inputs are zero padded, as a receive buffer
is). The optional 20 bytes after it choose the sender: byte 256 selects node2, node3 or the
GID/LID/QPN in bytes 257..275, so the fuzzer also covers unknown senders and LID changes.

A handler exception, an error logged by the daemon, or the world's trio run ending is a
crash. This module is imported by ``atheris_targets`` (instrumented with the rest of ibacm).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import trio
import trio.lowlevel
import trio.testing

from ibacm.acmp.endpoint import AcmpEndpoint
from ibacm.config.options import Options
from ibacm.fabric.api import ReceivedMad
from ibacm.wire.acm_mad import acm_request, acm_response
from tests.acmp.harness import cluster

MAD_SIZE = 256
START_TIMEOUT = 60.0


class RigFailure(Exception):
    """The simulated node stopped (an exception in one of its tasks)."""


@dataclass(frozen=True)
class Sender:
    gid: bytes
    lid: int
    qpn: int


class HandlerRig:
    """node1's provider on a running 3-node SimWorld, fed one received MAD at a time."""

    def __init__(self) -> None:
        self._started = threading.Event()
        self._stop: trio.Event | None = None
        self._failure: BaseException | None = None
        self.token: trio.lowlevel.TrioToken | None = None
        self.endpoint: AcmpEndpoint | None = None
        self.senders: list[Sender] = []
        self.mgids: list[bytes] = []
        self._thread = threading.Thread(target=self._run, name="mad-handler-rig", daemon=True)
        self._thread.start()
        if not self._started.wait(START_TIMEOUT) or self.endpoint is None:
            raise RigFailure(f"the simulated cluster did not start: {self._failure!r}")

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            self._failure = exc
        finally:
            self._started.set()

    async def _main(self) -> None:
        # Short timeouts: a request that waits on a peer gives up soon, as inputs go by fast.
        options = Options()
        options.timeout = 50
        options.retries = 1
        async with cluster(3, options) as running:
            self.endpoint = running.endpoint("node1")
            for node in ("node2", "node3"):
                host = running.world.node(node)
                qpn = running.endpoint(node).qpn
                self.senders.append(Sender(host.gids[0], host.lids[0], qpn))
            self.mgids = list(self.endpoint.joined)
            self.token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            self._started.set()
            await self._stop.wait()

    def close(self) -> None:
        if self.token is not None and self._thread.is_alive():
            stop = self._stop
            assert stop is not None
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(stop.set, trio_token=self.token)
        self._thread.join(10)

    def received(self, data: bytes) -> ReceivedMad:
        """The completion a receive loop would get for ``data`` (see the module docstring)."""
        mad = data[:MAD_SIZE].ljust(MAD_SIZE, b"\0")
        tail = data[MAD_SIZE : MAD_SIZE + 20]
        choice = tail[0] % 3 if tail else 0
        if choice < 2:
            sender = self.senders[choice]
        else:
            raw = tail[1:].ljust(19, b"\0")
            lid = int.from_bytes(raw[16:18], "big") or 1
            sender = Sender(raw[:16], lid, int.from_bytes(raw[18:19], "big") | 0x100)
        assert self.endpoint is not None
        return ReceivedMad(
            mad=mad,
            sgid=sender.gid,
            dgid=self.mgids[0] if self.mgids else bytes(16),
            slid=sender.lid,
            src_qp=sender.qpn,
        )

    def feed(self, data: bytes) -> None:
        """Hand one input to the handler; returns once everything it started is blocked."""
        received = self.received(data)
        try:
            trio.from_thread.run(self._handle, received, trio_token=self.token)
        except trio.RunFinishedError:
            raise RigFailure(f"the simulated node stopped: {self._failure!r}") from self._failure

    async def _handle(self, received: ReceivedMad) -> None:
        assert self.endpoint is not None
        self.endpoint.protocol.handle(received)
        await trio.testing.wait_all_tasks_blocked()


def handler_seeds(rig: HandlerRig) -> list[bytes]:
    """MADs node2 and node3 would send: requests for node1's addresses and for others, and
    responses (the tail picks the sender: 0 node2, 1 node3, 2 a stranger)."""
    mgid = rig.mgids[0] if rig.mgids else bytes(16)
    requests = [
        acm_request(1, 1, b"node1", 1, b"node2", [mgid]),
        acm_request(2, 2, bytes([10, 0, 0, 1]), 2, bytes([10, 0, 0, 2]), [mgid]),
        acm_request(3, 1, b"node3", 1, b"node2", [mgid]),
        acm_request(4, 3, rig.senders[0].gid, 4, rig.senders[1].gid, [mgid]),
        acm_request(5, 5, (2).to_bytes(2, "big"), 1, b"nobody", [mgid, bytes(16)]),
    ]
    responses = [acm_response(6, mgid), acm_response(7, mgid, status=1)]
    out = []
    for index, mad in enumerate([*requests, *responses]):
        raw = mad.encode()
        out += [raw, raw + bytes([index % 3]) + bytes(19)]
    return out
