"""The values options take beyond plain numbers and text: the C daemon's enums (same
numbers), the MTU and rate codes of ``min_mtu``/``min_rate``, and ``provider`` lines.

The option definitions (``ibacm.config.c_options``, ``ibacm.config.options``) use them as
their types; code that acts on a setting compares against them.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from ibacm.config import cnumbers
from ibacm.config.ctext import c_lower
from ibacm.config.errors import IssueSink
from ibacm.config.option_kinds import Kind, Setting
from ibacm.wire.rates import MIN_RATE_OPTION, MTU_BYTES


class ServerMode(enum.IntEnum):
    """Which client socket the daemon listens on (values as ``IBACM_SERVER_MODE_*``)."""

    UNIX = 0
    LOOP = 1
    OPEN = 2


class AddrProt(enum.Enum):
    """Address resolution protocol (ACM is the only one); values as the C enum."""

    ACM = 0


class RouteProt(enum.Enum):
    """How a path record is obtained once the address is known; values as the C enum."""

    ACM = 0
    SA = 1


class LoopbackProt(enum.Enum):
    """How local addresses are resolved; values as the C enum."""

    NONE = 0
    LOCAL = 1


class ProviderPrefer(enum.Enum):
    """Which of two providers of one name is loaded (``provider_prefer``)."""

    PYTHON = "python"
    LIBRARY = "library"


class RoutePreload(enum.Enum):
    """Route cache preloading; values as the C enum."""

    NONE = 0
    OPENSM_FULL_V1 = 1


class AddrPreload(enum.Enum):
    """Address cache preloading; values as the C enum."""

    NONE = 0
    ACM_HOSTS = 1


class LogFormat(enum.Enum):
    """Log record format (extension)."""

    AUTO = "auto"
    JSON = "json"
    CONSOLE = "console"


# min_mtu in bytes -> IBA MTU enum; anything else becomes 2048 (enum 4) as in C.
MTU_ENUM: dict[int, int] = {size: enum_ for enum_, size in MTU_BYTES.items()}
# min_rate in Gb/s (2 means 2.5) -> IBA rate enum, by Gb/s; anything else becomes 10 (enum 3)
# as in C.
RATE_ENUM: dict[int, int] = dict(sorted(MIN_RATE_OPTION.items()))
RATE_GBPS: dict[int, int] = {enum_: gbps for gbps, enum_ in RATE_ENUM.items()}


def lifetime_seconds(minutes: int) -> float:
    """Seconds a cache entry lives for an ``addr_timeout``/``route_timeout`` value.

    C stores ``now + (unsigned) minutes``, so every negative value means "never" (inf).
    """
    return math.inf if minutes < 0 else minutes * 60.0


@dataclass
class ProviderLine:
    """``provider <name> default`` (default=True) or ``provider <name> <prefix>``."""

    name: str
    default: bool
    prefix: int | None
    line: int = field(compare=False)
    """Where it was read; not part of the setting (moving the line changes nothing)."""


class ProviderLines(Kind[list[ProviderLine]]):
    """``provider`` lines (acm_load_prov_config): each line adds one, in file order."""

    whole_line = True

    def parse(
        self, s: Setting, previous: list[ProviderLine], default: list[ProviderLine]
    ) -> list[ProviderLine]:
        line = _provider_line(list(s.tokens), s.line, s.sink)
        return previous if line is None else [*previous, line]

    def text(self, value: list[ProviderLine]) -> str:
        return "\n".join(self.lines("provider", value))

    def lines(self, key: str, value: list[ProviderLine]) -> list[str]:
        written = []
        for p in value:
            if not p.name or any(char in cnumbers.C_SPACE for char in p.name):
                raise ValueError(f"provider name {p.name!r} cannot be written in an option file")
            which = "default" if p.default else f"0x{p.prefix or 0:016X}"
            written.append(f"{key} {p.name} {which}")
        return written

    def entries(self, label: str, value: list[ProviderLine]) -> list[tuple[str, str]]:
        return [
            (label, f"{p.name} {'default' if p.default else f'0x{p.prefix or 0:016x}'}")
            for p in value
        ]


def _provider_line(tokens: list[str], line: int, sink: IssueSink) -> ProviderLine | None:
    if len(tokens) < 3:
        sink.warn(line, "provider line needs a name and 'default' or a subnet prefix; ignored")
        return None
    name, which = tokens[1], tokens[2]
    if c_lower(which).startswith("default"):
        if c_lower(which) != "default":
            sink.warn(line, f"provider {name}: {which!r} read as 'default' (C checks 7 letters)")
        return ProviderLine(name=name, default=True, prefix=None, line=line)
    number = cnumbers.strtoul(which, 0)
    if not number.converted:
        sink.warn(line, f"provider {name}: {which!r} is neither 'default' nor a subnet prefix")
        return None
    if number.overflow or which[number.end :] or which.startswith("-"):
        sink.warn(
            line,
            f"provider {name}: subnet prefix {which!r} is not a plain 64-bit number; "
            f"using 0x{number.value:016x} (C strtoull)",
        )
    return ProviderLine(name=name, default=False, prefix=number.value, line=line)
