#!/bin/bash
# Leak-checking overhead per allocation (issue 4's benchmark), all in one run:
#   native   bench/leak_overhead (the shared "loguniform" trace, requests made
#            32 frames deep) under LD_PRELOAD=libspyreshim.so, leak checking
#            off vs on (SPYRESHIM_STACK_DEPTH=32);
#   heaptrack the same trace and depth with malloc/free, bare vs under
#            heaptrack (the anchor: what a host-memory tracker pays);
#   python   bench/leak_overhead.py (the same trace through simdev.Tensor
#            from 20 Python frames), leak checking off, on with native
#            stacks only, on with Python stacks; GIL held and released.
# Builds (release, in build-bench/) if needed. Figures, not a test.
#   bench/leak_overhead.sh            3 repetitions, best kept
#   REPS=5 PY=python3.12 bench/leak_overhead.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build-bench}
reps=${REPS:-3}
py=${PY:-python3}
if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$root" --buildtype=release >/dev/null
fi
ninja -C "$build" >/dev/null
bench=$build/bench/leak_overhead
shim=$build/libspyreshim.so
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

field() { awk '{ print $NF }'; }
native() { # leak_check
    env SIMDEV_MEMORY=64G LD_PRELOAD="$shim" SPYRESHIM_LEAK_CHECK="$1" SPYRESHIM_STACK_DEPTH=32 \
        SPYRESHIM_EXITCODE=0 "$bench" simdev 32 "$reps" 2>/dev/null | field
}
diff_ns() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%+.0f", a - b }'; }

printf '%-40s %12s %14s\n' case ns/pair overhead/alloc
off=$(native 0)
on=$(native 1)
printf '%-40s %12s %14s\n' "simdev, leak check off" "$off" -
printf '%-40s %12s %14s\n' "simdev, native stacks (depth 32)" "$on" "$(diff_ns "$on" "$off")"

bare=$("$bench" malloc 32 "$reps" | field)
if command -v heaptrack >/dev/null; then
    ht=$(cd "$tmp" && heaptrack -o "$tmp/ht" "$bench" malloc 32 "$reps" 2>/dev/null |
         awk '$1 == "malloc" { print $NF }')
else
    ht=-
fi
printf '%-40s %12s %14s\n' "malloc, bare" "$bare" -
printf '%-40s %12s %14s\n' "malloc, heaptrack (anchor)" "$ht" \
    "$([[ $ht == - ]] && echo - || diff_ns "$ht" "$bare")"

pyrun() { # leak_check python_stacks [--release-gil]
    env SIMDEV_MEMORY=64G LD_PRELOAD="$shim" PYTHONPATH="$build/tests/simdev" \
        SPYRESHIM_LEAK_CHECK="$1" SPYRESHIM_PYTHON_STACKS="$2" SPYRESHIM_EXITCODE=0 \
        "$py" "$root/bench/leak_overhead.py" --depth 20 --reps "$reps" ${3:-} 2>/dev/null | field
}
if env PYTHONPATH="$build/tests/simdev" "$py" -c 'import simdev' 2>/dev/null; then
    for gil in "" --release-gil; do
        label=$([[ -z $gil ]] && echo "GIL held" || echo "GIL released")
        p0=$(pyrun 0 0 $gil)
        p1=$(pyrun 1 0 $gil)
        p2=$(pyrun 1 1 $gil)
        printf '%-40s %12s %14s\n' "python ($label), leak check off" "$p0" -
        printf '%-40s %12s %14s\n' "python ($label), native stacks" "$p1" "$(diff_ns "$p1" "$p0")"
        printf '%-40s %12s %14s\n' "python ($label), + 20 Python frames" "$p2" "$(diff_ns "$p2" "$p0")"
    done
else
    echo "(python: $py cannot import simdev from $build/tests/simdev: skipped)"
fi
echo "(best of $reps; a pair is one free and one allocation, stacks are taken on"
echo " the allocation only; $(nproc) CPUs; $("$py" -c 'import platform; print("Python", platform.python_version())' 2>/dev/null))"
