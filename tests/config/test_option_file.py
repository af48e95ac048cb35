"""Reading the option file (``ibacm.config.option_file``): the C rules, the fixed defects
and our extensions."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibacm.config.errors import ConfigError, ConfigIssue
from ibacm.config.option_file import load_options, parse_options
from ibacm.config.option_values import (
    AddrPreload,
    AddrProt,
    LogFormat,
    LoopbackProt,
    ProviderLine,
    RoutePreload,
    RouteProt,
    ServerMode,
)
from ibacm.config.options import KNOWN_KEYS, Options

PATH = "opts.cfg"


def parse(text: str) -> tuple[Options, list[ConfigIssue]]:
    return parse_options(text, PATH)


def messages(issues: list[ConfigIssue]) -> list[str]:
    return [str(issue) for issue in issues]


def test_empty_file_gives_defaults_without_issues() -> None:
    assert parse("") == (Options(), [])
    assert parse("# only a comment\n\n   \n") == (Options(), [])


def test_every_key_is_read() -> None:
    text = """\
log_file stderr
log_level 2
umad_debug_level 1
lock_file /tmp/x.pid
server_port 7000
server_mode loop
acme_plus_kernel_only yes
provider_lib_path /opt/acm
support_ips_in_addr_cfg 1
timeout 500
retries 4
sa_depth 8
addr_prot acm
addr_timeout 60
route_prot acm
route_timeout 30
loopback_prot none
resolve_depth 3
send_depth 5
recv_depth 64
min_mtu 4096
min_rate 100
route_preload opensm_full_v1
route_data_file /tmp/route.data
addr_preload acm_hosts
addr_data_file /tmp/hosts.data
"""
    opts, issues = parse(text)
    assert issues == []
    assert opts == Options(
        log_file="stderr",
        log_level=2,
        umad_debug_level=1,
        lock_file="/tmp/x.pid",
        server_port=7000,
        server_mode=ServerMode.LOOP,
        acme_plus_kernel_only=True,
        provider_lib_path="/opt/acm",
        support_ips_in_addr_cfg=True,
        timeout=500,
        retries=4,
        sa_depth=8,
        addr_timeout=60,
        route_prot=RouteProt.ACM,
        route_timeout=30,
        loopback_prot=LoopbackProt.NONE,
        resolve_depth=3,
        send_depth=5,
        recv_depth=64,
        min_mtu=5,
        min_rate=16,
        route_preload=RoutePreload.OPENSM_FULL_V1,
        route_data_file="/tmp/route.data",
        addr_preload=AddrPreload.ACM_HOSTS,
        addr_data_file="/tmp/hosts.data",
    )
    assert opts.min_mtu_bytes == 4096 and opts.min_rate_gbps == 100


@pytest.mark.parametrize(
    ("value", "expected", "warned"),
    [("7", 7, False), ("-3", -3, False), ("+4", 4, False), ("12abc", 12, True), ("abc", 0, True)],
)
def test_integers_follow_c_atoi(value: str, expected: int, warned: bool) -> None:
    opts, issues = parse(f"log_level 1\nlog_level {value}\n")
    assert opts.log_level == expected
    if warned:
        assert messages(issues) == [
            f"{PATH}:2: log_level value {value!r} "
            + ("has trailing characters after the number" if expected else "is not a number")
            + f" (accepted: an integer); the C daemon would silently use {expected} (atoi)"
        ]
        assert issues[0].severity == "error"  # the daemon does not start, a reload is refused
    else:
        assert issues == []


def test_keys_are_case_insensitive_and_values_keywords_too() -> None:
    opts, issues = parse("LOG_LEVEL 2\nRoute_Prot ACM\nSERVER_MODE Open\nLoopback_Prot NONE\n")
    assert issues == []
    assert opts.log_level == 2
    assert opts.route_prot is RouteProt.ACM
    assert opts.server_mode is ServerMode.OPEN
    assert opts.loopback_prot is LoopbackProt.NONE


def test_route_timeout_key_is_case_sensitive_as_in_c() -> None:
    opts, issues = parse("route_timeout 30\nROUTE_TIMEOUT 5\nRoute_timeout 6\n")
    assert opts.route_timeout == 30
    assert [issue.line for issue in issues] == [2, 3]
    assert "must be written in lowercase" in issues[0].message


def test_last_occurrence_wins() -> None:
    opts, issues = parse("timeout 100\nretries 5\ntimeout 300\n")
    assert (opts.timeout, opts.retries, issues) == (300, 5, [])


def test_comment_rules() -> None:
    text = "#log_level 2\nlog_level 1 # trailing comment\n   #log_file stdout\n"
    opts, issues = parse(text)
    assert opts.log_level == 1 and opts.log_file == Options().log_file
    assert issues == []


def test_text_after_value_is_ignored_with_a_warning() -> None:
    opts, issues = parse("log_level 2 3\n")
    assert opts.log_level == 2
    assert messages(issues) == [f"{PATH}:1: log_level: text after the value '2' is ignored"]


def test_key_without_value_is_reported() -> None:
    opts, issues = parse("log_level\n")
    assert opts == Options()
    assert messages(issues) == [f"{PATH}:1: key 'log_level' has no value; line ignored"]


def test_long_line_is_one_line_with_a_warning() -> None:
    # C reads 119 characters at a time: the tail of this line would become "log_level 2".
    path = "/" + "d" * 108 + "/"
    line = f"log_file {path}log_level 2"
    assert len(line) > 119 and line[119:].startswith("log_level")
    opts, issues = parse(f"{line}\nretries 3\n")
    assert opts.log_file == f"{path}log_level"
    assert opts.log_level == 0
    assert opts.retries == 3
    assert len(issues) == 2  # the long line, and the extra token "2" after the value
    assert issues[0].line == 1 and "119" in issues[0].message and "split" in issues[0].message


def test_line_of_119_characters_is_not_reported() -> None:
    line = "log_file /" + "x" * 109
    assert len(line) == 119
    assert parse(line + "\n")[1] == []


@pytest.mark.parametrize(("mtu", "enum"), [(256, 1), (512, 2), (1024, 3), (2048, 4), (4096, 5)])
def test_min_mtu_table(mtu: int, enum: int) -> None:
    opts, issues = parse(f"min_mtu {mtu}\n")
    assert (opts.min_mtu, opts.min_mtu_bytes, issues) == (enum, mtu, [])


@pytest.mark.parametrize(
    ("rate", "enum"),
    [
        (2, 2), (5, 5), (10, 3), (14, 11), (20, 6), (25, 15), (30, 4), (40, 7), (56, 12),
        (60, 8), (80, 9), (100, 16), (112, 13), (120, 10), (168, 14), (200, 17), (300, 18),
    ],
)  # fmt: skip
def test_min_rate_table(rate: int, enum: int) -> None:
    opts, issues = parse(f"min_rate {rate}\n")
    assert (opts.min_rate, opts.min_rate_gbps, issues) == (enum, rate, [])


def test_invalid_min_mtu_and_rate_fall_back_like_c_but_are_reported() -> None:
    opts, issues = parse("min_mtu 4096\nmin_rate 40\nmin_mtu 1500\nmin_rate 15\n")
    assert (opts.min_mtu, opts.min_rate) == (4, 3)  # 2048 and 10, as C
    text = messages(issues)
    assert text[0].startswith(f"{PATH}:3: min_mtu value '1500' ")
    assert text[0].endswith("the C daemon would use 2048")
    assert text[1].startswith(f"{PATH}:4: min_rate value '15' ")
    assert text[1].endswith("the C daemon would use 10")


@pytest.mark.parametrize(
    ("key", "good", "attribute", "expected"),
    [
        ("route_prot", "acm", "route_prot", RouteProt.ACM),
        ("addr_prot", "acm", "addr_prot", AddrProt.ACM),
        ("loopback_prot", "none", "loopback_prot", LoopbackProt.NONE),
        ("route_preload", "opensm_full_v1", "route_preload", RoutePreload.OPENSM_FULL_V1),
        ("addr_preload", "acm_hosts", "addr_preload", AddrPreload.ACM_HOSTS),
    ],
)
def test_unknown_keyword_keeps_previous_value(
    key: str, good: str, attribute: str, expected: object
) -> None:
    opts, issues = parse(f"{key} {good}\n{key} bogus\n")
    assert getattr(opts, attribute) == expected
    assert len(issues) == 1 and issues[0].line == 2
    assert "'bogus' is not one of" in issues[0].message
    assert f"the C daemon would keep {good}" in issues[0].message
    assert issues[0].severity == "error"


def test_preload_no_means_none() -> None:
    opts, issues = parse("route_preload opensm_full_v1\nroute_preload no\naddr_preload NO\n")
    assert (opts.route_preload, opts.addr_preload, issues) == (
        RoutePreload.NONE,
        AddrPreload.NONE,
        [],
    )


def test_man_page_spelling_of_route_preload_is_accepted() -> None:
    opts, issues = parse("route_preload full_opensm_v1\n")
    assert opts.route_preload is RoutePreload.OPENSM_FULL_V1
    assert len(issues) == 1 and "C daemon accepts only opensm_full_v1" in issues[0].message


@pytest.mark.parametrize(
    ("value", "expected", "warned"),
    [
        ("true", True, False),
        ("YES", True, False),
        ("1", True, False),
        ("0x10", True, False),
        ("010", True, False),
        ("no", False, False),
        ("false", False, False),
        ("0", False, False),
        ("on", False, True),
        ("2x", True, True),
    ],
)
def test_acme_plus_kernel_only_truth(value: str, expected: bool, warned: bool) -> None:
    opts, issues = parse(f"acme_plus_kernel_only {value}\n")
    assert opts.acme_plus_kernel_only is expected
    assert bool(issues) is warned


@pytest.mark.parametrize(
    ("value", "mode", "warned"),
    [
        ("open", ServerMode.OPEN, False),
        ("LOOP", ServerMode.LOOP, False),
        ("unix", ServerMode.UNIX, False),
        ("tcp", ServerMode.UNIX, True),
    ],
)
def test_server_mode(value: str, mode: ServerMode, warned: bool) -> None:
    opts, issues = parse(f"server_mode open\nserver_mode {value}\n")
    assert opts.server_mode is mode
    assert bool(issues) is warned


def test_server_port_is_truncated_to_16_bits_like_c_with_a_warning() -> None:
    opts, issues = parse("server_port 70000\n")
    assert opts.server_port == 70000 - 65536
    assert "the C daemon would use 4464" in issues[0].message
    assert issues[0].severity == "error"


def test_settings_that_would_stall_the_daemon_are_raised() -> None:
    opts, issues = parse("sa_depth 0\nresolve_depth -1\nsend_depth 0\nrecv_depth 0\nretries -2\n")
    assert (opts.sa_depth, opts.resolve_depth, opts.send_depth, opts.recv_depth) == (1, 1, 1, 1)
    assert opts.retries == 0
    assert [issue.line for issue in issues] == [1, 2, 3, 4, 5]
    assert "below 1 and would not work (accepted: 1..)" in issues[0].message
    assert {issue.severity for issue in issues} == {"error"}


def test_negative_timeout_keeps_previous() -> None:
    opts, issues = parse("timeout 700\ntimeout -5\n")
    assert opts.timeout == 700
    assert "keeping 700" in issues[0].message


def test_lifetimes() -> None:
    opts, issues = parse("addr_timeout 60\nroute_timeout -1\n")
    assert opts.addr_lifetime == 3600.0 and opts.route_lifetime == math.inf
    assert issues == []
    opts, issues = parse("addr_timeout -7\n")
    assert opts.addr_lifetime == math.inf and "never expire" in issues[0].message


def test_log_file_stdout_is_case_insensitive() -> None:
    assert parse("log_file STDOUT\n")[0].log_file == "stdout"
    assert parse("log_file /var/log/Mine.log\n")[0].log_file == "/var/log/Mine.log"


def test_provider_lines() -> None:
    text = (
        "provider_lib_path /opt/providers\n"
        "provider ibacmp 0xFE80000000000000\n"
        "Provider other default\n"
        "provider third 010\n"
    )
    opts, issues = parse(text)
    assert issues == []
    assert opts.provider_lib_path == "/opt/providers"
    assert opts.providers == [
        ProviderLine(name="ibacmp", default=False, prefix=0xFE80000000000000, line=2),
        ProviderLine(name="other", default=True, prefix=None, line=3),
        ProviderLine(name="third", default=False, prefix=8, line=4),
    ]


def test_bad_provider_lines_are_reported_and_ignored() -> None:
    opts, issues = parse("provider ibacmp\nprovider ibacmp nonsense\nproviderx a default\n")
    assert opts.providers == []
    assert [issue.line for issue in issues] == [1, 2, 3]
    assert "C would read it as a provider line" in issues[2].message


def test_tab_in_provider_line_is_read_but_reported() -> None:
    opts, issues = parse("provider\tibacmp\tdefault\n")
    assert opts.providers == [ProviderLine("ibacmp", True, None, 1)]
    assert len(issues) == 1 and "TAB" in issues[0].message


def test_unknown_keys_are_warnings_never_errors() -> None:
    opts, issues = parse("vendor_option 5\nsome_provider_key abc\n")
    assert opts == Options()
    assert [issue.severity for issue in issues] == ["warning", "warning"]
    assert "unknown key 'vendor_option'" in issues[0].message


def test_nul_ends_the_line_as_in_c() -> None:
    opts, issues = parse("log_level 2\0 junk\n")
    assert opts.log_level == 2
    assert "NUL" in issues[0].message


def test_sa_timeout_follows_timeout_unless_set() -> None:
    opts, _ = parse("timeout 900\nretries 6\n")
    assert (opts.effective_sa_timeout, opts.effective_sa_retries) == (900, 6)
    opts, issues = parse("timeout 900\nsa_timeout 150\nsa_retries 1\n")
    assert (opts.timeout, opts.effective_sa_timeout, opts.effective_sa_retries) == (900, 150, 1)
    assert issues == []


def test_extension_keys() -> None:
    text = """\
