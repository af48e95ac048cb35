"""A relative ``cache_file`` on an ``ibacm-sim`` cluster: one file per node, in the node's
directory (its state directory), not one file shared through the daemons' working directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.conftest import ibacm_sim, require_peer


def test_each_sim_node_saves_its_own_relative_cache_file() -> None:
    ib_acme = require_peer("ib_acme")
    root = Path(tempfile.mkdtemp(prefix="cachefile"))
    try:
        extra = root / "extra.cfg"
        extra.write_text("cache_file cache.json\n")
        up = ibacm_sim("up", "--nodes", "3", "--dir", str(root), "--opts", str(extra))
        assert up.returncode == 0, up.stdout + up.stderr
        for src, dst in (("node1", "node2"), ("node2", "node3"), ("node3", "node1")):
            sock = str(root / src / "ibacm-unix.sock")
            done = subprocess.run(
                [ib_acme, "-S", sock, "-f", "n", "-s", src, "-d", dst],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            assert done.returncode == 0, done.stdout
        # A node restarted on its own keeps its state directory (and so its file).
        restart = ibacm_sim("restart", "--dir", str(root), "node1")
        assert restart.returncode == 0, restart.stdout + restart.stderr
        pid = json.loads((root / "pids.json").read_text())["nodes"]["node1"]
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"STATE_DIRECTORY={root / 'node1'}".encode() in environ
        assert ibacm_sim("down", "--dir", str(root)).returncode == 0
        saved = {}
        for node in ("node1", "node2", "node3"):
            document = json.loads((root / node / "cache.json").read_text())
            (entries,) = [e for e in document["endpoints"].values() if e]
            saved[node] = {bytes.fromhex(e["address"]).decode() for e in entries}
        # Each node's file holds what that node resolved (and nothing of a shared file).
        assert "node2" in saved["node1"] and "node3" in saved["node2"]
        assert "node1" in saved["node3"]
        assert not list(root.glob("cache.json")) and not list(root.glob("*/.cache.json.*.tmp"))
    finally:
        ibacm_sim("down", "--dir", str(root))
        shutil.rmtree(root, ignore_errors=True)
