"""``ib_acme``'s command line: GNU ``getopt`` with the tool's quirks, and what it asks for.

Option string ``e::f:s:d:vcA::O::D:P::S:C:V`` (ib_acme.md §1). Optional arguments are attached
(``-Pcol``) or the next word when it does not start with ``-`` (``-P col``); options may come
anywhere; numbers are read like C's ``atoi``. Differences from C, all for bad input or defects:
``-f u`` is accepted, ``-e N`` and ``-P N`` are kept apart (defect 55), endpoint indices above
255 and negative ``-C`` counts are refused with a message instead of being truncated.
Long options are this tool's extensions; the C tool has none.
"""

from __future__ import annotations

import argparse
import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ibacm.config.paths import SYSCONFDIR
from ibacm.tools.libacm import DEFAULT_RUNDIR, DEFAULT_TIMEOUT, default_service

PROG = "ib_acme"
DEFAULT_ADDR_NAME = "ibacm_addr.cfg"
DEFAULT_OPTS_NAME = "ibacm_opts.cfg"
OPTSTRING = "e::f:s:d:vcA::O::D:P::S:C:V"
LONG_OPTIONS: dict[str, bool] = {
    # name -> takes an argument
    "json": False,
    "run-dir": True,
    "timeout": True,
    "fabric": True,
    "sim-dir": True,
    "sim-node": True,
    "help": False,
}
MAX_INDEX = 0xFF  # endpoint indices travel in one header byte
FORMATS = "inlg"
"""``-f``: i(p), n(ame), l(id), g(id); only the first letter counts."""
FABRICS = ("hw", "sim")
"""``--fabric``: where ``-A`` finds devices."""


class UsageError(Exception):
    """The command line is wrong: usage is printed and the exit status is 1.

    An empty message means "just print the usage", as the C tool does for its own checks.
    """


@dataclass(frozen=True, slots=True)
class Option:
    name: str
    """One letter for short options, the long name for ``--name``."""
    value: str | None


def _parse_optstring(optstring: str) -> dict[str, int]:
    """Letter -> 0 (no argument), 1 (required), 2 (optional), as getopt reads ``x:``/``x::``."""
    spec: dict[str, int] = {}
    i = 0
    while i < len(optstring):
        letter = optstring[i]
        colons = len(optstring[i + 1 :]) - len(optstring[i + 1 :].lstrip(":"))
        spec[letter] = min(colons, 2)
        i += 1 + colons
    return spec


def getopt(
    argv: Sequence[str],
    optstring: str = OPTSTRING,
    long_options: dict[str, bool] | None = None,
) -> tuple[list[Option], list[str]]:
    """GNU ``getopt`` as ib_acme uses it: options anywhere, ``--`` ends them.

    An optional argument (``x::``) is the rest of its word (``-Pcol``) or, ib_acme's own
    convention, the next word if that does not start with ``-`` (``-P col``); that word is
    still returned among the operands, which ib_acme ignores. A required argument is the rest
    of the word or the next word, whatever it is. Raises UsageError with getopt's message.
    """
    spec = _parse_optstring(optstring)
    longs = LONG_OPTIONS if long_options is None else long_options
    options: list[Option] = []
    operands: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            operands.extend(argv[i + 1 :])
            break
        if word.startswith("--"):
            i = _long_option(argv, i, longs, options)
            continue
        if not word.startswith("-") or word == "-":
            operands.append(word)
            i += 1
            continue
        i = _short_cluster(argv, i, spec, options)
    return options, operands


def _long_option(argv: Sequence[str], i: int, longs: dict[str, bool], out: list[Option]) -> int:
    name, eq, value = argv[i][2:].partition("=")
    if name not in longs:
        raise UsageError(f"unrecognized option '--{name}'")
    if not longs[name]:
        if eq:
            raise UsageError(f"option '--{name}' doesn't allow an argument")
        out.append(Option(name, None))
        return i + 1
    if eq:
        out.append(Option(name, value))
        return i + 1
    if i + 1 >= len(argv):
        raise UsageError(f"option '--{name}' requires an argument")
    out.append(Option(name, argv[i + 1]))
    return i + 2


def _short_cluster(argv: Sequence[str], i: int, spec: dict[str, int], out: list[Option]) -> int:
    word = argv[i]
    pos = 1
    while pos < len(word):
        letter = word[pos]
        rest = word[pos + 1 :]
        kind = spec.get(letter)
        if kind is None or letter == ":":
            raise UsageError(f"invalid option -- '{letter}'")
        if kind == 0:
            out.append(Option(letter, None))
            pos += 1
            continue
        if rest:
            out.append(Option(letter, rest))
            return i + 1
        if kind == 1:
            if i + 1 >= len(argv):
                raise UsageError(f"option requires an argument -- '{letter}'")
            out.append(Option(letter, argv[i + 1]))
            return i + 2
        following = argv[i + 1] if i + 1 < len(argv) else None
        usable = following is not None and not following.startswith("-")
        out.append(Option(letter, following if usable else None))
        return i + 1
    return i + 1


_ATOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def c_atoi(text: str) -> int:
    """C's ``atoi``: leading blanks, a sign, digits, anything after ignored; 0 if none."""
    match = _ATOI.match(text)
    if match is None:
        return 0
    value = max(-(2**63), min(int(match.group(1)), 2**63 - 1))  # strtol saturates
    value &= 0xFFFFFFFF  # then the long is cut to an int
    return value - 2**32 if value >= 2**31 else value


class PerfMode(enum.Enum):
    NONE = "none"
    ROW = "row"
    COL = "col"
    INDEX = "index"
    ALL = "all"
    ADDR = "addr"


@dataclass(slots=True)
class Settings:
    """Everything the command line asked for."""

    fmt: str = "u"
    src_arg: str | None = None
    dest_arg: str | None = None
    verify: bool = False
    nodelay: bool = False
    repetitions: int = 1
    enum_ep: bool = False
    ep_index: int = 0
    perf: PerfMode = PerfMode.NONE
    perf_index: int = 0
    service: str | None = None
    make_addr: bool = False
    addr_file: str = DEFAULT_ADDR_NAME
    make_opts: bool = False
    opts_file: str = DEFAULT_OPTS_NAME
    dest_dir: str = SYSCONFDIR
    verbose: bool = False
    json: bool = False
    run_dir: Path = DEFAULT_RUNDIR
    timeout: float = DEFAULT_TIMEOUT
    fabric: str = "hw"
    sim_dir: Path | None = None
    sim_node: str | None = None
    help: bool = False

    @property
    def services(self) -> str:
        return self.service if self.service is not None else default_service(self.run_dir)


def _index_arg(flag: str, value: str) -> int:
    index = c_atoi(value)
    if index > MAX_INDEX:
        raise UsageError(f"-{flag}: endpoint index {index} is above {MAX_INDEX}")
    return max(index, 0)


def _perf_arg(settings: Settings, value: str | None) -> None:
    """``-P``: col / all (3-letter prefix, any case), exactly ``s``, a number, or nothing."""
    settings.perf_index = 0
    if value is None:
        settings.perf = PerfMode.ROW
    elif value[:3].lower() == "col":
        settings.perf = PerfMode.COL
    elif value[:3].lower() == "all":
        settings.perf = PerfMode.ALL
    elif value == "s":
        settings.perf = PerfMode.ADDR
    else:
        settings.perf_index = _index_arg("P", value)
        settings.perf = PerfMode.INDEX if settings.perf_index > 0 else PerfMode.ROW


def _apply_short(settings: Settings, letter: str, value: str | None) -> None:
    if letter == "e":
        settings.enum_ep = True
        if value is not None:
            settings.ep_index = _index_arg("e", value)
    elif letter == "f":
        # As the C tool: 'u' (unspecified) is the default, documented, but not accepted.
        if not value or value[0] not in FORMATS:
            raise UsageError(f"-f: address format {value!r} is not one of i, n, l, g")
        settings.fmt = value[0]
    elif letter == "s":
        settings.src_arg = value
    elif letter == "d":
        settings.dest_arg = value
    elif letter == "v":
        settings.verify = True
    elif letter == "c":
        settings.nodelay = True
    elif letter == "A":
        settings.make_addr = True
        settings.addr_file = value if value is not None else settings.addr_file
    elif letter == "O":
        settings.make_opts = True
        settings.opts_file = value if value is not None else settings.opts_file
    elif letter == "D":
        settings.dest_dir = value or ""
    elif letter == "P":
        _perf_arg(settings, value)
    elif letter == "S":
        settings.service = value
    elif letter == "C":
        repetitions = c_atoi(value or "")
        if repetitions < 0:
            raise UsageError(f"-C: repetitions {repetitions} must not be negative")
        settings.repetitions = repetitions or 1
    elif letter == "V":
        settings.verbose = True


def _apply_long(settings: Settings, name: str, value: str | None) -> None:
    if name == "json":
        settings.json = True
    elif name == "help":
        settings.help = True
    elif name == "run-dir":
        settings.run_dir = Path(value or ".")
    elif name == "timeout":
        try:
            settings.timeout = float(value or "")
        except ValueError:
            raise UsageError(f"--timeout: {value!r} is not a number of seconds") from None
        if not 0 < settings.timeout < 1e6:
            raise UsageError(f"--timeout: {value} must be a positive number of seconds")
    elif name == "fabric":
        if value not in FABRICS:
            raise UsageError(f"--fabric: {value!r} is neither 'hw' nor 'sim'")
        settings.fabric = value
    elif name == "sim-dir":
        settings.sim_dir = Path(value or ".")
    elif name == "sim-node":
        settings.sim_node = value


