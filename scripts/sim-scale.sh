#!/usr/bin/env bash
# A large simulated cluster on this machine: SIM_SCALE_NODES (500) real ibacm daemons up,
# a few pairs across the cluster resolved with ib_acme (by name and by address, each checked
# against the SA with -v), then everything down. Prints the seconds each step took.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/.venv/bin"
nodes=${SIM_SCALE_NODES:-500}
dir=$(mktemp -d "${TMPDIR:-/tmp}/ibacm-scale.XXXXXX")
up=0

cleanup() {
  if [ "$up" = 1 ]; then "$bin/ibacm-sim" down --dir "$dir" >/dev/null 2>&1 || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT INT TERM

seconds() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(seconds)" 'BEGIN { printf "%.1f", b - a }'; }

start=$(seconds)
up=1
"$bin/ibacm-sim" up --nodes "$nodes" --dir "$dir"
echo "== up: $nodes nodes in $(since "$start") s"
"$bin/ibacm-sim" status --dir "$dir" --json >"$dir/status.json"
# Every node running; then "NAME IPV4" per node, to resolve by address.
"$bin/python" - "$dir/status.json" >"$dir/addresses" <<'PY'
import json, sys
nodes = json.load(open(sys.argv[1]))["nodes"]
running = sum(node["state"] == "running" for node in nodes)
print(f"== status: {running}/{len(nodes)} running", file=sys.stderr)
for node in nodes:
    print(node["name"], node["ipv4"][0])
sys.exit(running != len(nodes))
PY

# Pairs from one end of the cluster to the other, and back.
half=$((nodes / 2))
start=$(seconds)
for pair in "1 $nodes" "$nodes 1" "2 $half" "$half $((nodes - 1))"; do
  set -- $pair
  sock="$dir/node$1/ibacm-unix.sock"
  "$bin/ib_acme" -S "$sock" -f n -s "node$1" -d "node$2" -v
  dest=$(awk -v n="node$2" '$1 == n { print $2 }' "$dir/addresses")
  "$bin/ib_acme" -S "$sock" -f i -d "$dest" -v
done
echo "== resolved 8 routes in $(since "$start") s"

start=$(seconds)
"$bin/ibacm-sim" down --dir "$dir"
up=0
echo "== down in $(since "$start") s"
