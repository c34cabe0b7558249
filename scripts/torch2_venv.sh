#!/bin/bash
# Makes (once) the project's own virtual environment with PyTorch 2.x from
# PyPI (torch==2.15.0, CPU use only: no GPU is touched), under the cache
# folder, and prints its Python. Nothing is installed into the system Python.
# The wheel is CUDA-enabled: its libraries need the CUDA toolkit's runtime
# libraries on LD_LIBRARY_PATH (nvcc's lib64) and four NVIDIA wheels the
# toolkit does not ship; everything else comes from the toolkit, so the
# other nvidia-* wheels (several GB) are not installed (--no-deps).
#
#   scripts/torch2_venv.sh                   -> .../venv-torch2/bin/python (installs)
#   scripts/torch2_venv.sh --if-present      -> the same, or exit 1 without installing
#   scripts/torch2_venv.sh --ld-library-path -> what LD_LIBRARY_PATH needs (toolkit lib64)
#
# Used by scripts/build.sh (-Dtorch2_python), tests/integration (the torch
# tests run on both 1.13 and 2.x) and scripts/demo.sh.
set -euo pipefail
cache=${SPYRESHIM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spyreshim}
venv=$cache/venv-torch2
py=$venv/bin/python
spec=(torch==2.15.0 nvidia-nccl-cu13==2.30.7 nvidia-cusparselt-cu13==0.8.1
      nvidia-nvshmem-cu13==3.7.2 nvidia-cufile
      filelock typing-extensions sympy mpmath networkx jinja2 MarkupSafe fsspec setuptools)
# the test tools, with their own dependencies
tools=(pytest numpy)

toolkit_lib() {
  local nvcc d
  nvcc=$(command -v nvcc 2>/dev/null || true)
  for d in ${nvcc:+"$(dirname "$(readlink -f "$nvcc")")/../lib64"} /usr/local/cuda/lib64; do
    if [ -e "$d/libcudart.so" ] || ls "$d"/libcudart.so.* >/dev/null 2>&1; then
      readlink -f "$d"
      return 0
    fi
  done
  return 1
}

case "${1:-}" in
  --ld-library-path)
    if ! toolkit_lib; then
      echo "torch2_venv: no CUDA toolkit (nvcc's lib64 with libcudart); PyTorch 2.x's wheel cannot load" >&2
      exit 1
    fi
    exit 0 ;;
  --if-present)
    ok=0
    if [ -x "$py" ] && lib=$(toolkit_lib); then
      LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
        "$py" -c 'import torch, pytest, numpy' 2>/dev/null && ok=1
    fi
    ((ok)) && echo "$py" && exit 0
    exit 1 ;;
  "") ;;
  *) echo "torch2_venv: unknown option $1 (--if-present, --ld-library-path)" >&2; exit 2 ;;
esac

if ! lib=$(toolkit_lib); then
  echo "torch2_venv: no CUDA toolkit (nvcc's lib64 with libcudart); PyTorch 2.x's wheel cannot load" >&2
  exit 1
fi
if [ ! -x "$py" ] || ! LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
      "$py" -c 'import torch, pytest, numpy' 2>/dev/null; then
  mkdir -p "$cache"
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv" >&2
  echo "torch2_venv: installing ${spec[0]} into $venv (about 540 MB, once)" >&2
  "$py" -m pip install -q --disable-pip-version-check --no-deps "${spec[@]}" >&2
  "$py" -m pip install -q --disable-pip-version-check "${tools[@]}" >&2
fi
echo "$py"
