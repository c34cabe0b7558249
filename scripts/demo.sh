#!/bin/bash
# The demo: an MLP trained with real PyTorch (PyPI's 2.x where
# scripts/torch2_venv.sh made its venv, Debian's python3-torch 1.13
# otherwise; the first line says which) on a
# small simulated device (simdev, through the PyTorch device of
# tests/torch/simdev_torch), with the reference cycles training scripts make
# and Python's collector disabled. Without the shim it runs out of device
# memory at a step it prints (with the collector enabled too, a little
# later); with the shim the pressure callback collects the cycles and it
# completes, with the same losses. The shim's run is traced, and the trace
# drawn as a timeline page.
#   scripts/demo.sh [--trace FILE]   # the trace's path (default build/demo/demo.trace)
#   scripts/demo.sh --minimal [--trace FILE]
#                                    # the hand-written loop on the simdev module (no torch)
set -uo pipefail
minimal=0 trace=
while (($#)); do
    case "$1" in
    --minimal) minimal=1; shift ;;
    --trace) [ -n "${2:-}" ] || { echo "demo.sh: --trace needs a file" >&2; exit 2; }
             trace=$(realpath -m "$2"); shift 2 ;;
    *) echo "usage: scripts/demo.sh [--minimal] [--trace FILE]" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
scripts/deps.sh
export SPYRESHIM_BUILD=${SPYRESHIM_BUILD:-$PWD/build}
scripts/build.sh || exit 1
shim=$SPYRESHIM_BUILD/libspyreshim.so

if ((minimal)); then
    export PYTHONPATH=$SPYRESHIM_BUILD/tests/simdev SIMDEV_MEMORY=${SIMDEV_MEMORY:-256M}
    echo "== without spyreshim (SIMDEV_MEMORY=$SIMDEV_MEMORY)"
    python3 scripts/demo_train.py
    echo "   exit status $?"
    echo
    echo "== LD_PRELOAD=$shim"
    env LD_PRELOAD="$shim" SPYRESHIM_LOG=info ${trace:+SPYRESHIM_TRACE=$trace} \
        python3 scripts/demo_train.py
    echo "   exit status $?"
    if [ -n "$trace" ]; then
        scripts/spyreshim report --view timeline --html "${trace%.trace}.html" "$trace"
    fi
    exit 0
fi

# PyTorch 2.x (scripts/torch2_venv.sh's venv, which scripts/test.sh makes)
# where it is there and the device was built for it, Debian's 1.13 otherwise.
if py=$(scripts/torch2_venv.sh --if-present 2>/dev/null) &&
   [ -f "$SPYRESHIM_BUILD/tests/torch2/simdev_torch/libsimdev_torch.so" ]; then
    pkg=$SPYRESHIM_BUILD/tests/torch2
    export LD_LIBRARY_PATH=$(scripts/torch2_venv.sh --ld-library-path)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
elif [ -f "$SPYRESHIM_BUILD/tests/torch/simdev_torch/libsimdev_torch.so" ]; then
    py=/usr/bin/python3 pkg=$SPYRESHIM_BUILD/tests/torch
else
    echo "demo.sh: the PyTorch device was not built (is Debian's libtorch-dev installed?)" >&2
    exit 1
fi
version=$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null) || {
    echo "demo.sh: $py cannot import torch" >&2; exit 1; }
echo "demo: PyTorch $version ($py)"
trace=${trace:-$SPYRESHIM_BUILD/demo/demo.trace}
mkdir -p "$(dirname "$trace")"
rm -f "$trace"
# One thread for PyTorch's CPU kernels (the device computes with them), so
# runs are comparable.
export PYTHONPATH=$pkg:$PWD/spyreshim/_child_path
export OMP_NUM_THREADS=1 SIMDEV_MEMORY=${SIMDEV_MEMORY:-8M}
steps=${DEMO_STEPS:-300}
echo "== without spyreshim (SIMDEV_MEMORY=$SIMDEV_MEMORY)"
"$py" scripts/demo_torch.py --steps "$steps"
echo "   exit status $?"
echo
echo "== without spyreshim, Python's collector enabled (it counts objects, not device bytes)"
"$py" scripts/demo_torch.py --steps "$steps" --gc
echo "   exit status $?"
echo
echo "== LD_PRELOAD=$shim SPYRESHIM_TRACE=$trace"
env LD_PRELOAD="$shim" SPYRESHIM_LOG=info SPYRESHIM_TRACE="$trace" \
    "$py" scripts/demo_torch.py --steps "$steps"
echo "   exit status $?"
page=${trace%.trace}-timeline.html
scripts/spyreshim report --view timeline --html "$page" "$trace" &&
    echo "timeline: $page"
