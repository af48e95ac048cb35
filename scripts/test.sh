#!/usr/bin/env bash
# Sets up (see setup.sh) and runs the whole test suite plus ruff and mypy.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
.venv/bin/ruff check ibacm tui tests packaging/bundle.py
.venv/bin/mypy
.venv/bin/mypy packaging/bundle.py
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
