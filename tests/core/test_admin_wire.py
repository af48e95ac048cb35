"""The admin protocol codec (ibacm.wire.admin): framing, requests, replies, events."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibacm.wire import admin as wire

# -- framing -----------------------------------------------------------------------------------


def test_lines_split_across_reads_and_coalesced_in_one_read() -> None:
    buffer = wire.LineBuffer(100)
    assert buffer.feed(b'{"a"') == []
    assert buffer.pending == 4
    assert buffer.feed(b":1}\n{}\n{") == [b'{"a":1}', b"{}"]
    assert buffer.tail() == b"{"


def test_oversize_line_is_reported_once_and_framing_resumes() -> None:
    buffer = wire.LineBuffer(10)
    out = buffer.feed(b"x" * 8)
    out += buffer.feed(b"y" * 8)  # now over the limit: memory is released
    assert buffer.pending == 0
    out += buffer.feed(b"z" * 1000)
    out += buffer.feed(b"\nok\n")
    assert out == [wire.LineTooLong(1016), b"ok"]


def test_line_of_exactly_the_limit_is_accepted() -> None:
    buffer = wire.LineBuffer(5)
    assert buffer.feed(b"12345\n123456\n") == [b"12345", wire.LineTooLong(6)]


def test_unterminated_oversize_tail_is_reported() -> None:
    buffer = wire.LineBuffer(3)
    buffer.feed(b"abcdef")
    assert buffer.tail() == wire.LineTooLong(6)
    assert wire.LineBuffer(3).tail() is None


def test_line_buffer_needs_a_positive_limit() -> None:
    with pytest.raises(ValueError, match="max_line must be positive"):
        wire.LineBuffer(0)


@given(
    st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=20),
    st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=30),
)
def test_any_chunking_gives_the_same_lines(lines: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(line + b"\n" for line in lines)
    buffer = wire.LineBuffer(30)
    out: list[bytes | wire.LineTooLong] = []
    pos, index = 0, 0
    while pos < len(stream):
        step = cuts[index % len(cuts)]
        out += buffer.feed(stream[pos : pos + step])
        pos, index = pos + step, index + 1
    expected = [line if len(line) <= 30 else wire.LineTooLong(len(line)) for line in lines]
    assert out == expected
    assert buffer.tail() is None


# -- requests ----------------------------------------------------------------------------------


def test_request_defaults_and_arguments() -> None:
    request = wire.parse_request(b'{"cmd": "flush", "dest": " 10.0.0.3 ", "extra": 1}')
    assert request.cmd is wire.Command.FLUSH
    assert (request.id, request.v) == (None, 1)
    assert dict(request.args) == {"endpoint": None, "dest": "10.0.0.3"}


def test_hello_versions_default_to_the_request_version() -> None:
    assert wire.parse_request(b'{"v": 1, "cmd": "hello"}').args["versions"] == [1]
    offered = wire.parse_request(b'{"v": 7, "cmd": "hello", "versions": [7, 1]}')
    assert wire.negotiate(offered.args["versions"]) == 1
    assert wire.negotiate([2, 3]) is None


@pytest.mark.parametrize(
    ("line", "code", "request_id", "text"),
    [
        (b"", wire.ErrorCode.BAD_JSON, None, "not JSON"),
        (b"{", wire.ErrorCode.BAD_JSON, None, "not JSON"),
        (b'"hello"', wire.ErrorCode.BAD_REQUEST, None, "got str"),
        (b'{"id": [1], "cmd": "hello"}', wire.ErrorCode.BAD_REQUEST, None, "'id' must be"),
        (b'{"id": true, "cmd": "hello"}', wire.ErrorCode.BAD_REQUEST, None, "'id' must be"),
        (b'{"id": 4, "v": "1", "cmd": "hello"}', wire.ErrorCode.BAD_REQUEST, 4, "'v' must"),
        (b'{"id": 5, "cmd": 3}', wire.ErrorCode.BAD_REQUEST, 5, "'cmd' must be a string"),
        (b'{"id": "a", "cmd": "nope"}', wire.ErrorCode.UNKNOWN_COMMAND, "a", "unknown command"),
        (b'{"id": 6, "v": 2, "cmd": "reload"}', wire.ErrorCode.UNSUPPORTED_VERSION, 6, "[1]"),
        (b'{"id": 7, "cmd": "hello", "versions": []}', wire.ErrorCode.BAD_ARGUMENT, 7, "list"),
        (b'{"id": 8, "cmd": "flush", "endpoint": ""}', wire.ErrorCode.BAD_ARGUMENT, 8, "empty"),
        (b'{"id": 9, "cmd": "set_log_level"}', wire.ErrorCode.BAD_ARGUMENT, 9, "got None"),
        (b'{"id": 10, "cmd": "subscribe", "kinds": [""]}', wire.ErrorCode.BAD_ARGUMENT, 10, ""),
        (b'{"cmd": "snapshot", "x": Infinity}', wire.ErrorCode.BAD_JSON, None, "Infinity"),
        (b"[" * 100_000, wire.ErrorCode.BAD_JSON, None, "not JSON"),
    ],
)
def test_bad_requests_raise_specific_errors(
    line: bytes, code: wire.ErrorCode, request_id: wire.RequestId, text: str
) -> None:
    with pytest.raises(wire.AdminProtocolError) as caught:
        wire.parse_request(line)
    assert caught.value.code is code
    assert caught.value.request_id == request_id
    assert text in caught.value.message


json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)


@given(
    st.integers(min_value=-(2**63), max_value=2**63) | st.text(max_size=10) | st.none(),
    st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=3),
)
def test_hello_request_round_trip(request_id: wire.RequestId, versions: list[int]) -> None:
    line = wire.encode_request(wire.Request(wire.Command.HELLO, request_id, {"versions": versions}))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    parsed = wire.parse_request(line[:-1])
    assert (parsed.cmd, parsed.id, parsed.args["versions"]) == (
        wire.Command.HELLO,
        request_id,
        versions,
    )


def test_request_encoder_refuses_clashing_and_oversize_arguments() -> None:
    with pytest.raises(ValueError, match="clashes"):
        wire.encode_request(wire.Request(wire.Command.FLUSH, 1, {"cmd": "x"}))
    with pytest.raises(ValueError, match="over the 65536 limit"):
        wire.encode_request(wire.Request(wire.Command.FLUSH, 1, {"dest": "x" * 70_000}))


# -- server messages ---------------------------------------------------------------------------


@settings(max_examples=50)
@given(json_values, st.integers() | st.none())
def test_reply_round_trip(result: object, request_id: int | None) -> None:
    line = wire.encode_reply(wire.ok_reply(request_id, result))
    assert line.count(b"\n") == 1
    parsed = wire.parse_server_message(line[:-1])
    assert parsed == wire.Reply(request_id, True, result)


def test_error_reply_round_trip() -> None:
    line = wire.encode_reply(
        wire.error_reply(3, "no", wire.ErrorCode.UNSUPPORTED_VERSION, {"versions": [1]})
    )
    body = json.loads(line)
    assert body == {
        "v": 1,
        "id": 3,
        "ok": False,
        "error": "no",
        "code": "unsupported_version",
        "result": {"versions": [1]},
    }
    parsed = wire.parse_server_message(line.strip())
    assert isinstance(parsed, wire.Reply)
    assert (parsed.ok, parsed.error, parsed.code) == (False, "no", "unsupported_version")


@settings(max_examples=50)
@given(
    st.text(min_size=1, max_size=10),
    st.dictionaries(st.text(max_size=8), json_values, max_size=4),
)
def test_event_round_trip(kind: str, data: dict[str, object]) -> None:
    line = wire.encode_event(wire.EventMessage(kind, data, 12.5))
    assert line.count(b"\n") == 1
    assert wire.parse_server_message(line[:-1]) == wire.EventMessage(kind, data, 12.5)


class Colour(enum.Enum):
    RED = 1


@dataclass
class Point:
    x: int


def test_daemon_objects_become_plain_json() -> None:
    snapshot = {
        "gid": b"\xfe\x80" + bytes(14),
        "state": Colour.RED,
        "set": frozenset({1}),
        "tuple": (1, 2),
        "point": Point(3),
        "nan": float("nan"),
        "nested": [float("inf")],
        "other": complex(1, 2),
    }
    body = json.loads(wire.encode_reply(wire.ok_reply(1, snapshot)))["result"]
    assert body["gid"] == "fe80" + "00" * 14
    assert body["state"] == "RED"
    assert body["set"] == [1] and body["tuple"] == [1, 2]
    assert body["point"] == {"x": 3}
    assert body["nan"] is None and body["nested"] == [None]
    assert body["other"] == "(1+2j)"


@pytest.mark.parametrize(
    ("line", "text"),
    [
        (b'{"ok": "yes"}', "boolean 'ok'"),
        (b'{"event": 1, "data": {}}', "string 'event'"),
        (b'{"event": "log", "data": {}, "ts": "now"}', "'ts' must be a number"),
        (b'{"v": null, "ok": true}', "'v' must be an integer"),
    ],
)
def test_bad_server_messages_are_rejected(line: bytes, text: str) -> None:
    with pytest.raises(wire.AdminProtocolError, match=text):
        wire.parse_server_message(line)


def test_snapshot_counters_by_name_for_people_and_scripts() -> None:
    snapshot = {
        "daemon": {"pid": 1},
        "counters": [0, 12, 1, 2, 3, 4, 5],
        "endpoints": [{"id": "mlx5_0/1/0xffff", "counters": [1, 2, 3, 4, 5, 6, 7]}, {"id": "x"}],
    }
    named = wire.snapshot_with_named_counters(snapshot)
    assert named["counters"] == {
        "error": 0,
        "resolve": 12,
        "nodata": 1,
        "addr_query": 2,
        "addr_cache": 3,
        "route_query": 4,
        "route_cache": 5,
    }
    assert named["endpoints"][0]["counters"]["route_cache"] == 7
    assert named["endpoints"][1] == {"id": "x"}
    assert snapshot["counters"] == [0, 12, 1, 2, 3, 4, 5]  # the reply itself is not changed
    # What is not seven counters stays as the daemon sent it (readers must be lenient).
    assert wire.named_counters([1, 2]) == [1, 2]
    assert wire.named_counters(None) is None
    assert wire.snapshot_with_named_counters("x") == "x"
