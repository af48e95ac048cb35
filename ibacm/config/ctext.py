"""Text as the C daemon's parsers see it: ``fgets`` lines, ``sscanf("%s")`` tokens (ASCII white
space only) and ``stricmp`` case folding (ASCII letters only). Shared by every file parser."""

from __future__ import annotations

import re

from ibacm.config import cnumbers
from ibacm.config.errors import IssueSink

# The C daemon reads lines into a 120-byte buffer: 119 characters plus the terminator.
C_MAX_LINE = 119
C_MAX_KEY = 31

_C_SPACE_RUN = re.compile(f"[{re.escape(cnumbers.C_SPACE)}]+")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def c_tokens(line: str) -> list[str]:
    """White-space separated tokens as ``sscanf("%s")`` finds them (ASCII white space only)."""
    return [token for token in _C_SPACE_RUN.split(line) if token]


def c_lower(text: str) -> str:
    """ASCII-only lowercase, like C's stricmp: non-ASCII letters are never folded."""
    return text.translate(_ASCII_LOWER)


def c_lines(text: str, sink: IssueSink, limit: int = C_MAX_LINE) -> list[tuple[int, str]]:
    """Split ``text`` as ``fgets`` would see it, numbered from 1, without C's line cutting.

    Warns about lines the C daemon would cut at ``limit`` characters, and cuts lines at an
    embedded NUL, where every C string function stops.
    """
    numbered = []
    for number, line in enumerate(text.split("\n"), start=1):
        if "\0" in line:
            sink.warn(number, "NUL character in line; the rest of the line is ignored")
            line = line[: line.index("\0")]
        # C counts bytes; a trailing CR only adds white space to what C reads next.
        length = len(line.rstrip("\r").encode("utf-8", "surrogateescape"))
        if length > limit:
            sink.warn(
                number,
                f"line is {length} bytes long; read as one line, but the C daemon reads at "
                f"most {limit} bytes per line and would split it",
            )
        numbered.append((number, line))
    return numbered
