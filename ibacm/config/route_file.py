"""The route preload file ``ibacm_route.data`` (``route_preload opensm_full_v1``).

This is OpenSM's "full" path-record dump (dump_pr plugin): for every port a header line

    <NodeType> 0x<port GUID>, base LID <lid>, "<node description>", port <n>

followed by ``0x<DLID> : <SL> : <MTU> : <RATE>`` lines (or ``0x<DLID> : UNREACHABLE``) and a
blank line. The C provider reads it with ``strtok``/``strtoul``/``atoi``; this parser reads
fields the same way (so ``base LID 010`` is octal 8), but reports what it skips.

``parse_route_file`` reads every section; the provider picks its own with
``RouteDump.section_for(port GUID, port LID)`` and maps each DLID to a GUID with
``RouteDump.lid_to_guid``. ``render_route_file`` writes the same format.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ibacm.config import cnumbers
from ibacm.config.ctext import c_lines
from ibacm.config.errors import ConfigIssue, IssueSink

MULTICAST_LID_START = 0xC000
_HEADER_WORDS = ("Switch", "Channel", "Router")
_BASE_LID = "base LID"
_PORT_AFTER_DESCRIPTION = re.compile(r'"\s*,\s*port\s+([0-9]+)')
# C reads lines into a 128-byte buffer.
C_MAX_ROUTE_LINE = 127


@dataclass(frozen=True)
class RoutePath:
    """One reachable destination: values as the C provider stores them in the path record."""

    dlid: int
    sl: int
    mtu: int
    rate: int


@dataclass(frozen=True)
class RouteSection:
    """The paths from one port (``guid``, ``lid``) to every destination."""

    node_type: str
    guid: int
    lid: int
    description: str
    port: int
    paths: list[RoutePath]
    unreachable: tuple[int, ...] = ()


@dataclass
class RouteDump:
    """A parsed dump: the LID -> port GUID table and every section in file order."""

    lid_to_guid: dict[int, int] = field(default_factory=dict)
    sections: list[RouteSection] = field(default_factory=list)

    def section_for(self, guid: int, lid: int) -> RouteSection | None:
        """The first section of the port with this GUID and base LID, as the C provider."""
        return next((s for s in self.sections if s.guid == guid and s.lid == lid), None)


def _strtok(text: str, pos: int, delimiters: str) -> tuple[str | None, int]:
    """C ``strtok_r``: the next token at or after ``pos`` and the position after it."""
    while pos < len(text) and text[pos] in delimiters:
        pos += 1
    if pos >= len(text):
        return None, len(text)
    start = pos
    while pos < len(text) and text[pos] not in delimiters:
        pos += 1
    return text[start:pos], min(pos + 1, len(text))


def _is_header(first_token: str) -> bool:
    return first_token.startswith(_HEADER_WORDS)


@dataclass
class _Header:
    node_type: str
    guid: int
    lid: int
    description: str
    port: int


def _parse_header(line: str, first: str, after_first: int) -> _Header | str:
    """A section header, or the reason it cannot be read."""
    node_type, pos = first, after_first
    if first.startswith("Channel"):
        second, pos = _strtok(line, pos, " ")
        if second is None:
            return "header has no node type after 'Channel'"
        node_type = f"{first} {second}"
    guid_text, pos = _strtok(line, pos, ",")
    if guid_text is None:
        return "header has no port GUID"
    guid = cnumbers.strtoul(guid_text, 16)
    if not guid.converted:
        return f"header GUID {guid_text.strip()!r} is not a hex number"
    at = line.find(_BASE_LID, pos)
    if at < 0:
        return "header has no 'base LID'"
    lid_text, pos = _strtok(line, at + len(_BASE_LID) + 1, ",")
    if lid_text is None:
        return "header has no LID after 'base LID'"
    lid = cnumbers.strtoul(lid_text, 0)
    if not lid.converted:
        return f"header LID {lid_text.strip()!r} is not a number"
    description, port = _description_and_port(line, pos)
    return _Header(node_type, guid.value, lid.value & 0xFFFF, description, port)


def _description_and_port(line: str, pos: int) -> tuple[str, int]:
    """The quoted node description and trailing port number (informative only; C ignores
    them, so a header without them is still valid)."""
    open_quote = line.find('"', pos)
    close_quote = line.rfind('"')
    if open_quote < 0 or close_quote <= open_quote:
        return "", 0
    match = _PORT_AFTER_DESCRIPTION.match(line, close_quote)
    return line[open_quote + 1 : close_quote], int(match.group(1)) if match else 0


@dataclass
class _Building:
    header: _Header
    paths: list[RoutePath] = field(default_factory=list)
    unreachable: list[int] = field(default_factory=list)

    def freeze(self) -> RouteSection:
        h = self.header
        return RouteSection(
            h.node_type, h.guid, h.lid, h.description, h.port, self.paths, tuple(self.unreachable)
        )


def _read_headers(
    lines: list[tuple[int, str]], sink: IssueSink
) -> tuple[dict[int, _Header | None], dict[int, int]]:
    """Pass 1: every header line (None if unreadable) and the LID -> GUID table."""
    headers: dict[int, _Header | None] = {}
    lid_to_guid: dict[int, int] = {}
    lid_line: dict[int, int] = {}
    for number, line in lines:
        first, after = _strtok(line, 0, " ")
        if first is None or not _is_header(first):
            continue
        header = _parse_header(line, first, after)
        if isinstance(header, str):
            sink.error(number, f"{header}; section ignored")
            headers[number] = None
            continue
        headers[number] = header
        if header.lid == 0 or header.lid >= MULTICAST_LID_START:
            # C keeps LID 0 (reserved, never a destination) and then preloads paths to it.
            kind = "the reserved LID" if header.lid == 0 else "a multicast LID"
            sink.warn(number, f"base LID 0x{header.lid:04x} is {kind}; not in LID table")
        elif header.guid == 0:
            sink.warn(number, "port GUID 0 cannot be a destination; not in LID table")
        elif header.lid in lid_to_guid:
            sink.warn(
                number,
                f"LID {header.lid} already belongs to GUID 0x{lid_to_guid[header.lid]:016x} "
                f"(line {lid_line[header.lid]}); keeping the first",
            )
        else:
            lid_to_guid[header.lid] = header.guid
            lid_line[header.lid] = number
    return headers, lid_to_guid


def _path_line(
    line: str, number: int, section: _Building, lid_to_guid: dict[int, int], sink: IssueSink
) -> None:
    """Pass 2 for one ``DLID : SL : MTU : RATE`` line of ``section``."""
    first, pos = _strtok(line, 0, " ")
    assert first is not None  # the caller skips blank lines
    dlid = cnumbers.strtoul(first, 0)
    fields: list[str] = []
    for _ in range(3):
        token, pos = _strtok(line, pos, ":")
        if token is None:
            break
        fields.append(token)
    if fields and fields[0].strip() == "UNREACHABLE":
        section.unreachable.append(dlid.value & 0xFFFF)
        return
    if len(fields) < 3:
        sink.warn(number, "path line is not 'DLID : SL : MTU : RATE'; skipped")
        return
    if not dlid.converted:
        sink.error(number, f"DLID {first!r} is not a number; path skipped")
        return
    lid = dlid.value & 0xFFFF
    if lid not in lid_to_guid:
        sink.error(number, f"DLID 0x{lid:04x} is not the base LID of any port; path skipped")
        return
    sl, mtu, rate = (cnumbers.atoi(text) for text in fields)
    stored = RoutePath(lid, sl & 0xF, mtu & 0xFF, rate & 0xFF)
    if (stored.sl, stored.mtu, stored.rate) != (sl, mtu, rate):
        sink.warn(
            number,
            f"SL {sl} / MTU {mtu} / RATE {rate} do not fit the path record; using "
            f"{stored.sl} / {stored.mtu} / {stored.rate}",
        )
    section.paths.append(stored)


def parse_route_file(text: str, path: str = "<string>") -> tuple[RouteDump, list[ConfigIssue]]:
    """Parse a full path-record dump; never raises for bad content."""
    sink = IssueSink(path)
    lines = [
        (number, line)
        for number, line in c_lines(text, sink, limit=C_MAX_ROUTE_LINE)
        if not line.startswith("#")
    ]
    headers, lid_to_guid = _read_headers(lines, sink)
    dump = RouteDump(lid_to_guid=lid_to_guid)
    seen: dict[tuple[int, int], int] = {}
    current: _Building | None = None
    skipping = False  # inside a section whose header could not be read
    for number, line in lines:
        first, _ = _strtok(line, 0, " ")
        if first is None or not first.strip(cnumbers.C_SPACE):
            continue
        if number in headers:
            if current is not None:
                dump.sections.append(current.freeze())
            header = headers[number]
            current, skipping = (None, True) if header is None else (_Building(header), False)
            if header is not None and (header.guid, header.lid) in seen:
                sink.warn(
                    number,
                    f"second section for GUID 0x{header.guid:016x} LID {header.lid} (first on "
                    f"line {seen[header.guid, header.lid]}); only the first is used",
                )
            elif header is not None:
                seen[header.guid, header.lid] = number
        elif current is not None:
            _path_line(line, number, current, lid_to_guid, sink)
        elif not skipping:
            sink.warn(number, "line before the first section header ignored")
    if current is not None:
        dump.sections.append(current.freeze())
    return dump, sink.issues


def _check_section(section: RouteSection) -> None:
    if not section.node_type.startswith(_HEADER_WORDS) or "\n" in section.node_type:
        raise ValueError(f"node type {section.node_type!r} must start with Switch/Channel/Router")
    if '"' in section.description or "\n" in section.description:
        raise ValueError(f"node description {section.description!r} contains '\"' or a newline")
    if not 0 <= section.guid < 2**64:
        raise ValueError(f"GUID {section.guid:#x} is not a 64-bit value")
    if not 0 <= section.lid <= 0xFFFF or not 0 <= section.port <= 255:
        raise ValueError(f"LID {section.lid} or port {section.port} out of range")
    for p in section.paths:
        if not (0 <= p.dlid <= 0xFFFF and 0 <= p.sl <= 15 and 0 <= p.mtu <= 255):
            raise ValueError(f"path {p} has a field out of range")
        if not 0 <= p.rate <= 255:
            raise ValueError(f"path {p} has a rate out of range")
    if any(not 0 <= lid <= 0xFFFF for lid in section.unreachable):
        raise ValueError(f"unreachable LIDs {section.unreachable} out of range")


def render_route_file(sections: Iterable[RouteSection]) -> str:
    """Write ``sections`` in the dump format, destinations in LID order within a section."""
    out: list[str] = []
    for section in sections:
        _check_section(section)
        out.append(
            f"{section.node_type} 0x{section.guid:016x}, base LID {section.lid}, "
            f'"{section.description}", port {section.port}'
        )
        out.append("# LID  : SL : MTU : RATE")
        rows = [
            (p.dlid, f"0x{p.dlid:04X} : {p.sl:<2d} : {p.mtu:<3d} : {p.rate:<4d}")
            for p in section.paths
        ]
        rows += [(lid, f"0x{lid:04X} : UNREACHABLE") for lid in section.unreachable]
        out.extend(text for _, text in sorted(rows, key=lambda row: row[0]))
        out.append("")
    return "".join(f"{line}\n" for line in out)
