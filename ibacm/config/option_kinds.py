"""What one option of ``ibacm_opts.cfg`` is: its kind of value, who reads it, what a reload
does with it and its help text, gathered in one ``OptionDef``.

``option()`` attaches an ``OptionDef`` to a field of ``ibacm.config.options.Options`` (the C
daemon's keys are the fields it inherits from ``ibacm.config.c_options.COptions``); the
parser, the start-up summary, the generated option file (``ib_acme -O``), the daemon's reload
groups and the documentation checks all read the definitions from there.

A ``Kind`` reads a value as the C daemon does (``atoi``, case-insensitive keywords, its
fallbacks) and writes it back as the file spells it. A value the C daemon would misread is an
error (the daemon does not start with it, a reload is refused) or, where C's reading is
harmless, a warning.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar, cast

from ibacm.config import cnumbers
from ibacm.config.ctext import c_lower
from ibacm.config.errors import IssueSink

T = TypeVar("T")
E = TypeVar("E", bound=enum.Enum)
N = TypeVar("N", int, int | None)
"""An integer option, or one that may be unset (``None``: it follows another option)."""

OPTION = "ibacm.option"
"""The key of a field's ``metadata`` that holds its ``OptionDef``."""


class Reload(enum.Enum):
    """What a reload (SIGHUP, the admin socket's ``reload``) does with a changed option."""

    RESTART = "restart"
    """The running daemon cannot change it: a reload reports it and keeps the running value."""
    ENDPOINT = "endpoint"
    """Built into an endpoint when it opens (its QP, groups, preloads, cache): as RESTART."""
    DAEMON = "daemon"
    """Applied by the daemon itself."""
    PROVIDER = "provider"
    """Applied by the providers (``Provider.options_changed``) to their open endpoints."""


class ReadBy(enum.Flag):
    """Which parser of the C daemon reads a key (options.md §2), or none: an extension.
    The start-up summary logs them in this order, as the C daemon does."""

    CORE = enum.auto()
    """acm.c ``acm_set_options`` (options.md §3)."""
    PROVIDER = enum.auto()
    """The default provider, acmp.c ``acmp_set_options`` (options.md §4)."""
    PROVIDER_LINES = enum.auto()
    """acm.c ``acm_load_prov_config`` (options.md §5)."""
    EXTENSION = enum.auto()
    """Nobody: a key of this implementation only, which the C daemon ignores."""


@dataclass
class Setting:
    """One ``key value`` line being applied."""

    key: str
    value: str
    line: int
    sink: IssueSink
    tokens: tuple[str, ...] = ()
    """Every token of the line (``key value ...``), for kinds that read a whole line."""
    invalid: bool = False

    def warn(self, message: str) -> None:
        self.sink.warn(self.line, f"{self.key} {message}")

    def error(self, message: str) -> None:
        """An invalid value: the daemon does not start with it, a reload is refused.

        Only the first error of a line is kept: the checks after it judge the value the
        first one made up ("banana" read as 0), which the line never said."""
        if not self.invalid:
            self.invalid = True
            self.sink.error(self.line, f"{self.key} {message}")

    def c_int(self) -> int:
        """The value as C ``atoi`` reads it; an error when that is not the number written."""
        number = cnumbers.atoi(self.value)
        problem = cnumbers.atoi_problem(self.value)
        if problem is not None:
            self.error(
                f"value {self.value!r} {problem} (accepted: an integer); "
                f"the C daemon would silently use {number} (atoi)"
            )
        return number


class Kind(abc.ABC, Generic[T]):
    """How values of one option are read from the file and written back."""

    whole_line: ClassVar[bool] = False
    """True: the kind reads every token of its line (``Setting.tokens``), not just a value."""

    @abc.abstractmethod
    def parse(self, s: Setting, previous: T, default: T) -> T:
        """The value a line sets; ``previous`` is the value before it, ``default`` the
        option's default (kinds that fall back use one of them)."""

    @abc.abstractmethod
    def text(self, value: T) -> str:
        """The value as the option file spells it; "" = unset (no line is written)."""

    def shown(self, value: T) -> str:
        """The value in the start-up summary."""
        return self.text(value)

    def lines(self, key: str, value: T) -> list[str]:
        """The lines of the option file that set ``value``."""
        written = self.text(value)
        return [f"{key} {written}"] if written else []

    def entries(self, label: str, value: T) -> list[tuple[str, str]]:
        """The (label, value) pairs of the start-up summary."""
        return [(label, self.shown(value))]


def yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


class Text(Kind[str]):
    """A word or path, taken as written."""

    def parse(self, s: Setting, previous: str, default: str) -> str:
        return s.value

    def text(self, value: str) -> str:
        return value


class LogFile(Text):
    """A path, or ``stdout``/``stderr``, which C matches case-insensitively: stored in one
    spelling."""

    def parse(self, s: Setting, previous: str, default: str) -> str:
        word = c_lower(s.value)
        return word if word in ("stdout", "stderr") else s.value


