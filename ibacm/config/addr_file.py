"""The address file ``ibacm_addr.cfg``: local names (and optionally IPs) of each endpoint.

Each line is ``<address> <device> <port> <pkey>`` (``sscanf("%46s%31s%d%7s")``), ``#`` in the
first column starts a comment, ``pkey`` is ``default`` (the port's first pkey-table entry) or a
hex number with or without ``0x``. IP literals are accepted only with
``support_ips_in_addr_cfg``.

Unlike the C daemon, a bad or duplicate line is reported and skipped and the rest of the file
still loads (C stops adding the file's addresses to the endpoint at the first failure).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ibacm.config.address_literals import classify, encode_text, match_key
from ibacm.config.cnumbers import C_SPACE
from ibacm.config.ctext import c_lines, c_lower, c_tokens
from ibacm.config.errors import ConfigIssue, IssueSink
from ibacm.wire.client import AddrType

MAX_ADDRESS_LEN = 46  # %46s
MAX_DEVICE_LEN = 31  # %31s
MAX_PKEY_LEN = 7  # %7s
PARTITION_MASK = 0x7FFF
IPS_NOT_ALLOWED = "IP's are not configured to be read from ibacm_addr.cfg"

_DECIMAL = re.compile(r"[+-]?[0-9]+")
_HEX_PKEY = re.compile(r"(0[xX])?[0-9a-fA-F]+")


@dataclass(frozen=True)
class AddrEntry:
    """One address line. ``pkey`` None means ``default``; ``type`` is an ``AddrType``."""

    address: str
    type: int
    device: str
    port: int
    pkey: int | None
    line: int

    @property
    def address_bytes(self) -> bytes:
        """The 64-byte zero-padded binary address the daemon stores for this entry."""
        return classify(self.address)[1]


def _parse_port(text: str) -> int | None:
    if not _DECIMAL.fullmatch(text):
        return None
    port = int(text)
    return port if 1 <= port <= 255 else None


def _parse_pkey(text: str) -> int | None:
    """The pkey of a hex pkey field (``%hx``), or None if it is not one."""
    if len(encode_text(text)) > MAX_PKEY_LEN or not _HEX_PKEY.fullmatch(text):
        return None
    value = int(text, 16)
    return value if value <= 0xFFFF else None


def _pkey_key(pkey: int | None) -> int | str:
    return "default" if pkey is None else pkey & PARTITION_MASK


def _entry_from_tokens(
    tokens: list[str], line: int, sink: IssueSink, support_ips: bool
) -> AddrEntry | None:
    """Check one line's fields; report and return None when the line must be skipped."""
    address, device, port_text, pkey_text = tokens[:4]
    if len(encode_text(address)) > MAX_ADDRESS_LEN:
        sink.error(line, f"address {address!r} is longer than {MAX_ADDRESS_LEN}; line skipped")
        return None
    if len(encode_text(device)) > MAX_DEVICE_LEN:
        sink.error(line, f"device {device!r} is longer than {MAX_DEVICE_LEN}; line skipped")
        return None
    port = _parse_port(port_text)
    if port is None:
        sink.error(line, f"port {port_text!r} is not a port number (1-255); line skipped")
        return None
    pkey: int | None = None
    if c_lower(pkey_text) != "default":
        pkey = _parse_pkey(pkey_text)
        if pkey is None:
            sink.error(line, f"pkey {pkey_text!r} is not 'default' or a hex pkey; line skipped")
            return None
        if pkey & PARTITION_MASK == 0:
            sink.error(line, f"pkey {pkey_text!r} is not a valid partition; line skipped")
            return None
    addr_type, _ = classify(address)
    if addr_type != AddrType.NAME and not support_ips:
        sink.error(
            line,
            f"{IPS_NOT_ALLOWED} (address {address!r}; set support_ips_in_addr_cfg 1 to "
            "allow it); line skipped",
        )
        return None
    if len(tokens) > 4 and not tokens[4].startswith("#"):
        sink.warn(line, f"text after the pkey {pkey_text!r} is ignored")
    return AddrEntry(address, addr_type, device, port, pkey, line)


