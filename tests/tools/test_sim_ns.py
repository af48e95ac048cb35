"""One simulated node's ``/run`` for an unmodified program (ibacm.tools.sim_ns and the fake
verbs device of ibacm.tools.sim_exec), in real private mount namespaces (root)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ibacm.tools.sim_exec import fake_verbs_device
from ibacm.tools.sim_ns import NamespaceError, namespace_support, private_run_argv
from tests.conftest import require, require_file, require_root

SIG_PIPE = 1 << (13 - 1)  # in /proc/PID/status SigIgn


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    require_root("a private mount namespace (unshare -m)")
    require(namespace_support() is None, f"no private mount namespace: {namespace_support()}")
    node = tmp_path / "node1"
    node.mkdir()
    (node / "marker").write_text("node1\n")
    return node


def test_the_program_sees_the_nodes_run_and_the_host_keeps_its_own(run_dir: Path) -> None:
    script = "echo $$; cat /run/marker; grep SigIgn /proc/self/status"
    argv = private_run_argv(run_dir, ["/bin/sh", "-c", script])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    pid, marker, ignored = out.splitlines()
    assert proc.returncode == 0 and marker == "node1"
    assert int(pid) == proc.pid  # no fork in between: the caller holds the program's pid
    assert not int(ignored.split()[1], 16) & SIG_PIPE
    assert not Path("/run/marker").exists()


def test_sigpipe_ignored_as_systemd_starts_a_service(run_dir: Path) -> None:
    argv = private_run_argv(run_dir, ["grep", "SigIgn", "/proc/self/status"], ignore_sigpipe=True)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    assert int(done.stdout.split()[1], 16) & SIG_PIPE


def test_no_command_is_refused(run_dir: Path) -> None:
    with pytest.raises(NamespaceError, match="no command"):
        private_run_argv(run_dir, [])


# libibverbs' own device list (ctypes, as a C program calls it): the fake device must be one.
LIST = """
import ctypes, json
lib = ctypes.CDLL("libibverbs.so.1")
lib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
lib.ibv_get_device_name.restype = ctypes.c_char_p
lib.ibv_get_device_name.argtypes = [ctypes.c_void_p]
lib.ibv_get_device_guid.restype = ctypes.c_uint64
lib.ibv_get_device_guid.argtypes = [ctypes.c_void_p]
count = ctypes.c_int(0)
devices = lib.ibv_get_device_list(ctypes.byref(count))
print(json.dumps([[lib.ibv_get_device_name(devices[i]).decode(),
                   lib.ibv_get_device_guid(devices[i]).to_bytes(8, "little").hex()]
                  for i in range(count.value)]))
"""


def test_libibverbs_finds_the_fake_device_of_a_simulated_node(run_dir: Path) -> None:
    require_file(Path("/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so"))
    environ, binds = fake_verbs_device(run_dir / ".exec", 0x0002C90300000A01)
    argv = private_run_argv(run_dir, [sys.executable, "-c", LIST], binds=binds)
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env=os.environ | environ
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [["rxe0", "0002c90300000a01"]]
