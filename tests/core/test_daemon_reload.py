"""A reload never ignores an option silently: every option of the option file either
applies to the running daemon (and its default provider's open endpoints) or is reported
as needing a restart. Real daemons with the real provider on the simulated fabric."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from ibacm.config.options import Options
from ibacm.core.daemon import CORE_OPTIONS, PROVIDER_OPTIONS, RESTART_OPTIONS, Daemon
from ibacm.core.model import iter_endpoints
from ibacm.provider.acmp.endpoint import AcmpEndpoint
from tests.core.support import cluster, make_options, sim_daemon

Probe = Callable[[Daemon, AcmpEndpoint], Any]


def _endpoint(daemon: Daemon) -> AcmpEndpoint:
    [endpoint] = list(iter_endpoints(daemon.topology.devices))
    assert isinstance(endpoint.ctx, AcmpEndpoint)
    return endpoint.ctx


def _sa_depth(daemon: Daemon, _: AcmpEndpoint) -> int:
    port = daemon.topology.devices[0].ports[0]
    assert port.sa is not None
    return port.sa.depth


def _capture(daemon: Daemon, _: AcmpEndpoint) -> str | None:
    status = daemon.mad_capture.status()
    return str(status["path"]) if status["active"] else None


def _credits(_: Daemon, ep: AcmpEndpoint) -> int:
    return int(ep.resolve_credits._credits.value)


# Every option that applies on reload: the file line that changes it, where the running
# daemon shows the change, and the value it must show there.
APPLIED: dict[str, tuple[str, Probe, Any]] = {
    "log_file": ("log_file stdout", lambda d, ep: d.options.log_file, "stdout"),
    "log_level": ("log_level 2", lambda d, ep: d.options.log_level, 2),
    "log_format": ("log_format json", lambda d, ep: d.options.log_format.value, "json"),
    "support_ips_in_addr_cfg": (
        "support_ips_in_addr_cfg 1",
        lambda d, ep: d.addr_file.support_ips,
        True,
    ),
    "sa_depth": ("sa_depth 3", _sa_depth, 3),
    "sa_timeout": ("sa_timeout 700", lambda d, ep: d.services.options.effective_sa_timeout, 700),
    "sa_retries": ("sa_retries 4", lambda d, ep: d.services.options.effective_sa_retries, 4),
    "capture_file": ("capture_file {dir}/mads.pcap", _capture, "{dir}/mads.pcap"),
    "max_clients": ("max_clients 50", lambda d, ep: d.clients.limits.max_clients, 50),
    "max_clients_per_user": (
        "max_clients_per_user 7",
        lambda d, ep: d.clients.limits.max_per_user,
        7,
    ),
    "client_request_timeout": (
        "client_request_timeout 4",
        lambda d, ep: d.clients.limits.request_timeout,
        4.0,
    ),
    "client_idle_timeout": (
        "client_idle_timeout 600",
        lambda d, ep: d.clients.limits.idle_timeout,
        600.0,
    ),
    "timeout": ("timeout 3000", lambda d, ep: ep.options.timeout, 3000),
    "retries": ("retries 5", lambda d, ep: ep.options.retries, 5),
    "addr_timeout": ("addr_timeout 5", lambda d, ep: ep.addr_lifetime, 300.0),
    "route_timeout": ("route_timeout 7", lambda d, ep: ep.route_lifetime, 420.0),
    "loopback_prot": ("loopback_prot none", lambda d, ep: ep.options.loopback_prot.name, "NONE"),
    "resolve_depth": ("resolve_depth 4", _credits, 4),
    "join_retry_initial_ms": (
        "join_retry_initial_ms 500",
        lambda d, ep: ep.options.join_retry_initial_ms,
        500,
    ),
    "join_retry_max_ms": (
        "join_retry_max_ms 90000",
        lambda d, ep: ep.options.join_retry_max_ms,
        90000,
    ),
}
# Options with a single accepted value: nothing to change, nothing to report.
SINGLE_VALUED = {"addr_prot": "addr_prot acm"}
# Every option that needs a restart: the file line that changes it.
RESTART: dict[str, str] = {
    "server_mode": "server_mode loop",
    "server_port": "server_port 7000",
    "acme_plus_kernel_only": "acme_plus_kernel_only yes",
    "lock_file": "lock_file {dir}/other.pid",
    "run_dir": "run_dir {dir}/elsewhere",
    "admin_socket": "admin_socket {dir}/admin.sock",
    "providers": "provider ibacmp default",
    "provider_lib_path": "provider_lib_path {dir}/lib",
    "provider_prefer": "provider_prefer library",
    "umad_debug_level": "umad_debug_level 1",
    "metrics_port": "metrics_port 9999",
    "recv_depth": "recv_depth 512",
    "send_depth": "send_depth 2",
    "route_prot": "route_prot acm",
    "min_mtu": "min_mtu 4096",
    "min_rate": "min_rate 40",
    "route_preload": "route_preload opensm_full_v1",
    "route_data_file": "route_data_file {dir}/route.data",
    "addr_preload": "addr_preload acm_hosts",
    "addr_data_file": "addr_data_file {dir}/hosts.data",
    "route_bulk_preload": "route_bulk_preload yes",
    "cache_max_entries": "cache_max_entries 10",
    "cache_file": "cache_file {dir}/cache",
    "cache_save_interval": "cache_save_interval 60",
}


def test_every_option_has_one_reload_behaviour() -> None:
    fields = {f.name for f in dataclasses.fields(Options)}
    groups = [set(RESTART_OPTIONS), set(CORE_OPTIONS), set(PROVIDER_OPTIONS)]
    assert sum(len(g) for g in groups) == len(set().union(*groups)), "an option in two groups"
    assert set().union(*groups) == fields
    # ... and this test walks each of them.
    assert set(APPLIED) | set(SINGLE_VALUED) | set(RESTART) == fields
    assert set(RESTART) == set(RESTART_OPTIONS)


@pytest.mark.trio
async def test_a_reload_applies_or_reports_every_option(tmp_path: Path) -> None:
    home = tmp_path / "node1"
    opts = tmp_path / "ibacm_opts.cfg"
    base = f"log_file stderr\nrun_dir {home}\nlock_file {home / 'pid'}\n"
    opts.write_text(base)

    def args(node: str) -> dict[str, Any]:
        return {"opts_file": str(opts)} if node == "node1" else {}

    async with cluster(tmp_path, nodes=2, daemon_args=args) as fabric:
        daemon = fabric.daemons["node1"]
        ep = _endpoint(daemon)
        missed: list[str] = []
        for name, (line, probe, wanted) in APPLIED.items():
            opts.write_text(base + line.format(dir=tmp_path) + "\n")
            restart = await daemon.reload()
            if isinstance(wanted, str):
                wanted = wanted.format(dir=tmp_path)
            shown = probe(daemon, ep)
            if restart or shown != wanted:
                missed.append(f"{name}: shows {shown!r}, wanted {wanted!r}; restart {restart}")
            opts.write_text(base)
            await daemon.reload()
        for name, line in RESTART.items():
            running = getattr(daemon.options, name)
            opts.write_text(base + line.format(dir=tmp_path) + "\n")
            restart = await daemon.reload()
            if restart != [name] or getattr(daemon.options, name) != running:
                missed.append(f"{name}: restart {restart}, now {getattr(daemon.options, name)}")
            opts.write_text(base)
            assert await daemon.reload() == []
        for name, line in SINGLE_VALUED.items():
            opts.write_text(base + line + "\n")
            assert await daemon.reload() == [], name
        assert not missed, "\n".join(missed)
        assert _endpoint(daemon) is ep  # the same endpoint took every change


@pytest.mark.trio
async def test_capture_file_from_the_command_line_outlasts_a_reload(tmp_path: Path) -> None:
    opts = tmp_path / "ibacm_opts.cfg"
    capture = str(tmp_path / "cli.pcap")

    def args(node: str) -> dict[str, Any]:
        return {"opts_file": str(opts), "capture_file": capture} if node == "node1" else {}

    home = tmp_path / "node1"
    opts.write_text(f"log_file stderr\nrun_dir {home}\nlock_file {home / 'pid'}\n")
    async with cluster(tmp_path, nodes=2, daemon_args=args) as fabric:
        daemon = fabric.daemons["node1"]
        assert _capture(daemon, _endpoint(daemon)) == capture
        assert await daemon.reload() == []
        assert _capture(daemon, _endpoint(daemon)) == capture


@pytest.mark.trio
async def test_a_provider_that_cannot_apply_options_gets_them_reported(tmp_path: Path) -> None:
    # testprov keeps the base Provider.options_changed, like a provider library.
    options = make_options(tmp_path)
    opts = tmp_path / "ibacm_opts.cfg"
    base = f"log_file stderr\nrun_dir {options.run_dir}\nlock_file {options.lock_file}\n"
    base += "provider testprov default\n"
    opts.write_text(base)
    async with sim_daemon(tmp_path, options=options, opts_file=str(opts)) as run:
        opts.write_text(base + "timeout 3000\nretries 4\nlog_level 1\n")
        with trio.fail_after(5):
            assert await run.daemon.reload() == ["timeout", "retries"]
        assert run.daemon.options.log_level == 1
