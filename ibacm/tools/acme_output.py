"""``ib_acme``'s output: the C tool's exact text, or one JSON document (``--json``).

The text formats are ib_acme.md §3.3 (path block, 0x1F masks kept so the text stays
identical, defect 52), §5 (perf rows and columns) and §6 (endpoint rows); the CSV headers are
printed once per process, as in C. ``JsonReporter`` carries the same facts, unmasked.
``Progress`` draws the ``-C`` progress bar on a terminal only.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Sequence
from typing import Any, TextIO

from ibacm.wire.client import EpConfig
from ibacm.wire.counters import Counter
from ibacm.wire.path_record import PathRecord


def counter_name(index: int) -> str:
    """The label of the counter at ``index`` of a reply; ``Unknown`` past the ones this tool
    knows (a daemon of ours sends no more than ``ACM_MAX_COUNTER``; another might)."""
    return Counter(index).label if 0 <= index < len(Counter) else "Unknown"


def gid_text(gid: bytes) -> str:
    """A GID as ``inet_ntop`` writes it (the C library's formatting, IPv4 tails included)."""
    return socket.inet_ntop(socket.AF_INET6, gid)


def path_lines(path: PathRecord) -> list[str]:
    """The path block (ib_acme.md §3.3), 0x1F masks included so the text stays identical."""
    return [
        "Path information",
        f"  dgid: {gid_text(path.dgid)}",
        f"  sgid: {gid_text(path.sgid)}",
        f"  dlid: {path.dlid}",
        f"  slid: {path.slid}",
        f"  flow label: 0x{path.flowlabel_hoplimit >> 8:x}",
        f"  hop limit: {path.hop_limit}",
        f"  tclass: {path.tclass}",
        f"  reversible: {path.reversible_numpath >> 7}",
        f"  pkey: 0x{path.pkey:x}",
        f"  sl: {path.sl}",
        f"  mtu: {path.mtu_byte & 0x1F}",
        f"  rate: {path.rate_byte & 0x1F}",
        f"  packet lifetime: {path.packetlifetime_byte & 0x1F}",
    ]


def path_json(path: PathRecord) -> dict[str, Any]:
    """The path for ``--json``: every field, unmasked (defect 52 stays in the text only)."""
    return {
        "service_id": f"0x{path.service_id:016x}",
        "dgid": gid_text(path.dgid),
        "sgid": gid_text(path.sgid),
        "dlid": path.dlid,
        "slid": path.slid,
        "flow_label": path.flow_label,
        "hop_limit": path.hop_limit,
        "tclass": path.tclass,
        "reversible": path.reversible,
        "numb_path": path.numb_path,
        "pkey": f"0x{path.pkey:04x}",
        "qos_class": path.qos_class,
        "sl": path.sl,
        "mtu": path.mtu,
        "mtu_selector": path.mtu_selector,
        "rate": path.rate,
        "rate_selector": path.rate_selector,
        "packet_lifetime": path.packet_life,
        "packet_lifetime_selector": path.packet_life_selector,
        "preference": path.preference,
        "record": path.encode().hex(),
    }


def perf_header(count: int) -> str:
    return ",".join(["svc", *(counter_name(i) for i in range(count))])


def perf_row(service: str, counters: Sequence[int]) -> str:
    return ",".join([service, *(str(value) for value in counters)])


def perf_column(service: str, counters: Sequence[int]) -> list[str]:
    return [service, *(f"{counter_name(i)} : {value}" for i, value in enumerate(counters))]


EP_HEADER = "svc,guid,port,pkey,ep_index,prov,addr_0,addresses"


def ep_row(service: str, index: int, config: EpConfig) -> str:
    head = (
        f"{service},0x{config.dev_guid:016x},{config.port_num},0x{config.pkey:04x},"
        f"{index},{config.prov_name}"
    )
    return head + "".join(f",{address}" for address in config.addrs)


class Reporter:
    """Where results go: the C tool's text, or one JSON document (``--json``)."""

    def contact_failed(self, service: str, message: str) -> None: ...
    def service_start(self, service: str) -> None: ...
    def resolve_start(self, service: str) -> None: ...
    def pair_start(self, dest: str, source: str | None, fmt: str) -> None: ...
    def server_source(self, address: str) -> None: ...
    def error(self, text: str) -> None: ...
    def path(self, path: PathRecord) -> None: ...
    def verified(self, ok: bool, message: str) -> None: ...
    def pair_end(self, ret: int) -> None: ...
    def perf(self, service: str, counters: Sequence[int], scope: str, column: bool) -> None: ...
    def perf_failed(self, service: str, message: str) -> None: ...
    def endpoint(self, service: str, index: int, config: EpConfig) -> None: ...
    def endpoint_missing(self, index: int) -> None: ...
    def verbose(self, text: str) -> None: ...
    def generated(self, kind: str, path: str, entries: Sequence[str]) -> None: ...
    def finish(self, ret: int, show_status: bool) -> None: ...


class TextReporter(Reporter):
    """Byte-for-byte the C tool's stdout."""

    def __init__(self, out: TextIO, *, verbose: bool) -> None:
        self._out = out
        self._verbose = verbose
        self._perf_labels = False  # the headers are printed once per process, as in C
        self._ep_labels = False

    def _line(self, text: str) -> None:
        self._out.write(text + "\n")

    def contact_failed(self, service: str, message: str) -> None:
        self._line(f"{service},unable to contact service: {message}")

    def resolve_start(self, service: str) -> None:
        self._line(f"Service: {service}")

    def pair_start(self, dest: str, source: str | None, fmt: str) -> None:
        self._line(f"Destination: {dest}")
        if source is not None:
            self._line(f"Source: {source}")

    def server_source(self, address: str) -> None:
        self._line(f"Source: {address}")

    def error(self, text: str) -> None:
        self._line(text)

    def path(self, path: PathRecord) -> None:
        for line in path_lines(path):
            self._line(line)

    def verified(self, ok: bool, message: str) -> None:
        self._line("SA verification: success" if ok else f"SA verification: failed {message}")

    def pair_end(self, ret: int) -> None:
        self._line("")

    def perf(self, service: str, counters: Sequence[int], scope: str, column: bool) -> None:
        if column:
            for line in perf_column(service, counters):
                self._line(line)
            return
        if not self._perf_labels:
            self._line(perf_header(len(counters)))
            self._perf_labels = True
        self._line(perf_row(service, counters))

    def perf_failed(self, service: str, message: str) -> None:
        self._line(f"{service}: Failed to query perf data: {message}")

    def endpoint(self, service: str, index: int, config: EpConfig) -> None:
        if not self._ep_labels:
            self._line(EP_HEADER)
            self._ep_labels = True
        self._line(ep_row(service, index, config))

    def endpoint_missing(self, index: int) -> None:
        self._line(f" Endpoint {index} is not available")

    def verbose(self, text: str) -> None:
        if self._verbose:
            self._line(text)

    def generated(self, kind: str, path: str, entries: Sequence[str]) -> None:
        # With -V the C tool echoes the address file's entries, not the option file's.
        if self._verbose and kind == "address":
            for entry in entries:
                self._line(entry)

    def finish(self, ret: int, show_status: bool) -> None:
        if show_status:
            self._line(f"return status 0x{ret & 0xFFFFFFFF:x}")
        self._out.flush()


class JsonReporter(Reporter):
    """Collects everything into one document, written by ``finish``."""

    _FORMATS = {"i": "ip", "n": "name", "l": "lid", "g": "gid"}

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._doc: dict[str, Any] = {"services": [], "generated": [], "errors": []}
        self._service: dict[str, Any] | None = None
        self._pair: dict[str, Any] | None = None

    def _current_service(self, service: str) -> dict[str, Any]:
        if self._service is None or self._service["service"] != service:
            self.service_start(service)
        assert self._service is not None
        return self._service

    def contact_failed(self, service: str, message: str) -> None:
        self._doc["services"].append({"service": service, "contacted": False, "error": message})
        self._service = None

    def service_start(self, service: str) -> None:
        self._service = {"service": service, "contacted": True, "errors": []}
        self._doc["services"].append(self._service)
        self._pair = None

    def resolve_start(self, service: str) -> None:
        self._current_service(service)["resolutions"] = []

    def pair_start(self, dest: str, source: str | None, fmt: str) -> None:
        assert self._service is not None
        self._pair = {
            "destination": dest,
            "source": source,
            "format": self._FORMATS.get(fmt, fmt),
            "status": None,
            "chosen_sources": [],
            "errors": [],
            "path": None,
            "verification": None,
        }
        self._service["resolutions"].append(self._pair)

    def server_source(self, address: str) -> None:
        if self._pair is not None:
            self._pair["chosen_sources"].append(address)

    def error(self, text: str) -> None:
        if self._pair is not None:
            self._pair["errors"].append(text)
        elif self._service is not None:
            self._service["errors"].append(text)
        else:
            self._doc["errors"].append(text)

    def path(self, path: PathRecord) -> None:
        if self._pair is not None:
            self._pair["path"] = path_json(path)

    def verified(self, ok: bool, message: str) -> None:
        if self._pair is not None:
            self._pair["verification"] = {"success": ok, "error": None if ok else message}

    def pair_end(self, ret: int) -> None:
        if self._pair is not None:
            self._pair["status"] = ret
        self._pair = None

    def perf(self, service: str, counters: Sequence[int], scope: str, column: bool) -> None:
        entry = {
            "scope": scope,
            "counters": {counter_name(i): value for i, value in enumerate(counters)},
        }
        self._current_service(service).setdefault("perf", []).append(entry)

    def perf_failed(self, service: str, message: str) -> None:
        self._current_service(service).setdefault("perf_errors", []).append(message)

    def endpoint(self, service: str, index: int, config: EpConfig) -> None:
        self._current_service(service).setdefault("endpoints", []).append(
            {
                "guid": f"0x{config.dev_guid:016x}",
                "port": config.port_num,
                "phys_port_cnt": config.phys_port_cnt,
                "pkey": f"0x{config.pkey:04x}",
                "ep_index": index,
                "provider": config.prov_name,
                "addresses": list(config.addrs),
            }
        )

    def endpoint_missing(self, index: int) -> None:
        self.error(f"Endpoint {index} is not available")

    def generated(self, kind: str, path: str, entries: Sequence[str]) -> None:
        self._doc["generated"].append({"kind": kind, "file": path, "entries": list(entries)})

    def finish(self, ret: int, show_status: bool) -> None:
        self._doc["return_status"] = ret
        json.dump(self._doc, self._out, indent=2)
        self._out.write("\n")
        self._out.flush()


class Progress:
    """A one-line progress bar on a terminal (stderr) for ``-C`` repetitions; silent otherwise."""

    WIDTH = 30
    INTERVAL = 0.1  # seconds between redraws, so drawing never slows the measurement

    def __init__(self, stream: TextIO, total: int, label: str) -> None:
        self._stream = stream
        self._total = total
        self._label = label
        self._done = 0
        self._drawn_at = 0.0
        self._active = total > 1 and _is_tty(stream)

    def advance(self) -> None:
        self._done += 1
        if not self._active:
            return
        now = time.monotonic()
        if now - self._drawn_at >= self.INTERVAL or self._done == self._total:
            self._drawn_at = now
            filled = self.WIDTH * self._done // self._total
            bar = "#" * filled + "-" * (self.WIDTH - filled)
            self._stream.write(f"\r{self._label} [{bar}] {self._done}/{self._total}")
            self._stream.flush()

    def close(self) -> None:
        if self._active:
            self._stream.write("\r\033[K")
            self._stream.flush()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
