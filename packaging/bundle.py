"""Install ibacm with its pure-Python dependencies into a private library directory.

Distribution packages use this instead of ``pip install``: the dependencies a Debian release
ships (trio, structlog, textual) are too old, and a package build must work offline. So the
project itself is copied from the source tree (its ``.dist-info`` written from
``pyproject.toml``, so provider entry points work) and every runtime dependency is copied,
file by file as its ``RECORD`` lists them, from the Python environment running this script.
Launchers for the console scripts run the system interpreter with the private directory
first on ``sys.path``, located relative to the launcher, so an unpacked tree (``dpkg -x``)
works as well as an installed one.

Usage (as ``debian/rules`` runs it)::

    python packaging/bundle.py --source . --root debian/ibacm-trio --extra metrics
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
except ImportError:  # pragma: no cover - depends on the build environment
    sys.exit("bundle: error: the 'packaging' library is needed (pip install packaging)")

BUNDLE_INSTALLER = "ibacm-bundle"
MANIFEST_NAME = "BUNDLED"
NATIVE_SUFFIXES = (".so", ".pyd", ".dylib")


class BundleError(Exception):
    """The bundle cannot be built; the message says what to fix."""


# ---------------------------------------------------------------------------------------------
# The project, from pyproject.toml


@dataclass(frozen=True)
class Project:
    """What ``pyproject.toml`` says about the project."""

    name: str
    version: str
    summary: str
    requires_python: str
    license: str
    dependencies: tuple[str, ...]
    optional: Mapping[str, tuple[str, ...]]
    scripts: Mapping[str, str]
    entry_points: Mapping[str, Mapping[str, str]]
    package_patterns: tuple[str, ...]

    def requirements(self, extras: Iterable[str]) -> list[Requirement]:
        chosen = list(self.dependencies)
        for extra in extras:
            if extra not in self.optional:
                known = ", ".join(sorted(self.optional)) or "none"
                raise BundleError(f"pyproject.toml has no extra {extra!r} (known: {known})")
            chosen.extend(self.optional[extra])
        return [Requirement(text) for text in chosen]


def read_project(source: Path) -> Project:
    """Parse ``source/pyproject.toml``; raises ``BundleError`` when a field is missing."""
    path = source / "pyproject.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BundleError(f"cannot read {path}: {exc}") from exc
    project = data.get("project")
    if not isinstance(project, dict) or "name" not in project or "version" not in project:
        raise BundleError(f"{path}: [project] with name and version is required")
    find = data.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {})
    patterns = tuple(find.get("include", [project["name"], f"{project['name']}.*"]))
    license_field = project.get("license", "")
    return Project(
        name=project["name"],
        version=project["version"],
        summary=project.get("description", ""),
        requires_python=project.get("requires-python", ""),
        license=license_field if isinstance(license_field, str) else "",
        dependencies=tuple(project.get("dependencies", [])),
        optional={k: tuple(v) for k, v in project.get("optional-dependencies", {}).items()},
        scripts=dict(project.get("scripts", {})),
        entry_points={k: dict(v) for k, v in project.get("entry-points", {}).items()},
        package_patterns=patterns,
    )


def _matches(name: str, patterns: Sequence[str]) -> bool:
    """setuptools ``find`` semantics: ``ibacm*`` matches ``ibacm`` and ``ibacm.core``."""
    return any(re.fullmatch(re.escape(p).replace(r"\*", ".*"), name) for p in patterns)


def project_packages(source: Path, patterns: Sequence[str]) -> list[Path]:
    """Top-level package directories (with ``__init__.py``) the project ships."""
    found = [
        child
        for child in sorted(source.iterdir())
        if child.is_dir() and (child / "__init__.py").is_file() and _matches(child.name, patterns)
    ]
    if not found:
        raise BundleError(f"no package matching {list(patterns)} in {source}")
    return found


def _package_files(package: Path) -> Iterator[Path]:
    """Every file of a package tree except byte code (package data such as py.typed or
    stylesheets is kept, as a wheel built with include-package-data would)."""
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield path


# ---------------------------------------------------------------------------------------------
# Dependencies, from the running environment


def normalize(name: str) -> str:
    """PEP 503 name normalization."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _applies(req: Requirement, extras: Iterable[str]) -> bool:
    """A dependency applies unconditionally, or for one of the extras asked for."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({"extra": extra}) for extra in (*sorted(extras), ""))


def resolve(requirements: Iterable[Requirement], project: str) -> dict[str, metadata.Distribution]:
    """Walk the requirement graph through the installed distributions (by normalized name).

    Raises ``BundleError`` when a requirement is missing or its installed version does not
    satisfy the specifier, naming what requires it.
    """
    resolved: dict[str, metadata.Distribution] = {}
    extras_of: dict[str, set[str]] = {}
    # Markers are evaluated when a requirement is queued: "extra == ..." is only true in the
    # context of the distribution whose extra was asked for.
    pending = [(req, project) for req in requirements if _applies(req, ())]
    while pending:
        req, wanted_by = pending.pop()
        key = normalize(req.name)
        if key == normalize(project):
            continue
        dist = _installed(req, wanted_by)
        extras = extras_of.setdefault(key, set())
        if key in resolved and set(req.extras) <= extras:
            continue
        extras |= set(req.extras)
        resolved[key] = dist
        for text in dist.requires or []:
            sub = Requirement(text)
            if _applies(sub, extras):
                pending.append((sub, f"{dist.metadata['Name']} {dist.version}"))
    return resolved


def _installed(req: Requirement, wanted_by: str) -> metadata.Distribution:
    try:
        dist = metadata.distribution(req.name)
    except metadata.PackageNotFoundError as exc:
        raise BundleError(
            f"{req} (required by {wanted_by}) is not installed for {sys.executable}; "
            "run the build with IBACM_BUNDLE_PYTHON set to an interpreter that has "
            "the project's dependencies"
        ) from exc
    if not req.specifier.contains(dist.version, prereleases=True):
        raise BundleError(f"{req} (required by {wanted_by}): installed version is {dist.version}")
    return dist


def dist_files(dist: metadata.Distribution) -> list[tuple[Path, PurePosixPath]]:
    """(installed file, path relative to site-packages) of everything a dependency installed
    under site-packages: scripts outside it and byte code are left out."""
    name = f"{dist.metadata['Name']} {dist.version}"
    if dist.files is None:
        raise BundleError(f"{name} has no RECORD; reinstall it with pip")
    if _is_editable(dist):
        raise BundleError(f"{name} is an editable install; install it normally to bundle it")
    files = []
    for rel in dist.files:
        posix = PurePosixPath(str(rel))
        if posix.parts and posix.parts[0] == "..":
            continue
        if "__pycache__" in posix.parts or posix.suffix == ".pyc":
            continue
        if posix.name.endswith(NATIVE_SUFFIXES):
            raise BundleError(
                f"{name} contains compiled code ({posix}); the package bundles "
                "pure-Python distributions only"
            )
        installed = Path(str(dist.locate_file(rel)))
        if not installed.is_file():
            raise BundleError(f"{name}: {posix} is listed in RECORD but missing")
        files.append((installed, posix))
    return files


def _is_editable(dist: metadata.Distribution) -> bool:
    try:
        direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
    except json.JSONDecodeError:
        return False
    return bool(isinstance(direct_url, dict) and direct_url.get("dir_info", {}).get("editable"))


# ---------------------------------------------------------------------------------------------
# Writing the bundle


def _record_line(path: PurePosixPath, data: bytes | None) -> str:
    if data is None:
        return f"{path},,"
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _metadata_text(project: Project) -> str:
    lines = [
        "Metadata-Version: 2.4",
        f"Name: {project.name}",
        f"Version: {project.version}",
    ]
    if project.summary:
        lines.append(f"Summary: {project.summary}")
    if project.license:
        lines.append(f"License-Expression: {project.license}")
    if project.requires_python:
        lines.append(f"Requires-Python: {project.requires_python}")
    lines += [f"Requires-Dist: {dep}" for dep in project.dependencies]
    for extra in sorted(project.optional):
        lines.append(f"Provides-Extra: {extra}")
        for dep in project.optional[extra]:
            req = Requirement(dep)
            marker = f"({req.marker}) and extra == {extra!r}" if req.marker else None
            req.marker = Marker(marker or f"extra == {extra!r}")
            lines.append(f"Requires-Dist: {req}")
    return "\n".join(lines) + "\n"


def _entry_points_text(project: Project) -> str:
    groups: dict[str, Mapping[str, str]] = {}
    if project.scripts:
        groups["console_scripts"] = project.scripts
    groups.update(project.entry_points)
    blocks = []
    for group, entries in groups.items():
        body = "".join(f"{name} = {target}\n" for name, target in entries.items())
        blocks.append(f"[{group}]\n{body}")
    return "\n".join(blocks)


def install_project(project: Project, source: Path, libdir: Path) -> list[str]:
    """Copy the project's packages and write its dist-info; returns the top-level names."""
    packages = project_packages(source, project.package_patterns)
    record: list[str] = []
    for package in packages:
        for path in _package_files(package):
            rel = PurePosixPath(path.relative_to(source).as_posix())
            target = libdir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            record.append(_record_line(rel, path.read_bytes()))
    info = PurePosixPath(f"{normalize(project.name).replace('-', '_')}-{project.version}.dist-info")
    contents = {
        "METADATA": _metadata_text(project),
        "entry_points.txt": _entry_points_text(project),
        "top_level.txt": "".join(f"{p.name}\n" for p in packages),
        "INSTALLER": f"{BUNDLE_INSTALLER}\n",
    }
    (libdir / info).mkdir(parents=True, exist_ok=True)
    for name, text in contents.items():
        data = text.encode()
        (libdir / info / name).write_bytes(data)
        record.append(_record_line(info / name, data))
    record.append(_record_line(info / "RECORD", None))
    (libdir / info / "RECORD").write_text("\n".join(record) + "\n", encoding="utf-8")
    return [p.name for p in packages]


