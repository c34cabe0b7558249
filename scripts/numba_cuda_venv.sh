#!/bin/bash
# Makes (once) the project's own virtual environment with numba-cuda from
# PyPI (the maintained CUDA target of numba, 0.30 or later), under the cache
# folder, and prints its Python. Nothing is installed into the system
# Python. Used by tests/integration/test_cudadrv_numba.py.
#
#   scripts/numba_cuda_venv.sh        -> .../venv-numba-cuda/bin/python
set -euo pipefail
cache=${SPYRESHIM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spyreshim}
venv=$cache/venv-numba-cuda
spec=('numba-cuda>=0.30' pytest filecheck cffi)
py=$venv/bin/python
if [ ! -x "$py" ] || ! "$py" -c 'import numba_cuda, pytest, filecheck, cffi' 2>/dev/null; then
  mkdir -p "$cache"
  /usr/bin/python3 -m venv "$venv" >&2
  "$py" -m pip install -q --disable-pip-version-check "${spec[@]}" >&2
fi
echo "$py"
