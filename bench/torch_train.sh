#!/bin/bash
# What the simdev PyTorch device and the shim cost a training step: each
# model of tests/torch_examples/train.py for STEPS steps (default 20) on the
# CPU, on the device (its kernels are the CPU's, plus a copy to the host and
# back around each operator the fallback runs), and on the device under
# LD_PRELOAD=libspyreshim.so, for each PyTorch version present (Debian's
# 1.13, PyPI's 2.x from scripts/torch2_venv.sh). Prints the milliseconds per
# step after the first (one run each) and the ratios device/CPU and
# shim/device, all measured in this run. No cycles: the shim's cost on the
# path every allocation takes, not a rescue.
#   bench/torch_train.sh [STEPS]
set -uo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
b=${SPYRESHIM_BUILD:-build}
shim=$PWD/$b/libspyreshim.so
[ -f "$shim" ] || { echo "torch_train.sh: $shim is not built (scripts/build.sh)" >&2; exit 1; }
export OMP_NUM_THREADS=1 SIMDEV_MEMORY=1G
ms() {  # ms PYTHON PKGDIR PRELOAD ARGS...: the per-step figure train.py prints
  local py=$1 pkg=$2 pre=$3; shift 3
  env PYTHONPATH="$pkg" ${pre:+LD_PRELOAD=$pre} "$py" tests/torch_examples/train.py "$@" \
      --steps "$steps" | sed -n 's/^train: completed .* (\([0-9.]*\) ms per step after the first)$/\1/p'
}
versions=()
[ -f "$b/tests/torch/simdev_torch/libsimdev_torch.so" ] && versions+=("1.13:/usr/bin/python3:$b/tests/torch")
if py2=$(scripts/torch2_venv.sh --if-present 2>/dev/null) &&
   [ -f "$b/tests/torch2/simdev_torch/libsimdev_torch.so" ]; then
  export LD_LIBRARY_PATH=$(scripts/torch2_venv.sh --ld-library-path)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  versions+=("2.x:$py2:$b/tests/torch2")
fi
((${#versions[@]})) || { echo "torch_train.sh: no PyTorch device built" >&2; exit 1; }
printf '%-5s %-12s %10s %10s %10s %12s %12s\n' torch model "cpu ms" "device ms" "shim ms" device/cpu shim/device
for v in "${versions[@]}"; do
  IFS=: read -r name py pkg <<<"$v"
  for m in mnist lstm transformer resnet; do
    c=$(ms "$py" "$pkg" "" "$m" --device cpu)
    d=$(ms "$py" "$pkg" "" "$m" --device simdev --import simdev_torch)
    s=$(ms "$py" "$pkg" "$shim" "$m" --device simdev --import simdev_torch)
    if [ -z "$c" ] || [ -z "$d" ] || [ -z "$s" ]; then
      echo "torch_train.sh: $name $m failed (cpu '$c', device '$d', shim '$s')" >&2; continue
    fi
    awk -v n="$name" -v m="$m" -v c="$c" -v d="$d" -v s="$s" \
      'BEGIN { printf "%-5s %-12s %10.2f %10.2f %10.2f %11.2fx %11.2fx\n", n, m, c, d, s, d / c, s / d }'
  done
done
