#!/bin/bash
# Configures (once) and builds into ${SPYRESHIM_BUILD:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."
b=${SPYRESHIM_BUILD:-build}
if [ ! -f "$b/build.ninja" ]; then
  meson setup "$b" >/dev/null
elif [ -f /usr/include/torch/library.h ] && [ -d "$b/tests" ] && [ ! -d "$b/tests/torch/simdev_torch" ]; then
  # Debian's torch was installed after this build dir was configured: the
  # PyTorch device (tests/torch) is built only where configure found it.
  meson setup --reconfigure "$b" >/dev/null
fi
ninja -C "$b" >/dev/null
