#!/bin/bash
# Installs the Debian packages the build, the tests and the demo need, when
# missing (as root, on Debian 12). Nothing is downloaded from anywhere else.
set -euo pipefail
pkgs=(
  meson ninja-build gcc g++ pkg-config
  libcriterion-dev libunwind8 libunwind-dev libdw1 libjemalloc2 libjemalloc-dev
  zlib1g-dev  # zlib.h: the trace writer compresses chunks (libz.so.1, dlopen'ed: shim/trace/tracecodec.c)
  python3 python3-dev python3-pytest python3.11-dbg python3-numba
  python3-pytest-xdist  # scripts/test.sh spreads the test files over the cores (pytest -n)
  python3-venv  # tests/integration/test_wheel.py: a fresh venv of Debian's python3 for the wheel
  python3-numpy  # the trace reader's vectorized path (spyreshim/reading/trace.py)
  pypy3 pypy3-dev
  chromium heaptrack
  patchelf
  python3-torch libtorch-dev
  golang-go   # go tool pprof reads `spyreshim report --pprof` (tests/integration/test_pprof.py)
  pocl-opencl-icd ocl-icd-libopencl1 ocl-icd-opencl-dev python3-pyopencl clinfo  # OpenCL on the CPU (tests/integration/test_opencl.py)
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}" >&2
  if [ "$(id -u)" != 0 ]; then
    echo "deps: not root; install these packages first: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
