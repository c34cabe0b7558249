#!/bin/bash
# clCreateBuffer + clReleaseMemObject pairs on OpenCL (PoCL on the CPU),
# with and without the shim, with buffers left untouched (idle) and with
# each new buffer written by a kernel (use): one run prints both. Best of
# REPS (default 3) runs, wall time and the process's CPU time per pair
# (the CPU figure is the steadier one on a busy machine).
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
best() {  # "wall cpu": the best of $reps runs of "$@", each figure on its own
  local bw= bc=
  for _ in $(seq "$reps"); do
    local out w c
    out=$("$@")
    w=$(echo "$out" | sed -n 's/.* ns_per_pair=\([0-9]*\).*/\1/p')
    c=$(echo "$out" | sed -n 's/.*cpu_ns_per_pair=\([0-9]*\).*/\1/p')
    if [ -z "$bw" ] || [ "$w" -lt "$bw" ]; then bw=$w; fi
    if [ -z "$bc" ] || [ "$c" -lt "$bc" ]; then bc=$c; fi
  done
  echo "$bw $bc"
}
printf '| buffers | PoCL ns/pair | shim ns/pair | ratio | PoCL CPU ns/pair | shim CPU ns/pair | CPU ratio |\n'
printf '|---|---:|---:|---:|---:|---:|---:|\n'
for mode in idle use; do
  pairs=$([ "$mode" = idle ] && echo 1000000 || echo 20000)
  arg=$([ "$mode" = use ] && echo use || echo "")
  read -r pw pc < <(best "$prog" "$pairs" $arg)
  read -r sw sc < <(LD_PRELOAD=$PWD/$b/libspyreshim.so best "$prog" "$pairs" $arg)
  printf '| %s | %s | %s | %.3f | %s | %s | %.3f |\n' "$mode" "$pw" "$sw" \
    "$(echo "$sw / $pw" | bc -l)" "$pc" "$sc" "$(echo "$sc / $pc" | bc -l)"
done
