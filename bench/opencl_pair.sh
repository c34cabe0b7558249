#!/bin/bash
# clCreateBuffer + clReleaseMemObject pairs on OpenCL (PoCL on the CPU),
# with and without the shim, with buffers left untouched and with each new
# buffer written by a kernel (use). Best of REPS (default 3).
#
#   bench/opencl_pair.sh [BUILD_DIR]        (default build-bench/, release)
set -euo pipefail
cd "$(dirname "$0")/.."
b=${1:-build-bench}
if [ ! -f "$b/build.ninja" ]; then
  meson setup "$b" --buildtype=release >/dev/null
fi
ninja -C "$b" >/dev/null
prog=$b/bench/opencl_pair
if [ ! -x "$prog" ]; then
  echo "opencl_pair.sh: $prog was not built (no libOpenCL or CL/cl.h: apt-get install ocl-icd-opencl-dev)" >&2
  exit 1
fi
reps=${REPS:-3}
export POCL_CACHE_DIR=${POCL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/spyreshim/pocl-kcache}
best() {  # best ns_per_pair of $reps runs of "$@"
  local best=
  for _ in $(seq "$reps"); do
    local ns
    ns=$("$@" | sed -n 's/.*ns_per_pair=\([0-9]*\).*/\1/p')
    if [ -z "$best" ] || [ "$ns" -lt "$best" ]; then best=$ns; fi
  done
  echo "$best"
}
printf '| buffers | PoCL ns/pair | shim ns/pair | ratio | waits for the device (shim) |\n'
printf '|---|---:|---:|---:|---:|\n'
for mode in idle use; do
  pairs=$([ "$mode" = idle ] && echo 200000 || echo 20000)
  arg=$([ "$mode" = use ] && echo use || echo "")
  plain=$(best "$prog" "$pairs" $arg)
  shim=$(LD_PRELOAD=$PWD/$b/libspyreshim.so best "$prog" "$pairs" $arg)
  stats=$(mktemp)
  LD_PRELOAD=$PWD/$b/libspyreshim.so SPYRESHIM_STATS=$stats "$prog" "$pairs" $arg >/dev/null
  waits=$(sed -n 's/.*"device_waits": \([0-9]*\).*/\1/p' "$stats")
  rm -f "$stats"
  printf '| %s | %s | %s | %.3f | %s |\n' "$mode" "$plain" "$shim" "$(echo "$shim / $plain" | bc -l)" "$waits"
done
