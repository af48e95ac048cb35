"""The option file ``ib_acme -O`` writes: explained settings, one ``key value`` per block.

Every block comes from the option's definition (``ibacm.config.options.OPTIONS``): its help
text, its examples and its value. The active (uncommented) lines are exactly those of the C
tool, in its order (``OptionDef.active``), so both daemons read the same settings from it.
Every other key appears as a commented example, unless ``options`` sets it to a non-default
value, in which case it is written active so that ``parse_options(render_opts_file(o))``
gives ``o`` back. The keys of this implementation only come last, under their own heading.
"""

from __future__ import annotations

from typing import Any

from ibacm.config.cnumbers import C_SPACE
from ibacm.config.option_kinds import OptionDef, ReadBy
from ibacm.config.options import OPTIONS, Options

_HEADER = """\
# ibacm_opts.cfg: settings of the InfiniBand Communication Management Assistant (ibacm)
#
# Written by 'ib_acme -O'. Each setting is one line 'name value'; lines starting with '#'
# are comments. Names are not case sensitive, except route_timeout. A setting that is
# missing takes the default shown here. ibacm reads this file when it starts and
# when asked to reload its configuration.
"""
_EXTENSIONS_HEADING = "# Settings of this implementation only (the C ibacm ignores them):"


def _setting_lines(definition: OptionDef, value: Any) -> list[str]:
    """The lines that set ``value``; a value no option file can hold is a ValueError."""
    if not definition.kind.whole_line:
        text = definition.kind.text(value)
        unwritable = any(char in C_SPACE or char == "\0" for char in text)
        if unwritable or (text == "" and definition.follows is None):
            raise ValueError(f"{definition.key} value {text!r} cannot be written in an option file")
    return definition.kind.lines(definition.key, value)


def _render_block(definition: OptionDef, options: Options) -> list[str]:
    lines = [f"# {definition.key}:", *(f"# {text}" for text in definition.help)]
    if definition.examples:
        lines += ["# Examples:", *(f"# {example}" for example in definition.examples)]
    setting = _setting_lines(definition, getattr(options, definition.name))
    if definition.active or setting != _setting_lines(definition, definition.default):
        lines += setting
    else:
        # Unset (a setting that follows another, no provider line) writes nothing here.
        lines += [f"# {line}" for line in setting]
    return [*lines, ""]


def render_opts_file(options: Options | None = None) -> str:
    """The option file for ``options`` (default: all defaults, as ``ib_acme -O`` writes)."""
    chosen = Options() if options is None else options
    c_keys = [d for d in OPTIONS if ReadBy.EXTENSION not in d.read_by]
    extensions = [d for d in OPTIONS if ReadBy.EXTENSION in d.read_by]
    out = [_HEADER]
    for definition in c_keys:
        out.extend(_render_block(definition, chosen))
    out += [_EXTENSIONS_HEADING, ""]
    for definition in extensions:
        out.extend(_render_block(definition, chosen))
    return "\n".join(out).rstrip("\n") + "\n"
