#!/bin/bash
# cuMemAlloc_v2 + cuMemFree_v2 pairs on the CUDA driver stand-in, with and
# without the shim, idle and with 1 and 2 streams busy (free-heavy trace:
# every freed block has work queued on it). Best of REPS (default 3).
#
#   bench/cuda_pair.sh [BUILD_DIR]        (default build-bench/, release)
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