class UnsetText(Kind[str | None]):
    """A path extension that is unset (``None``) until written; unset, it follows another
    setting (``OptionDef.follows``)."""

    def parse(self, s: Setting, previous: str | None, default: str | None) -> str | None:
        return s.value

    def text(self, value: str | None) -> str:
        return value or ""


class OptionalPath(Kind[str | None]):
    """A path extension where ``none`` (any case) means "not configured"."""

    def parse(self, s: Setting, previous: str | None, default: str | None) -> str | None:
        return None if c_lower(s.value) == "none" else s.value

    def text(self, value: str | None) -> str:
        return value or "none"


@dataclass(frozen=True)
class Integer(Kind[N]):
    """An ``atoi`` integer; outside [minimum, maximum] it is an error and the nearest limit
    is used, or the option's default when ``clamp`` is false."""

    minimum: int | None = None
    maximum: int | None = None
    clamp: bool = True

    def parse(self, s: Setting, previous: N, default: N) -> N:
        number = s.c_int()
        low, high = self.minimum, self.maximum
        accepted = f"{'' if low is None else low}..{'' if high is None else high}"
        if low is not None and number < low:
            s.error(
                f"value {number} is below {low} and would not work (accepted: {accepted}); "
                f"the C daemon would use {number}"
            )
            return low if self.clamp else default
        if high is not None and number > high:
            s.error(f"value {number} is above {high} (accepted: {accepted})")
            return high if self.clamp else default
        return number

    def text(self, value: N) -> str:
        return "" if value is None else str(value)


class Timeout(Kind[N]):
    """A timeout in ms, at least 1: with 0 or less no request could ever be answered."""

    def parse(self, s: Setting, previous: N, default: N) -> N:
        number = s.c_int()
        if number < 1:
            shown = "following timeout" if previous is None else str(previous)
            s.error(
                f"value {number} makes every request time out (accepted: 1.. milliseconds); "
                f"the C daemon would use {number}; keeping {shown}"
            )
            return previous
        return number

    def text(self, value: N) -> str:
        return "" if value is None else str(value)


class Lifetime(Kind[int]):
    """Minutes a cache entry lives; -1 = never expires (C: every negative value does)."""

    def parse(self, s: Setting, previous: int, default: int) -> int:
        number = s.c_int()
        if number < -1:
            s.error(
                f"value {number} is below -1 (accepted: -1 = never expire, or 0.. minutes); "
                "the C daemon would never expire entries"
            )
        return number

    def text(self, value: int) -> str:
        return str(value)


class Port(Kind[int]):
    """A TCP port; C reads ``(short) atoi()`` and binds it as an unsigned 16-bit port."""

    def parse(self, s: Setting, previous: int, default: int) -> int:
        number = s.c_int()
        port = number & 0xFFFF
        if not 0 <= number <= 0xFFFF:
            s.error(
                f"value {number} is not a TCP port (accepted: 0..65535, 0 = any free port); "
                f"the C daemon would use {port}"
            )
        return port

    def text(self, value: int) -> str:
        return str(value)


@dataclass(frozen=True)
class Keyword(Kind[E]):
    """A keyword (case-insensitive). An unknown one keeps the previous value, as acmp.c does,
    or, with ``fallback``, uses it, as acm.c does. The file spells a value with its first
    keyword in ``table``; ``numbered`` values are logged as numbers (the C provider's enums).
    ``aliases``: other spellings accepted with a warning (member, where the spelling comes
    from)."""

    table: Mapping[str, E]
    numbered: bool = False
    fallback: E | None = None
    aliases: Mapping[str, tuple[E, str]] = dataclasses.field(default_factory=dict)

    def parse(self, s: Setting, previous: E, default: E) -> E:
        word = c_lower(s.value)
        if word in self.aliases:
            member, origin = self.aliases[word]
            usual = self.text(member)
            s.warn(
                f"value {s.value!r} ({origin}) accepted as {usual}; the C daemon accepts only "
                f"{usual} and would ignore it"
            )
            return member
        chosen = self.table.get(word)
        if chosen is not None:
            return chosen
        if self.fallback is not None:
            allowed = ", ".join(self.table)
            s.error(
                f"value {s.value!r} is not one of {allowed}; "
                f"the C daemon would use {self.text(self.fallback)}"
            )
            return self.fallback
        s.error(
            f"value {s.value!r} is not one of {', '.join(sorted(self.table))}; "
            f"the C daemon would keep {self.text(previous)}"
        )
        return previous

    def text(self, value: E) -> str:
        return next(word for word, member in self.table.items() if member is value)

    def shown(self, value: E) -> str:
        return str(value.value) if self.numbered else self.text(value)