def install_dependencies(resolved: Mapping[str, metadata.Distribution], libdir: Path) -> list[str]:
    """Copy every resolved distribution; returns manifest lines ``name version license``."""
    manifest = []
    for key in sorted(resolved):
        dist = resolved[key]
        for installed, rel in dist_files(dist):
            target = libdir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(installed, target)
        manifest.append(f"{dist.metadata['Name']} {dist.version} {dist_license(dist)}")
    return manifest


def dist_license(dist: metadata.Distribution) -> str:
    """The declared license: License-Expression, a one-line License field, or classifiers."""
    meta = dist.metadata
    expression = meta["License-Expression"]
    if expression:
        return str(expression)
    short = meta["License"]
    if short and "\n" not in short and len(short) < 60:
        return str(short)
    prefix = "License :: "
    licenses = [
        c.split(" :: ")[-1] for c in meta.get_all("Classifier") or [] if c.startswith(prefix)
    ]
    return " OR ".join(licenses) if licenses else "UNKNOWN"


LAUNCHER = '''\
#!{python} -I
"""{name}: launcher of {target} (generated by packaging/bundle.py)."""
import os
import sys

# The private library lives at {relative} from this launcher's directory.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), {parts}))
from {module} import {function}

sys.exit({function}())
'''


def write_launcher(path: Path, name: str, target: str, python: str, relative: str) -> None:
    """A console-script launcher that finds the private library relative to itself."""
    module, _, function = target.partition(":")
    if not module or not function.isidentifier():
        raise BundleError(f"console script {name} = {target!r} is not 'module:function'")
    parts = ", ".join(repr(part) for part in PurePosixPath(relative).parts)
    text = LAUNCHER.format(
        python=python,
        name=name,
        target=target,
        relative=relative,
        parts=parts,
        module=module,
        function=function,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)


