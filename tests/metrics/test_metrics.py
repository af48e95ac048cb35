"""The Prometheus endpoint: scraped over real HTTP and parsed with prometheus_client's parsers.

These tests run on trio's real clock: the endpoint talks to a real HTTP client over TCP, and a
jumping mock clock would fire the request timeouts while the client's thread is working.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import socket
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from ibacm.config.options import Options
from ibacm.core.daemon import Daemon
from ibacm.core.metrics import DaemonMetrics, MetricsError, serve_metrics
from ibacm.fabric.capture import Direction, MadTrace, SaExchange, SaOutcome, TapFabric
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.provider.acmp.provider import AcmpProvider
from ibacm.provider.registry import ProviderEntry
from ibacm.wire.mad import build_path_get
from ibacm.wire.path_record import PathRecord
from tests.capture.traffic import acm_exchange, running
from tests.conftest import REPO, ibacm_sim

# The example snapshot of docs/admin-protocol.md, with a second cache entry.
SNAPSHOT: dict[str, Any] = {
    "daemon": {"version": "0.1.0", "pid": 4242, "node": "node1", "uptime": 12.5, "clients": 3},
    "counters": [0, 12, 1, 0, 0, 3, 9],
    "ports": [
        {
            "id": "mlx5_0/1",
            "state": "ACTIVE",
            "sa": {"depth": 1, "in_flight": 1, "waiting": 2, "sent": 40, "failed": 1},
        },
        {"id": "mlx5_0/2", "state": "DOWN"},
    ],
    "endpoints": [
        {
            "id": "mlx5_0/1/0xffff",
            "addresses": [{"type": "ip", "address": "10.0.0.1/24"}, {"type": "name"}],
            "groups": [{"mgid": "ff15:4001:ffff:0003:0400::", "state": "joined"}],
            "cache": [
                {"dest": "10.0.0.3", "state": "READY"},
                {"dest": "10.0.0.4", "state": "QUERY_ADDR"},
                {"dest": "10.0.0.5", "state": "READY"},
            ],
            "counters": [0, 12, 1, 0, 0, 3, 9],
        }
    ],
}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str, parser: Callable[[str], Any] = text_string_to_metric_families) -> Samples:
    out: Samples = {}
    for family in parser(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(got: Samples, name: str, **labels: str) -> float:
    return got[(name, frozenset(labels.items()))]


def http_get(port: int, path: str = "/metrics", accept: str | None = None) -> tuple[str, str]:
    """A real HTTP GET (urllib, in a worker thread): body and Content-Type."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if accept is not None:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode(), response.headers["Content-Type"]


async def scrape(port: int, accept: str | None = None) -> tuple[str, str]:
    return await trio.to_thread.run_sync(http_get, port, "/metrics", accept)


