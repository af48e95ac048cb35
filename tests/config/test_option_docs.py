"""Every option's definition against what documents it: ibacm(8), the spec of the C daemon's
options (options.md) and the generated ``ibacm_opts.cfg``."""

from __future__ import annotations

import dataclasses
import re

import pytest

from ibacm.config.option_file import parse_options
from ibacm.config.option_kinds import (
    CFlag,
    Coded,
    Integer,
    IntFlag,
    Keyword,
    Lifetime,
    OptionDef,
    Port,
    ReadBy,
    Reload,
    Timeout,
)
from ibacm.config.options import BY_KEY, OPTIONS, Options
from ibacm.config.opts_template import render_opts_file
from tests.conftest import SPEC, require_file
from tests.packaging.test_man import plain, render, source

KEYS = [definition.key for definition in OPTIONS]
SCALARS = [d.key for d in OPTIONS if not d.kind.whole_line]
C_KEYS = [d.key for d in OPTIONS if d.read_by & (ReadBy.CORE | ReadBy.PROVIDER)]

# ---------------------------------------------------------------------------------------------
# The definitions themselves


def test_every_field_of_options_is_a_defined_option() -> None:
    assert [d.name for d in OPTIONS] == [f.name for f in dataclasses.fields(Options)]
    assert len(set(KEYS)) == len(KEYS)


def test_every_follows_names_an_attribute_of_options() -> None:
    for definition in OPTIONS:
        if definition.follows is not None:
            assert definition.default is None, definition.key
            assert hasattr(Options(), definition.follows), definition.key


def test_an_integer_kind_falls_back_to_the_default_or_the_limit() -> None:
    # metrics_port falls back to its default (off), retries to its limit (0), both reported.
    options, issues = parse_options("metrics_port 70000\nretries -3\n")
    assert (options.metrics_port, options.retries) == (0, 0)
    assert [issue.severity for issue in issues] == ["error", "error"]


# ---------------------------------------------------------------------------------------------
# ibacm(8): one entry per key, in the section of its reader, stating its default


def _man_entries() -> dict[str, tuple[str, str]]:
    """key -> (the subsection it is in, its text), from the '.BI "key " arg' entries."""
    text = source("ibacm.8").split(".SH OPTION FILE", 1)[1].split("\n.SH ", 1)[0]
    found: dict[str, tuple[str, str]] = {}
    for part in re.split(r"^\.SS ", text, flags=re.MULTILINE)[1:]:
        heading = part.split("\n", 1)[0].replace("\\-", "-")
        for entry in re.split(r"^\.TP\n", part, flags=re.MULTILINE):
            head = re.match(r'\.BI "([a-z_]+) "', entry)
            if head is not None:
                found[head.group(1)] = (heading, entry)
    return found


def _stated_default(entry: str) -> str:
    if "Default:" not in entry:
        return ""
    stated = re.findall(r"\\fB(.*?)\\fR\.", entry.split("Default:", 1)[1])
    return stated[-1].replace("\\-", "-") if stated else ""


def _documented_default(definition: OptionDef) -> str:
    """How the man page shows the default: as the file writes it, or for a setting that
    follows another, that setting's name (or its value, when it is no option)."""
    if definition.follows is None:
        return definition.kind.text(definition.default)
    if definition.follows in BY_KEY:
        return definition.follows
    return str(getattr(Options(), definition.follows))


SECTIONS = {
    ReadBy.CORE: "Core settings",
    ReadBy.PROVIDER_LINES: "Core settings",
    ReadBy.PROVIDER: "Settings of the built-in provider (ibacmp)",
    ReadBy.EXTENSION: "Settings of this implementation",
}


def test_ibacm8_documents_every_option_key_and_no_other() -> None:
    assert sorted(_man_entries()) == sorted(KEYS)


@pytest.mark.parametrize("key", KEYS)
def test_ibacm8_documents_the_option_where_its_reader_is(key: str) -> None:
    definition = BY_KEY[key]
    # A key both parsers read (timeout, retries) is documented with the core's.
    reader = next(section for section in ReadBy if section in definition.read_by)
    assert _man_entries()[key][0] == SECTIONS[reader]


@pytest.mark.parametrize("key", SCALARS)
def test_ibacm8_states_the_real_default(key: str) -> None:
    assert _stated_default(_man_entries()[key][1]) == _documented_default(BY_KEY[key])


@pytest.mark.parametrize("key", [d.key for d in OPTIONS if isinstance(d.kind, Keyword)])
def test_ibacm8_names_every_keyword_an_option_accepts(key: str) -> None:
    entry = _man_entries()[key][1]
    kind = BY_KEY[key].kind
    assert isinstance(kind, Keyword)
    for word in (*kind.table, *kind.aliases):
        assert re.search(rf"(?<![\w-]){word}(?![\w-])", entry), f"{key}: {word} not named"


