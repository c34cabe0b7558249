#!/bin/bash
# The test command: installs what is missing, builds, runs the unit tests
# (Criterion, through meson test), the integration tests (pytest, every
# interpreter on the machine), then the threaded garbage-collection cases
# again against a ThreadSanitizer build (build-tsan/, detect_deadlocks=1).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
# PyTorch 2.x from PyPI in its own venv (cached), before the build, which
# builds the PyTorch device for it too; absent, the 2.x torch tests fail in
# CI mode and skip otherwise.
scripts/torch2_venv.sh >/dev/null || echo "test.sh: scripts/torch2_venv.sh failed; PyTorch 2.x is absent" >&2
export SPYRESHIM_BUILD=${SPYRESHIM_BUILD:-$PWD/build}
scripts/build.sh
# Debian unstable's CPython 3.14/3.15 for the matrix (cached; a failure
# leaves them absent, which CI mode reports as failures, not skips).
scripts/pythons.sh || echo "test.sh: scripts/pythons.sh failed; 3.14/3.15 are absent" >&2
meson test -C "$SPYRESHIM_BUILD" --print-errorlogs --suite unit
/usr/bin/python3 -m pytest -p no:cacheprovider -rs tests/integration "$@"
scripts/tsan_gc.sh