log_format json
run_dir /tmp/acm
cache_max_entries 100
cache_file /var/lib/ibacm/cache
cache_save_interval 60
join_retry_initial_ms 250
join_retry_max_ms 8000
route_bulk_preload yes
metrics_port 9100
capture_file /tmp/mads.erf
"""
    opts, issues = parse(text)
    assert issues == []
    assert opts.log_format is LogFormat.JSON
    assert opts.admin_socket_path == Path("/tmp/acm/ibacm-admin.sock")
    assert opts.run_paths.tcp_port_file == Path("/tmp/acm/ibacm-tcp.port")
    assert (opts.cache_max_entries, opts.cache_file, opts.cache_save_interval) == (
        100,
        "/var/lib/ibacm/cache",
        60,
    )
    assert (opts.join_retry_initial_ms, opts.join_retry_max_ms) == (250, 8000)
    assert opts.route_bulk_preload and opts.metrics_port == 9100
    assert opts.capture_file == "/tmp/mads.erf"
    opts, _ = parse("admin_socket /tmp/admin.sock\ncache_file none\n")
    assert opts.admin_socket_path == Path("/tmp/admin.sock") and opts.cache_file is None


def test_bad_extension_values_are_reported() -> None:
    opts, issues = parse(
        "join_retry_initial_ms 5000\njoin_retry_max_ms 1000\nroute_bulk_preload maybe\n"
        "log_format xml\nmetrics_port -1\nmetrics_port 70000\n"
    )
    assert opts.join_retry_max_ms == 5000
    assert not opts.route_bulk_preload
    assert opts.log_format is LogFormat.AUTO
    assert opts.metrics_port == 0
    assert sorted(issue.line for issue in issues) == [2, 3, 4, 5, 6]


def test_load_missing_file_gives_defaults(tmp_path: Path) -> None:
    assert load_options(tmp_path / "absent.cfg") == (Options(), [])


def test_load_unreadable_file_is_an_error(tmp_path: Path) -> None:
    opts, issues = load_options(tmp_path)  # a directory cannot be read as a file
    assert opts == Options()
    assert len(issues) == 1 and issues[0].severity == "error"
    assert str(issues[0]).startswith(f"{tmp_path}:0: cannot read option file")
    with pytest.raises(ConfigError) as caught:
        load_options(tmp_path, strict=True)
    assert caught.value.issues == issues


def test_load_reads_file_and_names_it_in_issues(tmp_path: Path) -> None:
    path = tmp_path / "ibacm_opts.cfg"
    path.write_bytes(b"log_file /var/log/caf\xe9.log\nmin_mtu 9000\n")
    opts, issues = load_options(str(path))
    assert opts.log_file.encode("utf-8", "surrogateescape") == b"/var/log/caf\xe9.log"
    assert str(issues[0]).startswith(f"{path}:2: min_mtu")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(max_size=150),
            st.builds(
                lambda key, value: f"{key} {value}",
                st.sampled_from([*sorted(KNOWN_KEYS), "Route_Timeout", "provider_lib_path"]),
                st.text(max_size=30),
            ),
        ),
        max_size=12,
    )
)
def test_parser_never_raises(lines: list[str]) -> None:
    opts, issues = parse_options("\n".join(lines), PATH)
    assert isinstance(opts, Options)
    assert all(issue.path == PATH and issue.line >= 0 for issue in issues)
    assert opts.join_retry_initial_ms <= opts.join_retry_max_ms
    assert min(opts.sa_depth, opts.resolve_depth, opts.send_depth, opts.recv_depth) >= 1
