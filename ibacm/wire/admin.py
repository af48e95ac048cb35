"""The admin protocol codec: versioned, line-delimited JSON between the daemon and its tools.

Pure and sans-I/O, shared by the daemon (trio) and the dashboard (asyncio): bytes go in,
typed messages come out, and messages become bytes. ``docs/admin-protocol.md`` is the
reference; the rules in short:

* every message is one UTF-8 JSON object on one line ending in ``\\n``;
* a request is ``{"v": 1, "id": <int|str|null>, "cmd": "<command>", ...arguments}``;
* a reply is ``{"v": 1, "id": <same>, "ok": true, "result": ...}`` or
  ``{"v": 1, "id": <same>, "ok": false, "error": "<text>", "code": "<code>"}``;
* after ``subscribe`` the server also sends ``{"v": 1, "event": kind, "data": {...}, "ts": t}``;
* request lines longer than ``MAX_REQUEST_LINE`` bytes are refused.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import enum
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypedDict

from ibacm.wire.counters import Counter

PROTOCOL_VERSION: Final = 1
SUPPORTED_VERSIONS: Final[tuple[int, ...]] = (1,)

MAX_REQUEST_LINE: Final = 64 * 1024
"""Longest request line the server accepts (bytes, newline excluded)."""
MAX_SERVER_LINE: Final = 64 * 1024 * 1024
"""Longest line a client accepts (a snapshot of a large cache is one line)."""

MAX_REPLAY: Final = 1000
"""Most recent log records a ``subscribe`` may ask to have replayed."""

LOG_LEVELS: Final[tuple[int, ...]] = (0, 1, 2)
"""ACM ``log_level`` values: 0 basic, 1 verbose configuration, 2 verbose operation."""


def named_counters(values: Any) -> Any:
    """Counters in wire order as ``{Counter.key: value}`` (for people and scripts); a value
    that is not a list of them is returned as it is."""
    if not isinstance(values, list | tuple) or len(values) != len(Counter):
        return values
    return {counter.key: value for counter, value in zip(Counter, values, strict=True)}


def snapshot_with_named_counters(snapshot: Any) -> Any:
    """A copy of a snapshot whose global and per-endpoint ``counters`` are named fields.

    The protocol keeps the arrays (readers in the field use them); this is the form
    ``ibacm-admin --json`` prints."""
    if not isinstance(snapshot, dict):
        return snapshot
    named = dict(snapshot)
    if "counters" in named:
        named["counters"] = named_counters(named["counters"])
    endpoints = named.get("endpoints")
    if isinstance(endpoints, list):
        named["endpoints"] = [
            {**ep, "counters": named_counters(ep["counters"])}
            if isinstance(ep, dict) and "counters" in ep
            else ep
            for ep in endpoints
        ]
    return named


class Command(enum.StrEnum):
    HELLO = "hello"
    SNAPSHOT = "snapshot"
    SUBSCRIBE = "subscribe"
    UNSUBSCRIBE = "unsubscribe"
    FLUSH = "flush"
    RELOAD = "reload"
    SET_LOG_LEVEL = "set_log_level"
    CAPTURE = "capture"


CAPTURE_ACTIONS = ("start", "stop", "status")
"""Actions of the ``capture`` command (MAD capture to a pcap/ERF file)."""


class ErrorCode(enum.StrEnum):
    """Machine-readable reason of an error reply (the ``code`` field)."""

    BAD_JSON = "bad_json"
    BAD_REQUEST = "bad_request"
    LINE_TOO_LONG = "line_too_long"
    UNSUPPORTED_VERSION = "unsupported_version"
    UNKNOWN_COMMAND = "unknown_command"
    BAD_ARGUMENT = "bad_argument"
    FAILED = "failed"
    BUSY = "busy"
    INVALID_CONFIG = "invalid_config"
    """A reload was refused: ``result.problems`` lists each problem (file:line: key ...)."""


class EventKind(enum.StrEnum):
    """Event kinds the daemon publishes (subscribers may name others; unknown kinds are fine)."""

    LOG = "log"
    CACHE = "cache"
    GROUP = "group"
    ENDPOINT = "endpoint"
    PORT = "port"
    STATS = "stats"
    DROPPED = "dropped"


RequestId = int | str | None


class AdminProtocolError(Exception):
    """A line that is not a valid message; ``code`` and ``request_id`` feed the error reply."""

    def __init__(self, message: str, code: ErrorCode, request_id: RequestId = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.request_id = request_id


# -- snapshot schema (documentation for both sides; every key is optional to readers) -----------


class CacheEntryInfo(TypedDict, total=False):
    dest: str
    type: str
    state: str
    age: float
    hits: int
    dlid: int
    sl: int
    mtu: int
    rate: int


class GroupInfo(TypedDict, total=False):
    mgid: str
    mlid: int
    rate: int
    mtu: int
    state: str
    pkey: int


class AddressInfo(TypedDict, total=False):
    type: str
    address: str


class EndpointInfo(TypedDict, total=False):
    id: str
    device: str
    port: int
    pkey: int
    state: str
    provider: str
    provider_origin: str
    """Where the provider was loaded from: a Python entry point or a library path."""
    addresses: list[AddressInfo]
    groups: list[GroupInfo]
    cache: list[CacheEntryInfo]
    counters: list[int]


class PortInfo(TypedDict, total=False):
    id: str
    device: str
    port: int
    state: str
    lid: int
    lmc: int
    sm_lid: int
    gid: str
    mtu: int
    rate: str
    pkeys: list[int]


class Snapshot(TypedDict, total=False):
    daemon: dict[str, Any]
    options: dict[str, Any]
    counters: list[int]
    ports: list[PortInfo]
    endpoints: list[EndpointInfo]


# -- messages ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    cmd: Command
    id: RequestId = None
    args: Mapping[str, Any] = field(default_factory=dict)
    v: int = PROTOCOL_VERSION


@dataclass(frozen=True, slots=True)
class Reply:
    id: RequestId
    ok: bool
    result: Any = None
    error: str | None = None
    code: ErrorCode | str | None = None
    v: int = PROTOCOL_VERSION


@dataclass(frozen=True, slots=True)
class EventMessage:
    event: str
    data: Mapping[str, Any]
    ts: float
    v: int = PROTOCOL_VERSION


ServerMessage = Reply | EventMessage


# -- argument validation -----------------------------------------------------------------------


def _optional_str(request: Mapping[str, Any], key: str, request_id: RequestId) -> str | None:
    value = request.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise AdminProtocolError(
            f"{key!r} must be a non-empty string or null, got {value!r}",
            ErrorCode.BAD_ARGUMENT,
            request_id,
        )
    return value.strip()


def _bounded_int(
    request: Mapping[str, Any], key: str, request_id: RequestId, *, low: int, high: int
) -> int | None:
    value = request.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise AdminProtocolError(
            f"{key!r} must be an integer from {low} to {high}, got {value!r}",
            ErrorCode.BAD_ARGUMENT,
            request_id,
        )
    return value


def _versions(request: Mapping[str, Any], request_id: RequestId) -> list[int]:
    value = request.get("versions", [request.get("v", PROTOCOL_VERSION)])
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise AdminProtocolError(
            f"'versions' must be a non-empty list of integers, got {value!r}",
            ErrorCode.BAD_ARGUMENT,
            request_id,
        )
    return list(value)


def _kinds(request: Mapping[str, Any], request_id: RequestId) -> list[str] | None:
    value = request.get("kinds")
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(k, str) and k for k in value):
        raise AdminProtocolError(
            f"'kinds' must be a list of event kinds (strings) or null, got {value!r}",
            ErrorCode.BAD_ARGUMENT,
            request_id,
        )
    return list(value)


def _level(request: Mapping[str, Any], request_id: RequestId) -> int:
    value = request.get("level")
    if isinstance(value, bool) or not isinstance(value, int) or value not in LOG_LEVELS:
        raise AdminProtocolError(
            f"'level' must be one of {list(LOG_LEVELS)}, got {value!r}",
            ErrorCode.BAD_ARGUMENT,
            request_id,
        )
    return value


def _arguments(cmd: Command, raw: Mapping[str, Any], request_id: RequestId) -> dict[str, Any]:
    """The validated arguments of ``cmd`` (unknown extra keys are ignored, for forward use)."""
    if cmd is Command.HELLO:
        return {"versions": _versions(raw, request_id), "client": raw.get("client")}
    if cmd is Command.SUBSCRIBE:
        return {
            "kinds": _kinds(raw, request_id),
            "max_queue": _bounded_int(raw, "max_queue", request_id, low=1, high=100_000),
            "replay": _bounded_int(raw, "replay", request_id, low=0, high=MAX_REPLAY) or 0,
        }
    if cmd is Command.FLUSH:
        return {
            "endpoint": _optional_str(raw, "endpoint", request_id),
            "dest": _optional_str(raw, "dest", request_id),
        }
    if cmd is Command.SET_LOG_LEVEL:
        return {"level": _level(raw, request_id)}
    if cmd is Command.CAPTURE:
        action = raw.get("action", "status")
        if action not in CAPTURE_ACTIONS:
            raise AdminProtocolError(
                f"'action' must be one of {', '.join(CAPTURE_ACTIONS)}, got {action!r}",
                ErrorCode.BAD_ARGUMENT,
                request_id,
            )
        return {"action": action, "path": _optional_str(raw, "path", request_id)}
    return {}


# -- decoding ----------------------------------------------------------------------------------


def _load_object(line: bytes) -> dict[str, Any]:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AdminProtocolError(
            f"line is not UTF-8 (byte {exc.start})", ErrorCode.BAD_JSON
        ) from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise AdminProtocolError(f"line is not JSON: {exc}", ErrorCode.BAD_JSON) from None
    if not isinstance(value, dict):
        raise AdminProtocolError(
            f"a message must be a JSON object, got {type(value).__name__}", ErrorCode.BAD_REQUEST
        )
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _request_id(value: Any) -> RequestId:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise AdminProtocolError(
        f"'id' must be an integer, a string or null, got {value!r}", ErrorCode.BAD_REQUEST
    )


def parse_request(line: bytes) -> Request:
    """Decode one request line (without its newline); raises AdminProtocolError."""
    raw = _load_object(line)
    request_id = _request_id(raw.get("id"))
    version = raw.get("v", PROTOCOL_VERSION)
    if isinstance(version, bool) or not isinstance(version, int):
        raise AdminProtocolError(
            f"'v' must be an integer, got {version!r}", ErrorCode.BAD_REQUEST, request_id
        )
    cmd_name = raw.get("cmd")
    if not isinstance(cmd_name, str):
        raise AdminProtocolError(
            f"'cmd' must be a string, got {cmd_name!r}", ErrorCode.BAD_REQUEST, request_id
        )
    try:
        cmd = Command(cmd_name)
    except ValueError:
        known = ", ".join(c.value for c in Command)
        raise AdminProtocolError(
            f"unknown command {cmd_name!r} (known: {known})",
            ErrorCode.UNKNOWN_COMMAND,
            request_id,
        ) from None
    # hello negotiates; every other request must already speak a version we know.
    if cmd is not Command.HELLO and version not in SUPPORTED_VERSIONS:
        raise AdminProtocolError(
            f"protocol version {version} is not supported (supported: {list(SUPPORTED_VERSIONS)})",
            ErrorCode.UNSUPPORTED_VERSION,
            request_id,
        )
    return Request(cmd, request_id, _arguments(cmd, raw, request_id), version)


def negotiate(offered: Sequence[int]) -> int | None:
    """The highest version both sides speak, or None."""
    common = set(offered) & set(SUPPORTED_VERSIONS)
    return max(common) if common else None


def parse_server_message(line: bytes) -> ServerMessage:
    """Decode one line from the server (client side); raises AdminProtocolError."""
    raw = _load_object(line)
    version = raw.get("v", PROTOCOL_VERSION)
    if not isinstance(version, int) or isinstance(version, bool):
        raise AdminProtocolError(f"'v' must be an integer, got {version!r}", ErrorCode.BAD_REQUEST)
    if "event" in raw:
        kind, data, ts = raw["event"], raw.get("data", {}), raw.get("ts", 0.0)
        if not isinstance(kind, str) or not isinstance(data, dict):
            raise AdminProtocolError(
                "an event needs a string 'event' and an object 'data'", ErrorCode.BAD_REQUEST
            )
        if isinstance(ts, bool) or not isinstance(ts, int | float):
            raise AdminProtocolError(f"'ts' must be a number, got {ts!r}", ErrorCode.BAD_REQUEST)
        return EventMessage(kind, data, float(ts), version)
    ok = raw.get("ok")
    if not isinstance(ok, bool):
        raise AdminProtocolError(
            "a server message is either an event or a reply with a boolean 'ok'",
            ErrorCode.BAD_REQUEST,
        )
    request_id = _request_id(raw.get("id"))
    if ok:
        return Reply(request_id, True, raw.get("result"), v=version)
    error = raw.get("error")
    code = raw.get("code")
    return Reply(
        request_id,
        False,
        raw.get("result"),  # details of the error, when the server gave any
        error if isinstance(error, str) else repr(error),
        code if isinstance(code, str) else None,
        version,
    )


# -- encoding ----------------------------------------------------------------------------------


def to_jsonable(value: Any) -> Any:
    """``json.dumps`` default: daemon objects become plain JSON values, never an exception."""
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b16encode(bytes(value)).decode("ascii").lower()
    if isinstance(value, set | frozenset | tuple | collections.deque):
        return list(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def _clean_floats(value: Any) -> Any:
    # JSON has no NaN/Infinity; a bad number in a snapshot must not break the stream.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean_floats(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean_floats(v) for v in value]
    return value


def _dump(obj: Mapping[str, Any]) -> bytes:
    try:
        text = json.dumps(obj, separators=(",", ":"), default=to_jsonable, allow_nan=False)
    except ValueError:
        text = json.dumps(
            _clean_floats(obj), separators=(",", ":"), default=to_jsonable, allow_nan=False
        )
    return text.encode("utf-8") + b"\n"


def encode_request(request: Request) -> bytes:
    body: dict[str, Any] = {"v": request.v, "id": request.id, "cmd": request.cmd.value}
    for key, value in request.args.items():
        if key in body:
            raise ValueError(f"argument {key!r} clashes with a protocol field")
        body[key] = value
    line = _dump(body)
    if len(line) - 1 > MAX_REQUEST_LINE:
        raise ValueError(f"request is {len(line) - 1} bytes, over the {MAX_REQUEST_LINE} limit")
    return line


def encode_reply(reply: Reply) -> bytes:
    body: dict[str, Any] = {"v": reply.v, "id": reply.id, "ok": reply.ok}
    if reply.ok:
        body["result"] = reply.result
    else:
        body["error"] = reply.error or "error"
        if reply.code is not None:
            body["code"] = str(reply.code)
        if reply.result is not None:
            body["result"] = reply.result
    return _dump(body)


def encode_event(event: EventMessage) -> bytes:
    return _dump({"v": event.v, "event": event.event, "data": event.data, "ts": event.ts})


def ok_reply(request_id: RequestId, result: Any = None) -> Reply:
    return Reply(request_id, True, result)


def error_reply(request_id: RequestId, message: str, code: ErrorCode, result: Any = None) -> Reply:
    return Reply(request_id, False, result, message, code)


# -- framing -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LineTooLong:
    """A line over the limit was skipped; ``length`` counts the bytes seen of it."""

    length: int


class LineBuffer:
    """Splits a byte stream into lines; a too-long line becomes one ``LineTooLong`` item.

    Memory stays bounded by ``max_line``: the rest of an oversize line is discarded as it
    arrives, and framing resumes at the next newline.
    """

    def __init__(self, max_line: int) -> None:
        if max_line < 1:
            raise ValueError(f"max_line must be positive, got {max_line}")
        self.max_line = max_line
        self._buffer = bytearray()
        self._skipping: int | None = None
        """Bytes discarded so far of an oversize line, or None when not skipping."""

    @property
    def pending(self) -> int:
        """Bytes of an unfinished line held in memory."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes | LineTooLong]:
        """Add received bytes; returns the complete lines (without newline), in order."""
        out: list[bytes | LineTooLong] = []
        pos = 0
        while pos < len(data):
            newline = data.find(b"\n", pos)
            end = newline if newline >= 0 else len(data)
            if self._skipping is not None:
                self._skipping += end - pos
            else:
                self._buffer += data[pos:end]
                if len(self._buffer) > self.max_line:
                    self._skipping = len(self._buffer)
                    self._buffer.clear()
            if newline < 0:
                break
            if self._skipping is not None:
                out.append(LineTooLong(self._skipping))
                self._skipping = None
            else:
                out.append(bytes(self._buffer))
                self._buffer.clear()
            pos = newline + 1
        return out

    def tail(self) -> bytes | LineTooLong | None:
        """What is left at end of stream: an unterminated line, its overflow, or nothing."""
        if self._skipping is not None:
            return LineTooLong(self._skipping)
        if self._buffer:
            return bytes(self._buffer)
        return None
