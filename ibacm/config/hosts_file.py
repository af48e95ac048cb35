"""The address preload file ``ibacm_hosts.data`` (``addr_preload acm_hosts``).

Each line is ``<address> <IB GID>``; ``#`` in the first column starts a comment. The GID must
be IPv6 text; the address is an IPv4 literal (type IP), an IPv6 literal (IP6) or a name.
Bad lines are reported and skipped; the rest of the file still loads.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from ibacm.config.address_literals import classify, encode_text, match_key, pton
from ibacm.config.ctext import c_lines, c_tokens
from ibacm.config.errors import ConfigIssue, IssueSink

MAX_FIELD_LEN = 45  # %45s: INET6_ADDRSTRLEN buffers


@dataclass(frozen=True)
class HostEntry:
    """One preload line: ``type`` is an ``AddrType``, ``gid`` the 16-byte GID."""

    address: str
    type: int
    gid: bytes
    line: int

    @property
    def address_bytes(self) -> bytes:
        """The 64-byte zero-padded binary address (the cache key)."""
        return classify(self.address)[1]


def parse_hosts_file(
    text: str, path: str = "<string>"
) -> tuple[list[HostEntry], list[ConfigIssue]]:
    """Parse hosts-file text into entries (file order) and issues; never raises.

    A later line for the same address overrides an earlier one when preloaded (as in C);
    such repeats are kept and reported.
    """
    sink = IssueSink(path)
    entries: list[HostEntry] = []
    seen: dict[tuple[int, bytes], int] = {}
    for number, line in c_lines(text, sink):
        if line.startswith("#"):
            continue
        tokens = c_tokens(line)
        if not tokens or (tokens[0].startswith("#") and len(tokens) < 2):
            continue
        if tokens[0].startswith("#"):
            sink.warn(
                number,
                f"indented '#' line treated as a comment; the C daemon would read {tokens[0]!r} "
                "as an address",
            )
            continue
        if len(tokens) < 2:
            sink.error(number, "expected '<address> <IB GID>'; line skipped")
            continue
        entry = _entry(tokens, number, sink)
        if entry is None:
            continue
        key = match_key(entry.type, entry.address_bytes)
        if key in seen:
            sink.warn(
                number,
                f"{entry.address} was already listed on line {seen[key]}; this later line wins",
            )
        seen[key] = number
        entries.append(entry)
    return entries, sink.issues


def _entry(tokens: list[str], line: int, sink: IssueSink) -> HostEntry | None:
    address, gid_text = tokens[0], tokens[1]
    for what, value in (("address", address), ("GID", gid_text)):
        if len(encode_text(value)) > MAX_FIELD_LEN:
            sink.error(line, f"{what} {value!r} is longer than {MAX_FIELD_LEN}; line skipped")
            return None
    gid = pton(socket.AF_INET6, gid_text)
    if gid is None:
        sink.error(line, f"{gid_text!r} is not an IB GID (IPv6 address text); line skipped")
        return None
    if len(tokens) > 2 and not tokens[2].startswith("#"):
        sink.warn(line, f"text after the GID {gid_text!r} is ignored")
    addr_type, _ = classify(address)
    return HostEntry(address=address, type=addr_type, gid=gid, line=line)
