#!/bin/bash
# cuMemAlloc_v2 + cuMemFree_v2 pairs on the CUDA driver stand-in, with and
# without the shim, idle and with 1 and 2 streams busy (free-heavy trace:
# every freed block has work queued on it). Best of REPS (default 3).
#
#   bench/cuda_pair.sh [BUILD_DIR]        (default build-bench/, release)
#   CALLGRIND=1 bench/cuda_pair.sh [BUILD_DIR]
#       instructions per pair instead (valgrind --tool=callgrind, no stream
#       busy): main's inclusive count at 40,000 pairs less at 20,000, over
#       20,000, for the stand-in alone and with the shim (the benchmark's
#       own loop is in both). Stable to the instruction from run to run.
set -euo pipefail
cd "$(dirname "$0")/.."
b=${1:-build-bench}
if [ ! -f "$b/build.ninja" ]; then
  meson setup "$b" --buildtype=release >/dev/null
fi
ninja -C "$b" >/dev/null
reps=${REPS:-3}
prog=$b/bench/cuda_pair
export CUDASTANDIN_DEVICES=1 CUDASTANDIN_MEMORY=4G
if [ -n "${CALLGRIND:-}" ]; then
  cg=$(mktemp -d)
  main_ir() {  # main's inclusive instructions of "$prog $1 0", LD_PRELOAD=$2
    LD_PRELOAD=$2 valgrind -q --tool=callgrind --callgrind-out-file="$cg/out" "$prog" "$1" 0 \
      >/dev/null 2>&1
    callgrind_annotate --inclusive=yes "$cg/out" | sed -n 's/^ *\([0-9,]*\) .*???:main \[.*/\1/p' |
      tr -d ,
  }
  printf '| | instructions per pair |\n|---|---:|\n'
  for pre in "" "$PWD/$b/libspyreshim.so"; do
    a=$(main_ir 20000 "$pre")
    z=$(main_ir 40000 "$pre")
    name=stand-in
    [ -n "$pre" ] && name=shim
    printf '| %s | %d |\n' "$name" $(( (z - a) / 20000 ))
  done
  rm -rf "$cg"
  exit 0
fi
best() {  # best ns_per_pair of $reps runs of "$@"
  local best=
  for _ in $(seq "$reps"); do
    local ns
    ns=$("$@" | sed -n 's/.*ns_per_pair=\([0-9]*\).*/\1/p')
    if [ -z "$best" ] || [ "$ns" -lt "$best" ]; then best=$ns; fi
  done
  echo "$best"
}
printf '| streams busy | driver stand-in ns/pair | shim ns/pair | ratio | waits for the device (shim) |\n'
printf '|---:|---:|---:|---:|---:|\n'
for s in 0 1 2; do
  pairs=$([ "$s" = 0 ] && echo 400000 || echo 40000)
  plain=$(best "$prog" "$pairs" "$s")
  shim=$(LD_PRELOAD=$PWD/$b/libspyreshim.so best "$prog" "$pairs" "$s")
  stats=$(mktemp)
  LD_PRELOAD=$PWD/$b/libspyreshim.so SPYRESHIM_STATS=$stats "$prog" "$pairs" "$s" >/dev/null
  waits=$(sed -n 's/.*"device_waits": \([0-9]*\).*/\1/p' "$stats")
  rm -f "$stats"
  printf '| %s | %s | %s | %.3f | %s |\n' "$s" "$plain" "$shim" "$(echo "$shim / $plain" | bc -l)" "$waits"
done
