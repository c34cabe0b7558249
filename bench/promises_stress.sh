#!/bin/bash
# Issue 7's threaded scenarios by the thousand, with both CPUs kept busy by
# two `yes > /dev/null` loops (not CI: tests/integration/test_promises.py
# runs each a few times). Counts runs and failures (a hang is a run killed
# by its generous timeout).
#   bench/promises_stress.sh [RUNS]      default 1000 per scenario
#   BUILD=build-pa bench/promises_stress.sh 1000
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
runs=${1:-1000}
prog=$build/tests/promises
export LD_PRELOAD=$build/libspyreshim.so SIMDEV_MEMORY=1G SPYRESHIM_LIMIT=8M SPYRESHIM_OOM_REPORT=0
yes > /dev/null & busy1=$!
yes > /dev/null & busy2=$!
trap 'kill $busy1 $busy2 2>/dev/null' EXIT

scenario() { # name timeout env... -- args...
    local name=$1 t=$2; shift 2
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    local fail=0 hang=0
    for ((i = 0; i < runs; i++)); do
        env "${envs[@]}" timeout "$t" "$prog" "$@" > /dev/null 2>&1
        case $? in
            0) ;;
            124) hang=$((hang + 1)) ;;
            *) fail=$((fail + 1)) ;;
        esac
    done
    printf '%-28s runs=%d failures=%d hangs=%d\n' "$name" "$runs" "$fail" "$hang"
}

scenario "loader lock" 30 X=1 -- loader "$build/tests/libctor_alloc.so"
scenario "foreign lock, order 1" 30 SPYRESHIM_GC=0 SPYRESHIM_GC_TIMEOUT_MS=50 -- foreign 1
scenario "foreign lock, order 2" 30 SPYRESHIM_GC=0 SPYRESHIM_GC_TIMEOUT_MS=50 -- foreign 2
scenario "unregister race (x10 rounds)" 60 SPYRESHIM_GC=0 SPYRESHIM_PRESSURE_ROUNDS=1 -- unregister 10
# Fork: RUNS forks per scenario run, FORK_RUNS runs (default 5).
runs_saved=$runs
runs=${FORK_RUNS:-5}
scenario "fork x$runs_saved, leak check" 600 SPYRESHIM_LEAK_CHECK=1 SPYRESHIM_EXITCODE=0 -- fork "$runs_saved"
