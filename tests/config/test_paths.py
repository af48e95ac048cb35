"""Default paths and the run-directory layout."""

from __future__ import annotations

from pathlib import Path

from ibacm.config import paths
from ibacm.config.paths import RunPaths


def test_distribution_defaults() -> None:
    assert paths.DEFAULT_OPTS_FILE == "/etc/rdma/ibacm_opts.cfg"
    assert paths.DEFAULT_ADDR_FILE == "/etc/rdma/ibacm_addr.cfg"
    assert paths.DEFAULT_ROUTE_DATA_FILE == "/etc/rdma/ibacm_route.data"
    assert paths.DEFAULT_ADDR_DATA_FILE == "/etc/rdma/ibacm_hosts.data"
    assert paths.DEFAULT_LOG_FILE == "/var/log/ibacm.log"
    assert paths.DEFAULT_LOCK_FILE == "/run/ibacm.pid"


def test_run_paths_in_a_private_directory(tmp_path: Path) -> None:
    run = RunPaths(tmp_path)
    assert run.unix_socket == tmp_path / "ibacm-unix.sock"
    assert run.unix_symlink == tmp_path / "ibacm.sock"
    assert run.tcp_port_file == tmp_path / "ibacm-tcp.port"
    assert run.port_symlink == tmp_path / "ibacm.port"
    assert run.admin_socket == tmp_path / "ibacm-admin.sock"
    assert RunPaths(Path(paths.RUNDIR)).unix_socket == Path("/run/ibacm-unix.sock")
