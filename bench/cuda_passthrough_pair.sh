#!/bin/bash
# Instructions per allocation + free pair of each CUDA family the shim
# passes through and watches (managed, host-pinned, VMM), and of the served
# cuMemAlloc_v2 for reference, on the driver stand-in, without and with the
# shim (callgrind: stable on a noisy machine). Per pair = (count at 2N pairs
# - count at N pairs) / N, so start-up and exit cancel out. One run each.
#
#   bench/cuda_passthrough_pair.sh [BUILD_DIR]   (default build-bench/, release)
#   N=2000 LIMIT=1G: pairs, and SPYRESHIM_LIMIT / SPYRESHIM_HOST_LIMIT for the shim
set -euo pipefail
cd "$(dirname "$0")/.."
b=${1:-build-bench}
if [ ! -f "$b/build.ninja" ]; then
  meson setup "$b" --buildtype=release >/dev/null
fi
ninja -C "$b" bench/cuda_passthrough_pair libspyreshim.so >/dev/null
n=${N:-2000}
limit=${LIMIT:-1G}
prog=$b/bench/cuda_passthrough_pair
export CUDASTANDIN_DEVICES=1 CUDASTANDIN_MEMORY=4G
count() {  # pairs env...: instructions of the program (every thread)
  local pairs=$1 fam=$2 out
  shift 2
  out=$(mktemp)
  env "$@" valgrind --tool=callgrind --callgrind-out-file="$out" "$prog" "$fam" "$pairs" \
    >/dev/null 2>&1
  sed -n 's/^summary: \([0-9]*\).*/\1/p' "$out"
  rm -f "$out"
}
per_pair() {  # family env...
  local fam=$1 a b2
  shift
  a=$(count "$n" "$fam" "$@")
  b2=$(count $((2 * n)) "$fam" "$@")
  echo $(( (b2 - a) / n ))
}
printf '| family | stand-in instr/pair | shim instr/pair | shim - stand-in |\n'
printf '|---|---:|---:|---:|\n'
for fam in device managed host vmm; do
  plain=$(per_pair "$fam" CUDASTANDIN_DEVICES=1)
  shim=$(per_pair "$fam" LD_PRELOAD="$PWD/$b/libspyreshim.so" SPYRESHIM_LIMIT="$limit" \
         SPYRESHIM_HOST_LIMIT="$limit")
  printf '| %s | %s | %s | %s |\n' "$fam" "$plain" "$shim" "$((shim - plain))"
done