def test_ibacm8_says_what_a_reload_does_with_every_option() -> None:
    section = re.search(r" SIGNALS (.*) SYSTEMD ", plain(render("ibacm.8")))
    assert section is not None
    signals = section.group(1).split(" SIGHUP ", 1)[1]
    applied, rest = signals.split("Every other option needs a restart", 1)
    restart, endpoint = rest.split("what an endpoint is built with when it opens", 1)
    endpoint = endpoint.split("A provider library applies", 1)[0]
    parts = {
        Reload.DAEMON: applied,
        Reload.PROVIDER: applied,
        Reload.RESTART: restart,
        Reload.ENDPOINT: endpoint,
    }
    for definition in OPTIONS:
        named = rf"(?<![\w-]){definition.key}(?![\w-])"
        assert re.search(named, parts[definition.reload]), f"{definition.key} not where it is"
        for reload, part in parts.items():
            if part is not parts[definition.reload]:
                assert not re.search(named, part), f"{definition.key} also under {reload}"


# ---------------------------------------------------------------------------------------------
# The spec of the C daemon's options (options.md §3-§5)


def _spec_tables() -> dict[str, dict[str, list[str]]]:
    """Section title -> key -> the row's cells, from the tables of options.md."""
    text = require_file(SPEC / "options.md").read_text(encoding="utf-8")
    tables: dict[str, dict[str, list[str]]] = {}
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        title = section.split("\n", 1)[0]
        rows = re.findall(r"^\| `([a-z_]+)` \|(.*)\|$", section, flags=re.MULTILINE)
        tables[title] = {key: [cell.strip() for cell in cells.split("|")] for key, cells in rows}
    return tables


def _spec_keys(title: str) -> dict[str, list[str]]:
    return next(rows for name, rows in _spec_tables().items() if name.startswith(title))


def _placeholders() -> dict[str, set[str]]:
    """``$SYSCONFDIR`` -> {/etc} ..., as the spec's preamble expands them (a build-time
    directory: the examples it gives)."""
    text = require_file(SPEC / "options.md").read_text(encoding="utf-8")
    found = {name: {value} for name, value in re.findall(r"`(\$[A-Z]+)` \(= (/[^) ,`]*)", text)}
    for name, examples in re.findall(r"`(\$[A-Z]+)` = [^(]*\(= [^)]*?e\.g\. ([^)]*)\)", text):
        found[name] = set(re.split(r"\s+or\s+", examples))
    return found


def test_the_core_keys_are_those_of_the_spec() -> None:
    core = {d.key for d in OPTIONS if ReadBy.CORE in d.read_by}
    assert set(_spec_keys("3. Core options")) == core


def test_the_provider_keys_are_those_of_the_spec() -> None:
    provider = {d.key for d in OPTIONS if ReadBy.PROVIDER in d.read_by}
    assert set(_spec_keys("4. Default provider")) == provider


def test_the_provider_line_key_is_that_of_the_spec() -> None:
    text = require_file(SPEC / "options.md").read_text(encoding="utf-8")
    lines = {d.key for d in OPTIONS if ReadBy.PROVIDER_LINES in d.read_by}
    assert lines == {"provider"}
    assert "`provider <name> default` / `provider <name> <subnet_prefix>`" in text


def _c_rows() -> dict[str, list[str]]:
    return {**_spec_keys("3. Core options"), **_spec_keys("4. Default provider")}


@pytest.mark.parametrize("key", C_KEYS)
def test_the_default_is_the_specs(key: str) -> None:
    definition = BY_KEY[key]
    cells = _c_rows()[key]
    stated = {cells[1].split(" (")[0].strip("`")}
    for placeholder, values in _placeholders().items():
        stated = {s.replace(placeholder, v) for s in stated for v in values}
    if stated <= {"false", "true"}:
        assert definition.default is ("true" in stated)
    else:
        assert definition.kind.text(definition.default) in stated


@pytest.mark.parametrize("key", C_KEYS)
def test_the_accepted_values_are_the_specs(key: str) -> None:
    definition = BY_KEY[key]
    kind = definition.kind
    allowed = _c_rows()[key][0]
    if isinstance(kind, Keyword):
        assert set(re.findall(r"`(\w+)`", allowed)) == set(kind.table)
    elif isinstance(kind, Coded):
        numbers = re.findall(r"(?<![(=.\d])(\d+)(?![.\d])", re.sub(r"\(.*?\)", "", allowed))
        assert sorted(int(n) for n in numbers) == sorted(kind.table)
    elif isinstance(kind, Integer | Timeout | Lifetime | Port | IntFlag):
        assert allowed.startswith("integer"), allowed
    elif isinstance(kind, CFlag):
        assert "strtol" in allowed
    else:
        assert re.match(r"(`stdout`, `stderr`.*)?(a )?(path|directory)", allowed), allowed
    assert ("case-sensitive" in allowed) is definition.case_sensitive


# ---------------------------------------------------------------------------------------------
# The generated ibacm_opts.cfg (ib_acme -O): a block of help text for every option


@pytest.mark.parametrize("key", KEYS)
def test_the_generated_file_explains_every_option(key: str) -> None:
    definition = BY_KEY[key]
    text = render_opts_file()
    block = [f"# {key}:", *(f"# {line}" for line in definition.help)]
    assert "\n".join(block) in text
    extensions = text.split("# Settings of this implementation only", 1)[1]
    assert (f"# {key}:" in extensions) is (ReadBy.EXTENSION in definition.read_by)
