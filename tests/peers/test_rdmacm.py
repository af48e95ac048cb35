"""The real librdmacm reaches our daemon: ``rdma_getaddrinfo()`` returns our path record.

Stock librdmacm gives up before talking to ACM when libibverbs finds no device. In a private
mount namespace (real-peers.md §2) it sees one fake verbs device (a sysfs tree used through
``SYSFS_PATH`` and a ``/dev`` with an empty ``infiniband/uverbs0``), and ``/run`` is a private
tmpfs holding the daemon's ``/run/ibacm.sock``. The daemon is ours, on OpenSM + ibsim
(``--fabric hw-umad``, peers from an acm_hosts file); librdmacm sends a RESOLVE for the
destination IP only, so the daemon picks the source through the routing table (an interface
with 10.0.0.1/24 in the namespace) and resolves the route with a real PathRecord query.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ibacm.wire.path_record import PathRecord
from tests.conftest import REPO, require_file, require_peer
from tests.peers.ibsim import PRELOAD, SimFabric, saquery_path

pytestmark = pytest.mark.peer

LIBRDMACM = Path("/usr/lib/x86_64-linux-gnu/librdmacm.so.1")

# Runs as root in a private mount namespace inside the simulator's network namespace.
SCRIPT = r"""
set -eu
work={work}
fs=$work/fakesys
dev=$work/dev
mkdir -p $fs/class/infiniband_verbs/uverbs0 $fs/class/infiniband/rxe0/ports/1 \
         $fs/class/misc/rdma_cm $dev/infiniband
echo 6 > $fs/class/infiniband_verbs/abi_version
echo rxe0 > $fs/class/infiniband_verbs/uverbs0/ibdev
echo 231:192 > $fs/class/infiniband_verbs/uverbs0/dev
echo 2 > $fs/class/infiniband_verbs/uverbs0/abi_version
echo "1: CA" > $fs/class/infiniband/rxe0/node_type
echo 0002:c903:0001:0001 > $fs/class/infiniband/rxe0/node_guid
echo 4 > $fs/class/misc/rdma_cm/abi_version
touch $dev/infiniband/uverbs0
for node in null zero urandom random tty; do
    touch $dev/$node
    mount --bind /dev/$node $dev/$node
done
mount --bind $dev /dev
mount -t tmpfs tmpfs /run
ip link add acm0 type veth peer name acm0p
trap 'ip link del acm0 2>/dev/null || true' EXIT
ip link set acm0 up
ip link set acm0p up
ip addr add 10.0.0.1/24 dev acm0
env LD_PRELOAD={preload} SIM_HOST=Hca1 PYTHONPATH={repo} \
    {python} -m ibacm.core.cli -P --fabric hw-umad -O $work/ibacm_opts.cfg \
    -A $work/ibacm_addr.cfg > $work/daemon.out 2>&1 &
daemon=$!
for _ in $(seq 300); do [ -S /run/ibacm.sock ] && break; sleep 0.1; done
[ -S /run/ibacm.sock ] || {{ echo "daemon not serving" >&2; kill $daemon; exit 3; }}
SYSFS_PATH=$fs PYTHONPATH={repo} {python} -m tests.peers.rdmacm_probe 10.0.0.2
kill $daemon
wait $daemon
"""


def write_config(work: Path, fabric: SimFabric) -> None:
    hosts = work / "ibacm_hosts.data"
    hosts.write_text(f"10.0.0.2 {fabric.nodes['Hca2'].gid}\n")
    (work / "ibacm_opts.cfg").write_text(
        f"log_file {work / 'ibacm.log'}\nlog_level 2\nlock_file {work / 'ibacm.pid'}\n"
        "run_dir /run\nserver_mode unix\naddr_prot acm\nroute_prot sa\n"
        f"addr_preload acm_hosts\naddr_data_file {hosts}\nsupport_ips_in_addr_cfg 1\n"
    )
    (work / "ibacm_addr.cfg").write_text("10.0.0.1 ibsim0 1 default\n")


def test_rdma_getaddrinfo_returns_our_path_record(sim_fabric: SimFabric, tmp_path: Path) -> None:
    require_file(LIBRDMACM)
    require_peer("unshare")
    write_config(tmp_path, sim_fabric)
    script = SCRIPT.format(
        work=shlex.quote(str(tmp_path)),
        preload=PRELOAD,
        repo=shlex.quote(str(REPO)),
        python=shlex.quote(sys.executable),
    )
    result = subprocess.run(
        [require_peer("ip"), "netns", "exec", sim_fabric.netns,
         require_peer("unshare"), "-m", "--propagation", "private", "bash", "-c", script],
        cwd=sim_fabric.workdir, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    log = tmp_path / "ibacm.log"
    context = f"{result.stdout}\n{result.stderr}\n{log.read_text()[-3000:] if log.exists() else ''}"
    assert result.returncode == 0, context
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["rc"] == 0 and answer["route_len"] == 72, context
    (path_data,) = (bytes.fromhex(entry) for entry in answer["paths"])
    assert int.from_bytes(path_data[:4], sys.byteorder) == 0x2B  # primary, GMP, bidirectional
    route = PathRecord.decode(path_data[8:])
    assert route == saquery_path(sim_fabric, "Hca1", "Hca2")
