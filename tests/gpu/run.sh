#!/bin/bash
# The CUDA checks on a real GPU, with the toolkit's real runtime (not part
# of CI: the CPU stand-in in tests/cudadrv cannot run the real runtime).
#
#   tests/gpu/run.sh [BUILD_DIR]     (default build/; needs nvcc and a GPU)
#
# Builds alloc_check.cu with the static runtime (nvcc's default) and with
# -cudart shared, runs each without and with the shim, runs numba's device
# arrays in cycles (when numba imports), and prints one table: whether the
# program passed, whether the shim served its allocations (statistics),
# devices seen, waits for the device before reuse, and the cudaMalloc +
# cudaFree pair time.
set -u
cd "$(dirname "$0")/../.."
build=${1:-build}
shim=$PWD/$build/libspyreshim.so
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
[ -f "$shim" ] || { echo "no $shim: run scripts/build.sh first" >&2; exit 2; }
[ -x "$nvcc" ] || { echo "no nvcc (set NVCC)" >&2; exit 2; }
nvidia-smi -L 2>/dev/null | head -4

"$nvcc" -O2 -o "$out/static" tests/gpu/alloc_check.cu || exit 2
"$nvcc" -O2 -cudart shared -o "$out/shared" tests/gpu/alloc_check.cu || exit 2

row() { printf '%-22s %-6s %-5s %-7s %-9s %-8s %s\n' "$@"; }
row case shim rc served devices waits "pair ns / detail"
stat() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d.get('allocs',0), ','.join(r['name'] for r in d.get('runtimes',[])) or '-', d.get('device_waits',0))" "$1" 2>/dev/null || echo "0 - 0"; }

for prog in static shared; do
  for with in no yes; do
    rm -f "$out/stats.json"
    if [ $with = yes ]; then
      res=$(LD_PRELOAD=$shim SPYRESHIM_STATS=$out/stats.json timeout 900 "$out/$prog" 2>"$out/err")
    else
      res=$(timeout 900 "$out/$prog" 2>"$out/err")
    fi
    rc=$?
    read -r allocs devs waits <<<"$(stat "$out/stats.json")"
    row "nvcc $prog" $with $rc "$allocs" "$devs" "$waits" "$res $(head -c 200 "$out/err" | tr '\n' ' ')"
  done
done

py=
for p in python3 /usr/bin/python3; do
  "$p" -c "import numba.cuda" 2>/dev/null && { py=$p; break; }
done
# 200 arrays of 1 GiB held by cycles: more than any GPU has, so without the
# shim numba runs out; with it, collections give the memory back.
if [ -n "$py" ]; then
  for with in no yes; do
    rm -f "$out/stats.json"
    if [ $with = yes ]; then
      LD_PRELOAD=$shim SPYRESHIM_STATS=$out/stats.json timeout 900 "$py" \
        tests/integration/cudadrv_numba_cycles.py --iterations 200 --array-bytes $((1 << 30)) \
        >"$out/res" 2>"$out/err"
    else
      timeout 900 "$py" tests/integration/cudadrv_numba_cycles.py --iterations 200 \
        --array-bytes $((1 << 30)) >"$out/res" 2>"$out/err"
    fi
    rc=$?
    res=$(tail -1 "$out/res"; tail -c 120 "$out/err" | tr '\n' ' ')
    read -r allocs devs waits <<<"$(stat "$out/stats.json")"
    row "numba cycles 1GiB" $with $rc "$allocs" "$devs" "$waits" "$(echo "$res" | head -c 160)"
  done
else
  row "numba" - - - - - "numba not importable: skipped"
fi
