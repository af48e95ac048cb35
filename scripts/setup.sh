#!/usr/bin/env bash
# Creates .venv at the repository root and installs the project with its test/dev extras.
# When run as root on Debian it also installs the real peers the tests use.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  pkgs="ibacm libibverbs-dev strace tmux ibsim-utils opensm infiniband-diags libibumad-dev python3-pyverbs tshark librdmacm-dev rdma-core debhelper dpkg-dev logrotate rpm man-db groff-base iproute2 systemd gcc zsh bash-completion"
  missing=""
  for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  if [ -n "$missing" ]; then
    echo "setup: installing Debian packages:$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq $missing >/dev/null
  fi
fi

py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
stamp=.venv/.ibacm-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e ".[dev,metrics]"
  touch "$stamp"
fi

# The emulated HCA library (C, built with the system compiler) that lets rdma-core's C ibacm and
# the real pyverbs run as nodes of the simulated fabric (ibacm-sim up --c-ibacm/--hw).
if ! .venv/bin/python -m ibacm.fabric.emu.build >/dev/null; then
  echo "setup: the emulated HCA library could not be built; --c-ibacm/--hw nodes are unavailable" >&2
fi
# The core functions of acm_prov.h, for provider libraries loaded by the daemon (ibacm/provider/cprov).
if ! .venv/bin/python -c "from ibacm.provider.cprov.provider import core_library; core_library()"; then
  echo "setup: libibacm_core could not be built; provider libraries cannot be loaded" >&2
fi
# The hot modules compiled with mypyc (ibacm/compiled): used when built for these sources,
# else the modules as written run.
if ! .venv/bin/python -m ibacm.compiled.build >/dev/null; then
  echo "setup: the compiled variant could not be built; ibacm runs its modules as written" >&2
fi