def parse_addr_file(
    text: str, path: str = "<string>", support_ips: bool = False
) -> tuple[list[AddrEntry], list[ConfigIssue]]:
    """Parse address-file text into entries (file order) and issues; never raises."""
    sink = IssueSink(path)
    entries: list[AddrEntry] = []
    seen: dict[tuple[object, ...], int] = {}
    for number, line in c_lines(text, sink):
        if line.startswith("#"):
            continue
        tokens = c_tokens(line)
        if not tokens:
            continue
        if tokens[0].startswith("#"):
            if len(tokens) >= 4:
                sink.warn(
                    number,
                    "indented '#' line treated as a comment; the C daemon would read "
                    f"{tokens[0]!r} as an address",
                )
            continue
        if len(tokens) < 4:
            sink.error(number, "expected 4 fields 'address device port pkey'; line skipped")
            continue
        entry = _entry_from_tokens(tokens, number, sink, support_ips)
        if entry is None:
            continue
        key = (
            *match_key(entry.type, entry.address_bytes),
            c_lower(entry.device),
            entry.port,
            _pkey_key(entry.pkey),
        )
        if key in seen:
            sink.warn(number, f"duplicate of line {seen[key]} ({entry.address}); line skipped")
            continue
        seen[key] = number
        entries.append(entry)
    return entries, sink.issues


def entries_for(
    entries: Iterable[AddrEntry], device: str, port: int, pkey: int, default_pkey: int
) -> list[AddrEntry]:
    """The entries of one endpoint, in file order, each address once.

    The device name matches in any case; the partition matches on the low 15 bits (the
    membership bit is ignored); ``default`` lines use ``default_pkey``.
    """
    wanted_device = c_lower(device)
    partition = pkey & PARTITION_MASK
    chosen: list[AddrEntry] = []
    taken: set[tuple[int, bytes]] = set()
    for entry in entries:
        entry_pkey = default_pkey if entry.pkey is None else entry.pkey
        if (
            c_lower(entry.device) != wanted_device
            or entry.port != port
            or entry_pkey & PARTITION_MASK != partition
        ):
            continue
        key = match_key(entry.type, entry.address_bytes)
        if key not in taken:
            taken.add(key)
            chosen.append(entry)
    return chosen


_ADDR_FILE_HEADER = """\
# ibacm_addr.cfg: local addresses served by the InfiniBand Communication Management Assistant
#
# Written by 'ib_acme -A'; run it again after changing adapters or the host name.
#
# One address per line:  <address> <device> <port> <pkey>
#   address  a host name (up to 46 characters). IPv4/IPv6 addresses of IPoIB interfaces
#            are found automatically and need not be listed; IP literals here are read
#            only with 'support_ips_in_addr_cfg 1' in ibacm_opts.cfg.
#   device   verbs device name, as listed by ibv_devices (e.g. mlx5_0)
#   port     port number, starting at 1
#   pkey     partition key in hex (e.g. 0x8001), or 'default' for the port's first entry
# An endpoint may have any number of addresses.
#
# Samples:
# node31      ibv_device0  1  default
# node31-1    ibv_device0  1  0x00FF
# node31-2    ibv_device0  2  0x00FF
#
"""


def _check_field(what: str, value: str, limit: int) -> None:
    if not value or any(char in C_SPACE for char in value):
        raise ValueError(f"{what} {value!r} must be a non-empty word without white space")
    if len(encode_text(value)) > limit:
        raise ValueError(f"{what} {value!r} is longer than {limit} characters")


def generate_addr_file(ports: Sequence[tuple[str, int, bool]], hostname: str) -> str:
    """The ``ib_acme -A`` file for ``ports`` (device, port number, active) in verbs order.

    The short host name (up to the first dot) goes on the first active port, and
    ``<host>-<n>`` on every port, n counting from 1 across all devices.
    """
    host = hostname.split(".", 1)[0]
    _check_field("host name", host, MAX_ADDRESS_LEN - len(f"-{max(len(ports), 1)}"))
    lines: list[str] = []
    named_active = False
    for number, (device, port, active) in enumerate(ports, start=1):
        _check_field("device", device, MAX_DEVICE_LEN)
        if not 1 <= port <= 255:
            raise ValueError(f"port {port} of {device} is not a port number (1-255)")
        if active and not named_active:
            lines.append(f"{host} {device} {port} default")
            named_active = True
        lines.append(f"{host}-{number} {device} {port} default")
    return _ADDR_FILE_HEADER + "".join(f"{line}\n" for line in lines)