@dataclass(frozen=True)
class Coded(Kind[int]):
    """A number of a fixed set stored as its IBA code (``table``: number -> code), as the C
    provider stores min_mtu and min_rate; any other number becomes ``fallback``'s code, as in
    C, with an error. Logged as the code, as C logs it."""

    table: Mapping[int, int]
    fallback: int

    def parse(self, s: Setting, previous: int, default: int) -> int:
        number = s.c_int()
        if number not in self.table:
            allowed = ", ".join(str(n) for n in self.table)  # tables are in number order
            s.error(
                f"value {s.value!r} is not one of {allowed}; the C daemon would use {self.fallback}"
            )
        return self.table.get(number, self.table[self.fallback])

    def text(self, value: int) -> str:
        numbers = {code: number for number, code in self.table.items()}
        return str(numbers.get(value, self.fallback))

    def shown(self, value: int) -> str:
        return str(value)


class CFlag(Kind[bool]):
    """acm.c's flag: "true", "yes" or ``strtol(value, 0) != 0``, exactly as C."""

    def parse(self, s: Setting, previous: bool, default: bool) -> bool:
        word = c_lower(s.value)
        number = cnumbers.strtol(s.value, 0)
        flag = word in ("true", "yes") or number.value != 0
        if word not in ("true", "yes", "false", "no") and (
            not number.converted or s.value[number.end :]
        ):
            s.error(
                f"value {s.value!r} is not yes/no/true/false or a number; "
                f"the C daemon would use {yes_no(flag)}"
            )
        return flag

    def text(self, value: bool) -> str:
        return yes_no(value)


class IntFlag(Kind[bool]):
    """A flag read with ``atoi``: non-zero is yes; written 0 or 1."""

    def parse(self, s: Setting, previous: bool, default: bool) -> bool:
        return s.c_int() != 0

    def text(self, value: bool) -> str:
        return str(int(value))


class YesNo(Kind[bool]):
    """A boolean extension: yes/true/on/1 or no/false/off/0; anything else keeps the
    previous value."""

    def parse(self, s: Setting, previous: bool, default: bool) -> bool:
        word = c_lower(s.value)
        if word in ("yes", "true", "on", "1"):
            return True
        if word in ("no", "false", "off", "0"):
            return False
        s.error(f"value {s.value!r} is not yes or no (accepted: yes, no, true, false, on, off)")
        return previous

    def text(self, value: bool) -> str:
        return yes_no(value)


@dataclass(frozen=True)
class OptionDef:
    """Everything about one option; ``name`` (the ``Options`` field) is filled in from the
    field."""

    kind: Kind[Any]
    reload: Reload
    read_by: ReadBy
    label: str
    """Its name in the start-up summary (the C daemon's log wording for C keys)."""
    help: tuple[str, ...]
    """The explanation written above it in the generated option file, one line each."""
    examples: tuple[str, ...] = ()
    active: bool = False
    """Written uncommented in the generated option file even at its default, as the C
    ``ib_acme -O`` writes it; otherwise written commented unless it differs."""
    follows: str | None = None
    """While unset (``None``), the value of this ``Options`` attribute applies."""
    case_sensitive: bool = False
    """The key must be written in lowercase (C compares it case-sensitively)."""
    key: str = ""
    """The key in the file ("" = the field's name)."""
    name: str = ""
    default: Any = None


def option(
    kind: Kind[T],
    default: T,
    *,
    reload: Reload,
    read_by: ReadBy,
    label: str,
    help: str | tuple[str, ...],
    examples: tuple[str, ...] = (),
    active: bool = False,
    follows: str | None = None,
    case_sensitive: bool = False,
    key: str = "",
) -> T:
    """A field of ``Options`` defined as an option (its type, default and all the rest)."""
    definition = OptionDef(
        kind=kind,
        reload=reload,
        read_by=read_by,
        label=label,
        help=(help,) if isinstance(help, str) else help,
        examples=examples,
        active=active,
        follows=follows,
        case_sensitive=case_sensitive,
        key=key,
    )
    metadata = {OPTION: definition}
    made: Any
    if isinstance(default, list):
        # A list default must be a fresh copy for each Options (dataclasses' rule).
        items = list(default)
        made = dataclasses.field(default_factory=lambda: list(items), metadata=metadata)
    else:
        made = dataclasses.field(default=default, metadata=metadata)
    # The dataclass turns this Field into the attribute's default; to the type checker the
    # attribute is a plain T.
    return cast(T, made)


def definitions(cls: type) -> tuple[OptionDef, ...]:
    """The ``OptionDef`` of every option field of the dataclass ``cls``, in field order,
    with its name, key and default filled in."""
    found = []
    instance = cls()
    for field in dataclasses.fields(cls):
        definition = field.metadata.get(OPTION)
        if definition is None:
            continue
        found.append(
            dataclasses.replace(
                definition,
                name=field.name,
                key=definition.key or field.name,
                default=getattr(instance, field.name),
            )
        )
    return tuple(found)
