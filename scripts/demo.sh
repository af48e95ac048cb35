#!/usr/bin/env bash
# Sets up .venv and runs the demo: a simulated cluster of real ibacm daemons, a few
# resolutions with ib_acme, a background workload, and the dashboard attached to node1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
bin="$root/.venv/bin"
nodes=${IBACM_DEMO_NODES:-8}
dir=$(mktemp -d "${TMPDIR:-/tmp}/ibacm-demo.XXXXXX")
workload_pid=""

cleanup() {
  [ -n "$workload_pid" ] && kill "$workload_pid" 2>/dev/null || true
  "$bin/ibacm-sim" down --dir "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT INT TERM

# A mixed cluster where it can run (root, Debian's ibacm installed): the last node runs
# rdma-core's unmodified C daemon on an emulated HCA. IBACM_DEMO_MIXED=0 turns it off.
kinds=()
if [ "$(id -u)" = 0 ] && [ -x /usr/sbin/ibacm ] && [ "${IBACM_DEMO_MIXED:-1}" = 1 ]; then
  kinds=(--c-ibacm "node$nodes")
fi
echo "== starting a simulated fabric with $nodes nodes in $dir"
"$bin/ibacm-sim" up --nodes "$nodes" --dir "$dir" "${kinds[@]}"
"$bin/ibacm-sim" status --dir "$dir"

sock="$dir/node1/ibacm-unix.sock"
echo
echo "== node1 resolves node3 by name, then verifies the path with the SA"
"$bin/ib_acme" -S "$sock" -f n -s node1 -d node3 -v || true
echo "== and again: now answered from the cache"
"$bin/ib_acme" -S "$sock" -f n -s node1 -d node3 || true
if [ ${#kinds[@]} -gt 0 ]; then
  echo "== node1 resolves node$nodes, which runs rdma-core's C ibacm"
  "$bin/ib_acme" -S "$sock" -f n -s node1 -d "node$nodes" -v || true
fi
echo "== counters of node1"
"$bin/ib_acme" -S "$sock" -P || true

"$bin/python" -m ibacm.tools.workload --dir "$dir" --node node1 --rate 50 >/dev/null 2>&1 &
workload_pid=$!

if [ -t 0 ] && [ -t 1 ]; then
  "$bin/ibacm-tui" --dir "$dir" --node node1
else
  echo "== no terminal: skipping the dashboard (run it with: ibacm-tui --dir DIR --node node1)"
  sleep 2
  "$bin/ib_acme" -S "$sock" -P || true
fi