@dataclass(frozen=True)
class Layout:
    """Install locations (absolute, as on the target system) and the staging root."""

    root: Path
    libdir: PurePosixPath
    bindir: PurePosixPath
    sbindir: PurePosixPath
    python: str
    sbin_scripts: frozenset[str]

    def staged(self, path: PurePosixPath) -> Path:
        return self.root / path.relative_to("/")


def build(source: Path, layout: Layout, extras: Sequence[str]) -> list[str]:
    """Build the whole bundle under ``layout.root``; returns the manifest lines."""
    project = read_project(source)
    resolved = resolve(project.requirements(extras), project.name)
    libdir = layout.staged(layout.libdir)
    if libdir.exists():
        shutil.rmtree(libdir)
    libdir.mkdir(parents=True)
    install_project(project, source, libdir)
    manifest = [f"{project.name} {project.version} {project.license or 'UNKNOWN'}"]
    manifest += install_dependencies(resolved, libdir)
    (libdir / MANIFEST_NAME).write_text("\n".join(manifest) + "\n", encoding="utf-8")
    for name, target in sorted(project.scripts.items()):
        bindir = layout.sbindir if name in layout.sbin_scripts else layout.bindir
        relative = os.path.relpath(layout.libdir, bindir)
        write_launcher(layout.staged(bindir) / name, name, target, layout.python, relative)
    return manifest


