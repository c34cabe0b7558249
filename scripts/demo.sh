#!/bin/bash
# The demo: a training-like loop whose steps leave reference cycles holding
# device tensors, with Python's collector disabled, on a small simulated
# device. Without the shim it runs out of device memory; with the shim the
# pressure callback collects the cycles and it completes.
#   scripts/demo.sh [--trace FILE]   # also record the shim's run as a trace
set -uo pipefail
trace=
if [ "${1:-}" = "--trace" ] && [ -n "${2:-}" ]; then
    trace=$(realpath -m "$2")
fi
cd "$(dirname "$0")/.."
scripts/deps.sh
export SPYRESHIM_BUILD=${SPYRESHIM_BUILD:-$PWD/build}
scripts/build.sh || exit 1
export PYTHONPATH=$SPYRESHIM_BUILD/tests/simdev SIMDEV_MEMORY=${SIMDEV_MEMORY:-256M}
py=python3
echo "== without spyreshim (SIMDEV_MEMORY=$SIMDEV_MEMORY)"
$py scripts/demo_train.py
echo "   exit status $?"
echo
echo "== LD_PRELOAD=$SPYRESHIM_BUILD/libspyreshim.so"
env LD_PRELOAD=$SPYRESHIM_BUILD/libspyreshim.so SPYRESHIM_LOG=info ${trace:+SPYRESHIM_TRACE=$trace} \
    $py scripts/demo_train.py
echo "   exit status $?"
if [ -n "$trace" ]; then
    scripts/spyreshim report --view timeline --html "${trace%.trace}.html" "$trace"
fi
