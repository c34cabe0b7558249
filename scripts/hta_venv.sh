#!/bin/bash
# Makes (once) the project's own virtual environment with Meta's Holistic
# Trace Analysis (PyPI HolisticTraceAnalysis, with all its dependencies:
# JupyterLab, pandas, plotly, ...) and kaleido (plotly's PNG writer, which
# drives the system's Chromium), under the cache folder, and prints its
# Python. Nothing is installed into the system Python. Used by
# tests/integration/test_categories.py: HTA's MemoryAnalysis reads and draws
# the memory timeline `spyreshim report --memory-timeline` writes.
#
#   scripts/hta_venv.sh        -> .../venv-hta/bin/python
set -euo pipefail
cache=${SPYRESHIM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spyreshim}
venv=$cache/venv-hta
spec=(HolisticTraceAnalysis kaleido)
py=$venv/bin/python
if [ ! -x "$py" ] || ! "$py" -c 'import hta.memory_analysis, kaleido' 2>/dev/null; then
  mkdir -p "$cache"
  /usr/bin/python3 -m venv "$venv" >&2
  "$py" -m pip install -q --disable-pip-version-check "${spec[@]}" >&2
fi
echo "$py"