async def raw_request(port: int, data: bytes, *, close_write: bool = True) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        if data:
            await stream.send_all(data)
        if close_write:
            await stream.send_eof()
        chunks = []
        while chunk := await stream.receive_some(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@asynccontextmanager
async def endpoint(metrics: DaemonMetrics, request_timeout: float = 10.0) -> AsyncIterator[int]:
    """``serve_metrics`` on a free port of 127.0.0.1, for the duration of the block."""

    async def serve(task_status: trio.TaskStatus[int]) -> None:
        await serve_metrics(0, metrics, request_timeout=request_timeout, task_status=task_status)

    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(serve)
        yield port
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_scrape_shows_the_snapshot_and_the_mads() -> None:
    world = SimWorld(generate(3))
    metrics = DaemonMetrics(lambda: SNAPSHOT)
    async with running(world), endpoint(metrics) as port:
        tap = TapFabric(world.fabric("node2"), [metrics.mads])
        await acm_exchange(tap, world.fabric("node3"))
        text, content_type = await scrape(port)
    assert content_type.startswith("text/plain; version=0.0.4")
    got = samples(text)
    assert value(got, "ibacm_snapshot_ok") == 1
    assert value(got, "ibacm_info", version="0.1.0", node="node1") == 1
    assert (value(got, "ibacm_uptime_seconds"), value(got, "ibacm_clients")) == (12.5, 3)
    # The seven ACM counters, globally and per endpoint, as ib_acme -P shows them.
    names = ["error", "resolve", "nodata", "addr_query", "addr_cache", "route_query", "route_cache"]
    ep = "mlx5_0/1/0xffff"
    assert [value(got, f"ibacm_{n}_total") for n in names] == [0, 12, 1, 0, 0, 3, 9]
    assert [value(got, f"ibacm_endpoint_{n}_total", endpoint=ep) for n in names] == [
        0, 12, 1, 0, 0, 3, 9
    ]  # fmt: skip
    assert value(got, "ibacm_cache_entries", endpoint=ep, state="READY") == 2
    assert value(got, "ibacm_cache_entries", endpoint=ep, state="QUERY_ADDR") == 1
    assert value(got, "ibacm_groups", endpoint=ep, state="joined") == 1
    assert value(got, "ibacm_endpoint_addresses", endpoint=ep) == 2
    assert value(got, "ibacm_port_active", port="mlx5_0/1") == 1
    assert value(got, "ibacm_port_active", port="mlx5_0/2") == 0
    assert value(got, "ibacm_port_sa_waiting", port="mlx5_0/1") == 2
    assert value(got, "ibacm_port_sa_sent_total", port="mlx5_0/1") == 40
    assert ("ibacm_port_sa_waiting", frozenset({("port", "mlx5_0/2")})) not in got
    # MADs by kind, as the tap saw them on node2.
    mads = {
        tuple(dict(labels)[k] for k in ("direction", "mgmt_class", "method", "attribute")): v
        for (name, labels), v in got.items()
        if name == "ibacm_mads_total"
    }
    assert mads == {
        ("sent", "sa", "set", "mc_member_record"): 1,
        ("received", "sa", "get_resp", "mc_member_record"): 1,
        ("sent", "sa", "get", "path_record"): 1,
        ("received", "sa", "get_resp", "path_record"): 1,
        ("sent", "acm", "get", "resolve"): 1,
        ("received", "acm", "get", "resolve"): 1,
        ("received", "acm", "get_resp", "resolve"): 1,
    }
    for attribute in ("path_record", "mc_member_record"):
        count = value(got, "ibacm_sa_request_duration_seconds_count", attribute=attribute)
        total = value(got, "ibacm_sa_request_duration_seconds_sum", attribute=attribute)
        assert count == 1 and 0 < total < 1
        assert value(got, "ibacm_sa_answers_total", attribute=attribute, status="0x0000") == 1
        inf = value(got, "ibacm_sa_request_duration_seconds_bucket", attribute=attribute, le="+Inf")
        assert inf == 1


@pytest.mark.trio
async def test_openmetrics_when_the_scraper_asks() -> None:
    metrics = DaemonMetrics(lambda: SNAPSHOT)
    async with endpoint(metrics) as port:
        text, content_type = await scrape(port, accept="application/openmetrics-text")
    assert content_type.startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n")
    got = samples(text, openmetrics_families)
    assert value(got, "ibacm_resolve_total") == 12
    assert value(got, "ibacm_cache_entries", endpoint="mlx5_0/1/0xffff", state="READY") == 2


@pytest.mark.trio
async def test_http_errors_are_answered_not_crashed() -> None:
    async with endpoint(DaemonMetrics(lambda: SNAPSHOT), request_timeout=0.3) as port:
        post = await raw_request(port, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert post.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
        assert b"Allow: GET, HEAD\r\n" in post
        missing = await raw_request(port, b"GET /nope HTTP/1.1\r\n\r\n")
        assert missing.startswith(b"HTTP/1.1 404 ") and b"try /metrics" in missing
        garbage = await raw_request(port, b"\x16\x03\x01 hello\r\n\r\n")  # a TLS client
        assert garbage.startswith(b"HTTP/1.1 400 ")
        header = await raw_request(port, b"GET /metrics HTTP/1.1\r\nbad header\r\n\r\n")
        assert header.startswith(b"HTTP/1.1 400 ") and b"malformed header" in header
        huge = await raw_request(port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n")
        assert huge.startswith(b"HTTP/1.1 431 ")
        early = await raw_request(port, b"GET /metrics HTTP/1.1\r\n")
        assert early.startswith(b"HTTP/1.1 400 ") and b"closed before" in early
        silent = await raw_request(port, b"", close_write=False)  # says nothing at all
        assert silent.startswith(b"HTTP/1.1 408 ")
        head = await raw_request(port, b"HEAD /metrics HTTP/1.0\r\n\r\n")
        head_part, _, body = head.partition(b"\r\n\r\n")
        assert head_part.startswith(b"HTTP/1.1 200 OK") and body == b""
        declared = re.search(rb"Content-Length: (\d+)", head_part)
        assert declared is not None
        length = int(declared.group(1))
        full = await raw_request(port, b"GET / HTTP/1.0\r\n\r\n")
        full_head, _, full_body = full.partition(b"\r\n\r\n")
        sent = re.search(rb"Content-Length: (\d+)", full_head)
        assert sent is not None and len(full_body) == int(sent.group(1)) > 0
        # HEAD declares what a GET would send then; only the process_* samples (CPU time,
        # memory) may have changed their digits since.
        assert abs(len(full_body) - length) < 64
        # After all that, the endpoint still answers.
        text, _ = await scrape(port)
        assert value(samples(text), "ibacm_resolve_total") == 12


@pytest.mark.trio
async def test_broken_or_odd_snapshots_do_not_break_the_endpoint() -> None:
    calls = {"n": 0}

    def flaky() -> Mapping[str, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("daemon is reloading")
        odd = copy.deepcopy(SNAPSHOT)
        odd["counters"] = [1, 2]  # too short: left out
        odd["daemon"] = {"uptime": math.nan, "clients": "many"}
        odd["ports"] = ["not a mapping", {"id": "p/1", "state": "ACTIVE", "sa": {"sent": True}}]
        odd["endpoints"][0]["cache"] = None
        odd["endpoints"][0]["entries"] = [{"state": "READY"}, {}]  # a provider's own key
        odd["endpoints"].append({"cache_entries": 5})
        return odd

    async with endpoint(DaemonMetrics(flaky)) as port:
        first = samples((await scrape(port))[0])
        second = samples((await scrape(port))[0])
    assert value(first, "ibacm_snapshot_ok") == 0
    assert not any(name.startswith("ibacm_resolve") for name, _ in first)
    assert value(second, "ibacm_snapshot_ok") == 1
    assert not any(name == "ibacm_resolve_total" for name, _ in second)
    assert not any(name in ("ibacm_uptime_seconds", "ibacm_clients") for name, _ in second)
    assert value(second, "ibacm_port_active", port="p/1") == 1
    assert not any(name == "ibacm_port_sa_sent_total" for name, _ in second)
    ep = "mlx5_0/1/0xffff"
    assert value(second, "ibacm_cache_entries", endpoint=ep, state="READY") == 1
    assert value(second, "ibacm_cache_entries", endpoint=ep, state="unknown") == 1
    assert value(second, "ibacm_cache_entries", endpoint="?", state="unknown") == 5


@pytest.mark.trio
async def test_sa_failures_are_counted_by_reason() -> None:
    metrics = DaemonMetrics()  # MAD metrics only: no daemon behind it
    request = build_path_get(1, PathRecord(pkey=0xFFFF))
    metrics.mads.on_sa_exchange(SaExchange("mlx5_0/1", request, SaOutcome.TIMEOUT, 6.0))
    metrics.mads.on_sa_exchange(SaExchange("mlx5_0/1", request, SaOutcome.TIMEOUT, 6.0))
    metrics.mads.on_sa_exchange(SaExchange("mlx5_0/1", request, SaOutcome.SEND_ERROR, 0.0))
    metrics.mads.on_sa_exchange(SaExchange("mlx5_0/1", request, SaOutcome.OK, 0.004, 0x0300))
    odd_class = bytes([1, 0x81, 1, 0x01]) + bytes(252)
    metrics.mads.on_mad(MadTrace(0.0, Direction.SENT, "mlx5_0/1", odd_class, 1, 2, 1, 1, 0xFFFF))
    async with endpoint(metrics) as port:
        got = samples((await scrape(port))[0])
    attr = "path_record"
    assert value(got, "ibacm_sa_failures_total", attribute=attr, reason="timeout") == 2
    assert value(got, "ibacm_sa_failures_total", attribute=attr, reason="send_error") == 1
    assert value(got, "ibacm_sa_answers_total", attribute=attr, status="0x0300") == 1
    assert value(got, "ibacm_sa_request_duration_seconds_bucket", attribute=attr, le="0.005") == 1
    assert value(got, "ibacm_sa_request_duration_seconds_bucket", attribute=attr, le="0.0025") == 0
    assert value(
        got, "ibacm_mads_total", direction="sent", mgmt_class="0x81", method="get",
        attribute="0x0000",
    ) == 1  # fmt: skip
    assert not any(name == "ibacm_snapshot_ok" for name, _ in got)


@pytest.mark.trio
async def test_a_taken_port_is_a_clear_error() -> None:
    metrics = DaemonMetrics()
    async with endpoint(metrics) as port:
        with pytest.raises(MetricsError, match=rf"cannot serve metrics on 127\.0\.0\.1:{port}"):
            await serve_metrics(port, metrics)
    with pytest.raises(MetricsError, match="out of range"):
        await serve_metrics(70000, metrics)
    with pytest.raises(MetricsError, match="request_timeout"):
        await serve_metrics(0, metrics, request_timeout=0)


@pytest.mark.trio
async def test_a_real_daemon_on_the_simulated_fabric(tmp_path: Path) -> None:
    """The daemon core and ibacmp behind a tap: the endpoint shows what they did."""
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "addr.cfg").write_text("")
    options = Options(log_file="stderr", lock_file=str(run / "pid"), run_dir=str(run))
    world = SimWorld(generate(2))
    async with running(world):
        tap = TapFabric(world.fabric("node2"))
        daemon = Daemon(
            options,
            tap,
            addr_file=str(tmp_path / "addr.cfg"),
            providers=[ProviderEntry("ibacmp", AcmpProvider, "ibacm.provider.acmp.provider")],
            admin=False,
        )
        metrics = DaemonMetrics(daemon.snapshot)
        tap.add_observer(metrics.mads)
        ep = "mlx5_0/1/0xffff"
        joined = ("ibacm_groups", frozenset({("endpoint", ep), ("state", "joined")}))
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            async with endpoint(metrics) as port:
                with trio.fail_after(10):
                    while True:  # the group-0 join completes shortly after start-up
                        got = samples((await scrape(port))[0])
                        if joined in got:
                            break
                        await trio.sleep(0.05)
            daemon.request_shutdown()
    assert value(got, "ibacm_info", version=daemon.snapshot()["daemon"]["version"], node="node2")
    assert value(got, "ibacm_port_active", port="mlx5_0/1") == 1
    assert value(got, "ibacm_endpoint_addresses", endpoint=ep) == 2  # 10.0.0.2 and fd00::2
    assert value(got, "ibacm_groups", endpoint=ep, state="joined") == 1
    assert value(got, "ibacm_port_sa_sent_total", port="mlx5_0/1") >= 1
    sent = ("sent", "sa", "set", "mc_member_record")
    labels = frozenset(zip(("direction", "mgmt_class", "method", "attribute"), sent, strict=True))
    assert got[("ibacm_mads_total", labels)] >= 1
    assert value(
        got, "ibacm_sa_request_duration_seconds_count", attribute="mc_member_record"
    ) >= 1  # fmt: skip


def test_grafana_dashboard_uses_only_exported_metrics() -> None:
    dashboard = json.loads((REPO / "contrib" / "grafana" / "ibacm-dashboard.json").read_text())
    assert dashboard["uid"] == "ibacm-overview" and dashboard["panels"]
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    used = {name for expr in exprs for name in re.findall(r"\bibacm_[a-z_]+", expr)}
    # Every series a full scrape can produce (one of each kind of MAD and SA outcome).
    metrics = DaemonMetrics(lambda: SNAPSHOT)
    request = build_path_get(1, PathRecord(pkey=0xFFFF))
    metrics.mads.on_sa_exchange(SaExchange("p", request, SaOutcome.OK, 0.001, 0))
    metrics.mads.on_sa_exchange(SaExchange("p", request, SaOutcome.TIMEOUT, 6.0))
    metrics.mads.on_mad(MadTrace(0.0, Direction.SENT, "p", request, 1, 2, 1, 1, 1))
    body, _ = metrics.render()
    exported = {name for name, _ in samples(body.decode())}
    assert used and used <= exported, sorted(used - exported)
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def _proc_start_time(pid: int) -> float:
    """Seconds since the epoch at which ``pid`` started, from /proc (as ps computes it)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[19])  # field 22 of stat(5), counted after "pid (comm)"
    boot = next(
        float(line.split()[1])
        for line in Path("/proc/stat").read_text().splitlines()
        if line.startswith("btime ")
    )
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def test_a_daemon_process_exports_its_process_metrics(tmp_path: Path) -> None:
    """``process_*`` (prometheus_client's process collector) of a real daemon process,
    checked against what /proc says of that process, not of the test."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    extra = tmp_path / "extra.cfg"
    extra.write_text(f"metrics_port {port}\n")
    sim = tmp_path / "sim"
    up = ibacm_sim("up", "--nodes", "1", "--dir", str(sim), "--opts", str(extra))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        pid = json.loads((sim / "pids.json").read_text())["nodes"]["node1"]
        got = samples(http_get(port)[0])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        limits = Path(f"/proc/{pid}/limits").read_text().splitlines()
    finally:
        ibacm_sim("down", "--dir", str(sim))
    assert abs(value(got, "process_start_time_seconds") - _proc_start_time(pid)) < 1.5
    assert abs(value(got, "process_open_fds") - fds) <= 3
    # The daemon raised its soft open-file limit to the hard one at start-up.
    soft = next(line.split()[3] for line in limits if line.startswith("Max open files"))
    assert value(got, "process_max_fds") == float(soft)
    assert value(got, "process_resident_memory_bytes") > 10 * 2**20  # a Python daemon
    assert value(got, "process_virtual_memory_bytes") >= value(got, "process_resident_memory_bytes")
    assert value(got, "process_cpu_seconds_total") > 0
