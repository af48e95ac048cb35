"""packaging/bundle.py: the private library the Debian package ships."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path, PurePosixPath
from types import ModuleType

import pytest
from packaging.requirements import Requirement

from tests.conftest import REPO, require_peer

BUNDLE_PY = REPO / "packaging" / "bundle.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ibacm_packaging_bundle", BUNDLE_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses need the module registered
    spec.loader.exec_module(module)
    return module


bundle = _load()


def _layout(root: Path, python: str = sys.executable) -> object:
    return bundle.Layout(
        root=root,
        libdir=PurePosixPath("/usr/lib/ibacm"),
        bindir=PurePosixPath("/usr/bin"),
        sbindir=PurePosixPath("/usr/sbin"),
        python=python,
        sbin_scripts=frozenset({"ibacm"}),
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("bundle")
    manifest = bundle.build(REPO, _layout(root), ["metrics"])
    return root, manifest


def test_project_is_read_from_pyproject() -> None:
    project = bundle.read_project(REPO)
    assert project.name == "ibacm"
    assert project.version == metadata.version("ibacm")
    assert project.scripts["ibacm"] == "ibacm.core.cli:main"
    assert "ibacmp" in project.entry_points["ibacm.providers"]
    assert [p.name for p in bundle.project_packages(REPO, project.package_patterns)] == [
        "ibacm",
        "tui",
    ]


def test_runtime_closure_has_the_dependencies_and_no_test_tools() -> None:
    project = bundle.read_project(REPO)
    resolved = bundle.resolve(project.requirements(["metrics"]), project.name)
    for needed in ("trio", "structlog", "textual", "prometheus-client", "attrs", "rich"):
        assert needed in resolved
    for tool in ("pytest", "hypothesis", "mypy", "ruff", "ibacm"):
        assert tool not in resolved


def test_closure_is_complete_including_extras_of_dependencies() -> None:
    project = bundle.read_project(REPO)
    resolved = bundle.resolve(project.requirements(["metrics"]), project.name)
    for dist in resolved.values():
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None:
                assert bundle.normalize(req.name) in resolved, f"{dist.metadata['Name']}: {req}"
    # textual asks for markdown-it-py[linkify]: the extra's own dependency must come along.
    assert "linkify-it-py" in resolved


def test_unknown_extra_is_refused() -> None:
    project = bundle.read_project(REPO)
    with pytest.raises(bundle.BundleError, match="no extra 'gpu'"):
        project.requirements(["gpu"])


def test_missing_dependency_names_who_needs_it() -> None:
    wanted = [Requirement("ibacm-no-such-distribution>=1")]
    with pytest.raises(bundle.BundleError, match=r"required by demo\).*not installed"):
        bundle.resolve(wanted, "demo")


def test_too_old_dependency_is_refused() -> None:
    installed = metadata.version("trio")
    with pytest.raises(bundle.BundleError, match=f"installed version is {installed}"):
        bundle.resolve([Requirement("trio>=999")], "demo")


def test_compiled_distribution_is_refused(tmp_path: Path) -> None:
    info = tmp_path / "fastthing-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fastthing\nVersion: 1.0\n")
    (tmp_path / "fastthing").mkdir()
    (tmp_path / "fastthing" / "_speedups.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\0")
    (info / "RECORD").write_text(
        "fastthing/_speedups.cpython-311-x86_64-linux-gnu.so,,\n"
        "fastthing-1.0.dist-info/METADATA,,\nfastthing-1.0.dist-info/RECORD,,\n"
    )
    dist = metadata.PathDistribution(info)
    with pytest.raises(bundle.BundleError, match="compiled code"):
        bundle.dist_files(dist)


def test_bundle_holds_project_dependencies_and_manifest(built: tuple[Path, list[str]]) -> None:
    root, manifest = built
    lib = root / "usr" / "lib" / "ibacm"
    assert (lib / "ibacm" / "core" / "__init__.py").is_file()
    assert (lib / "ibacm" / "py.typed").is_file()
    assert (lib / "tui" / "__init__.py").is_file()
    assert (lib / "trio" / "__init__.py").is_file()
    assert not list(lib.rglob("__pycache__"))
    assert not list(lib.rglob("*.so"))
    names = [line.split()[0] for line in manifest]
    assert names[0] == "ibacm"
    assert "trio" in names and "textual" in names
    assert (lib / "BUNDLED").read_text().splitlines() == manifest


def test_bundled_metadata_exposes_entry_points(built: tuple[Path, list[str]]) -> None:
    root, _ = built
    lib = root / "usr" / "lib" / "ibacm"
    dists = {d.metadata["Name"]: d for d in metadata.distributions(path=[str(lib)])}
    ours = dists["ibacm"]
    assert ours.version == metadata.version("ibacm")
    eps = {(ep.group, ep.name): ep.value for ep in ours.entry_points}
    assert eps[("ibacm.providers", "ibacmp")] == "ibacm.acmp.provider:AcmpProvider"
    assert eps[("console_scripts", "ib_acme")] == "ibacm.tools.ib_acme:main"
    record = ours.files
    assert record is not None
    assert PurePosixPath("ibacm/provider/api.py") in {PurePosixPath(str(f)) for f in record}


def test_launchers_land_in_bin_and_sbin(built: tuple[Path, list[str]]) -> None:
    root, _ = built
    for path in ("usr/sbin/ibacm", "usr/bin/ib_acme", "usr/bin/ibacm-sim", "usr/bin/ibacm-tui"):
        launcher = root / path
        assert os.access(launcher, os.X_OK), path
        first = launcher.read_text().splitlines()[0]
        assert first == f"#!{sys.executable} -I"
    assert "'..', 'lib', 'ibacm'" in (root / "usr/sbin/ibacm").read_text()


def test_launcher_uses_the_bundle_not_the_environment(built: tuple[Path, list[str]]) -> None:
    # The launcher imports from its own tree even from another directory and with a
    # PYTHONPATH that points elsewhere (-I ignores it). Debian's python3 is the target; the
    # test virtualenv's editable install of ibacm would win over any sys.path entry.
    python = require_peer("/usr/bin/python3")
    root, _ = built
    launcher = root / "usr" / "bin" / "ibacm-probe"
    bundle.write_launcher(
        launcher, "ibacm-probe", "ibacm.provider.api:Counters", python, "../lib/ibacm"
    )
    probe = launcher.with_name("probe.py")
    probe.write_text(
        textwrap.dedent(
            f"""\
            import runpy, sys
            sys.exit = lambda value=None: print(type(value).__name__)
            runpy.run_path({str(launcher)!r})
            import ibacm, trio
            print(ibacm.__file__)
            print(trio.__file__)
            """
        )
    )
    done = subprocess.run(
        [python, "-I", str(probe)],
        capture_output=True,
        text=True,
        cwd="/",
        env={"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "")},
        timeout=60,
        check=True,
    )
    kind, ibacm_file, trio_file = done.stdout.split()
    assert kind == "Counters"
    lib = (root / "usr" / "lib" / "ibacm").resolve()
    assert Path(ibacm_file).resolve().is_relative_to(lib)
    assert Path(trio_file).resolve().is_relative_to(lib)


def test_verify_imports_every_entry_point_with_the_system_python(tmp_path: Path) -> None:
    python = require_peer("/usr/bin/python3")
    bundle.build(REPO, _layout(tmp_path, python), ["metrics"])
    lines = bundle.verify(REPO, _layout(tmp_path, python))
    loaded = {line.split(":", 1)[0] + ":" + line.split()[1] for line in lines}
    assert "ibacm.providers:ibacmp" in loaded
    assert "console_scripts:ibacm" in loaded
    assert "console_scripts:ibacm-tui" in loaded


def test_verify_reports_a_bundle_of_another_version(tmp_path: Path) -> None:
    bundle.build(REPO, _layout(tmp_path), [])
    metadata_file = next((tmp_path / "usr/lib/ibacm").glob("ibacm-*.dist-info")) / "METADATA"
    text = metadata_file.read_text().replace("\nVersion: ", "\nVersion: 99.", 1)
    metadata_file.write_text(text)
    with pytest.raises(bundle.BundleError, match="found instead of"):
        bundle.verify(REPO, _layout(tmp_path))


def test_verify_reports_a_missing_launcher(tmp_path: Path) -> None:
    bundle.build(REPO, _layout(tmp_path), [])
    (tmp_path / "usr/bin/ibacm-tui").unlink()
    with pytest.raises(bundle.BundleError, match="ibacm-tui is missing"):
        bundle.verify(REPO, _layout(tmp_path))


def test_command_line_reports_errors_without_traceback(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "demo"\nversion = "1"\ndependencies = ["ibacm-no-such-dist"]\n'
    )
    done = subprocess.run(
        [sys.executable, str(BUNDLE_PY), "--source", str(tmp_path), "--root", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("bundle: error: ibacm-no-such-dist (required by demo)")
    assert "Traceback" not in done.stderr
