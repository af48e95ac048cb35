"""Which variant of the hot modules runs: as written, or compiled with mypyc.

    python -m ibacm.compiled.build [--force]     # build the compiled variant of these sources
    python -m ibacm.compiled.build --status      # say which variant a process would run

``MODULES`` are the modules every resolution and every cached RESOLVE runs through. At
set-up they are compiled with mypyc (the compiler that comes with mypy, the ``compiled``
extra) into the library cache directory (``clib.cache_dir()``), in a directory named after
a hash of their sources and of the interpreter's extension ABI: a build of other sources, or
for another interpreter, is never found, so an edited module never runs stale. A package
ships its build beside the modules instead (``build --ship``, into ``builds/`` here), where
a daemon confined away from home directories finds it; that place is looked at first.

``IBACM_COMPILED`` chooses, once per process, when ``ibacm`` is first imported:

* ``auto`` (the default): the compiled modules when a build of these sources exists, else the
  modules as written (no compiler at set-up, or a source changed since);
* ``0``: the modules as written;
* ``1``: the compiled modules; without a build, importing ``ibacm`` fails and says how to
  build one.

The compiled modules are loaded by a finder put first on ``sys.meta_path``; every other
module, and the sources themselves, stay as they are. Both variants behave the same (the
test command runs the suite on each); the source stays the readable reference.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.abc import MetaPathFinder
from pathlib import Path
from types import ModuleType

from ibacm.compiled.clib import cache_dir

MODULES = (
    "ibacm.wire.client",
    "ibacm.wire.acm_mad",
    "ibacm.wire.path_record",
    "ibacm.provider.route_table",
    "ibacm.core.client_loop",
    "ibacm.core.hits",
    "ibacm.core.clients",
    "ibacm.core.dispatch",
    "ibacm.provider.acmp.keys",
    "ibacm.provider.acmp.entry",
    "ibacm.provider.acmp.deadlines",
    "ibacm.provider.acmp.eviction",
    "ibacm.provider.acmp.publication",
    "ibacm.provider.acmp.cache",
    "ibacm.provider.acmp.counters",
    "ibacm.provider.acmp.protocol",
    "ibacm.provider.acmp.resolution",
    "ibacm.provider.acmp.bulk",
    "ibacm.provider.acmp.traffic",
    "ibacm.provider.acmp.endpoint",
    "ibacm.provider.acmp.groups",
    "ibacm.provider.acmp.provider",
    "ibacm.provider.acmp.routes",
    "ibacm.provider.acmp.timers",
    "ibacm.core.sa",
    "ibacm.core.events",
    "ibacm.fabric.capture",
    "ibacm.fabric.sim.hub_protocol",
    "ibacm.fabric.sim.hub_client",
    "ibacm.fabric.sim.umad",
    "ibacm.log",
)
"""Compiled together (one mypyc group): the client protocol, the dispatcher, the provider
(its endpoint and receive loop: ``traffic``; cache, with its keys, entries, deadlines,
eviction and published route table; bulk routes, groups, MAD handler, resolutions, SA
route queries and timers), the SA channel, the event bus, the capture tap every MAD passes,
the simulated fabric's transport (hub client, frames, umad agent) and the log gate they all
ask: everything between a client's request and the MAD it causes, and back. Not here: the
fabric interface (``fabric.api``: interpreted backends and test fakes subclass it) and
``core.services`` (the provider tests' core subclasses it)."""
GROUP = "ibacm_compiled"
"""mypyc's group name: the shared library is the top-level module ``GROUP + "__mypyc"``."""
EXTENSIONS = (*MODULES, GROUP + "__mypyc")
"""What a build holds: an extension per module and the group's shared library."""
BUILD = "python -m ibacm.compiled.build"
ENV = "IBACM_COMPILED"
MODES = ("auto", "0", "1")
MANIFEST = "manifest.json"
PACKAGE_DIR = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Variant:
    """What this process runs."""

    compiled: bool
    reason: str
    build: Path | None = None

    def describe(self) -> str:
        if self.compiled:
            return f"compiled ({len(MODULES)} modules, mypyc)"
        return f"as written ({self.reason})"


def source_path(module: str, package_dir: Path = PACKAGE_DIR) -> Path:
    return package_dir.joinpath(*module.split(".")[1:]).with_suffix(".py")


def digest(package_dir: Path = PACKAGE_DIR) -> str:
    """The build's name: the modules' names and sources and the extension ABI."""
    hashed = hashlib.sha256(str(sysconfig.get_config_var("EXT_SUFFIX")).encode())
    for module in MODULES:
        hashed.update(module.encode() + b"\0")
        hashed.update(source_path(module, package_dir).read_bytes())
    return hashed.hexdigest()[:16]


def build_name(package_dir: Path = PACKAGE_DIR) -> str:
    return f"compiled-{digest(package_dir)}"


def build_dir(package_dir: Path = PACKAGE_DIR) -> Path:
    """Where ``build`` puts (and finds) the build of these sources: the library cache."""
    return cache_dir() / build_name(package_dir)


SHIPPED = Path("compiled", "builds")
"""Where, inside the package, a package ships its build (``build --ship``)."""


def shipped_dir(package_dir: Path = PACKAGE_DIR) -> Path:
    """Where a package ships its build of the sources in ``package_dir``, beside them."""
    return package_dir / SHIPPED / build_name(package_dir)


def extension_path(root: Path, name: str) -> Path:
    return root.joinpath(*name.split(".")).with_name(
        name.rsplit(".", 1)[-1] + str(sysconfig.get_config_var("EXT_SUFFIX"))
    )


class _CompiledFinder(MetaPathFinder):
    """Serves the compiled modules, and their group's shared library, from one build."""

    def __init__(self, root: Path) -> None:
        self.paths = {name: extension_path(root, name) for name in EXTENSIONS}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        found = self.paths.get(fullname)
        if found is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(found))
        return importlib.util.spec_from_file_location(fullname, found, loader=loader)


