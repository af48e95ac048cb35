"""The emulated HCA with unmodified third-party code: Debian's pyverbs and libibumad.

A hub with two nodes and one emulated device process per node; programs run under
``/usr/bin/python3`` (where Debian installs pyverbs) with ``libibacm_emu.so`` preloaded.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from ibacm.fabric.emu import protocol as ep
from ibacm.fabric.emu.build import HERE, ensure_library
from ibacm.fabric.hw.ud_qp import SEND_DEPTH
from ibacm.fabric.sim.hub import hub_call
from ibacm.fabric.sim.topo_file import Host, Topology, generate
from tests.conftest import require_file, require_peer

pytestmark = [pytest.mark.peer]
PYVERBS = Path("/usr/lib/python3/dist-packages/pyverbs/device.cpython-311-x86_64-linux-gnu.so")
SYSTEM_PYTHON = "/usr/bin/python3"


def test_c_and_python_layouts_agree(tmp_path: Path) -> None:
    """emu_protocol.h and protocol.py describe the same bytes; umad records are the kernel's."""
    cc = require_peer("cc")
    source = tmp_path / "sizes.c"
    source.write_text(
        textwrap.dedent(
            """
            #include <stdio.h>
            #include <stddef.h>
            #include <infiniband/umad.h>
            #include "emu_protocol.h"
            int main(void) {
                printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\\n",
                       sizeof(struct emu_req), sizeof(struct emu_rep),
                       sizeof(struct emu_dev_info), sizeof(struct emu_port_attr),
                       sizeof(struct emu_qp_mod), sizeof(struct emu_send),
                       sizeof(struct emu_wc), sizeof(struct emu_async),
                       sizeof(struct ib_user_mad),
                       offsetof(struct ib_user_mad, addr) + offsetof(ib_mad_addr_t, pkey_index));
                return 0;
            }
            """
        )
    )
    binary = tmp_path / "sizes"
    subprocess.run([cc, "-I", str(HERE), "-o", str(binary), str(source)], check=True)
    sizes = [
        int(n) for n in subprocess.run([binary], capture_output=True, text=True).stdout.split()
    ]
    assert sizes == [
        ep.REQ.size,
        ep.REP.size,
        ep.DEV_INFO.size,
        ep.PORT_ATTR.size,
        ep.QP_MOD.size,
        ep.SEND.size,
        ep.WC.size,
        ep.ASYNC_EVENT.size,
        ep.UMAD_SIZE,
        ep.UMAD_HEAD.size + ep.UMAD_ADDR.size,
    ]


def test_the_library_exports_what_the_c_daemon_and_its_provider_import() -> None:
    """Every ibv_*/umad_* import of /usr/sbin/ibacm and libibacmp.so has a definition here."""
    nm = require_peer("nm")
    daemon = require_file(Path("/usr/sbin/ibacm"))
    provider = require_file(Path("/usr/lib/x86_64-linux-gnu/ibacm/libibacmp.so"))
    library = ensure_library()

    def symbols(path: Path, *flags: str) -> set[str]:
        out = subprocess.run([nm, "-D", *flags, str(path)], capture_output=True, text=True).stdout
        return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}

    wanted = {
        name
        for path in (daemon, provider)
        for name in symbols(path, "--undefined-only")
        if name.startswith(("ibv_", "umad_")) and name != "ibv_event_type_str"
    }
    assert len(wanted) >= 30
    assert wanted <= symbols(library, "--defined-only")


@dataclass
class Fabric:
    root: Path
    sockets: dict[str, Path]
    library: Path
    devices: dict[str, subprocess.Popen[str]]

    def env(self, node: str) -> dict[str, str]:
        return {
            **os.environ,
            "LD_PRELOAD": str(self.library),
            ep.SOCKET_ENV: str(self.sockets[node]),
        }

    def hub(self, request: dict[str, object]) -> object:
        return trio.run(hub_call, self.root / "hub.sock", request)


