"""Builds the compiled variant of ``ibacm.compiled.MODULES`` with mypyc (see there).

python -m ibacm.compiled.build [--force]     # build it unless built for these sources
python -m ibacm.compiled.build --status      # only say which variant a process runs
python -m ibacm.compiled.build --ship DIR    # and copy it beside a copy of the package in DIR

``--ship`` is for packages: DIR is the ``ibacm`` directory of a staged installation (e.g.
``debian/ibacm-trio/usr/lib/ibacm/ibacm``), which must hold the same sources.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ibacm.compiled import (
    GROUP,
    MANIFEST,
    MODULES,
    build_dir,
    choose,
    digest,
    missing_extensions,
    shipped_dir,
    source_path,
)

KEEP_BUILDS = 3
"""Builds kept in the cache: this one and the newest others (another checkout, a branch)."""


class CompiledBuildError(RuntimeError):
    """The compiled variant cannot be built here; the message says why."""


def build(force: bool = False) -> Path:
    """Compile ``MODULES`` into ``build_dir()`` unless a build of these sources is there."""
    target = build_dir()
    if (target / MANIFEST).is_file() and not force:
        return target
    try:
        from mypyc.build import mypycify  # the ``compiled`` extra

        setuptools = importlib.import_module("setuptools")  # no stubs: typed Any
    except ImportError as exc:
        raise CompiledBuildError(f"mypyc and setuptools are needed: {exc}") from exc
    if shutil.which(os.environ.get("CC") or "cc") is None and shutil.which("gcc") is None:
        raise CompiledBuildError("no C compiler (cc/gcc)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch_dir:
        scratch = Path(scratch_dir)
        paths = [str(source_path(module)) for module in MODULES]
        try:
            extensions = mypycify(
                paths,
                opt_level="3",
                group_name=GROUP,
                target_dir=str(scratch / "c"),
                # One C file per module: gcc takes half the time of one big file at -O3 (a
                # set-up cost); cached RESOLVEs at 64 clients ran within 2% of it.
                multi_file=True,
            )
            distribution = setuptools.Distribution({"name": GROUP, "ext_modules": extensions})
            command = distribution.get_command_obj("build_ext")
            command.build_lib = str(scratch / "lib")
            command.build_temp = str(scratch / "tmp")
            command.ensure_finalized()
            command.run()
        except (Exception, SystemExit) as exc:  # mypyc reports type errors by exiting
            raise CompiledBuildError(f"mypyc could not compile {', '.join(paths)}: {exc}") from exc
        missing = missing_extensions(scratch / "lib")
        if missing:
            raise CompiledBuildError(f"the build made no extension for {', '.join(missing)}")
        manifest = {"modules": list(MODULES), "group": GROUP, "digest": digest()}
        (scratch / "lib" / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if target.exists():
            shutil.rmtree(target)  # --force: the old build goes
        os.replace(scratch / "lib", target)
    prune(target)
    return target


def ship(package_dir: Path, force: bool = False) -> Path:
    """Build (unless built), then copy the build beside the modules in ``package_dir``."""
    try:
        theirs = digest(package_dir)
    except OSError as exc:
        raise CompiledBuildError(f"{package_dir} holds no copy of ibacm: {exc}") from exc
    if theirs != digest():
        raise CompiledBuildError(f"{package_dir} holds other sources than the ones compiled here")
    built = build(force=force)
    target = shipped_dir(package_dir)
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(built, target)
    return target


def prune(current: Path, keep: int = KEEP_BUILDS) -> list[Path]:
    """Remove all but the ``keep`` newest builds beside ``current`` (``current`` stays): every
    edit of a compiled module makes a build of its own, about 9 MB each."""
    others = [path for path in current.parent.glob("compiled-*") if path != current]
    others.sort(key=lambda path: path.stat().st_mtime, reverse=True)
    removed = others[max(keep - 1, 0) :]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ibacm.compiled.build",
        description="Build (or report) the mypyc-compiled variant of ibacm's hot modules.",
    )
    parser.add_argument("--force", action="store_true", help="build again even if built")
    parser.add_argument("--status", action="store_true", help="only say which variant runs")
    parser.add_argument(
        "--ship", type=Path, metavar="DIR", help="copy the build beside the package in DIR"
    )
    args = parser.parse_args(argv)
    if args.status:
        try:
            print(choose().describe())
        except ImportError as exc:
            print(f"ibacm.compiled.build: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        print(ship(args.ship, args.force) if args.ship else build(force=args.force))
    except (CompiledBuildError, OSError) as exc:
        print(f"ibacm.compiled.build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
