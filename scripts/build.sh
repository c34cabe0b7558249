#!/bin/bash
# Configures (once) and builds into ${SPYRESHIM_BUILD:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."
b=${SPYRESHIM_BUILD:-build}
# PyTorch 2.x's venv (scripts/torch2_venv.sh, made by scripts/test.sh) where
# it exists: the PyTorch device is then built for it too (tests/torch2).
t2=$(scripts/torch2_venv.sh --if-present 2>/dev/null || true)
if [ ! -f "$b/build.ninja" ]; then
  meson setup "$b" -Dtorch2_python="$t2" >/dev/null
  echo "$t2" > "$b/.torch2_python"
elif [ "$(cat "$b/.torch2_python" 2>/dev/null)" != "$t2" ]; then
  meson configure "$b" -Dtorch2_python="$t2" >/dev/null
  echo "$t2" > "$b/.torch2_python"
elif [ -f /usr/include/torch/library.h ] && [ -d "$b/tests" ] && [ ! -d "$b/tests/torch/simdev_torch" ]; then
  # Debian's torch was installed after this build dir was configured: the
  # PyTorch device (tests/torch) is built only where configure found it.
  meson setup --reconfigure "$b" >/dev/null
fi
ninja -C "$b" >/dev/null
