"""The ACM counters' one definition (``ibacm.wire.counters``) against the spec of the C original:
the index each has on the wire, the ``ib_acme`` label, and names every output can carry."""

from __future__ import annotations

import re

import pytest

from ibacm.provider import api
from ibacm.wire.client import AcmHdr, AcmOp, AcmStatus, decode_perf_reply, encode_perf_reply
from ibacm.wire.counters import ACM_MAX_COUNTER, Counter
from tests.wire.spec_hex import section_blocks, spec_text

# A row of client-protocol.md §6's table: | 6 | `ACM_CNTR_ROUTE_CACHE` | `Route Cache Count` |
_TABLE_ROW = re.compile(r"^\| (\d+) \| `ACM_CNTR_(\w+)` \| `([^`]+)` \|$", re.MULTILINE)


def test_each_counter_has_the_c_index_enum_and_ib_acme_label() -> None:
    rows = _TABLE_ROW.findall(spec_text("client-protocol.md"))
    spec = [(int(index), name, label) for index, name, label in rows]
    assert len(spec) == ACM_MAX_COUNTER == 7  # "(`ACM_MAX_COUNTER` = 7.)"
    # The C counters come first, in their order; a counter of our own could only follow them.
    ours = [(int(counter), counter.name, counter.label) for counter in Counter]
    assert ours[:ACM_MAX_COUNTER] == spec


def test_ib_acme_header_and_columns_are_the_labels_in_wire_order() -> None:
    text = spec_text("ib_acme.md")
    header = next(line for line in text.splitlines() if line.startswith("svc,Error Count"))
    labels = [counter.label for counter in Counter]
    assert header.split(",") == ["svc", *labels[:ACM_MAX_COUNTER]]
    column = section_blocks(text, "## 5")[1].splitlines()  # "<svc>" then "label : value"
    assert [line.split(" : ")[0] for line in column[1:]] == labels[:ACM_MAX_COUNTER]


def test_names_are_distinct_and_fit_json_and_metric_names() -> None:
    for attribute in ("key", "label", "description", "heading"):
        names = [getattr(counter, attribute) for counter in Counter]
        assert all(names) and len(set(names)) == len(names), attribute
    # A key is a JSON field and the middle of a Prometheus name (ibacm_<key>_total).
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", counter.key) for counter in Counter)
    assert Counter.NODATA.key == "nodata"  # ACM_CNTR_NODATA, lower-cased


def test_a_perf_reply_carries_each_counter_at_its_index() -> None:
    values = [1000 + int(counter) for counter in Counter]
    raw = encode_perf_reply(AcmHdr(opcode=AcmOp.PERF_QUERY), AcmStatus.SUCCESS, values)
    assert len(raw) == 16 + 8 * len(Counter)
    for counter in Counter:
        at = 16 + 8 * counter
        assert int.from_bytes(raw[at : at + 8], "big") == 1000 + counter
    assert decode_perf_reply(raw).counters[Counter.ROUTE_CACHE] == 1006


@pytest.mark.parametrize("counter", list(Counter))
def test_a_counter_is_found_by_its_index(counter: Counter) -> None:
    assert Counter(int(counter)) is counter
    assert api.Counter(int(counter)) is counter  # the provider API hands out this very one


def test_an_index_past_the_counters_is_refused() -> None:
    with pytest.raises(ValueError):
        Counter(len(Counter))


def test_a_perf_reply_never_carries_more_than_the_c_daemons_counters() -> None:
    # Debian's ib_acme -P dies of SIGSEGV on a longer reply: the encoder cuts, whoever calls.
    values = list(range(1, 10))
    reply = decode_perf_reply(encode_perf_reply(AcmHdr(opcode=AcmOp.PERF_QUERY), 0, values))
    assert list(reply.counters) == values[:ACM_MAX_COUNTER]
