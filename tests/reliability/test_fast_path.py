"""The cache-hit fast path (the client loop answering from ``Provider.route_table`` in its own
thread) is invisible to clients: the same bytes, the same counters, and replies still in
request order when hits and misses are pipelined."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from ibacm.provider.acmp.provider import AcmpProvider
from ibacm.provider.route_table import RouteTable
from ibacm.wire.client import (
    AcmHdr,
    AcmMessage,
    ClientFramer,
    EpFlag,
    decode_perf_reply,
    encode_ep_request,
    encode_perf_request,
)
from tests.reliability.live import Client, live_cluster, resolve_frame


def with_tid(frame: bytes, tid: int) -> bytes:
    return frame[:8] + tid.to_bytes(8, "little") + frame[16:]


SEQUENCE = [
    resolve_frame("node1", "node2"),
    resolve_frame("node1", "node3"),
    resolve_frame("node1", "node2", EpFlag.NODELAY),
    resolve_frame("node1", "nobody", EpFlag.NODELAY),
    resolve_frame("node1", "node3"),
    resolve_frame("nobody", "node2"),
    resolve_frame("node1", "node1"),
    resolve_frame("node1", "node2"),
]


async def run_sequence(tmp_path: Path, *, fast: bool) -> tuple[list[bytes], list[list[int]], int]:
    """Replies to SEQUENCE (three times over), the global + endpoint counters after, and how
    many requests the fast path answered."""
    tables: list[RouteTable] = []
    async with live_cluster(tmp_path, 3) as cluster:
        node = cluster["node1"]
        provider = node.daemon.providers.get("ibacmp")
        assert isinstance(provider, AcmpProvider)
        real = provider.route_table

        def table_or_none(addr_ctx: object) -> RouteTable | None:
            table = real(addr_ctx) if fast else None
            if table is not None and table not in tables:
                tables.append(table)
            return table

        provider.route_table = table_or_none  # type: ignore[method-assign,assignment]
        node.daemon.topology.devices.changed()  # the tables are asked for again
        client = await Client.connect(node.socket_path)
        replies = []
        for _ in range(3):
            for frame in SEQUENCE:
                replies.append(await client.request(frame))
        counters = [
            list(decode_perf_reply(await client.request(encode_perf_request(index))).counters)
            for index in (0, 1)
        ]
        await client.aclose()
    return replies, counters, sum(table.hits for table in tables)


@pytest.mark.trio
async def test_fast_and_slow_paths_answer_and_count_alike(tmp_path: Path) -> None:
    replies, counters, hits = await run_sequence(tmp_path / "fast", fast=True)
    slow_replies, slow_counters, none = await run_sequence(tmp_path / "slow", fast=False)
    assert (replies, counters) == (slow_replies, slow_counters)
    assert (hits, none) == (16, 0)  # every answer from the cache, loopback included
    assert [reply[2] for reply in replies[:8]] == [0, 0, 0, 3, 0, 7, 0, 0]
    assert counters[0][1] == 3 * len(SEQUENCE)  # every RESOLVE counted once


@pytest.mark.trio
async def test_pipelined_hits_and_misses_keep_their_order(tmp_path: Path) -> None:
    async with live_cluster(tmp_path, 4) as cluster:
        client = await Client.connect(cluster["node1"].socket_path)
        assert (await client.request(resolve_frame("node1", "node2")))[2] == 0
        frames = []
        for tid in range(1, 61):
            if tid % 20 == 0:
                frame = resolve_frame("node1", f"node{3 + tid // 40}")  # misses: ACM + SA
            elif tid % 7 == 0:
                frame = encode_ep_request(1, tid=tid)
            else:
                frame = resolve_frame("node1", "node2")  # hits
            frames.append(with_tid(frame, tid))
        await client.stream.send_all(b"".join(frames))
        framer = ClientFramer(replies=True)
        tids: list[int] = []
        with trio.fail_after(20):
            while len(tids) < len(frames):
                framer.feed(await client.stream.receive_some(65536))
                while (reply := framer.next_frame()) is not None:
                    tids.append(AcmHdr.decode(reply).tid)
                    if reply[1] & 0x0F == 1:
                        assert AcmMessage.decode(reply).hdr.status == 0
        assert tids == list(range(1, 61))
        await client.aclose()
