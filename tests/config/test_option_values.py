"""The values options take (``ibacm.config.option_values``): cache lifetimes, the MTU and
rate codes, and ``provider`` lines read and written back."""

from __future__ import annotations

import math

import pytest

from ibacm.config.errors import IssueSink
from ibacm.config.option_kinds import Setting
from ibacm.config.option_values import (
    MTU_ENUM,
    RATE_ENUM,
    RATE_GBPS,
    ProviderLine,
    ProviderLines,
    lifetime_seconds,
)
from ibacm.wire.rates import DEFAULT_MIN_MTU, DEFAULT_MIN_RATE, MTU_BYTES


@pytest.mark.parametrize(("minutes", "seconds"), [(0, 0.0), (1, 60.0), (1440, 86400.0)])
def test_lifetime_in_seconds(minutes: int, seconds: float) -> None:
    assert lifetime_seconds(minutes) == seconds


@pytest.mark.parametrize("minutes", [-1, -7, -(2**31)])
def test_every_negative_lifetime_is_never(minutes: int) -> None:
    # C stores now + (unsigned) minutes: any negative value is past every clock.
    assert lifetime_seconds(minutes) == math.inf


def test_codes_and_numbers_are_inverse() -> None:
    assert all(MTU_BYTES[code] == size for size, code in MTU_ENUM.items())
    assert all(RATE_GBPS[code] == gbps for gbps, code in RATE_ENUM.items())
    assert (MTU_BYTES[DEFAULT_MIN_MTU], RATE_GBPS[DEFAULT_MIN_RATE]) == (2048, 10)


def read(kind: ProviderLines, line: str, previous: list[ProviderLine]) -> list[ProviderLine]:
    sink = IssueSink("opts.cfg")
    tokens = tuple(line.split())
    setting = Setting(tokens[0], tokens[1], 7, sink, tokens=tokens)
    value = kind.parse(setting, previous, [])
    assert sink.issues == []
    return value


def test_provider_lines_add_up_in_file_order_and_write_back() -> None:
    kind = ProviderLines()
    first = read(kind, "provider ibacmp 0xfe80000000000000", [])
    both = read(kind, "provider other default", first)
    assert both == [
        ProviderLine("ibacmp", default=False, prefix=0xFE80000000000000, line=7),
        ProviderLine("other", default=True, prefix=None, line=7),
    ]
    assert kind.lines("provider", both) == [
        "provider ibacmp 0xFE80000000000000",
        "provider other default",
    ]
    assert kind.entries("provider", both)[0] == ("provider", "ibacmp 0xfe80000000000000")


def test_a_bad_provider_line_keeps_the_previous_ones_and_is_reported() -> None:
    kind = ProviderLines()
    previous = [ProviderLine("ibacmp", default=True, prefix=None, line=1)]
    sink = IssueSink("opts.cfg")
    setting = Setting("provider", "x", 3, sink, tokens=("provider", "x", "nonsense"))
    assert kind.parse(setting, previous, []) == previous
    assert sink.issues[0].line == 3 and "neither 'default' nor a subnet prefix" in str(
        sink.issues[0]
    )


@pytest.mark.parametrize("name", ["", "two words"])
def test_a_provider_name_no_file_can_hold_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="cannot be written"):
        ProviderLines().lines("provider", [ProviderLine(name, True, None, 1)])
