"""SM events against a real SM: our daemon, subscribed at OpenSM on ibsim, hears a link go.

The daemon runs as simulated node Hca1 (``--fabric hw-umad``: the umad SA agent that runs on
hardware), subscribes to traps 64/65 with InformInfo SETs that OpenSM accepts, and resolves
Hca3 through OpenSM's PathRecords. Then ibsim's console takes Hca3's link down; OpenSM sweeps,
finds the port gone and sends trap 65 Reports, which the daemon decodes, acknowledges and acts
on: the route of its entry for Hca3 is dropped without a flush (the address, from the hosts
file, stays). When the link is back, trap 64 follows and the next request gets OpenSM's path
afresh.

Two settings exist for the simulator only. ibsim hands an unsolicited MAD (a Report to QP1)
only to a node's SM client, so the daemon runs with ``SIM_SET_ISSM=1`` (libumad2sim.so's
switch for that); it also sets the IsSM bit of Hca1's port, so OpenSM runs with ``-d0``
(ignore other SMs) rather than ask Hca1 for an SMInfo no one there answers, and with
``-d2`` (flush its log) so the test can read it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.peers.ibsim import SimFabric, opensm_on_ibsim
from tests.peers.test_daemon_ibsim import RunningDaemon, ib_acme, run_daemon, snapshot

pytestmark = pytest.mark.peer

SWEEP_WAIT = 90.0
"""OpenSM notices a link change at its next sweep (trap 128 from the switch, or the 10 s
periodic sweep); generous because the machine is shared."""


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFabric]:
    # A fabric of its own: the test takes a link down and must not disturb the shared one.
    with opensm_on_ibsim(
        tmp_path_factory.mktemp("traps"), ("-d0", "-d2"), netns_prefix="ibacm-traps"
    ) as own:
        yield own


def sm_events(daemon: RunningDaemon) -> dict[str, int | bool]:
    (endpoint,) = snapshot(daemon.run_dir / "ibacm-admin.sock")["endpoints"]
    return dict(endpoint["sm_events"])


def wait_for(what: str, daemon: RunningDaemon, check: str, at_least: int = 1) -> None:
    deadline = time.monotonic() + SWEEP_WAIT
    while time.monotonic() < deadline:
        if int(sm_events(daemon).get(check, 0)) >= at_least:
            return
        time.sleep(0.2)
    log = (daemon.run_dir.parent / "ibacm.log").read_text()[-3000:]
    raise AssertionError(f"{what} not within {SWEEP_WAIT} s: {sm_events(daemon)}\n{log}")


def dlid(output: str) -> int | None:
    for line in output.splitlines():
        if line.strip().startswith("dlid:"):
            return int(line.split(":")[1])
    return None


def test_a_link_taken_down_makes_the_daemon_drop_that_node(
    fabric: SimFabric, tmp_path: Path
) -> None:
    hca3 = fabric.nodes["Hca3"]
    with run_daemon(fabric, tmp_path, env=["SIM_SET_ISSM=1"]) as daemon:
        wait_for("the subscription to traps 64 and 65", daemon, "subscriptions")
        assert sm_events(daemon)["subscribed"] is True  # OpenSM accepted both InformInfo SETs
        assert dlid(ib_acme(daemon, "-s", "10.0.0.1", "-d", "10.0.0.3")) == hca3.lid
        assert dlid(ib_acme(daemon, "-c", "-s", "10.0.0.1", "-d", "10.0.0.3")) == hca3.lid
        fabric.console('Unlink "Hca3"')
        wait_for("trap 65 for Hca3", daemon, "gid_out")
        events = sm_events(daemon)
        assert events["dropped"] >= 1 and events["acked"] == events["reports"]
        assert events.get("bad_reports", 0) == 0
        logged = [json.loads(line) for line in (tmp_path / "ibacm.log").read_text().splitlines()]
        assert any(
            entry["event"].startswith("GID out of service") and entry["gid"] == hca3.gid
            for entry in logged
        )
        # Dropped without a flush: the address (from the hosts file) stays, its route went.
        assert cache_state(daemon, "10.0.0.3") == "ADDR_RESOLVED"
        fabric.console('ReLink "Hca3"')
        wait_for("trap 64 for Hca3", daemon, "gid_in")
        # The next request asks OpenSM afresh and gets Hca3's path again.
        assert dlid(ib_acme(daemon, "-s", "10.0.0.1", "-d", "10.0.0.3")) == hca3.lid
        assert cache_state(daemon, "10.0.0.3") == "READY"
    osm_log = (fabric.workdir / "osm.log").read_text()
    # OpenSM got its acks: no Report of ours ended in a send error.
    assert "SubnAdmReport(Notice)" not in osm_log, osm_log[-3000:]


def cache_state(daemon: RunningDaemon, dest: str) -> str:
    (endpoint,) = snapshot(daemon.run_dir / "ibacm-admin.sock")["endpoints"]
    states = [entry["state"] for entry in endpoint["cache"] if entry["dest"] == dest]
    assert len(states) == 1, endpoint["cache"]
    return str(states[0])
