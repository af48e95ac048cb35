"""ib_acme's command line: GNU getopt semantics and the tool's quirks (ib_acme.md §1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibacm.tools.acme_cli import (
    Option,
    PerfMode,
    UsageError,
    c_atoi,
    getopt,
    parse_args,
)


def opts(*argv: str) -> list[tuple[str, str | None]]:
    options, _operands = getopt(argv)
    return [(o.name, o.value) for o in options]


# -- getopt -------------------------------------------------------------------------------


def test_optional_argument_attached() -> None:
    assert opts("-Pcol", "-e2", "-Amy.cfg") == [("P", "col"), ("e", "2"), ("A", "my.cfg")]


def test_optional_argument_from_the_next_word_stays_an_operand() -> None:
    options, operands = getopt(["-P", "col", "-e", "2"])
    assert options == [Option("P", "col"), Option("e", "2")]
    assert operands == ["col", "2"]  # C leaves them in argv, where they are ignored


def test_optional_argument_never_takes_an_option_or_the_end() -> None:
    assert opts("-P", "-e") == [("P", None), ("e", None)]
    assert opts("-O") == [("O", None)]


def test_required_argument_takes_the_next_word_whatever_it_is() -> None:
    assert opts("-s", "-d") == [("s", "-d")]
    assert opts("-d10.0.0.1") == [("d", "10.0.0.1")]


def test_clusters_of_flags() -> None:
    assert opts("-vcV") == [("v", None), ("c", None), ("V", None)]
    # An optional argument ends the cluster: "-Pv" is -P with argument "v".
    assert opts("-vPv") == [("v", None), ("P", "v")]
    assert opts("-vd", "x") == [("v", None), ("d", "x")]


def test_options_after_operands_are_still_options() -> None:
    options, operands = getopt(["stray", "-d", "x", "more"])
    assert options == [Option("d", "x")]
    assert operands == ["stray", "more"]


def test_double_dash_ends_the_options() -> None:
    options, operands = getopt(["-v", "--", "-d", "x"])
    assert options == [Option("v", None)]
    assert operands == ["-d", "x"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-x"], "invalid option -- 'x'"),
        (["-d"], "option requires an argument -- 'd'"),
        (["-v", "-S"], "option requires an argument -- 'S'"),
        (["--nope"], "unrecognized option '--nope'"),
        (["--run-dir"], "option '--run-dir' requires an argument"),
        (["--json=yes"], "option '--json' doesn't allow an argument"),
    ],
)
def test_getopt_errors_say_what_gnu_getopt_says(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as info:
        getopt(argv)
    assert str(info.value) == message


def test_long_options_with_equals_or_next_word() -> None:
    assert opts("--run-dir=/x", "--timeout", "2", "--json") == [
        ("run-dir", "/x"),
        ("timeout", "2"),
        ("json", None),
    ]


@pytest.mark.parametrize(
    ("text", "value"),
    [("12", 12), ("  7x", 7), ("-3", -3), ("+4", 4), ("abc", 0), ("", 0), ("4294967297", 1)],
)
def test_c_atoi(text: str, value: int) -> None:
    assert c_atoi(text) == value


# -- meaning ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "mode", "index"),
    [
        (["-P"], PerfMode.ROW, 0),
        (["-P", "col"], PerfMode.COL, 0),
        (["-PCOLUMNS"], PerfMode.COL, 0),
        (["-P", "All"], PerfMode.ALL, 0),
        (["-P", "s", "-s", "10.0.0.1"], PerfMode.ADDR, 0),
        (["-P", "3"], PerfMode.INDEX, 3),
        (["-P", "0"], PerfMode.ROW, 0),
        (["-P", "junk"], PerfMode.ROW, 0),
        (["-P", "co"], PerfMode.ROW, 0),
    ],
)
def test_perf_argument(argv: list[str], mode: PerfMode, index: int) -> None:
    settings = parse_args(argv)
    assert (settings.perf, settings.perf_index) == (mode, index)


def test_e_and_p_indices_are_independent() -> None:
    # C defect 55: one variable, so "-e 2 -P" asked for endpoint 2's counters.
    settings = parse_args(["-e", "2", "-P"])
    assert (settings.ep_index, settings.perf, settings.perf_index) == (2, PerfMode.ROW, 0)
    settings = parse_args(["-P", "3", "-e"])
    assert (settings.ep_index, settings.perf_index) == (0, 3)


def test_endpoint_indices_above_255_are_refused() -> None:
    with pytest.raises(UsageError, match="above 255"):
        parse_args(["-e", "256"])
    with pytest.raises(UsageError, match="above 255"):
        parse_args(["-P", "300"])


def test_repetitions() -> None:
    assert parse_args(["-d", "x", "-C", "0"]).repetitions == 1
    assert parse_args(["-d", "x", "-C", "25"]).repetitions == 25
    with pytest.raises(UsageError, match="negative"):
        parse_args(["-d", "x", "-C", "-2"])


@pytest.mark.parametrize(("value", "fmt"), [("i", "i"), ("name", "n"), ("l", "l"), ("g", "g")])
def test_format_uses_the_first_character(value: str, fmt: str) -> None:
    assert parse_args(["-f", value, "-d", "x"]).fmt == fmt


@pytest.mark.parametrize("value", ["x", "", "p4", "u"])
def test_other_formats_are_usage_errors(value: str) -> None:
    with pytest.raises(UsageError, match="address format"):
        parse_args(["-f", value, "-d", "x"])


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["-v"],
        ["-s", "10.0.0.1"],
        ["-s", "10.0.0.1", "-P"],
        ["-P", "s"],
        ["-V", "-D", "/tmp"],
    ],
)
def test_c_usage_checks(argv: list[str]) -> None:
    with pytest.raises(UsageError):
        parse_args(argv)


@pytest.mark.parametrize(
    "argv",
    [["-d", "x"], ["-P"], ["-e"], ["-A"], ["-O"], ["-P", "s", "-s", "n1"], ["-s", "a", "-d", "b"]],
)
def test_accepted_combinations(argv: list[str]) -> None:
    parse_args(argv)


def test_generation_defaults_and_names() -> None:
    settings = parse_args(["-A", "-O", "opts.cfg", "-D", "out"])
    assert (settings.make_addr, settings.addr_file) == (True, "ibacm_addr.cfg")
    assert (settings.make_opts, settings.opts_file) == (True, "opts.cfg")
    assert settings.dest_dir == "out"
    assert parse_args(["-O"]).dest_dir == "/etc/rdma"


def test_default_service_follows_the_run_dir() -> None:
    assert parse_args(["-P"]).services == "/run/ibacm-unix.sock"
    assert parse_args(["-P", "--run-dir", "/var/x"]).services == "/var/x/ibacm-unix.sock"
    assert parse_args(["-P", "-S", "host[1-2]"]).services == "host[1-2]"


def test_extension_options() -> None:
    settings = parse_args(["-A", "--fabric", "sim", "--sim-dir", "d", "--sim-node", "node2"])
    assert (settings.fabric, settings.sim_dir, settings.sim_node) == ("sim", Path("d"), "node2")
    assert parse_args(["-P", "--timeout", "2.5"]).timeout == 2.5
    with pytest.raises(UsageError, match="--sim-dir"):
        parse_args(["-A", "--fabric", "sim"])
    with pytest.raises(UsageError, match="neither"):
        parse_args(["-A", "--fabric", "ethernet"])
    with pytest.raises(UsageError, match="positive"):
        parse_args(["-P", "--timeout", "0"])
    with pytest.raises(UsageError, match="not a number"):
        parse_args(["-P", "--timeout", "soon"])
