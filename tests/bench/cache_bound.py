"""The cache bound under a flood of new sources: a daemon's RSS once ``cache_max_entries`` is
reached.

    python -m tests.bench.cache_bound [--sources 30000] [--bound 10000] [--every 10000]

Two real daemons (node1, node2: ``Daemon`` + ``ibacmp`` on an in-process ``SimWorld``, as
``tests.reliability.live_mad_fuzz``) and a rogue QP on node3 that sends node1 ACM requests
for node1's address, each from a new (spoofed) source IPv4 address, 200 at a time, each batch
handled before the next. node1 runs with ``cache_max_entries`` = ``--bound``. Every
``--every`` sources it prints and records the process's RSS (VmRSS; the daemons are in this
process), node1's cache size, its evictions and its deadline-list slots.

Target: from the bound on, RSS stays within 10% of its value at the bound (an evicted entry
is gone; before the fix the deadline lists kept every evicted entry for its 24-hour
lifetime: 56 -> 67 -> 78 MB at 10k/20k/30k sources).
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio
import trio.testing

from ibacm.fabric.api import AddressVector
from ibacm.wire.acm_mad import acm_request
from ibacm.wire.client import AddrType
from tests.bench.common import current_rss_mb, exit_on_sigterm, verdict, write_results
from tests.provider.acmp.harness import ipv4
from tests.reliability.live import live_cluster

BATCH = 200
TARGET_GROWTH = 0.10
"""RSS may grow at most this fraction after the bound is reached."""


async def run(sources: int, bound: int, every: int) -> dict[str, Any]:
    points: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ibacm-bound-") as tmp:
        async with live_cluster(Path(tmp), 3, start=2, cache_max_entries=bound) as cluster:
            world = cluster.world
            endpoint = cluster["node1"].endpoints()[0]
            device = (await world.fabric("node3").open())[0]
            qp = await device.port(1).open_ud(0, recv_depth=4)
            node1 = world.node("node1")
            av = AddressVector(dlid=node1.lids[0], dgid=node1.gids[0])
            dest = ipv4(world, "node1").info
            base = int(ipaddress.IPv4Address("172.16.0.0"))
            mgids = list(endpoint.joined)
            for first in range(0, sources, BATCH):
                for i in range(first, min(first + BATCH, sources)):
                    source = (base + i).to_bytes(4, "big")
                    mad = acm_request(i + 1, AddrType.IP, dest, AddrType.IP, source, mgids)
                    await qp.send(mad.encode(), av, endpoint.qpn)
                await trio.testing.wait_all_tasks_blocked(cushion=0.0005)
                sent = min(first + BATCH, sources)
                if sent % every == 0 or sent == sources:
                    gc.collect()
                    cache = endpoint.cache
                    point = {
                        "sources": sent,
                        "rss_mb": round(current_rss_mb(), 1),
                        "cache_entries": len(cache),
                        "evicted": cache.evicted,
                        "deadline_slots": cache.scheduled_entries(),
                        "requests_received": endpoint.stats.requests_received,
                    }
                    points.append(point)
                    print(
                        f"{sent:>7} sources  RSS {point['rss_mb']:6.1f} MB  cache "
                        f"{point['cache_entries']:>6}  evicted {point['evicted']:>6}  "
                        f"deadline slots {point['deadline_slots']:>6}",
                        flush=True,
                    )
    at_bound = next((p for p in points if p["sources"] >= bound), points[-1])
    peak_after = max(p["rss_mb"] for p in points if p["sources"] >= at_bound["sources"])
    growth = peak_after / at_bound["rss_mb"] - 1
    return {
        "sources": sources,
        "bound": bound,
        "points": points,
        "rss_growth_after_bound": round(growth, 3),
        "targets": {f"rss_growth<={TARGET_GROWTH:.0%}": verdict(growth <= TARGET_GROWTH)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=30_000)
    parser.add_argument("--bound", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=10_000)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    figures = trio.run(run, args.sources, args.bound, args.every)
    growth = figures["rss_growth_after_bound"]
    print(f"RSS growth after the bound: {growth:+.1%} ({figures['targets']})")
    write_results("cache_bound", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
