"""The Debian package: built offline by packaging/build-deb.sh, inspected, unpacked and run."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from collections.abc import Mapping
from pathlib import Path

import pytest

from ibacm import compiled
from ibacm.config.opts_template import render_opts_file
from tests.conftest import REPO, require_file, require_peer
from tests.packaging.bundle_module import bundle
from tests.packaging.shells import bash_complete, zsh_complete

pytestmark = pytest.mark.slow

BUILD = REPO / "packaging" / "build-deb.sh"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
BASH_COMPLETIONS = "/usr/share/bash-completion/completions"
ZSH_COMPLETIONS = "/usr/share/zsh/vendor-completions"
"""Where bash-completion loads a command's completion from, and Debian's zsh's $fpath entry."""
ARCH = subprocess.run(
    ["dpkg", "--print-architecture"], capture_output=True, text=True, check=False
).stdout.strip()
"""The package ships the hot modules compiled for this architecture (``ibacm.compiled``)."""


def run(
    *command: str | Path,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for tool in ("dpkg-buildpackage", "dh", "dpkg-deb"):
        require_peer(tool)
    out = tmp_path_factory.mktemp("dist")
    done = run("bash", BUILD, "-f", "-o", out)
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    debs = sorted(out.glob("ibacm-trio_*.deb"))
    assert [d.name for d in debs] == [f"ibacm-trio_{VERSION}_{ARCH}.deb"]
    return debs[0]


@pytest.fixture(scope="module")
def files(deb: Path) -> dict[str, str]:
    """Path in the package -> ls-style mode string, from ``dpkg -c``."""
    listing = run("dpkg", "-c", deb)
    assert listing.returncode == 0, listing.stderr
    found = {}
    for line in listing.stdout.splitlines():
        mode, *_, name = line.split(None, 5)
        found[name.split(" -> ")[0].lstrip(".").rstrip("/") or "/"] = mode
    return found


@pytest.fixture(scope="module")
def unpacked(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("root")
    done = run("dpkg", "-x", deb, root)
    assert done.returncode == 0, done.stderr
    return root


def control(deb: Path, name: str) -> str:
    done = run("dpkg-deb", "-I", deb, name)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_package_lists_console_scripts_units_man_pages_and_config(files: dict[str, str]) -> None:
    expected_executables = [
        "/usr/sbin/ibacm",
        "/usr/bin/ib_acme",
        "/usr/bin/ibacm-sim",
        "/usr/bin/ibacm-tui",
        "/usr/bin/ibacm-admin",
        "/etc/init.d/ibacm",
    ]
    for path in expected_executables:
        assert path in files, path
        assert files[path].startswith("-rwxr-xr-x"), path
    for path in (
        "/lib/systemd/system/ibacm.service",
        "/lib/systemd/system/ibacm.socket",
        "/etc/logrotate.d/ibacm",
        "/etc/rdma/ibacm_opts.cfg",
        "/usr/share/man/man8/ibacm.8.gz",
        "/usr/share/man/man1/ib_acme.1.gz",
        "/usr/share/man/man1/ibacm-sim.1.gz",
        "/usr/share/man/man1/ibacm-tui.1.gz",
        "/usr/share/man/man8/ibacm-admin.8.gz",
        "/usr/share/man/man7/ibacm.7.gz",
        "/usr/share/man/man7/ibacm_prov.7.gz",
        "/usr/share/doc/ibacm-trio/BUNDLED",
        "/usr/share/doc/ibacm-trio/examples/ibacm_route.data",
        "/usr/share/doc/ibacm-trio/examples/ibacm-notify-reload.conf",
        "/usr/share/ibacm-trio/wireshark/acm.lua",
        "/usr/share/ibacm-trio/grafana/ibacm-dashboard.json",
        "/usr/lib/ibacm/ibacm/core/cli.py",
        "/usr/lib/ibacm/trio/__init__.py",
        "/var/lib/ibacm",
    ):
        assert path in files, path
    for command in PYPROJECT["project"]["scripts"]:
        for path in (f"{BASH_COMPLETIONS}/{command}", f"{ZSH_COMPLETIONS}/_{command}"):
            assert files.get(path, "").startswith("-rw-r--r--"), path
    # Debian policy: no byte code in packages (postinst compiles it).
    assert not [p for p in files if p.endswith(".pyc") or "__pycache__" in p]
    # The compiled variant of the hot modules, beside them, built for these very sources.
    shipped = Path("/usr/lib/ibacm") / compiled.shipped_dir(REPO / "ibacm").relative_to(REPO)
    for name in compiled.EXTENSIONS:
        assert str(compiled.extension_path(shipped, name)) in files, name


def test_control_fields(deb: Path) -> None:
    fields = control(deb, "control")
    assert re.search(r"^Package: ibacm-trio$", fields, re.MULTILINE)
    assert re.search(rf"^Version: {re.escape(VERSION)}$", fields, re.MULTILINE)
    assert re.search(rf"^Architecture: {ARCH}$", fields, re.MULTILINE)
    depends = re.search(r"^Depends: (.*)$", fields, re.MULTILINE)
    assert depends is not None and "python3 (>= 3.11)" in depends.group(1)
    assert "libc6" in depends.group(1)  # the compiled modules' (dh_shlibdeps)
    relations = [r.strip() for r in depends.group(1).split(",")]
    # bundle.py's COMPILED table: a dependency from Debian is a Depends (with the project's
    # bounds: ibacm:Depends), a bundled one is not (dh_shlibdeps covers its extension).
    for key, how in bundle.COMPILED.items():
        if how.debian is not None:
            named = [r for r in relations if r.split()[0] == how.debian]
            assert named, (how.debian, relations)
            assert all(re.fullmatch(r"\S+ \((>=|<<|=) \S+\)", r) for r in named), named
        else:
            assert not [r for r in relations if r.split()[0] == f"python3-{key}"], relations
    # It replaces Debian's C ibacm, which installs the same paths.
    for relation in ("Conflicts", "Replaces", "Provides"):
        assert re.search(rf"^{relation}: ibacm$", fields, re.MULTILINE), relation


def test_configuration_files_are_conffiles(deb: Path) -> None:
    conffiles = control(deb, "conffiles").split()
    assert "/etc/rdma/ibacm_opts.cfg" in conffiles
    assert "/etc/logrotate.d/ibacm" in conffiles
    assert "/etc/init.d/ibacm" in conffiles


def test_maintainer_scripts_start_the_socket_not_the_sysv_script(deb: Path) -> None:
    postinst = control(deb, "postinst")
    assert "deb-systemd-helper enable 'ibacm.socket'" in postinst
    assert "deb-systemd-helper enable 'ibacm.service'" in postinst
    starts = re.findall(r"deb-systemd-invoke \$_dh_action (.*) >", postinst)
    assert starts == ["'ibacm.socket'"]  # the service starts on demand or with hardware
    assert "update-rc.d ibacm defaults" in postinst
    assert "invoke-rc.d" not in postinst  # no SysV start: fails without hardware
    assert "compileall" in postinst
    prerm = control(deb, "prerm")
    assert "__pycache__" in prerm
    for script in ("postinst", "prerm", "postrm"):
        text = control(deb, script)
        check = run("sh", "-n", "-c", text)
        assert check.returncode == 0, f"{script}: {check.stderr}"


def test_unpacked_ibacm_reports_its_version(unpacked: Path) -> None:
    require_peer("/usr/bin/python3")
    done = run(unpacked / "usr" / "sbin" / "ibacm", "--version", cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"ibacm {VERSION}"


def test_unpacked_ib_acme_writes_the_option_file(unpacked: Path, tmp_path: Path) -> None:
    require_peer("/usr/bin/python3")
    done = run(unpacked / "usr" / "bin" / "ib_acme", "-O", "-D", tmp_path, cwd="/")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "ibacm_opts.cfg").read_text() == render_opts_file()
    # The installed default configuration is the same file.
    installed = unpacked / "etc" / "rdma" / "ibacm_opts.cfg"
    assert installed.read_text() == render_opts_file()


def test_unpacked_launchers_ignore_pythonpath(unpacked: Path, tmp_path: Path) -> None:
    # A root daemon must not import from wherever the environment points.
    poison = tmp_path / "ibacm"
    poison.mkdir()
    (poison / "__init__.py").write_text("raise SystemExit('imported from PYTHONPATH')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = run(unpacked / "usr" / "sbin" / "ibacm", "--version", env=env, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"ibacm {VERSION}"


def test_installed_man_pages_render(unpacked: Path) -> None:
    man = require_peer("man")
    pages = sorted((unpacked / "usr" / "share" / "man").rglob("*.gz"))
    assert len(pages) == 7
    env = {**os.environ, "MANWIDTH": "80", "LC_ALL": "C.UTF-8"}
    for page in pages:
        done = run(man, "--warnings=all", "-l", page, env=env)
        assert done.returncode == 0 and done.stderr == "", f"{page.name}: {done.stderr}"
        assert "NAME" in done.stdout


def test_every_bundled_library_is_in_debian_copyright(unpacked: Path) -> None:
    manifest = (unpacked / "usr" / "share" / "doc" / "ibacm-trio" / "BUNDLED").read_text()
    copyright_text = (REPO / "packaging" / "debian" / "copyright").read_text()
    # Dependencies taken from Debian packages are listed, but not shipped.
    names = [line.split()[0] for line in manifest.splitlines() if "(not bundled" not in line]
    assert names[0] == "ibacm"
    for name in names[1:]:
        assert f" {name} (" in copyright_text, f"debian/copyright does not mention {name}"


def test_unpacked_ibacm_sim_and_ibacm_admin_run_their_examples(
    unpacked: Path, tmp_path: Path
) -> None:
    """ibacm-sim spawns the hub and the daemons: they must find the package's private library
    (they used to die with "No module named 'ibacm'")."""
    require_peer("/usr/bin/python3")
    cluster = tmp_path / "sim"
    sim = unpacked / "usr" / "bin" / "ibacm-sim"
    # An empty library cache: the daemons can only find the build the package ships.
    env = {**os.environ, "IBACM_LIB_DIR": str(tmp_path / "no-cache"), "IBACM_COMPILED": "auto"}
    up = run(sim, "up", "--nodes", "2", "--dir", cluster, cwd="/", env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        socket_path = cluster / "node1" / "ibacm-unix.sock"
        acme = unpacked / "usr" / "bin" / "ib_acme"
        done = run(acme, "-S", socket_path, "-f", "n", "-s", "node1", "-d", "node2", cwd="/")
        assert done.returncode == 0 and "dlid: 3" in done.stdout, done.stdout + done.stderr
        admin = unpacked / "usr" / "bin" / "ibacm-admin"
        status = run(admin, "--dir", cluster, "--node", "node1", "status", cwd="/")
        assert status.returncode == 0, status.stdout + status.stderr
        assert "endpoint mlx5_0/1/0xffff: ready" in status.stdout
        # Debian's python3 runs the compiled modules the package ships.
        assert f"modules: compiled ({len(compiled.MODULES)} modules, mypyc)" in status.stdout
    finally:
        run(sim, "down", "--dir", cluster, cwd="/", env=env)


def test_installed_completion_loads_in_bash_and_zsh(unpacked: Path, tmp_path: Path) -> None:
    """bash-completion finds the package's scripts where it looks for a command's completion,
    zsh finds them on Debian's $fpath, and both complete an ibacm-sim cluster's node names."""
    loader = require_file(Path("/usr/share/bash-completion/bash_completion"))
    zsh = require_peer("zsh")
    share = unpacked / "usr" / "share"
    cluster = tmp_path / "sim"
    sim = unpacked / "usr" / "bin" / "ibacm-sim"
    env = {**os.environ, "IBACM_LIB_DIR": str(tmp_path / "no-cache"), "IBACM_COMPILED": "auto"}
    up = run(sim, "up", "--nodes", "2", "--dir", cluster, cwd="/", env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        for command in PYPROJECT["project"]["scripts"]:
            # bash-completion's on-demand loader, searching XDG_DATA_DIRS as on an installed
            # system (where it is /usr/share).
            load = f"source {loader}; XDG_DATA_DIRS={share} __load_completion {command}"
            spec, _ = bash_complete(load, command, "")
            assert spec.endswith(f" {command}") and " -F _shtab_" in spec, spec
        load = f"source {loader}; XDG_DATA_DIRS={share} __load_completion ibacm-sim"
        subcommands = bash_complete(load, "ibacm-sim", "")[1]
        assert {"port-down", "restart"} <= set(subcommands)
        assert "--nodes" in bash_complete(load, "ibacm-sim", "up", "--")[1]
        nodes = bash_complete(load, "ibacm-sim", "flap", "--dir", str(cluster), "")[1]
        assert nodes == ["node1", "node2"]
        fpath = run(zsh, "-c", "print -l $fpath").stdout.split()
        assert ZSH_COMPLETIONS in fpath  # Debian's zsh looks there
        vendor = unpacked / ZSH_COMPLETIONS.lstrip("/")
        assert zsh_complete(vendor, f"ibacm-admin --dir {cluster} --node ") == ["node1", "node2"]
    finally:
        run(sim, "down", "--dir", cluster, cwd="/", env=env)


def test_unpacked_launcher_runs_bundled_compiled_code_and_sees_debian_packages(
    unpacked: Path, tmp_path: Path
) -> None:
    """The launcher's interpreter line (``python3 -I``) keeps Debian's dist-packages on
    sys.path after the private directory: a Debian package (python3-pyverbs, for the
    hardware fabric) imports from there, the bundled libraries from the package, and
    immutables runs its compiled Map, not the pure-Python fallback."""
    require_peer("/usr/bin/python3")
    pyverbs = require_file(Path("/usr/lib/python3/dist-packages/pyverbs/__init__.py"))
    launcher = unpacked / "usr" / "sbin" / "ibacm"
    interpreter = launcher.read_text().splitlines()[0].removeprefix("#!").split()
    assert interpreter == ["/usr/bin/python3", "-I"]
    probe = tmp_path / "probe.py"
    probe.write_text(
        f"""\
import runpy, sys
sys.argv = ["ibacm", "--version"]
try:
    runpy.run_path({str(launcher)!r}, run_name="__main__")
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
import ibacm, immutables, pyverbs
print(ibacm.__file__, immutables.__file__, immutables.Map.__module__, pyverbs.__file__)
"""
    )
    done = run(*interpreter, probe, cwd="/", env={"PATH": os.environ.get("PATH", "")})
    assert done.returncode == 0, done.stderr
    first, loaded = done.stdout.splitlines()
    assert first == f"ibacm {VERSION}"
    ibacm_file, immutables_file, map_module, pyverbs_file = loaded.split()
    lib = (unpacked / "usr" / "lib" / "ibacm").resolve()
    assert Path(ibacm_file).resolve().is_relative_to(lib)
    assert Path(immutables_file).resolve().is_relative_to(lib)
    assert map_module == "immutables._map"
    assert pyverbs_file == str(pyverbs)
