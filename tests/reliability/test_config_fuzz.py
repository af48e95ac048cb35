"""Fuzzing the configuration paths end to end: files of any bytes, read the way the daemon reads
them (UTF-8 with surrogate escapes), never raise, and what they yield can be used.

The parser-level "never raises" checks live in tests/config; here the results are also put to
work the way the daemon does (option summary and ``ib_acme -O`` rendering, run paths, address
entries, preload keys, route sections), and a live daemon is made to reload fuzzed option and
address files: it keeps serving every time.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ibacm.config.addr_file import parse_addr_file
from ibacm.config.errors import ConfigError
from ibacm.config.hosts_file import parse_hosts_file
from ibacm.config.option_file import parse_options
from ibacm.config.options import KNOWN_KEYS
from ibacm.config.opts_template import render_opts_file
from ibacm.config.route_file import parse_route_file
from ibacm.provider.acmp.keys import CacheKeyError, cache_key, key_address, key_type
from ibacm.wire.errors import WireError
from tests.reliability.errors import logged_errors
from tests.reliability.live import blocking_request, live_cluster, resolve_frame, soak

EXAMPLES = soak(150, 20_000)
RELOADS = soak(25, 1_000)
SAMPLE_OPTS = """\
log_level 1
timeout 2000
retries 2
route_prot sa
addr_prot acm
route_preload none
provider ibacmp default
server_mode unix
cache_max_entries 100
"""
SAMPLE_ROUTE = """\
Channel Adapter 0x0002c90300001001, base LID 2, "node1 HCA-1", port 1
0x0003 : 00 04 10 0x0002c90300002001
"""


def decoded(data: bytes) -> str:
    """How the daemon turns a file's bytes into text."""
    return data.decode("utf-8", "surrogateescape")


@st.composite
def option_files(draw: st.DrawFn) -> bytes:
    lines = draw(
        st.lists(
            st.one_of(
                st.binary(max_size=80).map(decoded),
                st.sampled_from(SAMPLE_OPTS.splitlines()),
                st.builds(
                    lambda key, value: f"{key} {value}",
                    st.sampled_from(sorted(KNOWN_KEYS)),
                    st.one_of(
                        st.text(max_size=20),
                        st.integers(-(2**40), 2**40).map(str),
                        st.sampled_from(["yes", "no", "0x10", "-1", "acm", "sa", "none"]),
                    ),
                ),
            ),
            max_size=14,
        )
    )
    return "\n".join(lines).encode("utf-8", "surrogateescape")


def mutate(seed: str) -> st.SearchStrategy[bytes]:
    raw = seed.encode()

    @st.composite
    def changed(draw: st.DrawFn) -> bytes:
        data = bytearray(raw)
        for _ in range(draw(st.integers(1, 10))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data[: draw(st.integers(1, len(data)))])

    return changed()


any_file = st.one_of(st.binary(max_size=600), mutate(SAMPLE_OPTS), mutate(SAMPLE_ROUTE))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.one_of(option_files(), any_file))
def test_any_option_file_parses_and_renders(data: bytes) -> None:
    options, issues = parse_options(decoded(data), "fuzz.cfg")
    assert all(issue.path == "fuzz.cfg" for issue in issues)
    assert options.timeout >= 0 and options.retries >= 0
    assert options.resolve_depth >= 1 and options.send_depth >= 1
    for label, value in options.summary("fuzz.cfg", "addr.cfg"):
        assert isinstance(label, str) and isinstance(value, str)
    rendered = render_opts_file(options)
    again, _ = parse_options(rendered, "rendered.cfg")
    assert again.timeout == options.timeout and again.route_prot == options.route_prot
    assert options.run_paths.unix_socket.name == "ibacm-unix.sock"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=any_file, support_ips=st.booleans())
def test_any_address_file_gives_usable_entries(data: bytes, support_ips: bool) -> None:
    entries, issues = parse_addr_file(decoded(data), "addr.cfg", support_ips)
    assert all(issue.path == "addr.cfg" for issue in issues)
    for entry in entries:
        assert 1 <= entry.port <= 255


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=any_file)
def test_any_hosts_file_gives_cache_keys(data: bytes) -> None:
    hosts, _ = parse_hosts_file(decoded(data), "hosts.data")
    for host in hosts:
        assert len(host.gid) == 16
        try:
            key = cache_key(host.type, host.address_bytes)
        except (CacheKeyError, WireError):
            continue  # skipped with a log line by the preload, as it should be
        assert key_type(key) == host.type and 1 <= len(key_address(key)) <= 64


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=any_file, guid=st.integers(0, 2**64 - 1), lid=st.integers(0, 0xFFFF))
def test_any_route_file_gives_sections(data: bytes, guid: int, lid: int) -> None:
    dump, _ = parse_route_file(decoded(data), "route.data")
    dump.section_for(guid, lid)
    for section in dump.sections:
        assert all(0 < path.dlid < 0xC000 for path in section.paths)


@pytest.mark.trio
async def test_reloading_fuzzed_files_keeps_the_daemon_serving(tmp_path: Path) -> None:
    """SIGHUP's reload with garbage option and address files: the daemon keeps serving."""
    opts_file = tmp_path / "fuzz_opts.cfg"
    with logged_errors() as errors:
        async with live_cluster(tmp_path, 2) as cluster:
            node = cluster["node1"]
            node.daemon.opts_file = str(opts_file)
            addr_file = Path(node.daemon.addr_file.path)
            good_addr = addr_file.read_bytes()

            @settings(
                max_examples=RELOADS,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(opts=option_files(), addr=any_file)
            def one_reload(opts: bytes, addr: bytes) -> None:
                opts_file.write_bytes(opts)
                addr_file.write_bytes(addr)
                with contextlib.suppress(ConfigError):  # refused as a whole: nothing changed
                    trio.from_thread.run(node.daemon.reload)
                # What was taken stays in force; restoring good files must bring node1 back.
                opts_file.write_bytes(SAMPLE_OPTS.encode())
                addr_file.write_bytes(good_addr)
                trio.from_thread.run(node.daemon.reload)
                reply = blocking_request(node.socket_path, resolve_frame("node1", "node2"))
                assert reply[2] == 0, reply.hex()

            await trio.to_thread.run_sync(one_reload)
            assert node.alive and not node.crashed
    # A refused reload is an operator's error, logged as one; anything else is a bug.
    assert [e for e in errors if e.get("event") != "reload refused; configuration unchanged"] == []
