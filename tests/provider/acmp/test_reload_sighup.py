"""SIGHUP with a broken option file, as an operator tried it: real daemons (``ibacm-sim``),
the real ``ib_acme``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import ibacm_sim, require_peer

pytestmark = [pytest.mark.peer]


def test_sighup_with_invalid_values_keeps_serving_with_the_running_configuration() -> None:
    ib_acme = require_peer("ib_acme")
    root = Path(tempfile.mkdtemp(prefix="sighup"))
    try:
        assert ibacm_sim("up", "--nodes", "3", "--dir", str(root)).returncode == 0
        node = root / "node1"
        opts = node / "ibacm_opts.cfg"
        opts.write_text(opts.read_text() + "timeout banana\nretries -5\n")
        pid = json.loads((root / "pids.json").read_text())["nodes"]["node1"]
        os.kill(pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        log = ""
        while "reload refused" not in log and time.monotonic() < deadline:
            time.sleep(0.1)
            log = (node / "ibacm.log").read_text()
        refused = [line for line in log.splitlines() if "reload refused" in line]
        # Said once, with the two lines counted once each and both problems.
        assert len(refused) == 1, log[-2000:]
        assert "2 invalid settings" in refused[0]
        assert "timeout value 'banana' is not a number" in refused[0]
        assert "retries value -5 is below 0" in refused[0]
        assert "timeout value 0" not in refused[0]  # not also the 0 'banana' was read as
        assert "configuration reloaded" not in log
        # A destination never resolved before still resolves: the timeout is still 2000 ms.
        result = subprocess.run(
            [ib_acme, "-S", str(node / "ibacm-unix.sock"), "-s", "10.0.0.1", "-d", "10.0.0.3"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert "dlid: 4" in result.stdout, result.stdout
    finally:
        ibacm_sim("down", "--dir", str(root))
        shutil.rmtree(root, ignore_errors=True)
