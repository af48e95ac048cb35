"""ibacm_route.data (route_preload opensm_full_v1): OpenSM's full path-record dump."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibacm.config.route_file import (
    RouteDump,
    RoutePath,
    RouteSection,
    parse_route_file,
    render_route_file,
)

PATH = "ibacm_route.data"

# The example of options.md §7.2 (path lines keep their trailing spaces).
SPEC_EXAMPLE = """\
Channel Adapter 0x0002c9030001e3f1, base LID 3, "node10 HCA-1", port 1
# LID  : SL : MTU : RATE
0x0001 : 0  : 4   : 7   
0x0003 : 0  : 4   : 7   
0x0005 : 0  : 4   : 7   
0x0009 : UNREACHABLE

Switch 0x0002c90200400001, base LID 1, "switch-1", port 0
# LID  : SL : MTU : RATE
0x0001 : 0  : 4   : 7   
0x0003 : 0  : 4   : 7   
0x0005 : 0  : 4   : 7   

Channel Adapter 0x0002c9030000a2b3, base LID 5, "node20 HCA-1", port 1
# LID  : SL : MTU : RATE
0x0001 : 0  : 4   : 7   
0x0003 : 0  : 4   : 7   
0x0005 : 0  : 4   : 7   
"""  # noqa: W291


def gid(guid: int) -> str:
    """The GID text of a port GUID in the fe80:: subnet."""
    return str(ipaddress.IPv6Address((0xFE80 << 112) | guid))


def test_spec_example_gives_the_stated_lids_and_gids() -> None:
    dump, issues = parse_route_file(SPEC_EXAMPLE, PATH)
    assert issues == []
    assert dump.lid_to_guid == {
        3: 0x0002C9030001E3F1,
        1: 0x0002C90200400001,
        5: 0x0002C9030000A2B3,
    }
    node10 = dump.section_for(0x0002C9030001E3F1, 3)
    assert node10 is not None
    assert node10.node_type == "Channel Adapter"
    assert (node10.description, node10.port) == ("node10 HCA-1", 1)
    assert node10.paths == [RoutePath(dlid, 0, 4, 7) for dlid in (1, 3, 5)]
    assert node10.unreachable == (9,)
    gids = {gid(dump.lid_to_guid[path.dlid]) for path in node10.paths}
    assert gids == {"fe80::2:c902:40:1", "fe80::2:c903:1:e3f1", "fe80::2:c903:0:a2b3"}
    assert [section.node_type for section in dump.sections] == [
        "Channel Adapter",
        "Switch",
        "Channel Adapter",
    ]


def test_section_needs_both_guid_and_lid() -> None:
    dump, _ = parse_route_file(SPEC_EXAMPLE)
    assert dump.section_for(0x0002C9030001E3F1, 5) is None
    assert dump.section_for(0x1234, 3) is None


def test_render_reproduces_the_dump_format() -> None:
    dump, _ = parse_route_file(SPEC_EXAMPLE)
    assert render_route_file(dump.sections) == SPEC_EXAMPLE + "\n"
    again, issues = parse_route_file(render_route_file(dump.sections))
    assert again == dump and issues == []


def test_lids_are_read_with_strtoul_base_0() -> None:
    text = (
        'Switch 0x10, base LID 010, "octal", port 0\n'
        "0x0010 : 1 : 5 : 16\n"
        "010 : 2 : 4 : 7\n"
        'Router 20, base LID 0x10, "hex", port 0\n'
        'Channel Adapter 0X0000000000000030, base LID 48, "dec", port 1\n'
    )
    dump, issues = parse_route_file(text, PATH)
    assert issues == []
    assert dump.lid_to_guid == {8: 0x10, 16: 0x20, 48: 0x30}
    section = dump.section_for(0x10, 8)
    assert section is not None
    assert section.paths == [RoutePath(16, 1, 5, 16), RoutePath(8, 2, 4, 7)]


def test_multicast_and_duplicate_lids_and_unknown_dlids() -> None:
    text = (
        'Switch 0x1, base LID 1, "a", port 0\n'
        "0x0002 : 0 : 4 : 7\n"
        "0x0007 : 0 : 4 : 7\n"
        'Switch 0x2, base LID 2, "b", port 0\n'
        'Switch 0x3, base LID 2, "dup", port 0\n'
        'Switch 0x4, base LID 0xC001, "mcast", port 0\n'
    )
    dump, issues = parse_route_file(text, PATH)
    assert dump.lid_to_guid == {1: 1, 2: 2}  # first owner of LID 2 kept, 0xC001 ignored
    section = dump.section_for(1, 1)
    assert section is not None and section.paths == [RoutePath(2, 0, 4, 7)]
    assert {(issue.line, issue.severity) for issue in issues} == {
        (3, "error"),  # DLID 7 is nobody's base LID
        (5, "warning"),  # duplicate LID
        (6, "warning"),  # multicast LID
    }
    assert "keeping the first" in next(i.message for i in issues if i.line == 5)


def test_malformed_header_ends_the_previous_section() -> None:
    text = (
        'Switch 0x1, base LID 1, "a", port 0\n'
        "0x0001 : 0 : 4 : 7\n"
        "Switch 0x2 no lid here\n"
        "0x0001 : 0 : 4 : 7\n"
    )
    dump, issues = parse_route_file(text, PATH)
    section = dump.section_for(1, 1)
    assert section is not None and len(section.paths) == 1
    assert [(issue.line, issue.severity) for issue in issues] == [(3, "error")]


def test_header_without_description_is_still_valid() -> None:
    dump, issues = parse_route_file("Switch 0xab, base LID 4,\n0x0004 : 0 : 4 : 7\n")
    assert issues == []
    section = dump.section_for(0xAB, 4)
    assert section is not None and (section.description, section.port) == ("", 0)


def test_values_are_stored_as_the_path_record_holds_them() -> None:
    text = 'Switch 0x1, base LID 1, "a", port 0\n0x0001 : 17 : 4 : 300\n'
    dump, issues = parse_route_file(text)
    section = dump.section_for(1, 1)
    assert section is not None and section.paths == [RoutePath(1, 1, 4, 44)]
    assert "using 1 / 4 / 44" in issues[0].message


def test_render_rejects_unreadable_sections() -> None:
    bad = RouteSection("Host", 1, 1, "x", 1, [])
    with pytest.raises(ValueError, match="node type"):
        render_route_file([bad])
    with pytest.raises(ValueError, match="description"):
        render_route_file([RouteSection("Switch", 1, 1, 'a"b', 0, [])])


def test_empty_file() -> None:
    assert parse_route_file("") == (RouteDump(), [])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(max_size=80),
            st.sampled_from(SPEC_EXAMPLE.splitlines()),
            st.from_regex(r"\A(Switch|Channel|Router)[ ,0-9a-zx\"]{0,40}(base LID)?[ ,0-9x]*\Z"),
        ),
        max_size=15,
    )
)
def test_parser_never_raises(lines: list[str]) -> None:
    dump, _ = parse_route_file("\n".join(lines), PATH)
    assert all(lid < 0xC000 for lid in dump.lid_to_guid)
    for section in dump.sections:
        assert all(path.dlid in dump.lid_to_guid for path in section.paths)
