"""Bracket expansion of ``ib_acme``'s ``-s``, ``-d`` and ``-S`` arguments (ib_acme.md §2).

``base[ranges]`` names several hosts at once: everything before the first ``[`` is the base,
everything up to the next ``]`` a comma-separated list of decimal numbers ``a`` or ranges
``a-b``; text after the ``]`` is ignored (as in C). Each number is zero-padded to the width of
the text that wrote it (``node[01-03]`` -> node01 node02 node03, ``node[8-10]`` -> node8 node9
node10). Without a ``[`` the argument is one item, commas included, exactly as the C tool
reads it.

Where the C parser silently produced nonsense (``node[a]`` -> ``node0``, ``node[3-1]`` ->
nothing, an empty argument -> a crash), ``expand`` raises ``ExpansionError`` saying why.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"[0-9]+")
MAX_ITEMS = 65536
"""More names than any fabric has: a typo like ``node[1-99999999]`` fails instead of hanging."""


class ExpansionError(ValueError):
    """A bracket expression cannot be expanded; the message names the offending part."""


def _split(arg: str) -> tuple[str, str | None]:
    """(base, text inside the brackets) the way the C parser splits; None = no brackets."""
    open_at = arg.find("[")
    if open_at < 0:
        return arg, None
    base = arg[:open_at]
    rest = arg[open_at + 1 :]
    close_at = rest.find("]")
    inner = rest if close_at < 0 else rest[:close_at]
    # C's strtok skips empty fields: "node[" and "node[]" are the plain base name.
    return base, inner or None


def _range_bounds(token: str, arg: str) -> tuple[int, int, int]:
    """(first, last, width) of one ``a`` or ``a-b`` token."""
    first_text, dash, last_text = token.partition("-")
    if not _NUMBER.fullmatch(first_text) or (dash and not _NUMBER.fullmatch(last_text)):
        raise ExpansionError(
            f"{arg!r}: {token!r} is not a number or a range of numbers like 1-4 or 01-16"
        )
    first = int(first_text)
    last = int(last_text) if dash else first
    if last < first:
        raise ExpansionError(f"{arg!r}: range {token!r} counts down; write it as {last}-{first}")
    return first, last, len(first_text)


def expand(arg: str) -> list[str]:
    """The items an ``ib_acme`` address or service argument stands for, in order.

    >>> expand("node[1-3,5]")
    ['node1', 'node2', 'node3', 'node5']
    """
    if not arg:
        raise ExpansionError("the argument is empty")
    base, inner = _split(arg)
    if inner is None:
        return [base]
    items: list[str] = []
    for token in inner.split(","):
        if not token:
            continue  # "1,,3" is "1,3", as strtok reads it
        first, last, width = _range_bounds(token, arg)
        if len(items) + last - first + 1 > MAX_ITEMS:
            raise ExpansionError(f"{arg!r}: expands to more than {MAX_ITEMS} names")
        items.extend(f"{base}{number:0{width}d}" for number in range(first, last + 1))
    if not items:
        raise ExpansionError(f"{arg!r}: the brackets hold no number")
    return items
