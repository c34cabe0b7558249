#!/bin/bash
# clCreateBuffer + clReleaseMemObject pairs on OpenCL (PoCL on the CPU),
# with and without the shim, with buffers left untouched (idle) and with
# each new buffer written by a kernel (use): one run prints both. Best of
# REPS (default 3) runs each way, alternated, wall time and the process's
# CPU time per pair (the CPU figure is the steadier one on a busy
# machine).
#
# With INSTR=1 (valgrind installed), a third figure: the instructions of
# a pair on the program's thread, the one that creates and releases,
# counted by callgrind (the difference of two runs, N1 and N2 pairs, over
# N2 - N1: the set-up and the kernel's compile cancel out), about the same
# on every run however loaded the machine is (idle: to the instruction;
# use: within about 150 of 6,700, PoCL's waits for its worker threads
# vary; the kernels those threads run are not counted, so the use ratio
# is above what the process's would be). Instructions are
# not time (a cache miss or a locked instruction costs more than an add),
# so the wall and CPU ratios stay the measure; the instruction ratio says
# what the shim's code adds where time is too noisy to.
#
#   bench/opencl_pair.sh [BUILD_DIR]        (default build-bench/, release)
#   INSTR=1 bench/opencl_pair.sh build      (the instruction counts too)
#
# The figures measured, and where the shim's share of a pair goes:
# docs/opencl.md, "Cost".
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
shim=$PWD/$b/libspyreshim.so
export POCL_CACHE_DIR=${POCL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/spyreshim/pocl-kcache}
# "bare_wall bare_cpu shim_wall shim_cpu": the best of $reps runs of
# "$@" each way, PoCL alone and under the shim alternated run by run (a
# shared machine's slow stretches then fall on both), each figure on its
# own.
best_pair() {
  local bw= bc= sw= sc=
  for _ in $(seq "$reps"); do
    local out w c
    for way in bare shim; do
      if [ "$way" = bare ]; then out=$("$@"); else out=$(LD_PRELOAD=$shim "$@"); fi
      w=$(echo "$out" | sed -n 's/.* ns_per_pair=\([0-9]*\).*/\1/p')
      c=$(echo "$out" | sed -n 's/.*cpu_ns_per_pair=\([0-9]*\).*/\1/p')
      if [ "$way" = bare ]; then
        if [ -z "$bw" ] || [ "$w" -lt "$bw" ]; then bw=$w; fi
        if [ -z "$bc" ] || [ "$c" -lt "$bc" ]; then bc=$c; fi
      else
        if [ -z "$sw" ] || [ "$w" -lt "$sw" ]; then sw=$w; fi
        if [ -z "$sc" ] || [ "$c" -lt "$sc" ]; then sc=$c; fi
      fi
    done
  done
  echo "$bw $bc $sw $sc"
}
instr=${INSTR:-0}
if [ "$instr" = 1 ] && ! command -v valgrind >/dev/null; then
  echo "opencl_pair.sh: INSTR=1 needs valgrind (apt-get install valgrind)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Instructions of the program's thread (callgrind's file of thread 1) in a
# run of N pairs [use].
thread_instr() {
  rm -f "$tmp"/cg*
  valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$tmp/cg" \
    "$prog" "$@" >/dev/null 2>&1
  sed -n 's/^summary: //p' "$tmp/cg-01"
}
# Instructions per pair: N1 N2 [use].
per_pair() {
  local n1=$1 n2=$2 a b
  shift 2
  a=$(thread_instr "$n1" "$@")
  b=$(thread_instr "$n2" "$@")
  echo $(( (b - a) / (n2 - n1) ))
}
head='| buffers | PoCL ns/pair | shim ns/pair | ratio | PoCL CPU ns/pair | shim CPU ns/pair | CPU ratio |'
rule='|---|---:|---:|---:|---:|---:|---:|'
if [ "$instr" = 1 ]; then
  head="$head PoCL instr/pair | shim instr/pair | instr ratio |"
  rule="$rule---:|---:|---:|"
fi
echo "$head"
echo "$rule"
for mode in idle use; do
  pairs=$([ "$mode" = idle ] && echo 1000000 || echo 100000)
  arg=$([ "$mode" = use ] && echo use || echo "")
  read -r pw pc sw sc < <(best_pair "$prog" "$pairs" $arg)
  line=$(printf '| %s | %s | %s | %.3f | %s | %s | %.3f |' "$mode" "$pw" "$sw" \
    "$(echo "$sw / $pw" | bc -l)" "$pc" "$sc" "$(echo "$sc / $pc" | bc -l)")
  if [ "$instr" = 1 ]; then
    n1=$([ "$mode" = idle ] && echo 20000 || echo 1000)
    n2=$([ "$mode" = idle ] && echo 120000 || echo 5000)
    pi=$(per_pair "$n1" "$n2" $arg)
    si=$(LD_PRELOAD=$shim per_pair "$n1" "$n2" $arg)
    line="$line $(printf ' %s | %s | %.3f |' "$pi" "$si" "$(echo "$si / $pi" | bc -l)")"
  fi
  echo "$line"
done
