"""The two variants of the hot modules: which one a process runs, and that a build is fresh."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from ibacm import compiled
from ibacm.compiled import ENV, MODULES, digest, source_path
from ibacm.compiled.build import prune
from tests.conftest import require, require_peer, require_root

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != ENV} | env
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environ, cwd=REPO
    )


def test_an_edited_module_is_a_build_of_other_sources(tmp_path: Path) -> None:
    package = tmp_path / "ibacm"
    for module in MODULES:
        copy = source_path(module, package)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_path(module), copy)
    assert digest(package) == digest()
    edited = source_path(MODULES[-1], package)
    edited.write_text(edited.read_text() + "\n# edited\n")
    assert digest(package) != digest()


def test_a_new_build_keeps_only_the_newest_older_builds(tmp_path: Path) -> None:
    for age, name in enumerate(["compiled-a", "compiled-b", "compiled-c", "compiled-d"]):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (1_000_000 + age, 1_000_000 + age))
    (tmp_path / "libibacm_emu-x.so").write_bytes(b"")  # other libraries are not builds
    current = tmp_path / "compiled-new"
    current.mkdir()
    removed = prune(current, keep=3)
    assert sorted(p.name for p in removed) == ["compiled-a", "compiled-b"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["compiled-c", "compiled-d", "compiled-new", "libibacm_emu-x.so"]


def test_without_a_build_auto_runs_the_modules_as_written(tmp_path: Path) -> None:
    done = _python(
        "import ibacm, ibacm.provider.acmp.cache as c; print(ibacm.variant.describe(), c.__file__)",
        IBACM_LIB_DIR=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("as written (no compiled build of these sources")
    assert done.stdout.strip().endswith("cache.py")


def test_asking_for_a_missing_build_or_a_bad_mode_fails_and_says_why(tmp_path: Path) -> None:
    missing = _python("import ibacm", IBACM_LIB_DIR=str(tmp_path), IBACM_COMPILED="1")
    assert missing.returncode != 0
    assert "IBACM_COMPILED=1: no compiled build" in missing.stderr
    assert "`IBACM_COMPILED=0 python -m ibacm.compiled.build` makes one" in missing.stderr
    bad = _python("import ibacm", IBACM_COMPILED="yes")
    assert bad.returncode != 0 and "IBACM_COMPILED='yes': expected one of auto, 0, 1" in bad.stderr
    for done in (missing, bad):  # one line, as every command of ours reports bad input
        assert "Traceback" not in done.stderr and done.stderr.startswith("ibacm: ")
    status = subprocess.run(
        [sys.executable, "-m", "ibacm.compiled.build", "--status"],
        capture_output=True,
        text=True,
        env=os.environ | {"IBACM_LIB_DIR": str(tmp_path), ENV: "auto"},
    )
    assert status.returncode == 0 and status.stdout.startswith("as written")


def test_an_incomplete_build_is_not_loaded(tmp_path: Path) -> None:
    _require_build()
    copy = tmp_path / compiled.build_dir().name
    shutil.copytree(compiled.build_dir(), copy)
    compiled.extension_path(copy, MODULES[0]).unlink()
    code = (
        "import ibacm, ibacm.wire.client as c; print(ibacm.variant.describe()); print(c.__file__)"
    )
    auto = _python(code, IBACM_LIB_DIR=str(tmp_path))
    assert auto.returncode == 0, auto.stderr
    assert f"lacks {MODULES[0]}" in auto.stdout and auto.stdout.strip().endswith("client.py")
    forced = _python(code, IBACM_LIB_DIR=str(tmp_path), IBACM_COMPILED="1")
    assert forced.returncode != 0 and f"lacks {MODULES[0]}" in forced.stderr


def _confined(
    hidden: Path, code: str, mode: str, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """``code`` run as under the shipped unit: ProtectHome= hides the home's cache and the
    unit's bounding set has no CAP_DAC_OVERRIDE, so looking into ``hidden`` fails (EACCES)."""
    capsh = require_peer("capsh")
    require_root("capsh drops CAP_DAC_OVERRIDE")
    drop = [capsh, "--drop=cap_dac_override,cap_dac_read_search", "--", "-c"]
    environ = {k: v for k, v in os.environ.items() if k != ENV}
    environ |= {"IBACM_LIB_DIR": str(hidden / "ibacm"), ENV: mode}
    (hidden / "ibacm").mkdir(parents=True, exist_ok=True)
    hidden.chmod(0)
    try:
        return subprocess.run(
            [*drop, f"{sys.executable} -c '{code}'"],
            capture_output=True,
            text=True,
            env=environ,
            cwd=cwd,
        )
    finally:
        hidden.chmod(0o755)


