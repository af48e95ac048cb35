"""Read the worked hex examples out of the specification's markdown at test time.

Two dump styles occur in the spec:

* offset dumps: ``0010: 01 00 ...   comment``; ``0020..004f: 00 ...`` is a zero range; bytes
  not shown are zero; ``...`` ends the bytes of a line;
* labelled dumps: ``request : 01 02 ...`` with indented continuation lines.

Comments are separated from the bytes by three or more spaces.
"""

from __future__ import annotations

import re

from tests.conftest import SPEC, require_file

_OFFSET_LINE = re.compile(r"^([0-9a-f]{4})(?:\.\.([0-9a-f]{4}))?:\s?(.*)$")
_LABEL_LINE = re.compile(r"^(\w+)\s*:\s(.*)$")
_HEX_BYTE = re.compile(r"[0-9a-f]{2}")
_COMMENT = re.compile(r"\s{3,}")


def spec_text(name: str) -> str:
    return require_file(SPEC / name).read_text(encoding="utf-8")


def section_blocks(text: str, heading: str) -> list[str]:
    """The fenced code blocks of the section whose heading starts with ``heading``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    level = heading.split(" ", 1)[0]
    end = len(lines)
    for i in range(start + 1, len(lines)):
        marker = lines[i].split(" ", 1)[0]
        if marker.startswith("#") and len(marker) <= len(level):
            end = i
            break
    blocks: list[str] = []
    current: list[str] | None = None
    for line in lines[start:end]:
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _line_bytes(content: str) -> list[int]:
    values: list[int] = []
    for token in _COMMENT.split(content, maxsplit=1)[0].split():
        if not _HEX_BYTE.fullmatch(token):
            break
        values.append(int(token, 16))
    return values


def offset_dump(block: str, length: int) -> bytes:
    """Bytes of an offset dump, ``length`` long, zero where the dump shows nothing."""
    data = bytearray(length)
    for line in block.splitlines():
        match = _OFFSET_LINE.match(line.strip())
        if match is None:
            continue
        offset = int(match.group(1), 16)
        if match.group(2) is not None:
            end = int(match.group(2), 16)
            data[offset : end + 1] = bytes(end + 1 - offset)
            continue
        values = _line_bytes(match.group(3))
        if offset + len(values) > length:
            raise AssertionError(f"dump line {line!r} runs past {length} bytes")
        data[offset : offset + len(values)] = bytes(values)
    return bytes(data)


def labelled_dump(block: str) -> dict[str, list[bytes]]:
    """For each label, the bytes of its first line and of each continuation line."""
    result: dict[str, list[bytes]] = {}
    label: str | None = None
    for line in block.splitlines():
        match = _LABEL_LINE.match(line)
        if match is not None:
            label = match.group(1)
            result[label] = [bytes(_line_bytes(match.group(2)))]
        elif label is not None and line.strip():
            result[label].append(bytes(_line_bytes(line.strip())))
    return result
