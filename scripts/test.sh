#!/usr/bin/env bash
# Sets up (see setup.sh) and runs the whole test suite plus ruff and mypy.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
.venv/bin/ruff check ibacm tui tests
.venv/bin/mypy
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
