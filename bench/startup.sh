#!/bin/bash
# What preloading costs a process that never touches a device runtime:
# N runs of each command with and without LD_PRELOAD=libspyreshim.so,
# interleaved (so machine noise hits both alike); prints the mean wall time
# of each and their ratio. Usage: bench/startup.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-40}
b=${SPYRESHIM_BUILD:-$PWD/build}
lib=$b/libspyreshim.so
[ -f "$lib" ] || { echo "build first: scripts/build.sh" >&2; exit 1; }
measure() { # measure PRELOAD CMD... -> nanoseconds
  local pre=$1; shift
  local t0 t1
  t0=$(date +%s%N)
  if [ -n "$pre" ]; then LD_PRELOAD=$pre "$@" >/dev/null 2>&1; else "$@" >/dev/null 2>&1; fi
  t1=$(date +%s%N)
  echo $((t1 - t0))
}
printf '%-32s %12s %12s %8s\n' command "plain ms" "preload ms" ratio
for cmd in "/bin/ls /" "/usr/bin/python3.11 -c pass"; do
  a=0; p=0
  for ((i = 0; i < n; i++)); do
    a=$((a + $(measure "" $cmd)))
    p=$((p + $(measure "$lib" $cmd)))
  done
  awk -v c="$cmd" -v a="$a" -v p="$p" -v n="$n" \
    'BEGIN { printf "%-32s %12.2f %12.2f %8.3f\n", c, a/n/1e6, p/n/1e6, p/a }'
done
