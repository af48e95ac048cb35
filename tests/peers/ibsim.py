"""A real SM/SA for tests: OpenSM on the ibsim fabric simulator (real-peers.md §3).

ibsim and OpenSM run in a network namespace of their own (ibsim's abstract ``@sim:*`` sockets
are per namespace, so parallel runs and other users of ibsim on the host do not collide), in
a scratch directory (the preload writes a fake sysfs tree ``./sys-<pid>`` into the working
directory). Clients run in the namespace with ``libumad2sim.so`` preloaded from the start and
``SIM_HOST`` naming the simulated node they are.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from ibacm.wire.path_record import PathRecord
from tests.conftest import REPO, require_file, require_peer
from tests.peers.netns import network_namespace

PRELOAD = Path("/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so")
NET_EXAMPLES = Path("/usr/share/doc/ibsim-utils/net-examples")
TOPOLOGY = "net.2sw2path4hca"
HCAS = ("Hca1", "Hca2", "Hca3", "Hca4")
START_TIMEOUT = 30.0


@dataclass(frozen=True)
class SimNode:
    name: str
    lid: int
    port_guid: int

    @property
    def gid(self) -> str:
        """The port GID as IPv6 text (subnet prefix fe80::/64)."""
        return str(ipaddress.IPv6Address((0xFE80 << 112) | self.port_guid))


@dataclass
class SimFabric:
    netns: str
    workdir: Path
    nodes: dict[str, SimNode]
    ibsim: subprocess.Popen[bytes] | None = None

    def console(self, command: str) -> None:
        """One ibsim console command, e.g. ``Unlink "Hca3"`` (a link down, as if pulled)."""
        if self.ibsim is None or self.ibsim.stdin is None:
            raise AssertionError("this fabric has no ibsim console")
        self.ibsim.stdin.write(command.encode() + b"\n")
        self.ibsim.stdin.flush()

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run in the namespace as simulated node ``host`` (preload from the start)."""
        return [
            require_peer("ip"), "netns", "exec", self.netns, "env",
            f"LD_PRELOAD={PRELOAD}", f"SIM_HOST={host}", f"PYTHONPATH={REPO}", *argv,
        ]  # fmt: skip

    def run(
        self, host: str, argv: Sequence[str], *, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(host, argv),
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def saquery(self, host: str, *args: str) -> str:
        result = self.run(host, [require_peer("saquery"), *args], timeout=10)
        if result.returncode != 0:
            raise AssertionError(f"saquery {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def python(self, host: str, *args: str, timeout: float = 30) -> str:
        result = self.run(host, [sys.executable, *args], timeout=timeout)
        if result.returncode != 0:
            raise AssertionError(f"{args} as {host} failed:\n{result.stdout}\n{result.stderr}")
        return result.stdout


def parse_dump(text: str, heading: str) -> list[dict[str, str]]:
    """saquery's ``<Record> dump:`` blocks as dicts of ``field -> value``."""
    records: list[dict[str, str]] = []
    for block in text.split(heading)[1:]:
        fields = {}
        for line in block.splitlines():
            match = re.match(r"\s+(\w+)\.+(.*)$", line)
            if match:
                fields[match.group(1)] = match.group(2).strip()
        records.append(fields)
    return records


def saquery_path(fabric: SimFabric, source: str, dest: str) -> PathRecord:
    """OpenSM's PathRecord from ``source`` to ``dest`` as ``saquery PR --slid --dlid`` shows it."""
    slid, dlid = fabric.nodes[source].lid, fabric.nodes[dest].lid
    text = fabric.saquery(source, "PR", "--slid", str(slid), "--dlid", str(dlid))
    (fields,) = parse_dump(text, "PathRecord dump:")
    record = PathRecord(
        service_id=int(fields["service_id"], 16),
        dgid=ipaddress.IPv6Address(fields["dgid"]).packed,
        sgid=ipaddress.IPv6Address(fields["sgid"]).packed,
        dlid=int(fields["dlid"]),
        slid=int(fields["slid"]),
        tclass=int(fields["tclass"], 16),
        pkey=int(fields["pkey"], 16),
        preference=int(fields["preference"], 16),
    )
    record.flowlabel_hoplimit = int(fields["hop_flow_raw"], 16)
    record.reversible_numpath = int(fields["num_path_revers"], 16)
    record.qosclass_sl = (int(fields["qos_class"], 16) << 4) | int(fields["sl"], 16)
    record.mtu_byte = int(fields["mtu"], 16)
    record.rate_byte = int(fields["rate"], 16)
    record.packetlifetime_byte = int(fields["pkt_life"], 16)
    return record


def _wait_for(predicate: object, what: str, logs: Sequence[Path]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return
        time.sleep(0.1)
    tails = "\n".join(f"--- {log}:\n{log.read_text()[-2000:]}" for log in logs if log.exists())
    raise AssertionError(f"{what} did not come up within {START_TIMEOUT} s\n{tails}")


@contextmanager
def _process(
    argv: list[str], log: Path, cwd: Path, env: dict[str, str]
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("w") as out:
        # stdin is a pipe: ibsim reads its console commands there (Unlink, ReLink, ...).
        process = subprocess.Popen(
            argv, cwd=cwd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        yield process
    finally:
        if process.stdin is not None:
            process.stdin.close()
        # ip netns exec execs the command, so this pid is ibsim/opensm itself.
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def opensm_on_ibsim(
    workdir: Path, opensm_args: Sequence[str] = (), *, netns_prefix: str = "ibacm-ibsim"
) -> Iterator[SimFabric]:
    """Start ibsim + OpenSM (with ``opensm_args``), wait until the SA answers, stop both
    afterwards. Fabrics alive at the same time need different ``netns_prefix``es."""
    for peer in ("ibsim", "opensm", "saquery", "ibstat", "ip"):
        require_peer(peer)
    require_file(PRELOAD)
    topology = require_file(NET_EXAMPLES / TOPOLOGY)
    with ExitStack() as stack:
        netns = stack.enter_context(network_namespace(netns_prefix))
        ip = require_peer("ip")
        env = {key: value for key, value in os.environ.items() if key != "LD_PRELOAD"}
        ibsim_log, osm_out, osm_log = (workdir / n for n in ("ibsim.log", "opensm.out", "osm.log"))
        ibsim = stack.enter_context(
            _process(
                [ip, "netns", "exec", netns, require_peer("ibsim"), "-s", str(topology)],
                ibsim_log,
                workdir,
                env,
            )
        )
        _wait_for(lambda: "simulator ready" in ibsim_log.read_text(), "ibsim", [ibsim_log])
        osm_env = {**env, "OSM_TMP_DIR": str(workdir), "OSM_CACHE_DIR": str(workdir)}
        stack.enter_context(
            _process(
                [ip, "netns", "exec", netns, "env", f"LD_PRELOAD={PRELOAD}",
                 require_peer("opensm"), "-f", str(osm_log), "-e", *opensm_args],
                osm_out,
                workdir,
                osm_env,
            )
        )  # fmt: skip
        fabric = SimFabric(netns, workdir, {}, ibsim)

        def sa_answers() -> bool:
            result = fabric.run("Hca1", [require_peer("saquery"), "-s"], timeout=10)
            return result.returncode == 0 and "PortInfoRecord" in result.stdout

        _wait_for(sa_answers, "OpenSM's SA", [ibsim_log, osm_out, osm_log])
        fabric.nodes = _nodes(fabric)
        yield fabric


def _nodes(fabric: SimFabric) -> dict[str, SimNode]:
    """LID and port GUID of every HCA as the simulated node itself sees them (ibstat).

    (OpenSM's NodeRecord table cannot be listed here: ibsim cuts GetTable answers to one MAD.)
    """
    nodes = {}
    for host in HCAS:
        result = fabric.run(host, [require_peer("ibstat")], timeout=10)
        lid = re.search(r"Base lid: (\d+)", result.stdout)
        guid = re.search(r"Port GUID: (0x[0-9a-f]+)", result.stdout)
        if result.returncode != 0 or lid is None or guid is None:
            raise AssertionError(f"ibstat as {host} failed: {result.stdout}{result.stderr}")
        nodes[host] = SimNode(host, int(lid.group(1)), int(guid.group(1), 16))
    return nodes