def choose(environ: dict[str, str] | os._Environ[str] = os.environ) -> Variant:
    """The variant ``environ`` asks for and this machine has (see the module docstring)."""
    mode = environ.get(ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ImportError(f"{ENV}={mode!r}: expected one of {', '.join(MODES)}")
    if mode == "0":
        return Variant(False, f"{ENV}=0")
    try:
        name = build_name()  # hashes the sources: once per process
    except OSError as exc:  # a source unreadable: nothing to compare a build with
        return _unbuilt(mode, f"cannot read the sources to compile: {exc}")
    root = PACKAGE_DIR / SHIPPED / name
    found, fix = "the build shipped beside the modules", "reinstall the package"
    if not _has_manifest(root):
        root = cache_dir() / name
        found, fix = "a build of these sources", f"`{BUILD} --force`"
        try:
            if not (root / MANIFEST).is_file():
                # The command to build must itself run as written.
                build = f"{ENV}=0 {BUILD}" if mode == "1" else BUILD
                return _unbuilt(mode, f"no compiled build of these sources; `{build}` makes one")
        except OSError as exc:  # e.g. a unit's ProtectHome=: the cache cannot be looked into
            return _unbuilt(mode, f"cannot look into the library cache {root}: {exc}")
    try:
        lacking = missing_extensions(root)
    except OSError as exc:
        return _unbuilt(mode, f"cannot look into {root}: {exc}")
    if lacking:  # a cache pruned by hand, a disk that filled up mid-copy
        return _unbuilt(mode, f"the build in {root} lacks {lacking[0]}; {fix}")
    return Variant(True, found, root)


def _unbuilt(mode: str, why: str) -> Variant:
    """No build to run: the modules as written, or (``1``) an ImportError saying why."""
    if mode == "1":
        raise ImportError(f"{ENV}=1: {why}")
    return Variant(False, why)


def _has_manifest(root: Path) -> bool:
    """Whether a build is shipped in ``root``; none there is no error (the cache is next)."""
    try:
        return (root / MANIFEST).is_file()
    except OSError:
        return False


def missing_extensions(root: Path) -> list[str]:
    """The extensions of ``EXTENSIONS`` that the build in ``root`` lacks."""
    return [name for name in EXTENSIONS if not extension_path(root, name).is_file()]


def activate(environ: dict[str, str] | os._Environ[str] = os.environ) -> Variant:
    """Choose the variant and, when compiled, put its finder first (once per process)."""
    variant = choose(environ)
    build = variant.build
    if build is not None and not any(isinstance(f, _CompiledFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _CompiledFinder(build))
    return variant


def is_compiled(module: ModuleType) -> bool:
    """Whether ``module`` was loaded from the compiled build."""
    return isinstance(getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader)
