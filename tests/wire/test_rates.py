"""Rate/MTU helpers: the C table of behavior.md §18, its HDR..XDR/2x extension, options."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ibacm.wire.errors import FieldRangeError
from ibacm.wire.rates import (
    bytes_to_mtu,
    convert_min_mtu,
    convert_min_rate,
    gbps_to_rate,
    get_rate,
    mtu_to_bytes,
    rate_to_gbps,
    speed_lane_gbps,
    width_lanes,
)

# behavior.md §18, rows = width code, columns = speed codes 1, 2, 4, 8, 16, 32.
C_TABLE = {
    1: [2, 5, 3, 3, 11, 15],
    2: [3, 6, 7, 7, 12, 16],
    4: [6, 7, 9, 9, 13, 17],
    8: [4, 8, 10, 10, 14, 18],
}


@pytest.mark.parametrize("width", sorted(C_TABLE))
def test_c_table_reproduced(width: int) -> None:
    assert [get_rate(width, speed) for speed in (1, 2, 4, 8, 16, 32)] == C_TABLE[width]


@pytest.mark.parametrize(
    ("width", "speed", "rate"),
    [
        (1, 64, 20),  # 1x HDR 50G
        (16, 64, 16),  # 2x HDR 100G
        (2, 64, 17),  # 4x HDR 200G
        (4, 64, 21),  # 8x HDR 400G
        (8, 64, 22),  # 12x HDR 600G
        (2, 128, 21),  # 4x NDR 400G
        (4, 128, 23),  # 8x NDR 800G
        (8, 128, 24),  # 12x NDR 1200G
        (2, 256, 23),  # 4x XDR 800G
        (4, 256, 25),  # 8x XDR 1600G
        (16, 1, 5),  # 2x SDR 5G
        (16, 16, 19),  # 2x FDR 28G
        (16, 32, 20),  # 2x EDR 50G
        (8, 256, 0),  # 12x XDR 2400G: no enum exists
        (3, 1, 0),  # unknown width
        (1, 3, 0),  # unknown speed
    ],
)
def test_beyond_edr(width: int, speed: int, rate: int) -> None:
    assert get_rate(width, speed) == rate


def test_enum_tables() -> None:
    assert [mtu_to_bytes(m) for m in range(1, 6)] == [256, 512, 1024, 2048, 4096]
    assert bytes_to_mtu(4096) == 5
    assert rate_to_gbps(2) == 2.5 and rate_to_gbps(19) == 28 and rate_to_gbps(24) == 1200
    assert gbps_to_rate(2.5) == 2 and gbps_to_rate(600) == 22 and gbps_to_rate(7) is None
    assert all(gbps_to_rate(rate_to_gbps(r)) == r for r in range(2, 26))
    assert [width_lanes(c) for c in (1, 2, 4, 8, 16)] == [1, 4, 8, 12, 2]
    assert speed_lane_gbps(8) == 10 and speed_lane_gbps(256) == 200
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: mtu_to_bytes(6), "mtu: 6 is not an IBA MTU enum"),
        (lambda: bytes_to_mtu(1500), "mtu: 1500 bytes is not an IBA MTU"),
        (lambda: rate_to_gbps(1), "rate: 1 is not an IBA rate enum"),
        (lambda: width_lanes(3), "active_width: 3"),
        (lambda: speed_lane_gbps(3), "active_speed: 3"),
    ]
    for call, message in cases:
        with pytest.raises(FieldRangeError, match=message):
            call()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (256, (1, True)),
        (512, (2, True)),
        ("1024", (3, True)),
        (" 2048", (4, True)),
        ("4096abc", (5, True)),  # atoi stops at the first non-digit
        (1500, (4, False)),
        ("big", (4, False)),
        ("", (4, False)),
    ],
)
def test_convert_min_mtu(value: int | str, expected: tuple[int, bool]) -> None:
    assert convert_min_mtu(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (2, 2),
        (5, 5),
        (10, 3),
        (14, 11),
        (20, 6),
        (25, 15),
        (30, 4),
        (40, 7),
        (56, 12),
        (60, 8),
        (80, 9),
        (100, 16),
        (112, 13),
        (120, 10),
        (168, 14),
        (200, 17),
        ("300", 18),
        ("2.5", 2),  # atoi reads 2, the spelling of 2.5 Gb/s
    ],
)
def test_convert_min_rate_table(value: int | str, expected: int) -> None:
    assert convert_min_rate(value) == (expected, True)


@pytest.mark.parametrize("value", [0, 3, 400, "-10", "fast", ""])
def test_convert_min_rate_invalid(value: int | str) -> None:
    assert convert_min_rate(value) == (3, False)
