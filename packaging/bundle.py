"""Install ibacm with its Python dependencies into a private library directory.

Distribution packages use this instead of ``pip install``: the dependencies a Debian release
ships (trio, structlog, textual) are too old, and a package build must work offline. So the
project itself is copied from the source tree (its ``.dist-info`` written from
``pyproject.toml``, so provider entry points work) and every runtime dependency is copied,
file by file as its ``RECORD`` lists them, from the Python environment running this script.
A dependency with compiled code must be in ``COMPILED``, which says whether it is bundled
(built for the target interpreter) or left to a Debian package (a ``Depends``, written to
the package's substvars as ``ibacm:Depends``); any other one is refused.
Launchers for the console scripts run the system interpreter with the private directory
first on ``sys.path``, located relative to the launcher, so an unpacked tree (``dpkg -x``)
works as well as an installed one.

Usage (as ``debian/rules`` runs it)::

    python packaging/bundle.py --source . --root debian/ibacm-trio --extra metrics \
        --substvars debian/ibacm-trio.substvars
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
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
except ImportError:  # pragma: no cover - depends on the build environment
    sys.exit("bundle: error: the 'packaging' library is needed (pip install packaging)")

BUNDLE_INSTALLER = "ibacm-bundle"
MANIFEST_NAME = "BUNDLED"
NATIVE_SUFFIXES = (".so", ".pyd", ".dylib")
SUBSTVAR = "ibacm:Depends"


@dataclass(frozen=True)
class Compiled:
    """A runtime dependency with compiled code, and how the Debian package gets it."""

    extension: str
    """Its compiled module: the smoke test imports it with the target interpreter."""
    debian: str | None = None
    """The Debian package that provides it: left out of the bundle and made a ``Depends``
    (with the project's version bounds). None: bundled with its compiled code, which must
    be built for the target interpreter (the package is architecture-specific anyway)."""


COMPILED: Mapping[str, Compiled] = {
    # Debian 12 has no python3-immutables: bundled from its manylinux wheel,
    # which needs only libc. Under an interpreter the extension was not built for, immutables
    # falls back to its pure-Python Map (slower); the smoke test insists on the extension.
    "immutables": Compiled(extension="immutables._map"),
}
"""Normalized distribution name -> how the package gets it; see README.md."""


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


def resolve(
    requirements: Iterable[Requirement],
    project: str,
    *,
    system: Collection[str] = (),
    specifiers: dict[str, SpecifierSet] | None = None,
) -> dict[str, metadata.Distribution]:
    """Walk the requirement graph through the installed distributions (by normalized name).

    Raises ``BundleError`` when a requirement is missing or its installed version does not
    satisfy the specifier, naming what requires it. The requirements of a distribution in
    ``system`` (one a Debian package provides) are not followed: its package brings them.
    ``specifiers`` receives every distribution's combined version bounds.
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
        if specifiers is not None:
            specifiers[key] = specifiers.get(key, SpecifierSet()) & req.specifier
        extras = extras_of.setdefault(key, set())
        if key in resolved and set(req.extras) <= extras:
            continue
        extras |= set(req.extras)
        resolved[key] = dist
        if key in system:
            continue
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


def dist_files(
    dist: metadata.Distribution, compiled: bool = False
) -> list[tuple[Path, PurePosixPath]]:
    """(installed file, path relative to site-packages) of everything a dependency installed
    under site-packages: scripts outside it and byte code are left out. Compiled code is
    refused unless ``compiled`` (the dependency is bundled as ``COMPILED`` says)."""
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
        if posix.name.endswith(NATIVE_SUFFIXES) and not compiled:
            raise BundleError(
                f"{name} contains compiled code ({posix}); the package bundles "
                "pure-Python distributions only, unless bundle.py's COMPILED table says "
                "how to get it (bundled for the target interpreter, or a Debian package)"
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


def install_dependencies(
    resolved: Mapping[str, metadata.Distribution],
    libdir: Path,
    compiled: Mapping[str, Compiled] = COMPILED,
    specifiers: Mapping[str, SpecifierSet] | None = None,
) -> list[str]:
    """Copy every resolved distribution but those a Debian package provides; returns
    manifest lines ``name version license``, or ``name (from Debian: relation)``."""
    manifest = []
    for key in sorted(resolved):
        dist = resolved[key]
        how = compiled.get(key)
        if how is not None and how.debian is not None:
            wanted = (specifiers or {}).get(key, SpecifierSet())
            relation = ", ".join(debian_relations(how.debian, wanted))
            manifest.append(f"{dist.metadata['Name']} (not bundled: Debian's {relation})")
            continue
        for installed, rel in dist_files(dist, compiled=how is not None):
            target = libdir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(installed, target)
        manifest.append(f"{dist.metadata['Name']} {dist.version} {dist_license(dist)}")
    return manifest


_DEBIAN_OPERATORS = {">=": ">=", "<=": "<=", ">": ">>", "<": "<<", "==": "=", "===": "="}


def debian_relations(package: str, specifiers: SpecifierSet) -> list[str]:
    """Debian dependency relations of a Python version specifier: ``>=0.19,<1`` gives
    ``python3-x (>= 0.19)`` and ``python3-x (<< 1)``; no bounds give the bare name."""
    relations = []
    # Two dependents asking for the same bound would repeat it.
    for spec in sorted({str(s): s for s in specifiers}.values(), key=str):
        operator = _DEBIAN_OPERATORS.get(spec.operator)
        if operator is None or "*" in spec.version:
            raise BundleError(f"{package}: {spec} has no Debian equivalent; use >=, <, ==")
        relations.append(f"{package} ({operator} {spec.version})")
    return relations or [package]


def debian_depends(
    resolved: Mapping[str, metadata.Distribution],
    compiled: Mapping[str, Compiled] = COMPILED,
    specifiers: Mapping[str, SpecifierSet] | None = None,
) -> list[str]:
    """The ``Depends`` relations of the resolved distributions Debian packages provide."""
    relations = []
    for key in sorted(resolved):
        how = compiled.get(key)
        if how is not None and how.debian is not None:
            wanted = (specifiers or {}).get(key, SpecifierSet())
            relations += debian_relations(how.debian, wanted)
    return relations


def write_substvars(path: Path, relations: Sequence[str]) -> None:
    """Set ``ibacm:Depends`` in a debhelper substvars file, keeping its other lines."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        lines = []
    kept = [line for line in lines if not line.startswith(f"{SUBSTVAR}=")]
    kept.append(f"{SUBSTVAR}={', '.join(relations)}")
    path.write_text("\n".join(kept) + "\n", encoding="utf-8")


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


def build(
    source: Path,
    layout: Layout,
    extras: Sequence[str],
    compiled: Mapping[str, Compiled] = COMPILED,
    substvars: Path | None = None,
) -> list[str]:
    """Build the whole bundle under ``layout.root``; returns the manifest lines. The
    ``Depends`` on the Debian packages of ``compiled`` go to ``substvars``."""
    project = read_project(source)
    system = {key for key, how in compiled.items() if how.debian is not None}
    specifiers: dict[str, SpecifierSet] = {}
    resolved = resolve(
        project.requirements(extras), project.name, system=system, specifiers=specifiers
    )
    libdir = layout.staged(layout.libdir)
    if libdir.exists():
        shutil.rmtree(libdir)
    libdir.mkdir(parents=True)
    install_project(project, source, libdir)
    manifest = [f"{project.name} {project.version} {project.license or 'UNKNOWN'}"]
    manifest += install_dependencies(resolved, libdir, compiled, specifiers)
    (libdir / MANIFEST_NAME).write_text("\n".join(manifest) + "\n", encoding="utf-8")
    if substvars is not None:
        write_substvars(substvars, debian_depends(resolved, compiled, specifiers))
    for name, target in sorted(project.scripts.items()):
        bindir = layout.sbindir if name in layout.sbin_scripts else layout.bindir
        relative = os.path.relpath(layout.libdir, bindir)
        write_launcher(layout.staged(bindir) / name, name, target, layout.python, relative)
    return manifest


VERIFY = """\
import importlib, json, sys
from importlib.machinery import EXTENSION_SUFFIXES
from importlib.metadata import entry_points, version

libdir, name, expected, checks = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
groups = sys.argv[5:]
sys.path.insert(0, libdir)
if version(name) != expected:
    sys.exit(f"{name} {version(name)} found instead of {expected}")
for module_name, debian in json.loads(checks):
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        sys.exit(f"{module_name} cannot be imported ({debian or 'bundled'}): {exc}")
    path = module.__file__ or ""
    if debian and path.startswith(libdir):
        sys.exit(f"{module_name} was imported from {path}, not from Debian's {debian}")
    if not debian and not (path.startswith(libdir) and path.endswith(tuple(EXTENSION_SUFFIXES))):
        sys.exit(f"{module_name} was imported from {path}, not as compiled code from {libdir}")
    print(f"compiled: {module_name} = {path} ({debian or 'bundled'})")
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


def _compiled_checks(libdir: Path, compiled: Mapping[str, Compiled]) -> list[list[str]]:
    """[compiled module, Debian package or ""] of the ``compiled`` entries the bundle's
    manifest lists (the others are no dependency of this build)."""
    try:
        lines = (libdir / MANIFEST_NAME).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise BundleError(f"the bundle has no manifest: {exc}") from exc
    listed = {normalize(line.split()[0]) for line in lines if line.strip()}
    return [
        [how.extension, how.debian or ""] for key, how in sorted(compiled.items()) if key in listed
    ]


def verify(source: Path, layout: Layout, compiled: Mapping[str, Compiled] = COMPILED) -> list[str]:
    """Import every console script and entry point of the staged bundle with the target
    interpreter in isolated mode, and each compiled dependency: a bundled one as compiled
    code from the bundle, a Debian one from outside it. Returns what was loaded, raises
    ``BundleError``."""
    project = read_project(source)
    for name in project.scripts:
        bindir = layout.sbindir if name in layout.sbin_scripts else layout.bindir
        launcher = layout.staged(bindir) / name
        if not os.access(launcher, os.X_OK):
            raise BundleError(f"launcher {launcher} is missing or not executable")
    groups = ["console_scripts", *project.entry_points]
    libdir = str(layout.staged(layout.libdir).resolve())
    checks = json.dumps(_compiled_checks(Path(libdir), compiled))
    command = [
        layout.python,
        "-I",
        "-B",
        "-c",
        VERIFY,
        libdir,
        project.name,
        project.version,
        checks,
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
        "--substvars",
        type=Path,
        default=None,
        help=f"debhelper substvars file that receives {SUBSTVAR} (the Debian packages of "
        "the compiled dependencies that are not bundled)",
    )
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
            lines = build(args.source, layout, args.extra, substvars=args.substvars)
    except BundleError as exc:
        print(f"bundle: error: {exc}", file=sys.stderr)
        return 1
    for line in lines:
        print(f"bundle: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
