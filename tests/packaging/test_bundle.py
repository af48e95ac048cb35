"""packaging/bundle.py: the private library the Debian package ships."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path, PurePosixPath

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.conftest import REPO, require_file, require_peer
from tests.packaging.bundle_module import BUNDLE_PY, bundle

DEBIAN_DIST_PACKAGES = Path("/usr/lib/python3/dist-packages")


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
    # Compiled code only from the dependencies COMPILED bundles: immutables' extension.
    bundled = {how.extension for how in bundle.COMPILED.values() if how.debian is None}
    assert bundled == {"immutables._map"}
    found = {".".join(p.relative_to(lib).parts).split(".cpython-")[0] for p in lib.rglob("*.so")}
    assert found == bundled
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
    assert eps[("ibacm.providers", "ibacmp")] == "ibacm.provider.acmp.provider:AcmpProvider"
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


def _compiled_files(dist: metadata.Distribution) -> list[str]:
    return [str(f) for f in dist.files or [] if str(f).endswith(bundle.NATIVE_SUFFIXES)]


def test_every_compiled_dependency_is_in_the_table_or_refused() -> None:
    """A runtime dependency with compiled code either has a COMPILED entry (bundled for the
    target interpreter, or a Debian package) or bundling it fails: it never slips in."""
    project = bundle.read_project(REPO)
    resolved = bundle.resolve(project.requirements(["metrics"]), project.name)
    compiled = {key: dist for key, dist in resolved.items() if _compiled_files(dist)}
    assert "immutables" in compiled
    for key, dist in compiled.items():
        if key in bundle.COMPILED:
            bundle.dist_files(dist, compiled=True)
        else:
            with pytest.raises(bundle.BundleError, match="compiled code"):
                bundle.dist_files(dist)
    # Today every compiled dependency has an entry (else the package cannot be built), and
    # no entry is stale: each names a dependency and, when bundled, its compiled module.
    assert set(compiled) == set(bundle.COMPILED)
    for key, how in bundle.COMPILED.items():
        if how.debian is None:
            stem = how.extension.replace(".", "/") + "."
            assert any(f.startswith(stem) for f in _compiled_files(resolved[key])), how


def test_debian_relations_of_version_specifiers() -> None:
    relations = bundle.debian_relations
    assert relations("python3-x", SpecifierSet(">=0.19")) == ["python3-x (>= 0.19)"]
    assert relations("python3-x", SpecifierSet(">=0.19,<1")) == [
        "python3-x (<< 1)",
        "python3-x (>= 0.19)",
    ]
    assert relations("python3-x", SpecifierSet("==2.1")) == ["python3-x (= 2.1)"]
    assert relations("python3-x", SpecifierSet()) == ["python3-x"]
    for inexpressible in ("~=1.2", "!=1.0", "==1.*"):
        with pytest.raises(bundle.BundleError, match="no Debian equivalent"):
            relations("python3-x", SpecifierSet(inexpressible))


def test_a_dependency_debian_provides_is_left_out_and_becomes_a_depends(tmp_path: Path) -> None:
    """A table entry with a Debian package: not bundled, the manifest says so, its version
    bounds become ``ibacm:Depends``, and Debian's python3 in isolated mode (-I, as the
    launchers run it) imports it from dist-packages. Debian's python3-pygments stands in
    (rich and textual need Pygments; that it is pure Python does not matter here)."""
    python = require_peer("/usr/bin/python3")
    require_file(DEBIAN_DIST_PACKAGES / "pygments" / "lexer.py")
    table = {**bundle.COMPILED, "pygments": bundle.Compiled("pygments.lexer", "python3-pygments")}
    substvars = tmp_path / "ibacm-trio.substvars"
    substvars.write_text("misc:Depends=\nibacm:Depends=stale\n")
    root = tmp_path / "root"
    layout = _layout(root, python)
    manifest = bundle.build(REPO, layout, ["metrics"], compiled=table, substvars=substvars)

    lib = root / "usr" / "lib" / "ibacm"
    assert not (lib / "pygments").exists()
    assert not list(lib.glob("[pP]ygments-*"))
    assert (lib / "rich" / "__init__.py").is_file()  # what needs it is still bundled
    # Every bound of every dependent (rich and textual): textual's >= 2.19.2 is one reason
    # why the package cannot use bookworm's 2.14.
    wanted = SpecifierSet()
    for dependent in ("rich", "textual"):
        for text in metadata.distribution(dependent).requires or []:
            if Requirement(text).name.lower() == "pygments":
                wanted &= Requirement(text).specifier
    depends = bundle.debian_relations("python3-pygments", wanted)
    assert len(depends) == len(set(depends)) >= 2
    assert substvars.read_text().splitlines() == [
        "misc:Depends=",
        f"ibacm:Depends={', '.join(depends)}",
    ]
    assert f"Pygments (not bundled: Debian's {', '.join(depends)})" in manifest
    assert (lib / "BUNDLED").read_text().splitlines() == manifest

    lines = bundle.verify(REPO, layout, table)
    debian = str(DEBIAN_DIST_PACKAGES / "pygments" / "lexer.py")
    assert f"compiled: pygments.lexer = {debian} (python3-pygments)" in lines
    assert any(line.startswith("compiled: immutables._map = ") for line in lines)
    assert "console_scripts: ibacm-tui = tui.app:main (function)" in lines  # rich works


def test_verify_reports_a_debian_dependency_that_is_not_installed(tmp_path: Path) -> None:
    python = require_peer("/usr/bin/python3")
    table = {**bundle.COMPILED, "structlog": bundle.Compiled("structlog", "python3-structlog")}
    installed = subprocess.run([python, "-I", "-c", "import structlog"], check=False)
    if installed.returncode == 0:
        table = {**bundle.COMPILED, "sniffio": bundle.Compiled("sniffio", "python3-no-sniffio")}
    layout = _layout(tmp_path, python)
    bundle.build(REPO, layout, [], compiled=table)
    with pytest.raises(bundle.BundleError, match=r"cannot be imported \(python3-"):
        bundle.verify(REPO, layout, table)


def test_verify_insists_on_the_compiled_extension_of_a_bundled_dependency(tmp_path: Path) -> None:
    """Without its extension immutables would run its pure-Python Map: the smoke test must
    catch a bundle whose extension the target interpreter cannot load."""
    layout = _layout(tmp_path)
    bundle.build(REPO, layout, [])
    for extension in (tmp_path / "usr/lib/ibacm/immutables").glob("_map.*.so"):
        extension.unlink()
    with pytest.raises(bundle.BundleError, match=r"immutables\._map cannot be imported"):
        bundle.verify(REPO, layout)
