#!/bin/bash
# Allocation benchmark: builds (release, in build-bench/) if needed, replays
# the two traces through every path and prints a table. Figures, not a test.
#   bench/run.sh                 all paths, 3 repetitions (best kept)
#   REPS=5 bench/run.sh          more repetitions
#   TABLES=scale bench/run.sh    one table only: classic, scale or threads
# Paths: core = arena + table as device.c uses them (uncontended mutex, fake
# backend); interposed = simdevMalloc/simdevFree under
# LD_PRELOAD=libspyreshim.so with SIMDEV_MEMORY=64G (the scale table peaks
# at about 12 GiB live); jemalloc = Debian's
# libjemalloc.so.2 through dlopen; glibc = malloc/free, for information.
set -euo pipefail
tables=${TABLES:-classic scale threads}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build-bench}
reps=${REPS:-3}
if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$root" --buildtype=release >/dev/null
fi
ninja -C "$build" bench/bench_alloc libspyreshim.so >/dev/null
bench=$build/bench/bench_alloc
shim=$build/libspyreshim.so

run() { # path trace reps live max_kib threads[ fill] [env...]
    local path=$1 trace=$2 n=$3 live=$4 max=$5 th=$6
    shift 6
    env "$@" "$bench" "$path" "$trace" "$n" "$live" "$max" $th 2>/dev/null ||
        echo "$path $trace - - - - - -"
}
ratio() { # a b
    if [[ $1 != - && $2 != - ]]; then awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'
    else echo -; fi
}
onepath() { # path trace live max_kib threads
    case $1 in
    core) run core "$2" "$reps" "$3" "$4" "$5" ;;
    interposed) run simdev "$2" "$reps" "$3" "$4" "$5" SIMDEV_MEMORY=64G LD_PRELOAD="$shim" ;;
    jemalloc) run jemalloc "$2" "$reps" "$3" "$4" "$5" ;;
    glibc) run glibc "$2" 1 "$3" "$4" "$5" ;;
    esac
}

if [[ " $tables " == *" classic "* ]]; then

printf '%-10s %-10s %10s %10s %8s\n' trace path ns/pair vs_jemalloc frag
for trace in loguniform sizes64; do
    declare -A ns=() frag=()
    for p in core interposed jemalloc glibc; do
        line=$(onepath $p "$trace" 10000 4096 1)
        read -r _ _ t _ _ f _ <<<"$line"
        ns[$p]=$t
        frag[$p]=$f
    done
    for p in core interposed jemalloc glibc; do
        ratio=$(ratio "${ns[$p]}" "${ns[jemalloc]}")
        f=${frag[$p]}
        [[ $f == 0.0000 ]] && f=-
        printf '%-10s %-10s %10s %10s %8s\n' "$trace" "$p" "${ns[$p]}" "$ratio" "$f"
    done
    unset ns frag
done
echo "(ns per alloc+free pair, best of $reps; frag = peak reserved / peak live;" \
     "10,000 live blocks of 256 B .. 4 MiB, 1,000,000 pairs; $(nproc) CPUs)"
echo
fi

# The live-set axis: 1k .. 1M live blocks of 256 B .. 64 KiB (at 4 MiB, 1M
# blocks would be terabytes of simulated device). meta = host bytes of
# metadata per live block: rss (resident memory gained) and the shim's own
# accounting (core only; the interposed path uses the same structures).
if [[ " $tables " == *" scale "* ]]; then
printf '%-10s %9s %-10s %8s %6s %7s %8s %8s\n' trace live path ns/pair vs_je frag rss/blk acct/blk
for trace in loguniform sizes64; do
    for live in 1000 10000 100000 1000000; do
        declare -A ns=() rest=()
        for p in core interposed jemalloc; do
            read -r _ _ t _ _ f rss acct <<<"$(onepath $p "$trace" "$live" 64 1)"
            ns[$p]=$t
            [[ $f == 0.0000 ]] && f=-
            [[ $acct == 0.0 ]] && acct=-
            rest[$p]="$f $rss $acct"
        done
        for p in core interposed jemalloc; do
            read -r f rss acct <<<"${rest[$p]}"
            printf '%-10s %9s %-10s %8s %6s %7s %8s %8s\n' "$trace" "$live" "$p" "${ns[$p]}" \
                "$(ratio "${ns[$p]}" "${ns[jemalloc]}")" "$f" "$rss" "$acct"
        done
        unset ns rest
    done
done
echo "(ns per pair, best of $reps; sizes 256 B .. 64 KiB; 1,000,000 pairs; $(nproc) CPUs)"
echo
fi

# Two threads against the same device (each its own trace, half the live
# set and half the pairs) vs one thread; ns per pair over wall time, so a
# lower figure with 2 threads means more total throughput. "own": each
# thread allocates its live blocks itself; "handoff": the main thread
# allocates them all, and the threads free blocks it allocated.
if [[ " $tables " == *" threads "* ]]; then
printf '%-10s %9s %-10s %10s %10s %8s %10s %8s\n' trace live path 1thread 2own 2own/1 2handoff 2hand/1
for live in 10000 100000; do
    for p in core interposed jemalloc; do
        read -r _ _ t1 _ <<<"$(onepath $p loguniform "$live" 64 1)"
        read -r _ _ t2 _ <<<"$(onepath $p loguniform "$live" 64 "2 own")"
        read -r _ _ th _ <<<"$(onepath $p loguniform "$live" 64 "2 main")"
        printf '%-10s %9s %-10s %10s %10s %8s %10s %8s\n' loguniform "$live" "$p" "$t1" "$t2" \
            "$(ratio "$t2" "$t1")" "$th" "$(ratio "$th" "$t1")"
    done
done
echo "(ns per pair over wall time, best of $reps; sizes 256 B .. 64 KiB; $(nproc) CPUs)"
fi
