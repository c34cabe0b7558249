#!/bin/bash
# Allocation benchmark: builds (release, in build-bench/) if needed, replays
# the two traces through every path and prints a table. Figures, not a test.
#   bench/run.sh                 all paths, 3 repetitions (best kept)
#   REPS=5 bench/run.sh          more repetitions
# Paths: core = arena + table as device.c uses them (uncontended mutex, fake
# backend); interposed = simdevMalloc/simdevFree under
# LD_PRELOAD=libspyreshim.so with SIMDEV_MEMORY=64G; jemalloc = Debian's
# libjemalloc.so.2 through dlopen; glibc = malloc/free, for information.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build-bench}
reps=${REPS:-3}
if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$root" --buildtype=release >/dev/null
fi
ninja -C "$build" bench/bench_alloc libspyreshim.so >/dev/null
bench=$build/bench/bench_alloc
shim=$build/libspyreshim.so

run() { # path trace reps [env...]
    local path=$1 trace=$2 n=$3
    shift 3
    env "$@" "$bench" "$path" "$trace" "$n" 2>/dev/null || echo "$path $trace - - - -"
}

printf '%-10s %-10s %10s %10s %8s\n' trace path ns/pair vs_jemalloc frag
for trace in loguniform sizes64; do
    declare -A ns=() frag=()
    for p in core interposed jemalloc glibc; do
        case $p in
        core) line=$(run core "$trace" "$reps") ;;
        interposed) line=$(run simdev "$trace" "$reps" SIMDEV_MEMORY=64G LD_PRELOAD="$shim") ;;
        jemalloc) line=$(run jemalloc "$trace" "$reps") ;;
        glibc) line=$(run glibc "$trace" 1) ;;
        esac
        read -r _ _ t _ _ f <<<"$line"
        ns[$p]=$t
        frag[$p]=$f
    done
    for p in core interposed jemalloc glibc; do
        ratio=-
        if [[ ${ns[$p]} != - && ${ns[jemalloc]} != - ]]; then
            ratio=$(awk -v a="${ns[$p]}" -v b="${ns[jemalloc]}" 'BEGIN { printf "%.2f", a / b }')
        fi
        f=${frag[$p]}
        [[ $f == 0.0000 ]] && f=-
        printf '%-10s %-10s %10s %10s %8s\n' "$trace" "$p" "${ns[$p]}" "$ratio" "$f"
    done
    unset ns frag
done
echo "(ns per alloc+free pair, best of $reps; frag = peak reserved / peak live;" \
     "10,000 live blocks, 1,000,000 pairs; $(nproc) CPUs)"
