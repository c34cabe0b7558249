#!/bin/bash
# The test command: installs what is missing, builds, runs the unit tests
# (Criterion, through meson test), the integration tests (pytest, every
# interpreter on the machine, test files spread over the machine's cores
# with pytest-xdist), then the threaded garbage-collection cases again
# against a ThreadSanitizer build (build-tsan/, detect_deadlocks=1). Prints
# each stage's wall time at the end, failed or not.
#   scripts/test.sh [pytest args for the integration tests...]
set -euo pipefail
cd "$(dirname "$0")/.."
export SPYRESHIM_BUILD=${SPYRESHIM_BUILD:-$PWD/build}
# Workers for pytest-xdist: one per core. Files, not tests, are spread
# (--dist loadfile): a file's module fixtures (a wheel, a venv, a torch
# version) are made once, on one worker.
jobs=${SPYRESHIM_TEST_JOBS:-$(nproc)}

stages=()
start=$SECONDS
report() {
  local rc=$?
  echo "test.sh: stages (wall seconds):"
  local s
  for s in "${stages[@]}"; do echo "  $s"; done
  echo "  total $((SECONDS - start)) s, exit $rc"
}
trap report EXIT
# stage NAME CMD...: runs CMD, records its wall time; a failure ends the run.
stage() {
  local name=$1 t0=$SECONDS rc=0
  shift
  "$@" || rc=$?
  stages+=("$(printf '%-28s %5d s%s' "$name" $((SECONDS - t0)) "$( ((rc)) && echo "  (exit $rc)")")")
  return $rc
}

stage "deps (apt)" scripts/deps.sh
# Debian unstable's CPython 3.14/3.15 for the matrix (cached; a failure
# leaves them absent, which CI mode reports as failures, not skips). It only
# downloads and unpacks: it runs beside the PyTorch venv and the build.
pythons_log=$(mktemp)
scripts/pythons.sh >"$pythons_log" 2>&1 &
pythons_pid=$!
t_pythons=$SECONDS
# PyTorch 2.x from PyPI in its own venv (cached), before the build, which
# builds the PyTorch device for it too; absent, the 2.x torch tests fail in
# CI mode and skip otherwise.
stage "torch 2.x venv (pip)" bash -c 'scripts/torch2_venv.sh >/dev/null' ||
  echo "test.sh: scripts/torch2_venv.sh failed; PyTorch 2.x is absent" >&2
stage "build" scripts/build.sh
rc=0
wait "$pythons_pid" || rc=$?
cat "$pythons_log" >&2
rm -f "$pythons_log"
stages+=("$(printf '%-28s %5d s (beside the two above)' "pythons 3.14/3.15 (apt)" $((SECONDS - t_pythons)))")
((rc == 0)) || echo "test.sh: scripts/pythons.sh failed; 3.14/3.15 are absent" >&2
stage "unit (meson test)" meson test -C "$SPYRESHIM_BUILD" --print-errorlogs --suite unit
stage "integration (pytest -n $jobs)" /usr/bin/python3 -m pytest -p no:cacheprovider -rs \
  -n "$jobs" --dist loadfile tests/integration "$@"
stage "ThreadSanitizer" scripts/tsan_gc.sh -n "$jobs" --dist loadfile
