"""Which provider libraries of ``provider_lib_path`` get loaded (ibacm.provider.cprov.provider),
checked
as rdma-core's core checks them: ``provider_query``, its version and structure size, the name.
A child process holds the core library (one per process) and reports what it found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import structlog

from ibacm.provider.cprov.provider import discover_c_providers
from tests.conftest import REPO, require_file, require_peer

HERE = Path(__file__).resolve().parent

DISCOVER = """
import json, sys, trio
from pathlib import Path
from types import SimpleNamespace
from ibacm.config.options import Options
from ibacm.provider.cprov.provider import CoreBridge, discover_c_providers

async def main():
    core = SimpleNamespace(options=Options())
    bridge = CoreBridge(core, trio.lowlevel.current_trio_token(), "/dev/null")
    loaded, rejected = discover_c_providers(Path(sys.argv[1]), bridge)
    print(json.dumps({
        "loaded": [[lib.name, lib.path.name, lib.cls.__name__] for lib in loaded],
        "rejected": {lib.path.name: lib.reason for lib in rejected},
    }))

trio.run(main)
"""


def build(cc: str, target: Path, source: Path, *defines: str) -> None:
    command = [cc, "-shared", "-fPIC", "-o", str(target), str(source), *defines]
    subprocess.run(command, check=True, capture_output=True)


def test_only_libraries_that_pass_rdma_cores_checks_are_loaded(tmp_path: Path) -> None:
    cc = require_peer("cc")
    require_file(Path("/usr/include/infiniband/acm_prov.h"))
    libs = tmp_path / "libs"
    libs.mkdir()
    build(cc, libs / "libtestprov.so", HERE / "testprov.c")
    build(cc, libs / "libwrongver.so", HERE / "testprov.c", "-DWRONG_VERSION")
    build(cc, libs / "liblong.so", HERE / "testprov.c", f'-DPROV_NAME="{"x" * 64}"')
    (tmp_path / "noquery.c").write_text("int not_a_provider(void) { return 0; }\n")
    build(cc, libs / "libnoquery.so", tmp_path / "noquery.c")
    (libs / "notalib.so").write_text("not an ELF file\n")
    (libs / "liblink.so").symlink_to(libs / "libtestprov.so")  # rdma-core skips links
    (libs / "README").write_text("not a .so: never tried\n")
    done = subprocess.run(
        [sys.executable, "-c", DISCOVER, str(libs)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])  # after the log lines of the rejects
    assert found["loaded"] == [["testprov", "libtestprov.so", "CProvider_testprov"]]
    reasons = found["rejected"]
    assert sorted(reasons) == ["liblong.so", "libnoquery.so", "libwrongver.so", "notalib.so"]
    assert (
        reasons["liblong.so"].startswith("provider name 'xxx")
        and "1..63 bytes" in reasons["liblong.so"]
    )
    assert reasons["libnoquery.so"] == "provider_query not found"
    assert reasons["libwrongver.so"].startswith("unmatched provider version 0x00000002")
    assert reasons["notalib.so"].startswith("could not load")


def test_a_directory_that_cannot_be_read_loads_nothing_and_says_so(tmp_path: Path) -> None:
    # The directory is read before any library, so no core library (bridge) is needed.
    with structlog.testing.capture_logs() as logs:
        found = discover_c_providers(tmp_path / "none", None)  # type: ignore[arg-type]
    assert found == ([], [])
    assert [(e["event"], e["path"]) for e in logs] == [
        ("could not open provider lib dir", str(tmp_path / "none"))
    ]
