"""Reading the option file ``ibacm_opts.cfg`` into ``Options``, with issues.

Parsing follows the C daemon (``acm_set_options``, ``acmp_set_options``,
``acm_load_prov_config``) wherever its behaviour is not a known defect:

* a line whose first character is ``#`` is a comment; otherwise the first two white-space
  separated tokens are key and value (``sscanf("%31s%255s")``), the rest is ignored;
* keys are case-insensitive, except ``route_timeout`` which must be lowercase;
* numbers use C ``atoi`` (``12abc`` is 12, ``abc`` is 0), the last occurrence of a key wins;
* ``provider <name> default|<subnet prefix>`` lines choose providers.

Defects of the C parsers that are fixed (each fix is reported as an issue naming file:line):

* long lines are not cut every 119 characters (a warning says the C daemon would);
* an invalid ``min_mtu``/``min_rate`` still falls back to 2048/10, but is reported;
* unknown ``*_prot``/``*_preload`` values keep the previous value, and are reported;
* ``route_preload full_opensm_v1`` (the man page's spelling) is accepted;
* ``provider_lib_path`` is never mistaken for a provider line;
* settings that would stall the daemon (a depth below 1, negative retries or timeouts) are
  raised to the smallest working value, with a warning.
"""

from __future__ import annotations

from pathlib import Path

from ibacm.config.ctext import C_MAX_KEY, c_lines, c_lower, c_tokens
from ibacm.config.errors import ConfigError, ConfigIssue, IssueSink, errors_in
from ibacm.config.option_kinds import OptionDef, Setting
from ibacm.config.options import BY_KEY, Options
from ibacm.config.paths import DEFAULT_OPTS_FILE


def parse_options(text: str, path: str = "<string>") -> tuple[Options, list[ConfigIssue]]:
    """Parse option-file text. Never raises for bad content: problems become issues."""
    opts = Options()
    sink = IssueSink(path)
    set_at: dict[str, int] = {}
    for number, line in c_lines(text, sink):
        if line.startswith("#"):
            continue
        tokens = c_tokens(line)
        if not tokens or tokens[0].startswith("#"):
            # An indented '#' is not a comment to C, but such a key is unknown and ignored.
            continue
        if "\t" in line and c_lower(tokens[0]) == "provider":
            sink.warn(
                number,
                "TAB in a provider line: read as a separator here, but the C daemon's "
                "provider parser splits only at spaces and would misread this line",
            )
        _apply_line(opts, tokens, number, sink, set_at)
    _check_together(opts, sink, set_at)
    return opts, sink.issues


def _apply_line(
    opts: Options, tokens: list[str], line: int, sink: IssueSink, set_at: dict[str, int]
) -> None:
    key = tokens[0]
    lowered = c_lower(key)
    definition = BY_KEY.get(lowered)
    if definition is not None and definition.kind.whole_line:
        value = tokens[1] if len(tokens) > 1 else ""
        _apply(opts, definition, Setting(lowered, value, line, sink, tokens=tuple(tokens)))
        return
    if len(tokens) < 2:
        sink.warn(line, f"key {key!r} has no value; line ignored")
        return
    if len(key) > C_MAX_KEY:
        sink.warn(line, f"key {key[:40]!r}... is longer than {C_MAX_KEY} characters; ignored")
        return
    if definition is not None and definition.case_sensitive and key != lowered:
        sink.warn(line, f"key {key!r} ignored: {lowered} must be written in lowercase (as in C)")
        return
    if definition is None:
        if lowered.startswith("provider"):
            # C's provider parser would have taken this line for a provider line.
            sink.warn(line, f"unknown key {key!r} ignored (C would read it as a provider line)")
        else:
            sink.warn(line, f"unknown key {key!r} ignored (it may belong to another provider)")
        return
    if len(tokens) > 2 and not tokens[2].startswith("#"):
        sink.warn(line, f"{key}: text after the value {tokens[1]!r} is ignored")
    _apply(opts, definition, Setting(lowered, tokens[1], line, sink))
    set_at[lowered] = line


def _apply(opts: Options, definition: OptionDef, setting: Setting) -> None:
    previous = getattr(opts, definition.name)
    setattr(opts, definition.name, definition.kind.parse(setting, previous, definition.default))


def _check_together(opts: Options, sink: IssueSink, set_at: dict[str, int]) -> None:
    """Checks that involve more than one key."""
    if opts.join_retry_max_ms < opts.join_retry_initial_ms:
        line = max(set_at.get("join_retry_max_ms", 0), set_at.get("join_retry_initial_ms", 0))
        sink.warn(
            line,
            f"join_retry_max_ms {opts.join_retry_max_ms} is below join_retry_initial_ms "
            f"{opts.join_retry_initial_ms}; using {opts.join_retry_initial_ms} for both",
        )
        opts.join_retry_max_ms = opts.join_retry_initial_ms


def load_options(
    path: str | Path | None = None, *, strict: bool = False
) -> tuple[Options, list[ConfigIssue]]:
    """Read and parse an option file (``None`` = the default location).

    A missing file gives the defaults and no issue, as in C. A file that exists but cannot be
    read gives the defaults plus an error issue, or ``ConfigError`` when ``strict``.
    """
    where = str(DEFAULT_OPTS_FILE if path is None else path)
    try:
        data = Path(where).read_bytes()
    except FileNotFoundError:
        return Options(), []
    except OSError as exc:
        issue = ConfigIssue(where, 0, f"cannot read option file: {exc.strerror or exc}", "error")
        if strict:
            raise ConfigError([issue]) from exc
        return Options(), [issue]
    # Bytes that are not UTF-8 survive as surrogates, so paths round-trip like os.fsdecode.
    opts, issues = parse_options(data.decode("utf-8", "surrogateescape"), where)
    if strict and errors_in(issues):
        raise ConfigError(errors_in(issues))
    return opts, issues