VERIFY = """\
import sys
from importlib.metadata import entry_points, version

libdir, name, expected, groups = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
sys.path.insert(0, libdir)
if version(name) != expected:
    sys.exit(f"{name} {version(name)} found instead of {expected}")
for group in groups:
    for ep in entry_points(group=group):
        if ep.dist is None or ep.dist.name != name:
            continue
        target = ep.load()
        module = sys.modules[ep.module]
        if not (module.__file__ or "").startswith(libdir):
            sys.exit(f"{ep.value} was imported from {module.__file__}, not from {libdir}")
        print(f"{group}: {ep.name} = {ep.value} ({type(target).__name__})")
"""


def verify(source: Path, layout: Layout) -> list[str]:
    """Import every console script and entry point of the staged bundle with the target
    interpreter in isolated mode; returns what was loaded, raises ``BundleError``."""
    project = read_project(source)
    for name in project.scripts:
        bindir = layout.sbindir if name in layout.sbin_scripts else layout.bindir
        launcher = layout.staged(bindir) / name
        if not os.access(launcher, os.X_OK):
            raise BundleError(f"launcher {launcher} is missing or not executable")
    groups = ["console_scripts", *project.entry_points]
    libdir = str(layout.staged(layout.libdir).resolve())
    command = [
        layout.python,
        "-I",
        "-B",
        "-c",
        VERIFY,
        libdir,
        project.name,
        project.version,
        *groups,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BundleError(f"cannot run {layout.python}: {exc}") from exc
    if done.returncode != 0:
        raise BundleError(f"{layout.python} cannot use the bundle:\n{done.stderr.strip()}")
    return done.stdout.splitlines()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--source", type=Path, default=Path.cwd(), help="project tree")
    parser.add_argument("--root", type=Path, required=True, help="staging root (DESTDIR)")
    parser.add_argument("--libdir", default="/usr/lib/ibacm", help="private library directory")
    parser.add_argument("--bindir", default="/usr/bin")
    parser.add_argument("--sbindir", default="/usr/sbin")
    parser.add_argument("--python", default="/usr/bin/python3", help="interpreter of launchers")
    parser.add_argument(
        "--sbin",
        action="append",
        default=None,
        metavar="SCRIPT",
        help="console script installed in sbindir (default: ibacm)",
    )
    parser.add_argument("--extra", action="append", default=[], help="optional dependencies")
    parser.add_argument(
        "--verify-only",
        action="store_true",
        help="do not build: import every entry point of the staged bundle with --python",
    )
    args = parser.parse_args(argv)
    layout = Layout(
        root=args.root,
        libdir=PurePosixPath(args.libdir),
        bindir=PurePosixPath(args.bindir),
        sbindir=PurePosixPath(args.sbindir),
        python=args.python,
        sbin_scripts=frozenset(args.sbin if args.sbin is not None else ["ibacm"]),
    )
    for location in (layout.libdir, layout.bindir, layout.sbindir):
        if not location.is_absolute():
            parser.error(f"{location} must be an absolute path")
    try:
        if args.verify_only:
            lines = verify(args.source, layout)
        else:
            lines = build(args.source, layout, args.extra)
    except BundleError as exc:
        print(f"bundle: error: {exc}", file=sys.stderr)
        return 1
    for line in lines:
        print(f"bundle: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
