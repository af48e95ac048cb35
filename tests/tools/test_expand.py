"""Bracket expansion of -s/-d/-S (ib_acme.md §2): the spec's examples and C's parsing rules."""

from __future__ import annotations

import pytest

from ibacm.tools.expand import MAX_ITEMS, ExpansionError, expand


@pytest.mark.parametrize(
    ("arg", "items"),
    [
        ("node[1-3,5]", ["node1", "node2", "node3", "node5"]),
        ("node[01-03]", ["node01", "node02", "node03"]),
        ("node[8-10]", ["node8", "node9", "node10"]),
        ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
        ("node[1-3,5,7-8]", ["node1", "node2", "node3", "node5", "node7", "node8"]),
    ],
)
def test_spec_examples(arg: str, items: list[str]) -> None:
    assert expand(arg) == items


def test_without_brackets_the_argument_is_one_item_commas_included() -> None:
    # The C parser splits only inside brackets: "a,b" is one (odd) host name.
    assert expand("node1,node2") == ["node1,node2"]
    assert expand("/run/ibacm-unix.sock") == ["/run/ibacm-unix.sock"]


def test_a_leading_bracket_means_an_empty_base() -> None:
    assert expand("[3-4]") == ["3", "4"]


def test_text_after_the_closing_bracket_is_ignored_as_in_c() -> None:
    assert expand("node[1-2].ib") == ["node1", "node2"]


def test_a_missing_closing_bracket_still_expands() -> None:
    assert expand("node[2-3") == ["node2", "node3"]


def test_empty_brackets_leave_the_base() -> None:
    assert expand("node[]") == ["node"]
    assert expand("node[") == ["node"]


def test_single_numbers_keep_their_own_width() -> None:
    assert expand("n[007,8]") == ["n007", "n8"]


def test_empty_fields_between_commas_are_skipped() -> None:
    assert expand("n[1,,2]") == ["n1", "n2"]


@pytest.mark.parametrize(
    ("arg", "fragment"),
    [
        ("", "empty"),
        ("node[a]", "'a' is not a number"),
        ("node[1-b]", "'1-b' is not a number"),
        ("node[-3]", "'-3' is not a number"),
        ("node[3-1]", "counts down"),
        ("node[,]", "hold no number"),
        ("[10.0.0.2]", "'10.0.0.2' is not a number"),
    ],
)
def test_bad_brackets_are_explained(arg: str, fragment: str) -> None:
    with pytest.raises(ExpansionError, match=fragment):
        expand(arg)


def test_absurd_ranges_are_refused_before_building_them() -> None:
    with pytest.raises(ExpansionError, match=f"more than {MAX_ITEMS}"):
        expand("node[1-999999999]")
