"""Release metadata of the Debian and RPM packaging agrees with the project."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from tests.conftest import REPO, require_file, require_peer
from tests.packaging.bundle_module import bundle

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
SCRIPTS = PYPROJECT["project"]["scripts"]
SPEC = REPO / "packaging" / "rpm" / "ibacm.spec"
DEBIAN = REPO / "packaging" / "debian"
MAN_PAGES = sorted(p.name for p in (REPO / "packaging" / "man").iterdir())

# What Fedora defines and Debian's rpm does not, so the spec can be expanded here.
FEDORA_MACROS = {
    "_unitdir": "/usr/lib/systemd/system",
    "_sharedstatedir": "/var/lib",
    "python3_sitelib": "/usr/lib/python3.13/site-packages",
    "pyproject_files": "/tmp/pyproject-files",
}


def expanded_spec() -> str:
    rpmspec = require_peer("rpmspec")
    defines = [
        arg for key, value in FEDORA_MACROS.items() for arg in ("--define", f"{key} {value}")
    ]
    done = subprocess.run(
        [rpmspec, *defines, "-P", str(SPEC)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_debian_changelog_is_at_the_project_version() -> None:
    first = (DEBIAN / "changelog").read_text().splitlines()[0]
    match = re.match(r"^ibacm-trio \((.+)\) \w+; urgency=\w+$", first)
    assert match is not None, first
    assert match.group(1) == VERSION  # native package: no Debian revision


def test_debian_packaging_names_every_man_page() -> None:
    listed = (DEBIAN / "ibacm-trio.manpages").read_text().split()
    assert sorted(p.rsplit("/", 1)[1] for p in listed) == MAN_PAGES


def test_rpm_spec_parses_at_the_project_version() -> None:
    rpmspec = require_peer("rpmspec")
    done = subprocess.run(
        [rpmspec, "-q", "--qf", "%{name} %{version} %{arch}\n", str(SPEC)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ibacm-trio", VERSION, "noarch"]


def test_rpm_files_section_covers_scripts_units_and_man_pages() -> None:
    files = expanded_spec().split("\n%files", 1)[1].split("\n%changelog", 1)[0]
    for name in SCRIPTS:
        directory = "/usr/sbin" if name == "ibacm" else "/usr/bin"
        assert f"\n{directory}/{name}\n" in files, name
    for page in MAN_PAGES:
        section = page.rsplit(".", 1)[1]
        assert f"/usr/share/man/man{section}/{page}*" in files, page
        # Shell completion, where Fedora's bash-completion and zsh look.
        assert f"\n/usr/share/bash-completion/completions/{name}\n" in files, name
        assert f"\n/usr/share/zsh/site-functions/_{name}\n" in files, name
    for unit in ("ibacm.service", "ibacm.socket"):
        assert f"/usr/lib/systemd/system/{unit}" in files
    assert "%config(noreplace) /etc/rdma/ibacm_opts.cfg" in files


def test_rpm_changelog_is_at_the_project_version() -> None:
    changelog = SPEC.read_text().split("%changelog\n", 1)[1]
    assert changelog.splitlines()[0].endswith(f" - {VERSION}-1")


def test_rpm_makes_the_completion_scripts_at_build_time() -> None:
    spec = expanded_spec()
    install = spec.split("\n%install\n", 1)[1].split("\n%check\n", 1)[0]
    assert "-m ibacm.tools.completion" in install
    assert "--bash-dir /" in install and "/usr/share/bash-completion/completions" in install
    assert "--zsh-dir /" in install and "/usr/share/zsh/site-functions" in install
    assert re.search(r"^BuildRequires:\s+python3-shtab$", spec, re.MULTILINE)


def test_rpm_requires_every_runtime_dependency_through_rpms_python_generator(
    tmp_path: Path,
) -> None:
    """The spec has no Requires of its own for Python libraries: rpm's dependency generator
    reads them from the installed metadata (what %pyproject_install puts in sitelib). Run
    that generator on the project's metadata: every dependency of pyproject.toml, with its
    bounds, becomes a Requires, immutables >= 0.19 among them (Fedora's python3-immutables
    provides python3.13dist(immutables))."""
    generator = require_file(Path("/usr/lib/rpm/pythondistdeps.py"))
    spec = SPEC.read_text()
    for disabling in ("python_disable_dependency_generator", "AutoReq:", "__requires_exclude"):
        assert disabling not in spec, disabling
    sitelib = tmp_path / "usr" / "lib" / "python3.13" / "site-packages"
    project = bundle.read_project(REPO)
    bundle.install_project(project, REPO, sitelib)
    (info,) = sitelib.glob("ibacm-*.dist-info")
    done = subprocess.run(
        [sys.executable, str(generator), "--requires"],
        input=f"{info}\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    requires = set(done.stdout.splitlines())
    assert "python3.13dist(immutables) >= 0.19" in requires
    for text in PYPROJECT["project"]["dependencies"]:
        req = Requirement(text)
        for spec_item in req.specifier:
            name = bundle.normalize(req.name)
            wanted = f"python3.13dist({name}) {spec_item.operator} {spec_item.version}"
            assert wanted in requires, (wanted, sorted(requires))
