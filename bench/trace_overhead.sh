#!/bin/bash
# Trace recording overhead per allocation (issue 11's target: <= +100 ns
# beyond stack capture), all in one run, release build (build-bench/):
#   native   bench/leak_overhead (the "loguniform" trace, 32 frames deep)
#            with leak checking alone vs leak checking + SPYRESHIM_TRACE,
#            one thread and two threads at once;
#   python   bench/leak_overhead.py (simdev.Tensor from 20 Python frames),
#            same pair, native stacks only and with Python stacks;
#   callgrind instructions of the recording path (on_event, inclusive, per
#            event) and of the whole allocating thread (replay, per pair):
#            deterministic, where the timings depend on a quiet machine.
# A pair is one free and one allocation, so per pair = two events; stacks
# are captured on the allocation only. Timings: best of REPS; "cpu" is the
# allocating thread's own CPU time (CLOCK_THREAD_CPUTIME_ID), "wall" its
# elapsed time. The trace goes to $TRACE_DIR (default /dev/shm).
#   bench/trace_overhead.sh           REPS=5, callgrind on
#   REPS=9 CALLGRIND=0 PY=python3.12 bench/trace_overhead.sh
#   TIMINGS=0 bench/trace_overhead.sh  callgrind only (its counts are stable
#                                      on a busy machine; the timings are not)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build-bench}
reps=${REPS:-5}
py=${PY:-python3}
dir=${TRACE_DIR:-/dev/shm}
if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$root" --buildtype=release >/dev/null
fi
ninja -C "$build" >/dev/null
bench=$build/bench/leak_overhead
shim=$build/libspyreshim.so
tr=$dir/trace_overhead.$$.trace
trap 'rm -f "$tr" "$tr".cg.*' EXIT

run_native() { # threads trace? -> "wall cpu"
    local t=()
    [[ $2 == 1 ]] && t=(SPYRESHIM_TRACE="$tr")
    env SIMDEV_MEMORY=64G LD_PRELOAD="$shim" SPYRESHIM_LEAK_CHECK=1 SPYRESHIM_STACK_DEPTH=32 \
        SPYRESHIM_EXITCODE=0 "${t[@]}" "$bench" simdev 32 "$reps" "$1" 2>/dev/null |
        awk '{ print $6, $8 }'
}
d() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%+.0f", a - b }'; }  # per pair = per allocation and its free
if [[ ${TIMINGS:-1} == 1 ]]; then
printf '%-44s %10s %10s %14s %14s\n' case wall/pair cpu/pair +wall/alloc +cpu/alloc
for th in 1 2; do
    read -r w0 c0 <<<"$(run_native "$th" 0)"
    read -r w1 c1 <<<"$(run_native "$th" 1)"
    printf '%-44s %10s %10s %14s %14s\n' "native, $th thread(s), leak check" "$w0" "$c0" - -
    printf '%-44s %10s %10s %14s %14s\n' "native, $th thread(s), leak check + trace" "$w1" "$c1" \
        "$(d "$w1" "$w0")" "$(d "$c1" "$c0")"
done

pyrun() { # python_stacks trace?
    local t=()
    [[ $2 == 1 ]] && t=(SPYRESHIM_TRACE="$tr")
    env SIMDEV_MEMORY=64G LD_PRELOAD="$shim" PYTHONPATH="$build/tests/simdev" \
        SPYRESHIM_LEAK_CHECK=1 SPYRESHIM_PYTHON_STACKS="$1" SPYRESHIM_EXITCODE=0 "${t[@]}" \
        "$py" "$root/bench/leak_overhead.py" --depth 20 --reps "$reps" --clock "$3" 2>/dev/null |
        awk '{ print $NF }'
}
if env PYTHONPATH="$build/tests/simdev" "$py" -c 'import simdev' 2>/dev/null; then
    for ps in 0 1; do
        label=$([[ $ps == 0 ]] && echo "native stacks" || echo "+ Python stacks")
        p0=$(pyrun "$ps" 0 wall) c0=$(pyrun "$ps" 0 cpu)
        p1=$(pyrun "$ps" 1 wall) c1=$(pyrun "$ps" 1 cpu)
        printf '%-44s %10s %10s %14s %14s\n' "python, $label, leak check" "$p0" "$c0" - -
        printf '%-44s %10s %10s %14s %14s\n' "python, $label, leak check + trace" "$p1" "$c1" \
            "$(d "$p1" "$p0")" "$(d "$c1" "$c0")"
    done
else
    echo "(python: $py cannot import simdev from $build/tests/simdev: skipped)"
fi
fi

if [[ ${CALLGRIND:-1} == 1 ]] && command -v valgrind >/dev/null; then
    pairs=100000 events=$((2 * 100000 + 2 * 10000))
    for t in 0 1; do
        e=()
        [[ $t == 1 ]] && e=(SPYRESHIM_TRACE="$tr")
        env SIMDEV_MEMORY=8G LD_PRELOAD="$shim" SPYRESHIM_LEAK_CHECK=1 SPYRESHIM_STACK_DEPTH=32 \
            SPYRESHIM_EXITCODE=0 "${e[@]}" valgrind -q --tool=callgrind \
            --callgrind-out-file="$tr.cg.$t" "$bench" simdev 32 1 1 "$pairs" >/dev/null 2>&1
    done
    # awk reads to the end: an early exit would SIGPIPE callgrind_annotate,
    # and pipefail with set -e would end the script without a word.
    ir() { callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
           awk -v f="$2" '$0 ~ f && !v { v = $1; gsub(",", "", v) } END { print v + 0 }'; }
    r0=$(ir "$tr.cg.0" ':replay ') r1=$(ir "$tr.cg.1" ':replay ') ev=$(ir "$tr.cg.1" ':on_event ')
    wr=$(ir "$tr.cg.1" ':writer_main ')
    awk -v r0="$r0" -v r1="$r1" -v ev="$ev" -v wr="${wr:-0}" -v n="$events" 'BEGIN {
        printf "callgrind: allocating thread +%.0f instructions per event (%d events);\n", (r1 - r0) / n, n
        printf "           the hook (on_event, inclusive) %.0f per event; the writer thread %.1f\n", ev / n, wr / n }'
fi
echo "(best of $reps; +/alloc: per pair, an allocation and its free both recorded; trace file in $dir; $(nproc) CPUs," \
     "load $(cut -d' ' -f1 /proc/loadavg); $("$py" -c 'import platform; print("Python", platform.python_version())' 2>/dev/null))"
