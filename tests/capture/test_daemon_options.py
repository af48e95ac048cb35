"""``capture_file`` and ``metrics_port`` work through the daemon itself.

Two real daemons with the default provider share a simulated fabric; node1 captures every MAD
and serves metrics. A resolution between them must show up in the capture (SA joins and path
queries, ACM request and response) and in a real scrape of the metrics endpoint.
"""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
import trio

from ibacm.config.options import Options
from ibacm.tools.workload import receive_reply, resolve_request
from ibacm.wire.client import AcmHdr, AcmStatus
from ibacm.wire.erf import ErfRecord, UdPacket, parse_pcap
from tests.core.support import cluster


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


@pytest.mark.trio
async def test_capture_file_and_metrics_port(tmp_path: Path) -> None:
    capture = tmp_path / "node1.pcap"
    metrics_port = free_port()

    def node1_observed(name: str, options: Options) -> None:
        if name == "node1":
            options.capture_file = str(capture)
            options.metrics_port = metrics_port

    async with cluster(
        tmp_path,
        nodes=2,
        customize=node1_observed,
        daemon_args=lambda name: {"kernel_service": False},
    ) as run:
        stream = await trio.open_unix_socket(run.socket("node1"))
        async with stream:
            with trio.fail_after(30):
                await stream.send_all(resolve_request("node1", "node2", nodelay=False))
                reply = AcmHdr.decode(await receive_reply(stream))
        assert reply.status == AcmStatus.SUCCESS

        text = await trio.to_thread.run_sync(scrape, metrics_port)
        lines = set(text.splitlines())
        assert "ibacm_resolve_total 1.0" in lines
        assert "ibacm_route_query_total 1.0" in lines
        sent_request = (
            'ibacm_mads_total{attribute="resolve",direction="sent",'
            'method="get",mgmt_class="acm"} 1.0'
        )
        assert sent_request in lines
        assert 'ibacm_sa_request_duration_seconds_count{attribute="path_record"} 1.0' in lines
        assert 'ibacm_groups{endpoint="mlx5_0/1/0xffff",state="joined"} 1.0' in lines

    pcap = parse_pcap(capture.read_bytes())
    classes = set()
    for packet in pcap.packets:
        record = ErfRecord.decode(packet.data)
        ud = UdPacket.decode(record.payload)
        classes.add((ud.payload[1], ud.payload[3]))
    # SA: MCMemberRecord SET, PathRecord GET, and their GetResp answers (IBA answers a Set
    # with GetResp); ACM: the multicast request (also looped back) and the unicast response.
    assert {(0x03, 0x02), (0x03, 0x01), (0x03, 0x81)} <= classes
    assert (0x2C, 0x01) in classes and (0x2C, 0x81) in classes
