#!/bin/bash
# The failing thread's cost of an out-of-memory (bench/oom_cost.c): the
# median over RUNS processes of the first failing simdevMalloc (10,000 live
# blocks, leak checking on, SPYRESHIM_REPORT set), and of later ones.
#   BUILD=build bench/oom_cost.sh        RUNS=11 by default
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
runs=${RUNS:-11}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq "$runs"); do
    env SIMDEV_MEMORY=256M LD_PRELOAD="$build/libspyreshim.so" SPYRESHIM_LEAK_CHECK=1 \
        SPYRESHIM_GC=0 SPYRESHIM_EXITCODE=0 SPYRESHIM_REPORT="$tmp/r.%p.json" \
        "$build/bench/oom_cost" 2>/dev/null
done > "$tmp/times"
med() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "first failing call: median $(awk '{ print $2 }' "$tmp/times" | med) us over $runs runs;" \
     "later calls: median $(awk '{ print $9 }' "$tmp/times" | med) us"
