"""The whole tool against the fake daemon: output, exit status, defects fixed, --json, -A/-O."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path

import pytest
import trio

from ibacm.config.addr_file import generate_addr_file
from ibacm.config.opts_template import render_opts_file
from ibacm.fabric.sim.hub import serve_hub
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.tools import ib_acme
from ibacm.wire.client import AcmMessage, AddrType
from tests.tools.conftest import Result, run_ours
from tests.tools.fake_acm import FakeAcm

PATH_TO_NODE2 = """\
Path information
  dgid: fe80::2:c903:0:2
  sgid: fe80::2:c903:0:1
  dlid: 2
  slid: 1
  flow label: 0x0
  hop limit: 0
  tclass: 0
  reversible: 1
  pkey: 0xffff
  sl: 0
  mtu: 4
  rate: 7
  packet lifetime: 18
"""
PERF_HEADER = (
    "svc,Error Count,Resolve Count,No Data,Addr Query Count,Addr Cache Count,"
    "Route Query Count,Route Cache Count"
)


async def acme(fake: FakeAcm, *args: str) -> Result:
    return await run_ours("-S", str(fake.path), *args)


# -- resolution ---------------------------------------------------------------------------


@pytest.mark.trio
async def test_resolve_and_verify_prints_the_c_session(fake: FakeAcm) -> None:
    result = await acme(fake, "-d", "10.0.0.2", "-v")
    assert result.stdout == (
        f"Service: {fake.path}\nDestination: 10.0.0.2\nSource: 10.0.0.1\n"
        f"{PATH_TO_NODE2}SA verification: success\n\nreturn status 0x0\n"
    )
    assert result.status == 0


@pytest.mark.trio
async def test_cache_only_miss_is_the_spec_example(fake: FakeAcm) -> None:
    result = await acme(fake, "-f", "n", "-c", "-s", "node1", "-d", "node3")
    assert result.stdout == (
        f"Service: {fake.path}\nDestination: node3\nSource: node1\n"
        "ib_acm_resolve_name failed: No data available\n\nreturn status 0xffffffff\n"
    )
    assert result.status == 255


@pytest.mark.trio
async def test_repetitions_resolve_each_pair_c_times_and_keep_the_last(fake: FakeAcm) -> None:
    result = await acme(fake, "-f", "n", "-d", "node[2-3]", "-C", "3")
    assert len(fake.requests) == 6
    # The daemon's chosen source is printed only without repetitions, as libacm does.
    assert "Source:" not in result.stdout
    assert result.stdout.count("Path information") == 2
    assert result.status == 0


@pytest.mark.trio
async def test_every_destination_with_every_source(fake: FakeAcm) -> None:
    result = await acme(fake, "-f", "n", "-s", "node[1-2]", "-d", "node[2-3]")
    pairs = [line for line in result.stdout.splitlines() if line.startswith(("Dest", "Source"))]
    assert pairs == [
        "Destination: node2", "Source: node1", "Destination: node2", "Source: node2",
        "Destination: node3", "Source: node1", "Destination: node3", "Source: node2",
    ]  # fmt: skip
    # node2 is not local to the fake, so the LAST pair fails and decides the status.
    assert result.status == 255


@pytest.mark.trio
async def test_unspecified_format_sends_unknown_names_as_lid_zero_as_c_does(fake: FakeAcm) -> None:
    await acme(fake, "-d", "node2")
    entry = AcmMessage.decode(fake.requests[0]).entries[0]
    assert (entry.type, entry.path().dlid) == (AddrType.PATH, 0)


@pytest.mark.trio
async def test_a_lid_that_is_not_a_number_is_lid_zero_as_in_c(fake: FakeAcm) -> None:
    await acme(fake, "-f", "l", "-s", "x", "-d", "node2")
    path = AcmMessage.decode(fake.requests[0]).entries[0].path()
    assert (path.slid, path.dlid) == (0, 0)


@pytest.mark.trio
async def test_unspecified_number_is_ipv4_shorthand_as_c_reads_it(fake: FakeAcm) -> None:
    result = await acme(fake, "-d", "3")
    entry = AcmMessage.decode(fake.requests[0]).entries[0]
    assert (entry.type, entry.address_text()) == (AddrType.IP, "0.0.0.3")
    assert "Destination: 0.0.0.3" in result.stdout


@pytest.mark.trio
@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["-f", "i", "-d", "node2"], "inet_pton error on destination address (node2): 0x0"),
        (["-f", "i", "-s", "x", "-d", "10.0.0.2"], "inet_pton error on source address (x): 0x0"),
        (["-s", "fd00::1", "-d", "10.0.0.2"], "source and destination address families don't"),
        (["-f", "g", "-d", "zz"], "inet_pton error on dest address (zz): 0x0"),
        (["-f", "n", "-d", "n" * 64], "ib_acm_resolve_name failed: name: 'nnnn"),
        (["-d", "10.0.0.[3-1]"], "Unable to parse destination argument: '10.0.0.[3-1]': range"),
    ],
)
async def test_bad_addresses_are_explained_and_nothing_is_sent(
    fake: FakeAcm, args: list[str], line: str
) -> None:
    result = await acme(fake, *args)
    assert any(out.startswith(line) for out in result.stdout.splitlines()), result.stdout
    assert result.stdout.endswith("return status 0xffffffff\n")
    assert result.status == 255
    assert fake.requests == []


# -- counters and endpoints ---------------------------------------------------------------


@pytest.mark.trio
async def test_perf_formats(fake: FakeAcm) -> None:
    svc = str(fake.path)
    row = await acme(fake, "-P")
    assert row.stdout == f"{PERF_HEADER}\n{svc},0,12,1,2,0,3,8\nreturn status 0x0\n"
    col = await acme(fake, "-P", "col")
    assert col.stdout.splitlines()[:3] == [svc, "Error Count : 0", "Resolve Count : 12"]
    every = await acme(fake, "-P", "all")
    assert every.stdout == f"{PERF_HEADER}\n{svc},0,5,0,1,0,1,4\nreturn status 0x0\n"
    missing = await acme(fake, "-P", "4")
    assert missing.stdout == (
        f"{svc}: Failed to query perf data: Cannot assign requested address\nreturn status 0x0\n"
    )
    assert missing.status == 0  # a daemon's refusal is an answer: C exits 0 too


@pytest.mark.trio
async def test_perf_by_source_address(fake: FakeAcm) -> None:
    result = await acme(fake, "-V", "-P", "s", "-s", "10.0.0.1")
    assert result.stdout.splitlines()[:2] == ["query_perf_ip: src_addr 10.0.0.1", PERF_HEADER]
    result = await acme(fake, "-f", "l", "-P", "s", "-s", "3")
    assert result.stdout.splitlines()[0] == "Unsupported src_type 108"


@pytest.mark.trio
async def test_endpoints(fake: FakeAcm) -> None:
    svc = str(fake.path)
    result = await acme(fake, "-e")
    assert result.stdout.splitlines() == [
        "svc,guid,port,pkey,ep_index,prov,addr_0,addresses",
        f"{svc},0x0002c90300000001,1,0xffff,1,ibacmp,10.0.0.1/16,fd00::1/64,node1,node1-1",
        f"{svc},0x0002c90300000001,2,0xffff,1,ibacmp,node1-2",
        f"{svc},0x0002c90300000001,1,0x8001,2,ibacmp,node1-3",
        "return status 0x0",
    ]
    missing = await acme(fake, "-e", "7")
    assert missing.stdout == " Endpoint 7 is not available\nreturn status 0x0\n"


@pytest.mark.trio
async def test_e_and_p_indices_do_not_leak_into_each_other(fake: FakeAcm) -> None:
    # C defect 55: "-e 1 -P" printed endpoint 1's counters and "-P 2 -e" listed only index 2.
    result = await acme(fake, "-e", "1", "-P")
    assert f"{fake.path},0,12,1,2,0,3,8" in result.stdout.splitlines()
    result = await acme(fake, "-P", "2", "-e")
    assert result.stdout.count(",ibacmp,") == 3


# -- services -----------------------------------------------------------------------------


@pytest.mark.trio
async def test_the_last_service_decides_the_status(fake: FakeAcm, short_dir: Path) -> None:
    missing = short_dir / "none.sock"
    good_last = await run_ours("-S", f"{missing}", "-P")
    assert good_last.stdout == (
        f"{missing},unable to contact service: No such file or directory\nreturn status 0x2\n"
    )
    assert good_last.status == 2
    base = str(short_dir / "svc")
    os.symlink(fake.path, base + "1")
    listing = await run_ours("-S", f"{base}[1-2]", "-P")
    assert listing.stdout.splitlines()[1:] == [
        f"{base}1,0,12,1,2,0,3,8",
        f"{base}2,unable to contact service: No such file or directory",
        "return status 0x2",
    ]


@pytest.mark.trio
async def test_tcp_service_uses_the_port_file_of_the_run_dir(short_dir: Path) -> None:
    fake = FakeAcm(short_dir / "unused.sock")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(fake.serve_tcp)
        (short_dir / "ibacm-tcp.port").write_text(f"{port}\n")
        result = await run_ours("-S", "127.0.0.1", "--run-dir", str(short_dir), "-P")
        (short_dir / "ibacm-tcp.port").write_text("junk\n")
        junk = await run_ours("-S", "nosuchhost.invalid", "--run-dir", str(short_dir), "-P")
        nursery.cancel_scope.cancel()
    assert result.stdout.splitlines()[1] == "127.0.0.1,0,12,1,2,0,3,8"
    assert junk.stdout.splitlines() == [
        "Failed to read server port",
        "nosuchhost.invalid,unable to contact service: Name or service not known",
        "return status 0xfffffffe",
    ]
    assert junk.status == 254


# -- a daemon that misbehaves -------------------------------------------------------------


@pytest.mark.trio
@pytest.mark.parametrize("mode", ["close", "garbage", "short"])
@pytest.mark.parametrize(
    ("args", "prefix"),
    [
        (["-d", "10.0.0.2"], "ib_acm_resolve_ip failed: the service "),
        (["-f", "l", "-d", "2"], "ib_acm_resolve_path failed: the service "),
        (["-P"], "{svc}: Failed to query perf data: the service "),
        (["-P", "all"], "{svc}: Failed to query perf data: the service "),
        (["-e"], "{svc}: Failed to query endpoints: the service "),
    ],
)
async def test_broken_daemon_gives_a_clear_error_and_a_failure_status(
    fake: FakeAcm, mode: str, args: list[str], prefix: str
) -> None:
    fake.mode = mode
    result = await acme(fake, *args)
    wanted = prefix.format(svc=fake.path)
    assert any(line.startswith(wanted) for line in result.stdout.splitlines()), result.stdout
    assert result.stdout.endswith("return status 0xffffffff\n")
    assert result.status == 255


@pytest.mark.trio
async def test_a_silent_daemon_times_out(fake: FakeAcm) -> None:
    fake.mode = "silent"
    result = await acme(fake, "--timeout", "0.2", "-d", "10.0.0.2")
    assert "ib_acm_resolve_ip failed: no answer from the service within 0.2 s" in result.stdout
    assert result.status == 255


# -- json ---------------------------------------------------------------------------------


@pytest.mark.trio
async def test_json_replaces_the_text(fake: FakeAcm) -> None:
    result = await acme(fake, "--json", "-d", "10.0.0.[2-3]", "-v", "-P", "-e")
    doc = json.loads(result.stdout)
    (service,) = doc["services"]
    assert [r["destination"] for r in service["resolutions"]] == ["10.0.0.2", "10.0.0.3"]
    first = service["resolutions"][0]
    assert (first["status"], first["chosen_sources"]) == (0, ["10.0.0.1"])
    assert (first["path"]["dlid"], first["path"]["mtu"], first["path"]["rate"]) == (2, 4, 7)
    assert first["verification"] == {"success": True, "error": None}
    assert service["perf"][0]["counters"]["Resolve Count"] == 12
    assert [e["ep_index"] for e in service["endpoints"]] == [1, 1, 2]
    assert doc["return_status"] == 0
    assert result.status == 0


@pytest.mark.trio
async def test_json_reports_failures(fake: FakeAcm) -> None:
    fake.mode = "close"
    result = await acme(fake, "--json", "-f", "n", "-d", "node2")
    doc = json.loads(result.stdout)
    pair = doc["services"][0]["resolutions"][0]
    assert pair["status"] == -1
    assert pair["errors"] == [
        "ib_acm_resolve_name failed: the service closed the connection without answering"
    ]
    assert (doc["return_status"], result.status) == (-1, 255)


# -- command line -------------------------------------------------------------------------


def test_usage_goes_to_stdout_and_getopt_errors_to_stderr() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert ib_acme.run(["-x"], out, err) == 1
    assert out.getvalue().startswith("usage 1: ib_acme\n")
    # stdout is the C tool's usage text; this tool's extensions go to stderr.
    assert "extensions:" not in out.getvalue()
    assert err.getvalue().startswith("ib_acme: invalid option -- 'x'\nextensions:\n")
    out, err = io.StringIO(), io.StringIO()
    assert ib_acme.run([], out, err) == 1
    assert out.getvalue().count("usage") == 2 and err.getvalue().startswith("extensions:\n")
    out = io.StringIO()
    assert ib_acme.run(["--help"], out, err) == 0
    assert "--json" in out.getvalue()


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.trio
async def test_progress_bar_goes_to_a_terminal_stderr_only(fake: FakeAcm) -> None:
    out, err = io.StringIO(), FakeTty()
    args = ["-S", str(fake.path), "-d", "10.0.0.2", "-C", "4"]
    status = await trio.to_thread.run_sync(ib_acme.run, args, out, err)
    assert status == 0
    assert "10.0.0.2: [" in err.getvalue() and "4/4" in err.getvalue()
    assert "[" not in out.getvalue()


# -- configuration files ------------------------------------------------------------------


def run_tool(*args: str) -> Result:
    out, err = io.StringIO(), io.StringIO()
    status = ib_acme.run(list(args), out, err)
    return Result(status, out.getvalue(), err.getvalue())


def test_option_file(tmp_path: Path) -> None:
    target = tmp_path / "conf"
    result = run_tool("-O", "-D", str(target))
    assert (result.stdout, result.status) == ("", 0)  # -O alone prints nothing, as C
    assert (target / "ibacm_opts.cfg").read_text() == render_opts_file()
    assert stat.S_IMODE(target.stat().st_mode) == 0o755  # C: 0644, not searchable
    verbose = run_tool("-V", "-O", "mine.cfg", "-D", str(target))
    assert verbose.stdout == f"Generating {target}/mine.cfg\nreturn status 0x0\n"
    assert (target / "mine.cfg").exists()


def test_option_file_in_an_unusable_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_tool("-O", "-D", str(blocker))
    assert result.stdout == (
        f"Failed to open directory {blocker}: Not a directory\n"
        "Failed to open option configuration file: Not a directory\n"
        "return status 0xffffffff\n"
    )
    assert result.status == 255


@pytest.mark.trio
async def test_generation_only_after_successful_queries(fake: FakeAcm, tmp_path: Path) -> None:
    result = await acme(fake, "-f", "n", "-d", "nodeX", "-O", "-D", str(tmp_path))
    assert result.status == 255
    assert not (tmp_path / "ibacm_opts.cfg").exists()


def test_address_file_from_a_simulated_node_without_a_running_cluster(tmp_path: Path) -> None:
    topology = generate(3, ports_per_hca=2)
    (tmp_path / "topology.json").write_text(topology.to_json())
    out = tmp_path / "out"
    result = run_tool(
        "-V", "-A", "-D", str(out), "--fabric", "sim", "--sim-dir", str(tmp_path),
        "--sim-node", "node2",
    )  # fmt: skip
    assert result.status == 0
    expected = generate_addr_file([("mlx5_0", 1, True), ("mlx5_0", 2, True)], "node2")
    assert (out / "ibacm_addr.cfg").read_text() == expected
    assert result.stdout.splitlines() == [
        f"Generating {out}/ibacm_addr.cfg",
        "node2 mlx5_0 1 default",
        "node2-1 mlx5_0 1 default",
        "node2-2 mlx5_0 2 default",
        "return status 0x0",
    ]


def test_address_file_for_an_unknown_simulated_node(tmp_path: Path) -> None:
    (tmp_path / "topology.json").write_text(generate(2).to_json())
    result = run_tool(
        "-A", "-D", str(tmp_path), "--fabric", "sim", "--sim-dir", str(tmp_path),
        "--sim-node", "node9",
    )  # fmt: skip
    assert result.stdout == (
        "ibv_get_device_list - no devices present?\nreturn status 0xffffffff\n"
    )
    assert "node9" in result.stderr
    # C leaves the file it created empty, and ibacm then starts without an endpoint.
    assert not (tmp_path / "ibacm_addr.cfg").exists()
    assert result.status == 255


def test_a_failed_address_file_leaves_none_and_keeps_an_existing_one(tmp_path: Path) -> None:
    (tmp_path / "topology.json").write_text(generate(2).to_json())
    out = tmp_path / "etc"
    args = ["-D", str(out), "--fabric", "sim", "--sim-dir", str(tmp_path), "--sim-node", "node9"]
    result = run_tool("-A", "-O", *args)
    assert result.status == 255
    assert not (out / "ibacm_addr.cfg").exists()  # not even an empty one
    assert not (out / "ibacm_opts.cfg").exists()  # -O is not reached after a failed -A
    previous = "node1 mlx5_0 1 default\n"
    (out / "ibacm_addr.cfg").write_text(previous)
    (out / "ibacm_addr.cfg").chmod(0o640)
    assert run_tool("-A", *args).status == 255
    assert (out / "ibacm_addr.cfg").read_text() == previous
    assert (out / "ibacm_addr.cfg").stat().st_mode & 0o777 == 0o640
    # A working run replaces the whole of a longer file.
    (out / "ibacm_addr.cfg").write_text(previous * 200)
    good = ["-D", str(out), "--fabric", "sim", "--sim-dir", str(tmp_path), "--sim-node", "node2"]
    assert run_tool("-A", *good).status == 0
    expected = generate_addr_file([("mlx5_0", 1, True)], "node2")
    assert (out / "ibacm_addr.cfg").read_text() == expected


@pytest.mark.trio
async def test_address_file_from_a_running_hub_sees_live_port_state(
    short_dir: Path, tmp_path: Path
) -> None:
    world = SimWorld(generate(2, ports_per_hca=2))
    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        await nursery.start(serve_hub, world, short_dir / "hub.sock")
        world.set_port_state("node1", "mlx5_0", 1, False)
        args = ["-A", "-D", str(tmp_path), "--fabric", "sim", "--sim-dir", str(short_dir)]
        result = await run_ours(*args, "--sim-node", "node1")
        nursery.cancel_scope.cancel()
    assert (result.stdout, result.status) == ("", 0)
    # Port 1 is down, so the plain host name goes on port 2, the first ACTIVE one.
    expected = generate_addr_file([("mlx5_0", 1, False), ("mlx5_0", 2, True)], "node1")
    assert (tmp_path / "ibacm_addr.cfg").read_text() == expected


@pytest.mark.trio
async def test_repetitions_stop_at_a_broken_connection(fake: FakeAcm) -> None:
    fake.mode = "close"
    result = await acme(fake, "-d", "10.0.0.2", "-C", "50")
    assert result.stdout.count("failed:") == 1
    assert len(fake.requests) == 1
    assert result.status == 255
