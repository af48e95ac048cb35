"""The option definitions (``ibacm.config.options``): the extensions' defaults, what is
derived from them, the start-up summary and the reload groups."""

from __future__ import annotations

from pathlib import Path

from ibacm.config.option_file import parse_options
from ibacm.config.option_kinds import Reload
from ibacm.config.option_values import LogFormat
from ibacm.config.options import BY_KEY, KNOWN_KEYS, OPTIONS, Options, option_names


def parse(text: str) -> Options:
    opts, issues = parse_options(text, "opts.cfg")
    assert issues == []
    return opts


def test_extension_defaults() -> None:
    opts = Options()
    assert opts.min_mtu_bytes == 2048 and opts.min_rate_gbps == 10
    assert opts.effective_sa_timeout == 2000 and opts.effective_sa_retries == 2
    assert opts.admin_socket_path == Path("/run/ibacm-admin.sock")
    assert opts.run_paths.unix_socket == Path("/run/ibacm-unix.sock")
    assert opts.cache_max_entries == 65536 and opts.cache_file is None
    assert opts.log_format is LogFormat.AUTO and opts.metrics_port == 0
    assert not opts.route_bulk_preload and opts.capture_file is None
    assert opts.join_retry_initial_ms <= opts.join_retry_max_ms


def test_known_keys_produce_no_issue() -> None:
    assert {"log_file", "route_timeout", "provider", "sa_timeout"} <= KNOWN_KEYS


def test_each_option_is_defined_once_under_its_key() -> None:
    assert len(BY_KEY) == len(OPTIONS) == len({d.name for d in OPTIONS})
    assert BY_KEY["provider"].name == "providers"


def test_admin_socket_follows_run_dir_unless_set() -> None:
    assert Options(run_dir="/tmp/n1").admin_socket_path == Path("/tmp/n1/ibacm-admin.sock")
    assert Options(admin_socket="/tmp/a.sock").admin_socket_path == Path("/tmp/a.sock")


def test_reload_groups_partition_the_options() -> None:
    groups = [option_names(reload) for reload in Reload]
    assert sorted(name for group in groups for name in group) == sorted(d.name for d in OPTIONS)
    assert "log_level" in option_names(Reload.DAEMON)
    assert "server_mode" in option_names(Reload.RESTART, Reload.ENDPOINT)
    assert "server_mode" not in option_names(Reload.PROVIDER)


def test_summary_logs_the_core_settings_in_the_c_daemons_order() -> None:
    # options.md §3: ... sa depth, options file, addr file, provider lib path, support IP's.
    labels = [label for label, _ in Options().summary()][:14]
    assert labels == [
        "log file",
        "log level",
        "umad debug level",
        "lock file",
        "server_port",
        "server_mode",
        "acme_plus_kernel_only",
        "timeout",
        "retries",
        "sa depth",
        "options file",
        "addr file",
        "provider lib path",
        "support IP's in ibacm_addr.cfg",
    ]


def test_summary_lists_core_then_provider_settings() -> None:
    opts = parse("server_mode open\nroute_preload opensm_full_v1\nprovider x default\n")
    summary = opts.summary(options_file="/etc/o.cfg", addr_file="/etc/a.cfg")
    pairs = dict(summary)
    labels = [label for label, _ in summary]
    assert labels[0] == "log file" and labels.index("sa depth") < labels.index("address resolution")
    assert pairs["server_mode"] == "open"
    assert pairs["acme_plus_kernel_only"] == "no"
    assert pairs["options file"] == "/etc/o.cfg" and pairs["addr file"] == "/etc/a.cfg"
    assert pairs["route resolution"] == "1"  # enums as numbers, as the C provider logs
    assert pairs["route preload"] == "1"
    assert pairs["minimum mtu"] == "4" and pairs["minimum rate"] == "3"
    assert ("provider", "x default") in summary