def parse_args(argv: Sequence[str]) -> Settings:
    """Settings from the command line (without the program name); raises UsageError."""
    options, _operands = getopt(argv)
    settings = Settings()
    for option in options:
        if len(option.name) == 1:
            _apply_short(settings, option.name, option.value)
        else:
            _apply_long(settings, option.name, option.value)
    if settings.help:
        return settings
    _check_combination(settings)
    return settings


def _check_combination(s: Settings) -> None:
    """The C tool's checks (usage, exit 1), then the ones our extensions need."""
    if s.src_arg is not None and s.dest_arg is None and s.perf is not PerfMode.ADDR:
        raise UsageError("")
    if s.perf is PerfMode.ADDR and s.src_arg is None:
        raise UsageError("")
    queries = s.src_arg is not None or s.dest_arg is not None or s.perf is not PerfMode.NONE
    if not (queries or s.make_addr or s.make_opts or s.enum_ep):
        raise UsageError("")
    if s.make_addr and s.fabric == "sim" and (s.sim_dir is None or not s.sim_node):
        raise UsageError("--fabric sim needs --sim-dir DIR and --sim-node NAME")


_HELP_LINE = re.compile(r"^ +\[?(-[A-Za-z]|--[a-z-]+)(?: \[?([\w|]+)\]?)?\]? +- (.+)$", re.M)


def argument_parser() -> argparse.ArgumentParser:
    """The same command line as an argparse parser, for tools that read one (the shell
    completion scripts, ``ibacm.tools.completion``).

    ib_acme itself parses with ``getopt`` above; this parser is built from the same
    definitions (``OPTSTRING``, ``LONG_OPTIONS``, the usage text for metavars and help), so the
    two cannot list different options.
    """
    parser = argparse.ArgumentParser(
        prog=PROG, add_help=False, description="Query an ibacm service or write its files."
    )
    described = {flag: (meta, text) for flag, meta, text in _HELP_LINE.findall(usage(PROG))}
    choices = {"-f": list(FORMATS), "--fabric": list(FABRICS)}
    arguments = {f"-{letter}": kind for letter, kind in _parse_optstring(OPTSTRING).items()} | {
        f"--{name}": int(takes) for name, takes in LONG_OPTIONS.items()
    }
    for flag, kind in arguments.items():
        meta, text = described.get(flag, ("", ""))
        if kind == 0:
            parser.add_argument(flag, action="store_true", help=text or None)
            continue
        parser.add_argument(
            flag,
            nargs="?" if kind == 2 else None,
            choices=choices.get(flag),
            metavar=None if flag in choices or not meta else meta,
            help=text or None,
        )
    return parser


def usage(prog: str, *, extensions: bool = True) -> str:
    """The usage text: the C tool's two blocks (what a usage error prints on stdout, as C),
    then, for ``--help``, this tool's extensions."""
    text = _usage(prog)
    return text + _EXTENSIONS if extensions else text


def _usage(prog: str) -> str:
    return f"""\
usage 1: {prog}
Query specified ibacm service for data
   [-e [N]]         - display one or all endpoints:
                        No index: all endpoints
                        N: endpoint N (N = 1, 2, ...)
   [-f addr_format] - i(p), n(ame), l(id), g(gid), or u(nspecified)
                      address format for -s and -d options, default: 'u'
   [-s src_addr]    - source address for path queries
   [-d dest_addr]   - destination addresses for path queries
   [-v]             - verify ACM response against SA query response
   [-c]             - read ACM cached data only
   [-P [opt]]       - query performance data from destination service:
                        No option: output combined data in row format.
                        col: output combined data in column format.
                        N: output data for endpoint N (N = 1, 2,...)
                        all: output data for all endpoints
                        s: output data for the endpoint with the
                           address specified in -s option
   [-S svc_addr]    - address of ACM service, default: local service
   [-C repetitions] - repeat count for resolution
usage 2: {prog}
Generate default ibacm service configuration and option files
   -A [addr_file]   - generate local address configuration file
                      (default is {DEFAULT_ADDR_NAME})
   -O [opt_file]    - generate local ibacm_opts.cfg options file
                      (default is {DEFAULT_OPTS_NAME})
   -D dest_dir      - specify destination directory for output files
                      (default is {SYSCONFDIR})
   -V               - enable verbose output
"""


_EXTENSIONS = f"""\
extensions:
   --json           - print one JSON document instead of the text
   --run-dir DIR    - directory of the service socket and TCP port file (default /run)
   --timeout SEC    - give up on an unanswered request after SEC seconds (default {
    DEFAULT_TIMEOUT:g})
   --fabric hw|sim  - where -A finds devices: this host's HCAs (default) or a simulated
                      cluster node (--sim-dir DIR --sim-node NAME)
"""
