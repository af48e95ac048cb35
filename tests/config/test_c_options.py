"""The C daemon's keys (``ibacm.config.c_options``): its defaults, and the order and
readers ``Options`` inherits them with."""

from __future__ import annotations

import pytest

from ibacm.config.c_options import COptions
from ibacm.config.option_kinds import ReadBy, definitions
from ibacm.config.option_values import (
    AddrPreload,
    AddrProt,
    LoopbackProt,
    RoutePreload,
    RouteProt,
    ServerMode,
)
from ibacm.config.options import OPTIONS, Options

# The defaults of options.md §3/§4 (the C daemon and provider).
C_DEFAULTS = {
    "log_file": "/var/log/ibacm.log",
    "log_level": 0,
    "umad_debug_level": 0,
    "lock_file": "/run/ibacm.pid",
    "server_port": 6125,
    "server_mode": ServerMode.UNIX,
    "acme_plus_kernel_only": False,
    "provider_lib_path": "/usr/lib/x86_64-linux-gnu/ibacm",
    "support_ips_in_addr_cfg": False,
    "timeout": 2000,
    "retries": 2,
    "sa_depth": 1,
    "addr_prot": AddrProt.ACM,
    "addr_timeout": 1440,
    "route_prot": RouteProt.SA,
    "route_timeout": -1,
    "loopback_prot": LoopbackProt.LOCAL,
    "resolve_depth": 1,
    "send_depth": 1,
    "recv_depth": 1024,
    "min_mtu": 4,
    "min_rate": 3,
    "route_preload": RoutePreload.NONE,
    "route_data_file": "/etc/rdma/ibacm_route.data",
    "addr_preload": AddrPreload.NONE,
    "addr_data_file": "/etc/rdma/ibacm_hosts.data",
    "providers": [],
}


@pytest.mark.parametrize(("name", "value"), sorted(C_DEFAULTS.items()))
def test_defaults_are_those_of_the_c_daemon(name: str, value: object) -> None:
    assert getattr(COptions(), name) == value


def test_the_c_keys_are_exactly_those_with_c_defaults() -> None:
    assert {d.name for d in definitions(COptions)} == set(C_DEFAULTS)


def test_the_c_keys_come_first_and_are_read_by_a_c_parser() -> None:
    # ib_acme -O writes them in this order before the extensions (opts_template relies on it).
    c_keys = definitions(COptions)
    assert OPTIONS[: len(c_keys)] == c_keys
    assert all(ReadBy.EXTENSION not in d.read_by for d in c_keys)
    assert all(ReadBy.EXTENSION in d.read_by for d in OPTIONS[len(c_keys) :])
    assert {d.name: d.default for d in c_keys} == {
        d.name: getattr(Options(), d.name) for d in c_keys
    }


def test_derived_values_of_the_c_keys() -> None:
    opts = COptions(min_mtu=5, min_rate=7, addr_timeout=60, route_timeout=-1)
    assert (opts.min_mtu_bytes, opts.min_rate_gbps) == (4096, 40)
    assert (opts.addr_lifetime, opts.route_lifetime) == (3600.0, float("inf"))