def _wait_for(path: Path, proc: subprocess.Popen[Any]) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert proc.poll() is None, f"{proc.args!r} exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@contextlib.contextmanager
def emulated(root: Path, nodes: Sequence[str], *hub_args: str) -> Iterator[Fabric]:
    """A hub (``hub_args``: its topology) and the emulated device process of each of
    ``nodes``, stopped on the way out."""
    library = ensure_library()
    procs: list[subprocess.Popen[Any]] = []
    try:
        hub = subprocess.Popen(
            [sys.executable, "-m", "ibacm.fabric.sim.hub", "--dir", str(root), *hub_args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(hub)
        _wait_for(root / "hub.sock", hub)
        sockets, devices = {}, {}
        for node in nodes:
            sockets[node] = root / f"{node}.sock"
            command = [sys.executable, "-m", "ibacm.fabric.emu.device", "--hub"]
            command += [str(root / "hub.sock"), "--node", node, "--socket", str(sockets[node])]
            devices[node] = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
            procs.append(devices[node])
            stdout = devices[node].stdout
            assert stdout is not None and stdout.readline().strip() == "READY"
        yield Fabric(root, sockets, library, devices)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=10)


@pytest.fixture
def fabric(tmp_path: Path) -> Iterator[Fabric]:
    require_peer(SYSTEM_PYTHON)
    require_file(PYVERBS)
    with emulated(tmp_path, ("node1", "node2"), "--nodes", "2") as running:
        yield running


# The same pyverbs calls as the hw backend (ibacm/fabric/hw/ud_qp.py, verbs_attrs.py).
PRELUDE = """
import json, select, sys
import pyverbs.addr as addr, pyverbs.cq as cqm, pyverbs.device as dev, pyverbs.enums as e
import pyverbs.mr as mrm, pyverbs.pd as pdm, pyverbs.qp as qpm, pyverbs.wr as wrm
ctx = dev.Context(name=dev.get_device_list()[0].name.decode())
port = ctx.query_port(1)
pd = pdm.PD(ctx)
channel = cqm.CompChannel(ctx)
cq = cqm.CQ(ctx, 32, None, channel, 0)
cq.req_notify()
mr = mrm.MR(pd, 8192, e.IBV_ACCESS_LOCAL_WRITE)
cap = qpm.QPCap(max_send_wr=4, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
init = qpm.QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, cap=cap, sq_sig_all=1)
attr = qpm.QPAttr(port_num=1)
attr.pkey_index, attr.qkey, attr.sq_psn = 0, 0x80010000, 0
qp = qpm.QP(pd, init, attr)

def completions(timeout):
    # The channel's fd is the one the hw backend hands to trio: it must be pollable. An
    # event may find the CQ empty (its completion was polled after an earlier arm, as on
    # an HCA whose arm carries the consumer index): wait for the next one then.
    while True:
        ready, _, _ = select.select([channel_fd], [], [], timeout)
        if not ready:
            return []
        channel.get_cq_event(cq)
        cq.ack_events(1)
        cq.req_notify()
        count, wcs = cq.poll(16)
        if count:
            return wcs[:count]
"""

RECEIVER = """
import ctypes
from pyverbs.base import PyverbsCM
pointer = ctypes.c_void_p.from_address(id(channel) + PyverbsCM.__basicsize__).value
channel_fd = ctypes.c_int.from_address(pointer + 8).value
for slot in range(4):
    qp.post_recv(wrm.RecvWR(wr_id=slot, num_sge=1, sg=[wrm.SGE(mr.buf + slot * 296, 296, mr.lkey)]))
print(json.dumps({"lid": port.lid, "qpn": qp.qp_num, "gid": str(ctx.query_gid(1, 0))}), flush=True)
wcs = completions(20)
wc = wcs[0]
buf = mr.read(296, wc.wr_id * 296)
print(json.dumps({
    "status": wc.status, "opcode": wc.opcode, "byte_len": wc.byte_len, "src_qp": wc.src_qp,
    "slid": wc.slid, "grh": bool(wc.wc_flags & e.IBV_WC_GRH), "qp_num": wc.qp_num,
    "grh_version": buf[0] >> 4, "next_header": buf[6], "sgid": buf[8:24].hex(),
    "dgid": buf[24:40].hex(), "payload": buf[40:296].hex(),
}), flush=True)
"""

SENDER = """
import ctypes
from pyverbs.base import PyverbsCM
pointer = ctypes.c_void_p.from_address(id(channel) + PyverbsCM.__basicsize__).value
channel_fd = ctypes.c_int.from_address(pointer + 8).value
peer = json.loads(sys.argv[1])
route = addr.GlobalRoute(dgid=addr.GID(peer["gid"]), sgid_index=0)
ah = addr.AH(pd, attr=addr.AHAttr(dlid=peer["lid"], is_global=1, port_num=1, gr=route))
results = []
for wr_id, length in ((7, 256), (8, 100)):
    mr.write(bytes(range(256)), 256, 0)
    wr = wrm.SendWR(wr_id=wr_id, opcode=e.IBV_WR_SEND, num_sge=1,
                    sg=[wrm.SGE(mr.buf, length, mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
    wr.set_wr_ud(ah, peer["qpn"], 0x80010000)
    qp.post_send(wr)
    wc = completions(20)[0]
    results.append({"wr_id": wc.wr_id, "status": wc.status, "opcode": wc.opcode})
print(json.dumps({"qpn": qp.qp_num, "gid": str(ctx.query_gid(1, 0)), "sends": results}))
"""


def run_pyverbs(fabric: Fabric, node: str, body: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [SYSTEM_PYTHON, "-c", PRELUDE + body, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=fabric.env(node),
    )


def test_pyverbs_ud_send_lands_in_a_posted_buffer_behind_its_grh(fabric: Fabric) -> None:
    receiver = run_pyverbs(fabric, "node2", RECEIVER)
    assert receiver.stdout is not None
    line = receiver.stdout.readline()
    assert line, receiver.communicate()[1]
    peer = json.loads(line)
    sender = run_pyverbs(fabric, "node1", SENDER, json.dumps(peer))
    sent_out, sent_err = sender.communicate(timeout=60)
    assert sender.returncode == 0, sent_err
    sent = json.loads(sent_out)
    got_out, got_err = receiver.communicate(timeout=60)
    assert receiver.returncode == 0, got_err
    got = json.loads(got_out)
    # The MAD-sized send completes; a 100-byte one is refused with a local length error.
    assert sent["sends"] == [
        {"wr_id": 7, "status": 0, "opcode": 0},
        {"wr_id": 8, "status": 1, "opcode": 0},
    ]
    assert got["status"] == 0 and got["opcode"] == 128  # IBV_WC_RECV
    assert got["byte_len"] == 40 + 256 and got["grh"]
    assert got["qp_num"] == peer["qpn"] and got["src_qp"] == sent["qpn"]
    assert got["slid"] == 2  # node1's LID
    assert got["grh_version"] == 6 and got["next_header"] == 0x1B
    assert got["sgid"] == sent["gid"].replace(":", "")
    assert got["dgid"] == peer["gid"].replace(":", "")
    assert got["payload"] == bytes(range(256)).hex()


UMAD = """
import ctypes, errno, json
# Functions resolved as a C program's calls are (the preload first), not per library.
ctypes.CDLL("libibumad.so.3", mode=ctypes.RTLD_GLOBAL)
lib = ctypes.CDLL(None, use_errno=True)
lib.umad_get_mad.restype = ctypes.c_void_p
lib.umad_get_mad.argtypes = [ctypes.c_void_p]
lib.umad_size.restype = ctypes.c_size_t
assert lib.umad_init() == 0
names = (ctypes.c_char * 20 * 4)()
count = lib.umad_get_cas_names(names, 4)
ca = bytes(names[0]).rstrip(b"\\0")
portid = lib.umad_open_port(ca, 1)
agent = lib.umad_register(portid, 0x03, 2, 1, None)
size = lib.umad_size()
buf = ctypes.create_string_buffer(size + 256)
mad = bytearray(256)
mad[0:4] = bytes([1, 0x03, 2, 0x01])            # SubnAdmGet
mad[8:16] = (0x1234).to_bytes(8, "big")        # TID
mad[16:18] = (0x0035).to_bytes(2, "big")       # PathRecord
ctypes.memmove(lib.umad_get_mad(buf), bytes(mad), 256)
lib.umad_set_addr(buf, int(sys.argv[1]), 1, 0, 0x80010000)
assert lib.umad_send(portid, agent, buf, 256, 100, 1) == 0
small = ctypes.create_string_buffer(size + 256)
length = ctypes.c_int(0)
first = lib.umad_recv(portid, small, ctypes.byref(length), 5000)  # too small: ENOSPC
length2 = ctypes.c_int(256)
got = lib.umad_recv(portid, small, ctypes.byref(length2), 5000)
answer = ctypes.string_at(lib.umad_get_mad(small), 256)
print(json.dumps({"count": count, "size": size, "agent": agent, "first": first,
                  "needed": length.value, "got": got, "status": lib.umad_status(small),
                  "method": answer[3], "tid_low": answer[12:16].hex()}))
"""


def run_json(fabric: Fabric, python: str, code: str, *args: str) -> dict[str, Any]:
    """Run ``code`` as a program on node1 (the preload in force); what it printed, as JSON."""
    done = subprocess.run(
        [python, "-c", code, *args],
        capture_output=True,
        text=True,
        env=fabric.env("node1"),
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


OUR_SA_AGENT = """
import json, trio
from ibacm.fabric.api import SaDestination
from ibacm.fabric.hw.sa_agent import SaAgent
from ibacm.fabric.hw.umad import LibUmad
from ibacm.wire.mad import SaMad, build_path_get
from ibacm.wire.path_record import PathRecord

async def main():
    umad = LibUmad()
    ca = umad.ca_names()[0]
    port = umad.port(ca, 1)
    agent = SaAgent(umad, ca, 1)
    agent.open()
    query = build_path_get(0x77, PathRecord(dlid=port.base_lid))
    dest = SaDestination(sm_lid=port.sm_lid, sm_sl=0, pkey_index=0)
    reply = SaMad.decode(await agent.request(query, dest, timeout_ms=1000, retries=1))
    await agent.aclose()
    path = PathRecord.decode(reply.data[:64])
    print(json.dumps({"polled": agent.polled, "status": reply.mad.status,
                      "method": reply.mad.method, "dlid": path.dlid, "lid": port.base_lid}))

trio.run(main)
"""


def test_our_sa_agent_polls_the_emulated_umad_port(fabric: Fabric) -> None:
    """The hw backend's SA agent under the preload: the port's fd is a socket it can poll
    (as a kernel umad device), so replies are read without a worker thread."""
    result = run_json(fabric, sys.executable, OUR_SA_AGENT)
    assert result["polled"] is True
    assert (result["status"], result["method"]) == (0, 0x81)
    assert result["dlid"] == result["lid"]


OUR_SA_CALLS = """
import json, sys, trio
from ibacm.fabric.api import SaDestination
from ibacm.fabric.hw.sa_agent import SaAgent
from ibacm.fabric.hw.umad import LibUmad
from ibacm.wire.mad import Method, SaMad, build_path_get, build_path_get_table
from ibacm.wire.path_record import PathRecord

class Steps(trio.abc.Instrument):
    steps = 0

    def before_task_step(self, task):
        self.steps += 1

async def main():
    umad = LibUmad()
    ca = umad.ca_names()[0]
    port = umad.port(ca, 1)
    agent = SaAgent(umad, ca, 1)
    agent.open()
    dest = SaDestination(sm_lid=port.sm_lid, sm_sl=0, pkey_index=0)
    counter, read_in, out = Steps(), [], {"polled": agent.polled}
    recv = umad.recv

    def counting_recv(portid, timeout_ms):
        packet = recv(portid, timeout_ms)
        if packet is not None:
            read_in.append(counter.steps)
        return packet

    umad.recv = counting_recv
    trio.lowlevel.add_instrument(counter)

    def start(mad, timeout_ms=1000, retries=1):
        return agent.start(mad, dest, timeout_ms=timeout_ms, retries=retries)

    def path_get(tid):
        return build_path_get(tid, PathRecord(dlid=port.base_lid))

    if sys.argv[1] == "timeout":  # the SA is down: the MAD layer reports ETIMEDOUT
        call = start(path_get(0x301), timeout_ms=100, retries=1)
        ended = []
        call.when_ended(lambda c: ended.append(type(c.error).__name__))
        try:
            await call.wait()
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
        out["ended"], out["outstanding"] = ended, agent.outstanding
        print(json.dumps(out))
        return
    # A reply ends its call in the step that read it, before its wait resumes.
    call, ended = start(path_get(0x101)), []
    call.when_ended(lambda c: ended.append(counter.steps))
    reply = await call.wait()
    out["ended_in"], out["read_in"] = ended, read_in
    out["dlid"], out["lid"] = PathRecord.decode(SaMad.decode(reply).data[:64]).dlid, port.base_lid
    # A GetTable reply (RMPP, reassembled below us) ends its call whole.
    query = build_path_get_table(0x102, PathRecord(slid=port.base_lid), comp_mask=0x20)
    table = await start(query).wait()
    records = SaMad.decode(table).records(64)
    out["table"] = [len(table), [PathRecord.decode(record).dlid for record in records]]
    # A cancelled wait leaves no transaction: its reply, read later, is unmatched.
    lost = start(path_get(0x103))
    with trio.move_on_after(0):
        await lost.wait()
    out["abandoned"], out["after_cancel"] = str(lost.error), agent.outstanding
    tid = 0x200
    while not agent.unmatched and tid < 0x300:
        await start(path_get(tid)).wait()
        tid += 1
    out["unmatched"] = agent.unmatched
    # A MAD the MAD layer neither answers nor reports (a response): the grace deadline.
    silent = bytearray(path_get(0x104))
    silent[3] = Method.GET_RESP
    try:
        await start(bytes(silent), timeout_ms=50, retries=0).wait()
    except Exception as exc:
        out["silent"] = f"{type(exc).__name__}: {exc}"
    out["outstanding"] = agent.outstanding
    await agent.aclose()
    print(json.dumps(out))

trio.run(main)
"""


def test_our_sa_calls_end_in_the_round_that_reads_the_emulated_port(tmp_path: Path) -> None:
    """``SaAgent.start`` (the hw ports' ``sa_start``) under the preload: a reply ends its
    call in the task step that read it; a GetTable ends whole; the MAD layer's ETIMEDOUT
    and the grace deadline end calls SaTimeout; a cancelled wait leaves no transaction."""
    require_peer(SYSTEM_PYTHON)
    require_file(PYVERBS)
    with emulated(tmp_path, ("node1",), "--nodes", "6") as fabric:
        result = run_json(fabric, sys.executable, OUR_SA_CALLS, "calls")
        assert result["polled"] is True
        assert result["dlid"] == result["lid"]
        assert len(result["ended_in"]) == 1 and result["ended_in"][0] in result["read_in"]
        size, dlids = result["table"]
        # A path to every port (6 nodes and the switch): more records than one MAD carries,
        # RMPP segments on the wire, one whole reply to the call.
        assert result["lid"] in dlids and len(set(dlids)) == len(dlids) >= 6
        assert size == 56 + 64 * len(dlids) > 256
        assert "abandoned" in result["abandoned"] and result["after_cancel"] == 0
        assert result["unmatched"] == 1
        assert result["silent"] == "SaTimeout: no SA reply for TID 0x00000104 in 300 ms"
        assert result["outstanding"] == 0

        fabric.hub({"op": "faults", "set": {"sa_down": "on"}})
        result = run_json(fabric, sys.executable, OUR_SA_CALLS, "timeout")
        assert result["error"].startswith("SaTimeout: ") and "ETIMEDOUT" in result["error"]
        assert result["ended"] == ["SaTimeout"] and result["outstanding"] == 0


def test_libibumad_sa_request_with_enospc_and_timeout(fabric: Fabric) -> None:
    """A SubnAdmGet through the real libibumad API: answered by the fabric's SA; a too-small
    buffer gets -ENOSPC with the length it needs and the answer stays queued; with the SA
    down the request comes back with status ETIMEDOUT after timeout x (retries + 1)."""
    result = run_json(fabric, SYSTEM_PYTHON, "import sys\n" + UMAD, "2")
    assert result["count"] == 1 and result["size"] == 64
    assert result["first"] == -28 and result["needed"] == 256  # -ENOSPC
    assert result["got"] == result["agent"] and result["status"] == 0
    assert result["method"] == 0x81 and result["tid_low"] == "00001234"

    fabric.hub({"op": "faults", "set": {"sa_down": "on"}})
    started = time.monotonic()
    result = run_json(fabric, SYSTEM_PYTHON, "import sys\n" + UMAD, "2")
    took = time.monotonic() - started
    assert result["status"] == 110  # ETIMEDOUT: the request comes back, as the kernel does
    assert result["method"] == 0x01
    assert took >= 0.2  # 100 ms x (1 retry + 1)


def test_async_port_events_reach_the_program(fabric: Fabric) -> None:
    script = """
import ctypes, json, select, sys
import pyverbs.device as dev
class Event(ctypes.Structure):
    _fields_ = (("element", ctypes.c_uint64), ("event_type", ctypes.c_int))
ctx = dev.Context(name=dev.get_device_list()[0].name.decode())
from pyverbs.base import PyverbsCM
pointer = ctypes.c_void_p.from_address(id(ctx) + PyverbsCM.__basicsize__).value
async_fd = ctypes.c_int.from_address(pointer + 268).value
print("ready", flush=True)
seen = []
while len(seen) < 2:
    if not select.select([async_fd], [], [], 20)[0]:
        break
    event = Event()
    get = ctypes.CDLL(None).ibv_get_async_event
    assert get(ctypes.c_void_p(pointer), ctypes.byref(event)) == 0
    seen.append([event.event_type, event.element, ctx.query_port(1).state])
print(json.dumps(seen))
"""
    proc = subprocess.Popen(
        [SYSTEM_PYTHON, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=fabric.env("node2"),
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    target = {"node": "node2", "device": "mlx5_0", "port": 1}
    fabric.hub({"op": "port", **target, "up": False})
    time.sleep(0.3)
    fabric.hub({"op": "port", **target, "up": True})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    # IBV_EVENT_PORT_ERR then IBV_EVENT_PORT_ACTIVE on port 1, and the port state follows.
    assert json.loads(out) == [[10, 1, 1], [9, 1, 4]]


FLOOD = 1000

FLOOD_RECEIVER = """
import ctypes, time
from pyverbs.base import PyverbsCM
pointer = ctypes.c_void_p.from_address(id(channel) + PyverbsCM.__basicsize__).value
channel_fd = ctypes.c_int.from_address(pointer + 8).value
cq = cqm.CQ(ctx, 2048, None, channel, 0)
cq.req_notify()
mr = mrm.MR(pd, 1100 * 296, e.IBV_ACCESS_LOCAL_WRITE)
cap = qpm.QPCap(max_send_wr=4, max_recv_wr=1100, max_send_sge=1, max_recv_sge=1)
init = qpm.QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, cap=cap, sq_sig_all=1)
qp = qpm.QP(pd, init, attr)
for slot in range(1100):
    qp.post_recv(wrm.RecvWR(wr_id=slot, num_sge=1, sg=[wrm.SGE(mr.buf + slot * 296, 296, mr.lkey)]))
print(json.dumps({"lid": port.lid, "qpn": qp.qp_num, "gid": str(ctx.query_gid(1, 0))}), flush=True)
got, events, deadline = 0, 0, time.monotonic() + 60
while got < int(sys.argv[1]) and time.monotonic() < deadline:
    # rdma-core's pattern (acmp_comp_handler): event, ack, poll, arm, poll again.
    if not select.select([channel_fd], [], [], 5)[0]:
        break  # a lost wake-up: completions wait in the CQ and no event comes
    channel.get_cq_event(cq)
    cq.ack_events(1)
    events += 1
    for rearm in (False, True):
        if rearm:
            cq.req_notify()
        while True:
            count, wcs = cq.poll(16)
            got += sum(1 for wc in wcs[:count] if wc.status == 0)
            if count < 16:
                break
print(json.dumps({"got": got, "events": events}), flush=True)
"""

FLOOD_SENDER = """
import ctypes, time
from pyverbs.base import PyverbsCM
pointer = ctypes.c_void_p.from_address(id(channel) + PyverbsCM.__basicsize__).value
channel_fd = ctypes.c_int.from_address(pointer + 8).value
peer = json.loads(sys.argv[1])
route = addr.GlobalRoute(dgid=addr.GID(peer["gid"]), sgid_index=0)
ah = addr.AH(pd, attr=addr.AHAttr(dlid=peer["lid"], is_global=1, port_num=1, gr=route))
mr.write(bytes(256), 256, 0)
sent = 0
for n in range(int(sys.argv[2])):
    wr = wrm.SendWR(wr_id=n, opcode=e.IBV_WR_SEND, num_sge=1, sg=[wrm.SGE(mr.buf, 256, mr.lkey)],
                    send_flags=e.IBV_SEND_SIGNALED)
    wr.set_wr_ud(ah, peer["qpn"], 0x80010000)
    qp.post_send(wr)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the sender polls; the receiver is the one on trial
        count, wcs = cq.poll(4)
        if count:
            sent += sum(1 for wc in wcs[:count] if wc.status == 0)
            break
        time.sleep(0.0002)
print(json.dumps({"sent": sent}))
"""


def test_a_flood_of_receives_never_loses_the_completion_event(fabric: Fabric) -> None:
    """1000 MADs into a QP with room for all of them, read with the arm-then-poll pattern of
    rdma-core's provider: every one arrives and no wake-up is lost between poll and arm."""
    receiver = run_pyverbs(fabric, "node2", FLOOD_RECEIVER, str(FLOOD))
    assert receiver.stdout is not None
    line = receiver.stdout.readline()
    assert line, receiver.communicate()[1]
    sender = run_pyverbs(fabric, "node1", FLOOD_SENDER, line.strip(), str(FLOOD))
    sent_out, sent_err = sender.communicate(timeout=120)
    assert sender.returncode == 0, sent_err
    assert json.loads(sent_out) == {"sent": FLOOD}
    got_out, got_err = receiver.communicate(timeout=120)
    assert receiver.returncode == 0, got_err
    result = json.loads(got_out)
    assert result["got"] == FLOOD, result


# -- what reaches a program past the message sizes it expects ---------------------------------

LIST_DEVICES = """
import ctypes, json
lib = ctypes.CDLL(None)  # the preloaded library's ibv_*/umad_* (a C program's calls)
lib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
lib.ibv_get_device_name.restype = ctypes.c_char_p
lib.ibv_get_device_name.argtypes = [ctypes.c_void_p]
lib.ibv_get_device_guid.restype = ctypes.c_uint64
lib.ibv_get_device_guid.argtypes = [ctypes.c_void_p]
count = ctypes.c_int(-1)
devices = lib.ibv_get_device_list(ctypes.byref(count))
names = (ctypes.c_char * 20 * 128)()  # UMAD_CA_NAME_LEN
cas = lib.umad_get_cas_names(names, 128)
print(json.dumps({
    "names": [lib.ibv_get_device_name(devices[i]).decode() for i in range(count.value)],
    "guids": [lib.ibv_get_device_guid(devices[i]).to_bytes(8, "little").hex()
              for i in range(count.value)],
    "cas": [bytes(names[i]).rstrip(b"\\0").decode() for i in range(cas)],
}))
"""


def one_node_with(hcas: int) -> Topology:
    """node1 with ``hcas`` HCAs: those of a generated cluster, gathered on one host."""
    topology = generate(hcas)
    gathered = [host.hcas[0] for host in topology.hosts]
    for index, hca in enumerate(gathered):
        hca.name = f"mlx5_{index}"
        hca.ports[0].ifname = f"ib{index}"
    topology.hosts = [Host("node1", gathered)]
    return topology.validate()


@pytest.mark.parametrize("hcas", [40, 70])
def test_every_device_of_a_long_device_list_reaches_the_program(tmp_path: Path, hcas: int) -> None:
    """The device list is one message of 160 bytes a device: past 26 devices it is longer
    than any other reply, and past 64 longer than a fixed table; every device still comes
    through ibv_get_device_list and umad_get_cas_names, named and with its GUID."""
    topology = one_node_with(hcas)
    (tmp_path / "topology.json").write_text(topology.to_json())
    hub_args = ("--topology-json", str(tmp_path / "topology.json"))
    with emulated(tmp_path, ("node1",), *hub_args) as running:
        result = run_json(running, sys.executable, LIST_DEVICES)
    hosted = topology.host("node1").hcas
    assert result["names"] == [hca.name for hca in hosted]
    assert result["guids"] == [f"{hca.node_guid:016x}" for hca in hosted]
    assert result["cas"] == result["names"]


GONE = """
import pyverbs.pyverbs_error as pe
route = addr.GlobalRoute(dgid=ctx.query_gid(1, 0), sgid_index=0)
ah = addr.AH(pd, attr=addr.AHAttr(dlid=port.lid, is_global=1, port_num=1, gr=route))
print("ready", flush=True)
sys.stdin.readline()  # by then the device process is gone

def failure(call, bad):
    try:
        call()
    except pe.PyverbsRDMAError as exc:
        return [exc.error_code, bad.wr_id if bad is not None else None]
    return None

def sge():
    return [wrm.SGE(mr.buf, 256, mr.lkey)]

send = wrm.SendWR(wr_id=41, opcode=e.IBV_WR_SEND, num_sge=1, sg=sge())
send.set_wr_ud(ah, qp.qp_num, 0x80010000)
bad_send = wrm.SendWR(wr_id=0, num_sge=1, sg=sge())  # where pyverbs copies the bad one
recv = wrm.RecvWR(wr_id=42, num_sge=1, sg=sge())
bad_recv = wrm.RecvWR(wr_id=0, num_sge=1, sg=sge())
print(json.dumps({
    "send": failure(lambda: qp.post_send(send, bad_send), bad_send),
    "recv": failure(lambda: qp.post_recv(recv, bad_recv), bad_recv),
    "arm": failure(cq.req_notify, None),
}))
"""


def test_posts_to_a_device_that_is_gone_fail_as_verbs_report_it(fabric: Fabric) -> None:
    """A send, a receive and a CQ arm are posted to the device without a reply: when the
    device process is gone, each verbs call returns the send's errno (EPIPE) and names the
    work request that was not posted, instead of reporting a success that never completes."""
    program = run_pyverbs(fabric, "node1", GONE)
    assert program.stdout is not None
    line = program.stdout.readline()
    assert line.strip() == "ready", program.communicate()[1]
    device = fabric.devices["node1"]
    device.kill()
    device.wait(timeout=10)
    out, err = program.communicate(input="\n", timeout=60)
    assert program.returncode == 0, err
    assert json.loads(out) == {
        "send": [errno.EPIPE, 41],
        "recv": [errno.EPIPE, 42],
        "arm": [errno.EPIPE, None],
    }


# -- the hw backend's post and serve (issue 28) through Debian's pyverbs ----------------------

UD_PROGRAM = """
import json, sys, time
import structlog, trio
from ibacm.fabric.api import AddressVector, SendQueueFull
from ibacm.fabric.hw.fabric import HwFabric
from ibacm.fabric.hw.ud_qp import SEND_DEPTH

BAD = 0xEE  # byte 16 of a MAD the responder's handler refuses (it raises)


def say(**values):
    print(json.dumps(values), flush=True)


async def word():
    # The test's next word: one line at a time, each after this program's last answer.
    await trio.lowlevel.wait_readable(sys.stdin.fileno())
    return sys.stdin.readline().strip()


def mad(n, marker=0):
    return bytes([1, 0x2C, 1, 1]) + bytes(4) + n.to_bytes(8, "big") + bytes([marker]) + bytes(239)


async def open_qp():
    fabric = HwFabric()
    port = (await fabric.open())[0].port(1)
    attrs = await port.query()
    return fabric, attrs, await port.open_ud(0, recv_depth=64)


async def responder():
    fabric, attrs, qp = await open_qp()
    answered = []

    def answer(batch):
        refused = 0
        for got in batch:
            if got.mad[16] == BAD:
                refused += 1
                continue
            reply = got.mad[:3] + bytes([0x81]) + got.mad[4:]
            qp.post(reply, AddressVector(dlid=got.slid, dgid=got.sgid), got.src_qp)
            answered.append(int.from_bytes(got.mad[8:16], "big"))
        if refused:
            raise ValueError("a MAD this handler refuses")

    say(lid=attrs.lid, gid=attrs.gids[0].hex(), qpn=qp.qpn)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            served = trio.Event()

            async def serve():
                await qp.serve(answer)
                served.set()

            nursery.start_soon(serve)
            await word()
            await qp.aclose()
            with trio.fail_after(10):
                await served.wait()
    failures = [e["event"] for e in logs if e["log_level"] == "error"]
    say(answered=len(answered), failures=failures, errors=qp.completion_errors)
    await fabric.aclose()


async def initiator(peer):
    fabric, attrs, qp = await open_qp()
    av = AddressVector(dlid=peer["lid"], dgid=bytes.fromhex(peer["gid"]))
    replies = []

    async def replies_reach(count):
        with trio.fail_after(30):
            while len(replies) < count:
                await trio.sleep(0.005)

    def reply_numbers(first, last):
        return sorted(n for n in replies if first <= n < last) == list(range(first, last))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(qp.serve, lambda batch: replies.extend(
            int.from_bytes(got.mad[8:16], "big") for got in batch if got.mad[3] == 0x81))
        qp.post(mad(1000), av, peer["qpn"])  # the address handle exists before the stop
        await replies_reach(1)
        say(phase="ready")
        await word()  # the device process is stopped now: nothing completes
        slowest, full = 0.0, False
        for n in range(SEND_DEPTH):
            started = time.perf_counter()
            qp.post(mad(n), av, peer["qpn"])
            slowest = max(slowest, time.perf_counter() - started)
        try:
            qp.post(mad(SEND_DEPTH), av, peer["qpn"])
        except SendQueueFull:
            full = True
        say(phase="posted", slowest=slowest, full=full)
        await word()  # the device runs again: completions and replies come
        await replies_reach(1 + SEND_DEPTH)
        for n in range(100, 100 + SEND_DEPTH):  # every slot came back
            qp.post(mad(n), av, peer["qpn"])
        await replies_reach(1 + 2 * SEND_DEPTH)
        say(phase="refilled",
            ok=reply_numbers(0, SEND_DEPTH) and reply_numbers(100, 100 + SEND_DEPTH))
        await word()  # this port is down now: a send completes with an error
        qp.post(mad(200), av, peer["qpn"])
        with trio.fail_after(30):
            while qp.completion_errors == 0:
                await trio.sleep(0.005)
        say(phase="failed", errors=qp.completion_errors)
        await word()  # the port is up again: the QP was not wedged
        qp.post(mad(300, marker=0xEE), av, peer["qpn"])  # its handler raises
        qp.post(mad(301), av, peer["qpn"])
        await replies_reach(2 + 2 * SEND_DEPTH)
        qp.post(mad(302), av, peer["qpn"])
        await replies_reach(3 + 2 * SEND_DEPTH)
        await qp.aclose()  # serve returns: the nursery ends
    say(phase="done", after_down=sorted(n for n in replies if 200 <= n < 1000),
        errors=qp.completion_errors, total=len(replies))
    await fabric.aclose()


if sys.argv[1] == "responder":
    trio.run(responder)
else:
    trio.run(initiator, json.loads(sys.argv[2]))
"""


class Conversation:
    """A program on a node of the emulated fabric, spoken to one line at a time."""

    def __init__(self, fabric: Fabric, node: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", UD_PROGRAM, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=fabric.env(node),
        )

    def answer(self, word: str | None = None, timeout: float = 60) -> dict[str, Any]:
        """Send ``word`` (if any); the program's next line, or fail with what it said."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if word is not None:
            self.proc.stdin.write(word + "\n")
            self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.proc.kill()
            pytest.fail(f"no answer within {timeout} s: {self.proc.communicate()[1]}")
        line = self.proc.stdout.readline()
        if not line:
            pytest.fail(f"the program ended: {self.proc.communicate()[1]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def finish(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


def test_hw_qp_posts_and_serves_through_pyverbs(fabric: Fabric) -> None:
    """Our UD QP (``HwUdQp`` through Debian's pyverbs) on both nodes: node2 serves, its
    handler posting a reply to each MAD; node1 posts and serves the replies.

    With node1's device process stopped (nothing is read from the program's socket, nothing
    completes) SEND_DEPTH posts in a row still return and the next one is SendQueueFull: the
    trio thread never blocks on the device. Once the device runs again every MAD is answered
    and every slot comes back. A send on a down port completes with an error that is counted,
    and the QP goes on; a handler that raises is logged and the next MADs are still served;
    serve returns on both sides when their QP is closed."""
    responder = Conversation(fabric, "node2", "responder")
    initiator: Conversation | None = None
    try:
        peer = responder.answer()
        initiator = Conversation(fabric, "node1", "initiator", json.dumps(peer))
        assert initiator.answer() == {"phase": "ready"}
        device = fabric.devices["node1"]
        device.send_signal(signal.SIGSTOP)
        try:
            posted = initiator.answer("go")
        finally:
            device.send_signal(signal.SIGCONT)
        assert posted["phase"] == "posted" and posted["full"] is True
        assert initiator.answer("go") == {"phase": "refilled", "ok": True}
        target = {"node": "node1", "device": "mlx5_0", "port": 1}
        fabric.hub({"op": "port", **target, "up": False})
        assert initiator.answer("go") == {"phase": "failed", "errors": 1}
        fabric.hub({"op": "port", **target, "up": True})
        done = initiator.answer("go")
        # 200 was lost on the down port, 300 refused by the handler.
        total = 1 + 2 * SEND_DEPTH + 2
        assert done == {"phase": "done", "after_down": [301, 302], "errors": 1, "total": total}
        served = responder.answer("quit")
        assert served == {
            "answered": total,
            "failures": ["received MADs could not be handled; dropped"],
            "errors": 0,
        }
    finally:
        responder.finish()
        if initiator is not None:
            initiator.finish()
