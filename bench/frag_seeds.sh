#!/bin/bash
# Fragmentation over several traces of the classic shape (10,000 live
# blocks of 256 B .. 4 MiB, 1,000,000 pairs): one line per seed and the
# mean, for the core and the interposed path. Figures, not a test.
#   bench/frag_seeds.sh            seeds 0..9
#   SEEDS=20 bench/frag_seeds.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build-bench}
seeds=${SEEDS:-10}
if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$root" --buildtype=release >/dev/null
fi
ninja -C "$build" bench/bench_alloc libspyreshim.so >/dev/null
bench=$build/bench/bench_alloc
printf '%-10s %5s %10s %10s\n' trace seed core interposed
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for trace in loguniform sizes64; do
    for ((k = 0; k < seeds; k++)); do
        c=$(BENCH_SEED=$k "$bench" core "$trace" 1 10000 4096 1 | awk '{print $6}')
        i=$(BENCH_SEED=$k SIMDEV_MEMORY=64G LD_PRELOAD="$build/libspyreshim.so" \
            "$bench" simdev "$trace" 1 10000 4096 1 | awk '{print $6}')
        printf '%-10s %5d %10s %10s\n' "$trace" "$k" "$c" "$i" | tee -a "$out"
    done
done
awk '{c[$1] += $3; i[$1] += $4; n[$1]++}
     END {for (t in n) printf "%-10s %5s %10.4f %10.4f\n", t, "mean", c[t] / n[t], i[t] / n[t]}' "$out" | sort