def test_a_cache_it_may_not_look_into_means_as_written(tmp_path: Path) -> None:
    code = "import ibacm; print(ibacm.variant.describe())"
    auto = _confined(tmp_path / "hidden", code, "auto")
    forced = _confined(tmp_path / "hidden", code, "1")
    assert auto.returncode == 0, auto.stderr
    assert auto.stdout.startswith("as written (cannot look into the library cache")
    assert forced.returncode != 0 and "IBACM_COMPILED=1: cannot look into" in forced.stderr
    assert "Traceback" not in forced.stderr


def test_0_runs_the_modules_as_written_even_with_a_build() -> None:
    done = _python(
        "import ibacm, ibacm.provider.acmp.cache as c; print(c.__file__)", IBACM_COMPILED="0"
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("cache.py")


def test_a_build_of_these_sources_is_what_1_and_auto_load() -> None:
    _require_build()
    code = (
        "import importlib, ibacm\n"
        "from ibacm.compiled import MODULES, is_compiled\n"
        "print(ibacm.variant.describe())\n"
        "print(all(is_compiled(importlib.import_module(m)) for m in MODULES))\n"
        "import ibacm.core.daemon as d; print(is_compiled(d))\n"
    )
    for mode in ("1", "auto"):
        done = _python(code, IBACM_COMPILED=mode)
        assert done.returncode == 0, done.stderr
        # Every listed module compiled; the rest (here the daemon) as written.
        assert done.stdout.split("\n")[:3] == [
            f"compiled ({len(MODULES)} modules, mypyc)",
            "True",
            "False",
        ]


def _require_build() -> None:
    require(
        (compiled.build_dir() / compiled.MANIFEST).is_file(),
        "no compiled build here (scripts/setup.sh builds it with mypyc)",
    )


def test_a_package_runs_the_build_shipped_beside_its_modules(tmp_path: Path) -> None:
    # As the Debian package ships it: a copy of the modules with their build beside them,
    # and a daemon whose library cache holds nothing (ProtectHome=, another user).
    _require_build()
    lib = tmp_path / "lib"
    package = lib / "ibacm"
    shutil.copytree(REPO / "ibacm", package, ignore=shutil.ignore_patterns("__pycache__", "builds"))
    ship = [sys.executable, "-m", "ibacm.compiled.build", "--ship", str(package)]
    done = subprocess.run(ship, capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    shipped = compiled.shipped_dir(package)
    assert done.stdout.strip() == str(shipped)
    code = (
        "import ibacm, ibacm.provider.acmp.cache as c\n"
        "print(ibacm.variant.describe()); print(ibacm.variant.reason); print(c.__file__)\n"
    )
    environ = {k: v for k, v in os.environ.items() if k != ENV}
    environ["IBACM_LIB_DIR"] = str(tmp_path / "empty")

    def run_copy(mode: str) -> subprocess.CompletedProcess[str]:
        # cwd first on sys.path: the copy is imported, not this checkout.
        return subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            cwd=lib,
            env=environ | {ENV: mode},
        )

    for mode in ("1", "auto"):
        found = run_copy(mode)
        assert found.returncode == 0, found.stderr
        assert found.stdout.split("\n")[:3] == [
            f"compiled ({len(MODULES)} modules, mypyc)",
            "the build shipped beside the modules",
            str(compiled.extension_path(shipped, "ibacm.provider.acmp.cache")),
        ]
    # An edited copy is other sources: its shipped build is never loaded, nor made from these.
    edited = source_path(MODULES[-1], package)
    edited.write_text(edited.read_text() + "\n# edited\n")
    stale = run_copy("auto")
    assert stale.returncode == 0 and stale.stdout.startswith("as written (no compiled build")
    refused = subprocess.run(ship, capture_output=True, text=True, cwd=REPO)
    assert refused.returncode == 1
    assert refused.stderr.strip().endswith("holds other sources than the ones compiled here")


def test_a_confined_daemon_runs_the_build_its_package_ships(tmp_path: Path) -> None:
    # The reason a package ships its build: under the unit the library cache is out of reach.
    _require_build()
    lib = tmp_path / "lib"
    package = lib / "ibacm"
    shutil.copytree(REPO / "ibacm", package, ignore=shutil.ignore_patterns("__pycache__", "builds"))
    shutil.copytree(compiled.build_dir(), compiled.shipped_dir(package))
    code = "import ibacm; print(ibacm.variant.describe()); print(ibacm.variant.reason)"
    done = _confined(tmp_path / "hidden", code, "1", cwd=lib)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == [
        f"compiled ({len(MODULES)} modules, mypyc)",
        "the build shipped beside the modules",
    ]
