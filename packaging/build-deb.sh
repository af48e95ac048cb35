#!/usr/bin/env bash
# Builds the Debian package ibacm-trio from a copy of this tree, offline.
#
#   packaging/build-deb.sh [-o OUTDIR] [-n] [-f]
#
#   -o OUTDIR  where the .deb, .buildinfo and .changes go (default: dist/ in the repository)
#   -n         skip the build-time smoke test (DEB_BUILD_OPTIONS=nocheck)
#   -f         fast xz compression (level 1: a larger .deb, built in seconds), for tests and CI
#
# packaging/debian becomes debian/ at the top of the copied tree, then
# "dpkg-buildpackage -us -uc -b" runs there. The runtime dependencies are bundled from the
# environment of IBACM_BUNDLE_PYTHON (default: the repository's .venv/bin/python), so no
# network is needed. Needs dpkg-dev and debhelper.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/dist
nocheck=
fast=
usage() {
	sed -n '3,9s/^# \{0,1\}//p' "$0" >&2
	exit 2
}
while getopts o:nfh opt; do
	case $opt in
	o) out=$OPTARG ;;
	n) nocheck=1 ;;
	f) fast=1 ;;
	*) usage ;;
	esac
done
shift $((OPTIND - 1))
[ $# -eq 0 ] || usage

for tool in dpkg-buildpackage dh; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "build-deb: $tool is missing (apt-get install dpkg-dev debhelper)" >&2
		exit 1
	fi
done

python=${IBACM_BUNDLE_PYTHON:-}
if [ -z "$python" ]; then
	if [ -x "$root/.venv/bin/python" ]; then python=$root/.venv/bin/python; else python=python3; fi
fi
export IBACM_BUNDLE_PYTHON=$python

work=$(mktemp -d "${TMPDIR:-/tmp}/ibacm-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
src=$work/ibacm-trio
mkdir -p "$src"

# The files git knows about (committed or not, minus ignored ones); a plain tree without
# .git is copied minus the usual build and cache directories.
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	(cd "$root" && git ls-files -z --cached --others --exclude-standard) |
		(cd "$root" && xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh) |
		tar -C "$root" --null -T - -cf - | tar -C "$src" -xf -
else
	tar -C "$root" --exclude=./.git --exclude=./.venv --exclude=./dist --exclude=./build \
		--exclude='*.egg-info' --exclude=__pycache__ --exclude=.mypy_cache \
		--exclude=.ruff_cache --exclude=.pytest_cache --exclude=.hypothesis -cf - . |
		tar -C "$src" -xf -
fi
rm -rf "$src/debian"
cp -a "$src/packaging/debian" "$src/debian"

if [ -n "$fast" ]; then
	export IBACM_DEB_COMPRESSION="-Zxz -z1"
fi
if [ -n "$nocheck" ]; then
	export DEB_BUILD_OPTIONS="${DEB_BUILD_OPTIONS:+$DEB_BUILD_OPTIONS }nocheck"
fi
(cd "$src" && dpkg-buildpackage -us -uc -b)

mkdir -p "$out"
cp "$work"/*.deb "$work"/*.buildinfo "$work"/*.changes "$out"/
for deb in "$work"/*.deb; do
	echo "build-deb: $out/$(basename "$deb")"
done
