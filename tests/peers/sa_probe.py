"""Our SA client on ibsim: run as ``python -m tests.peers.sa_probe ACTION...`` under the
``libumad2sim.so`` preload with ``SIM_HOST`` set; prints one JSON object.

It goes through the product's fabric interface exactly as the daemon does: ``HwFabric`` in
umad-only mode, ``Port.query()``, ``Port.sa_send()`` with the wire codecs' MADs.

Actions: ``join`` / ``leave`` (the ACM group 0 of the default options, as ibacmp builds it),
``path=<dgid>`` (a PathRecord GET sgid -> dgid like ibacmp's route query).
"""

from __future__ import annotations

import ipaddress
import json
import sys
from typing import Any

import trio

from ibacm.fabric.api import ACM_QKEY, Port, SaDestination
from ibacm.fabric.hw.fabric import HwFabric, HwMode
from ibacm.wire.acm_mad import mgid_for
from ibacm.wire.mad import McMemberRecord, SaMad, build_mc_join, build_mc_leave, build_path_get
from ibacm.wire.path_record import PathRecord

DEFAULT_PKEY = 0xFFFF
RATE_10G = 3  # min_rate 10 (options.md §4)
MTU_2048 = 4  # min_mtu 2048
TIMEOUT_MS = 2000
RETRIES = 2


def acm_group_record(port_gid: bytes) -> McMemberRecord:
    return McMemberRecord(
        mgid=mgid_for(DEFAULT_PKEY, RATE_10G, MTU_2048),
        port_gid=port_gid,
        qkey=ACM_QKEY,
        mtu_selector=2,
        mtu=MTU_2048,
        pkey=DEFAULT_PKEY,
        rate_selector=2,
        rate=RATE_10G,
        scope=5,
        join_state=1,
    )


async def run(actions: list[str]) -> dict[str, Any]:
    fabric = HwFabric(mode=HwMode.UMAD_ONLY)
    devices = await fabric.open()
    port = devices[0].port(1)
    attrs = await port.query()
    dest = SaDestination(attrs.sm_lid, attrs.sm_sl, attrs.sa_pkey_index())
    own_gid = attrs.gids[0]
    out: dict[str, Any] = {
        "device": devices[0].name,
        "lid": attrs.lid,
        "gid": str(ipaddress.IPv6Address(own_gid)),
        "sm_lid": attrs.sm_lid,
    }
    for tid, action in enumerate(actions, start=1):
        if action in ("join", "leave"):
            build = build_mc_join if action == "join" else build_mc_leave
            reply = await _ask(port, build(tid, acm_group_record(own_gid)), dest)
            record = McMemberRecord.decode(reply.data[:56])
            out[action] = {
                "status": reply.mad.status,
                "mgid": str(ipaddress.IPv6Address(record.mgid)),
                "mlid": record.mlid,
                "scope_join": record.scope_join,
                "qkey": record.qkey,
            }
        elif action.startswith("path="):
            dgid = ipaddress.IPv6Address(action[5:]).packed
            query = PathRecord(sgid=own_gid, dgid=dgid, pkey=DEFAULT_PKEY, reversible=True)
            reply = await _ask(port, build_path_get(tid, query), dest)
            out.setdefault("paths", {})[action[5:]] = {
                "status": reply.mad.status,
                "record": reply.data[:64].hex(),
            }
        else:
            raise SystemExit(f"unknown action {action!r}")
    await fabric.aclose()
    return out


async def _ask(port: Port, mad: bytes, dest: SaDestination) -> SaMad:
    return SaMad.decode(await port.sa_send(mad, dest, timeout_ms=TIMEOUT_MS, retries=RETRIES))


if __name__ == "__main__":
    print(json.dumps(trio.run(run, sys.argv[1:])))
