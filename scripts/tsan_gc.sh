#!/bin/bash
# The threaded Python GC cases under ThreadSanitizer: a -Dtsan=true build of
# the shim (build-tsan/), preloaded after the TSan runtime, with
# TSAN_OPTIONS=detect_deadlocks=1; any report (a data race, a lock-order
# inversion) makes the process exit 66 and the test fail.
#   scripts/tsan_gc.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${SPYRESHIM_TSAN_BUILD:-build-tsan}
[ -f "$dir/build.ninja" ] || meson setup "$dir" -Dtsan=true -Dbuildtype=debug >/dev/null
ninja -C "$dir" >/dev/null
SPYRESHIM_BUILD=$PWD/$dir SPYRESHIM_TSAN=1 exec /usr/bin/python3 -m pytest -q -rs \
    -p no:cacheprovider tests/integration/test_gc_threads.py \
    tests/integration/test_gc_lifecycle.py \
    tests/integration/test_gc_embed.py tests/integration/test_stress.py \
    tests/integration/test_promises.py "$@"
