"""The generated option file (``ib_acme -O``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibacm.config.ctext import c_lower
from ibacm.config.option_file import parse_options
from ibacm.config.option_values import (
    MTU_ENUM,
    RATE_ENUM,
    AddrPreload,
    LogFormat,
    LoopbackProt,
    ProviderLine,
    RoutePreload,
    RouteProt,
    ServerMode,
)
from ibacm.config.options import Options
from ibacm.config.opts_template import render_opts_file

# ib_acme.md §7.2, placeholders expanded to the distribution paths.
ACTIVE_LINES = [
    "log_file /var/log/ibacm.log",
    "log_level 0",
    "umad_debug_level 0",
    "lock_file /run/ibacm.pid",
    "addr_prot acm",
    "addr_timeout 1440",
    "route_prot sa",
    "route_timeout -1",
    "loopback_prot local",
    "server_port 6125",
    "server_mode unix",
    "acme_plus_kernel_only no",
    "timeout 2000",
    "retries 2",
    "resolve_depth 1",
    "sa_depth 1",
    "send_depth 1",
    "recv_depth 1024",
    "min_mtu 2048",
    "min_rate 10",
    "route_preload none",
    "addr_preload none",
]

COMMENTED_EXAMPLES = [
    "# log_file stdout",
    "# log_file stderr",
    "# log_file /var/log/ibacm.log",
    "# route_data_file /etc/rdma/ibacm_route.data",
    "# addr_data_file /etc/rdma/ibacm_hosts.data",
    "# support_ips_in_addr_cfg 0",
    "# provider_lib_path /usr/lib/x86_64-linux-gnu/ibacm",
    "# provider ibacmp 0xFE80000000000000",
    "# provider ibacmp default",
]


def active(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_default_file_has_exactly_the_c_tools_active_lines() -> None:
    assert active(render_opts_file()) == ACTIVE_LINES


def test_default_file_has_the_commented_examples() -> None:
    lines = render_opts_file().splitlines()
    for example in COMMENTED_EXAMPLES:
        assert example in lines


def test_extensions_appear_only_commented() -> None:
    lines = render_opts_file().splitlines()
    for key in ("sa_timeout", "log_format", "cache_max_entries", "metrics_port", "run_dir"):
        assert any(line.startswith(f"# {key} ") for line in lines)


def test_default_file_parses_back_to_defaults_without_issues() -> None:
    assert parse_options(render_opts_file()) == (Options(), [])


def test_non_default_options_round_trip() -> None:
    options = Options(
        log_file="stdout",
        log_level=2,
        server_mode=ServerMode.OPEN,
        acme_plus_kernel_only=True,
        support_ips_in_addr_cfg=True,
        route_prot=RouteProt.ACM,
        loopback_prot=LoopbackProt.NONE,
        min_mtu=5,
        min_rate=17,
        route_preload=RoutePreload.OPENSM_FULL_V1,
        route_data_file="/srv/route.data",
        addr_preload=AddrPreload.ACM_HOSTS,
        provider_lib_path="/opt/lib",
        providers=[
            ProviderLine("ibacmp", False, 0xFE80000000000000, 0),
            ProviderLine("ibacmp", True, None, 0),
        ],
        sa_timeout=100,
        log_format=LogFormat.JSON,
        admin_socket="/tmp/a.sock",
        cache_file="/var/lib/ibacm.cache",
        route_bulk_preload=True,
        metrics_port=9100,
    )
    parsed, issues = parse_options(render_opts_file(options))
    assert issues == []
    # Provider lines record where they were read; compare everything else as is.
    assert [(p.name, p.default, p.prefix) for p in parsed.providers] == [
        (p.name, p.default, p.prefix) for p in options.providers
    ]
    parsed.providers = options.providers
    assert parsed == options


def test_values_that_cannot_be_written_are_refused() -> None:
    with pytest.raises(ValueError, match="log_file"):
        render_opts_file(Options(log_file="/var/log/my ibacm.log"))


def test_empty_values_are_refused() -> None:
    with pytest.raises(ValueError, match="lock_file"):
        render_opts_file(Options(lock_file=""))


# Values the parser keeps exactly as given (no normalising, no fallback, no long lines).
_WORD = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters=" \t\n\v\f\r\0"),
    min_size=1,
    max_size=40,
).filter(lambda word: c_lower(word) not in ("stdout", "stderr", "none") or word.islower())
_PATH = _WORD.filter(lambda word: c_lower(word) != "none")
_INT32 = st.integers(-(2**31), 2**31 - 1)


@st.composite
def _options(draw: st.DrawFn) -> Options:
    first, second = sorted(draw(st.lists(st.integers(1, 10**6), min_size=2, max_size=2)))
    return Options(
        log_file=draw(_WORD),
        log_level=draw(_INT32),
        umad_debug_level=draw(_INT32),
        lock_file=draw(_WORD),
        server_port=draw(st.integers(1, 0xFFFF)),
        server_mode=draw(st.sampled_from(ServerMode)),
        acme_plus_kernel_only=draw(st.booleans()),
        provider_lib_path=draw(_WORD),
        support_ips_in_addr_cfg=draw(st.booleans()),
        timeout=draw(st.integers(1, 2**31 - 1)),
        retries=draw(st.integers(0, 100)),
        sa_depth=draw(st.integers(1, 2**31 - 1)),
        addr_timeout=draw(st.integers(-1, 2**31 - 1)),
        route_prot=draw(st.sampled_from(RouteProt)),
        route_timeout=draw(st.integers(-1, 2**31 - 1)),
        loopback_prot=draw(st.sampled_from(LoopbackProt)),
        resolve_depth=draw(st.integers(1, 1000)),
        send_depth=draw(st.integers(1, 1000)),
        recv_depth=draw(st.integers(1, 10**5)),
        min_mtu=draw(st.sampled_from(sorted(MTU_ENUM.values()))),
        min_rate=draw(st.sampled_from(sorted(RATE_ENUM.values()))),
        route_preload=draw(st.sampled_from(RoutePreload)),
        route_data_file=draw(_WORD),
        addr_preload=draw(st.sampled_from(AddrPreload)),
        addr_data_file=draw(_WORD),
        sa_timeout=draw(st.none() | st.integers(1, 10**6)),
        sa_retries=draw(st.none() | st.integers(0, 100)),
        log_format=draw(st.sampled_from(LogFormat)),
        run_dir=draw(_WORD),
        admin_socket=draw(st.none() | _WORD),
        cache_max_entries=draw(st.integers(0, 10**7)),
        cache_file=draw(st.none() | _PATH),
        cache_save_interval=draw(st.integers(0, 10**5)),
        join_retry_initial_ms=first,
        join_retry_max_ms=second,
        route_bulk_preload=draw(st.booleans()),
        metrics_port=draw(st.integers(0, 0xFFFF)),
        capture_file=draw(st.none() | _PATH),
    )


@settings(max_examples=150, deadline=None)
@given(_options())
def test_any_writable_options_round_trip(options: Options) -> None:
    text = render_opts_file(options)
    assert parse_options(text) == (options, [])
