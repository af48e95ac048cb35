"""IBA MTU and rate encodings, port width/speed to rate, option conversions.

``get_rate`` reproduces the C table (behavior.md §18) for SDR..EDR and widths 1x/4x/8x/12x and
extends it the way C should have (defect #47): lanes x per-lane rate, mapped to the IBA rate
enum, so HDR, NDR, XDR and the 2x width get real rates. It returns 0 only when no enum value
exists for the product (e.g. 12x XDR, 2400 Gb/s).
"""

from __future__ import annotations

from ibacm.wire.errors import FieldRangeError

MTU_BYTES: dict[int, int] = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}

# IBA / enum ibv_rate (kernel enum ib_rate for 25 = 1600 Gb/s).
_RATE_GBPS: dict[int, float] = {
    2: 2.5,
    3: 10.0,
    4: 30.0,
    5: 5.0,
    6: 20.0,
    7: 40.0,
    8: 60.0,
    9: 80.0,
    10: 120.0,
    11: 14.0,
    12: 56.0,
    13: 112.0,
    14: 168.0,
    15: 25.0,
    16: 100.0,
    17: 200.0,
    18: 300.0,
    19: 28.0,
    20: 50.0,
    21: 400.0,
    22: 600.0,
    23: 800.0,
    24: 1200.0,
    25: 1600.0,
}

# ibv_port_attr.active_width codes -> lanes.
_WIDTH_LANES: dict[int, int] = {1: 1, 2: 4, 4: 8, 8: 12, 16: 2}

# ibv_port_attr.active_speed codes -> Gb/s per lane, as the rate enum counts them (FDR10 runs
# 64b/66b at 10.3125 Gbaud = 10 Gb/s of data, which is why C puts it in the QDR column).
_SPEED_LANE_GBPS: dict[int, float] = {
    1: 2.5,  # SDR
    2: 5.0,  # DDR
    4: 10.0,  # QDR
    8: 10.0,  # FDR10
    16: 14.0,  # FDR
    32: 25.0,  # EDR
    64: 50.0,  # HDR
    128: 100.0,  # NDR
    256: 200.0,  # XDR
}

DEFAULT_MIN_MTU = 4  # 2048
DEFAULT_MIN_RATE = 3  # 10 Gb/s

# options.md §4: min_rate is given in whole Gb/s ("2" means 2.5).
MIN_RATE_OPTION: dict[int, int] = {
    2: 2,
    5: 5,
    10: 3,
    20: 6,
    30: 4,
    40: 7,
    60: 8,
    80: 9,
    120: 10,
    14: 11,
    56: 12,
    112: 13,
    168: 14,
    25: 15,
    100: 16,
    200: 17,
    300: 18,
}


def mtu_to_bytes(mtu: int) -> int:
    """IBA MTU enum (1..5) -> bytes."""
    try:
        return MTU_BYTES[mtu]
    except KeyError:
        raise FieldRangeError(f"mtu: {mtu} is not an IBA MTU enum (1..5)") from None


def bytes_to_mtu(size: int) -> int:
    """256/512/1024/2048/4096 -> IBA MTU enum."""
    for enum_value, mtu_bytes in MTU_BYTES.items():
        if mtu_bytes == size:
            return enum_value
    raise FieldRangeError(f"mtu: {size} bytes is not an IBA MTU (256..4096, powers of two)")


def rate_to_gbps(rate: int) -> float:
    """IBA rate enum -> Gb/s."""
    try:
        return _RATE_GBPS[rate]
    except KeyError:
        raise FieldRangeError(f"rate: {rate} is not an IBA rate enum") from None


def gbps_to_rate(gbps: float) -> int | None:
    """Gb/s -> IBA rate enum, or None when no enum value has exactly that rate."""
    for enum_value, value in _RATE_GBPS.items():
        if abs(value - gbps) < 1e-6:
            return enum_value
    return None


def width_lanes(code: int) -> int:
    """``active_width`` code (1, 2, 4, 8, 16) -> lanes (1, 4, 8, 12, 2)."""
    try:
        return _WIDTH_LANES[code]
    except KeyError:
        raise FieldRangeError(f"active_width: {code} is not a port width code") from None


def speed_lane_gbps(code: int) -> float:
    """``active_speed`` code (1 SDR .. 256 XDR) -> Gb/s per lane."""
    try:
        return _SPEED_LANE_GBPS[code]
    except KeyError:
        raise FieldRangeError(f"active_speed: {code} is not a port speed code") from None


def get_rate(active_width: int, active_speed: int) -> int:
    """The port's IBA rate enum from its width and speed codes; 0 = unknown/no enum."""
    lanes = _WIDTH_LANES.get(active_width)
    lane_gbps = _SPEED_LANE_GBPS.get(active_speed)
    if lanes is None or lane_gbps is None:
        return 0
    return gbps_to_rate(lanes * lane_gbps) or 0


def _atoi(value: int | str) -> int:
    """C ``atoi``: leading blanks, optional sign, digits up to the first non-digit, else 0."""
    if isinstance(value, int):
        return value
    text = value.lstrip(" \t\n\v\f\r")
    sign = 1
    if text[:1] in ("+", "-"):
        sign = -1 if text[0] == "-" else 1
        text = text[1:]
    digits = ""
    for char in text:
        if not "0" <= char <= "9":
            break
        digits += char
    return sign * int(digits) if digits else 0


def convert_min_mtu(value: int | str) -> tuple[int, bool]:
    """``min_mtu`` option (bytes, int or the option text) -> (MTU enum, valid).

    Invalid values give the default 4 (2048) and ``valid=False`` so the caller can warn
    (C silently uses 2048, defect #19).
    """
    size = _atoi(value)
    for enum_value, mtu_bytes in MTU_BYTES.items():
        if mtu_bytes == size:
            return enum_value, True
    return DEFAULT_MIN_MTU, False


def convert_min_rate(value: int | str) -> tuple[int, bool]:
    """``min_rate`` option (whole Gb/s, "2" = 2.5) -> (rate enum, valid); default 3 (10G)."""
    rate = MIN_RATE_OPTION.get(_atoi(value))
    if rate is None:
        return DEFAULT_MIN_RATE, False
    return rate, True
