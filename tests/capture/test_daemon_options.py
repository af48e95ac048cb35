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
from tests.fullfs import SIZE, fill, free, full_tmpfs


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


@pytest.mark.trio
async def test_a_capture_file_on_a_full_disk_costs_records_not_the_daemon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics_port = free_port()
    with full_tmpfs(tmp_path / "full", room=SIZE) as full:
        capture = full / "node1.pcap"

        def node1_observed(name: str, options: Options) -> None:
            if name == "node1":
                options.capture_file = str(capture)
                options.metrics_port = metrics_port

        (tmp_path / "nodes").mkdir()
        async with cluster(
            tmp_path / "nodes",
            nodes=3,
            customize=node1_observed,
            daemon_args=lambda name: {"kernel_service": False},
        ) as run:
            daemon = run.daemons["node1"]

            async def resolve(dest: str) -> None:
                stream = await trio.open_unix_socket(run.socket("node1"))
                async with stream:
                    with trio.fail_after(30):
                        await stream.send_all(resolve_request("node1", dest, nodelay=False))
                        reply = AcmHdr.decode(await receive_reply(stream))
                assert reply.status == AcmStatus.SUCCESS
                await daemon.flush(None, None)  # the next one asks the fabric again

            fill(full)
            for _ in range(5):
                for dest in ("node2", "node3"):
                    await resolve(dest)  # served while the capture loses its MADs
            with trio.fail_after(30):
                while not daemon.mad_capture.status()["lost"]:
                    await trio.sleep(0.05)
            lost = daemon.snapshot()["daemon"]["capture"]
            assert lost["active"] and "No space left on device" in lost["error"]
            text = await trio.to_thread.run_sync(scrape, metrics_port)
            name = 'ibacm_capture_records_lost_total{reason="write_failed"} '
            counted = [
                float(line[len(name) :]) for line in text.splitlines() if line.startswith(name)
            ]
            assert counted and counted[0] >= lost["lost"], text

            free(full)
            await resolve("node2")
            status = await daemon.capture("stop", None)
        assert status["lost"] >= lost["lost"] and status["error"] is None
        assert status["records"] > lost["records"]  # written again once there was room
        assert len(parse_pcap(capture.read_bytes()).packets) == status["records"]
    err = capsys.readouterr().err
    reports = [line for line in err.splitlines() if line.startswith("ibacm: cannot write")]
    assert len(reports) == 1 and "captured MAD(s) lost" in reports[0], err
    assert "Traceback" not in err
