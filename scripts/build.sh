#!/bin/bash
# Configures (once) and builds into ${SPYRESHIM_BUILD:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."
b=${SPYRESHIM_BUILD:-build}
if [ ! -f "$b/build.ninja" ]; then
  meson setup "$b" >/dev/null
fi
ninja -C "$b" >/dev/null
