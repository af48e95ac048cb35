#!/usr/bin/env bash
# Sets up (see setup.sh) and runs ruff, mypy and the test suite on both variants of the hot
# modules (ibacm/compiled): the whole suite on the modules as written, then the tests that
# run through the compiled modules (COMPILED_TESTS) on the compiled build. Arguments go to
# both pytest runs (and replace COMPILED_TESTS).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
.venv/bin/ruff check ibacm tui tests packaging/bundle.py
# ibacm and tui strict, tests/ checked without strict's annotation rules (pyproject.toml)
.venv/bin/mypy
.venv/bin/mypy packaging/bundle.py

COMPILED_TESTS=${COMPILED_TESTS:-tests/compiled tests/wire tests/provider/acmp tests/core tests/fabric tests/peers tests/reliability}
status=0
IBACM_COMPILED=0 .venv/bin/python -m pytest -q -p no:cacheprovider "$@" || status=$?
variant=$(IBACM_COMPILED=auto .venv/bin/python -m ibacm.compiled.build --status 2>&1 || true)
if [[ $variant == compiled* ]]; then
  echo "test.sh: again on the compiled variant: $variant"
  if [ $# -eq 0 ]; then
    read -r -a selected <<<"$COMPILED_TESTS"
    set -- "${selected[@]}"
  fi
  IBACM_COMPILED=1 .venv/bin/python -m pytest -q -p no:cacheprovider "$@" || status=$?
else
  echo "test.sh: no compiled variant to test: $variant" >&2
  if [ "${CI:-}" = true ]; then status=1; fi
fi
exit "$status"
