#!/bin/bash
# Instructions per cuMemAllocAsync + cuMemFreeAsync pair on the CUDA driver
# stand-in, without and with the shim (callgrind counts: stable on a noisy
# machine). The per-pair figure is the difference between a run of 2*N and
# one of N pairs, divided by N, so start-up and the 1,000 blocks set up
# first cancel out. One run each.
#
#   bench/cuda_async_pair.sh [BUILD_DIR] [N]   (default build-bench/, 2000)
set -euo pipefail
cd "$(dirname "$0")/.."
b=${1:-build-bench}
n=${2:-2000}
if [ ! -f "$b/build.ninja" ]; then
  meson setup "$b" --buildtype=release >/dev/null
fi
ninja -C "$b" >/dev/null
prog=$b/bench/cuda_pair
export CUDASTANDIN_DEVICES=1 CUDASTANDIN_MEMORY=4G
ir() {  # total instructions (every thread) of PRELOAD's run of PAIRS pairs
  local out
  out=$(mktemp)
  LD_PRELOAD=$1 valgrind --tool=callgrind --callgrind-out-file="$out" "$prog" "$2" 0 async \
    >/dev/null 2>&1
  sed -n 's/^summary: \([0-9]*\).*/\1/p' "$out"
  rm -f "$out"
}
per_pair() {  # instructions per pair with PRELOAD
  local one two
  one=$(ir "$1" "$n")
  two=$(ir "$1" $((2 * n)))
  echo $(((two - one) / n))
}
plain=$(per_pair "")
shim=$(per_pair "$PWD/$b/libspyreshim.so")
printf '| pair | driver stand-in Ir/pair | shim Ir/pair | shim adds |\n|---|---:|---:|---:|\n'
printf '| cuMemAllocAsync + cuMemFreeAsync | %s | %s | %s |\n' "$plain" "$shim" "$((shim - plain))"
