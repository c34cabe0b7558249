#!/bin/bash
# Peak RSS (KiB, /usr/bin/time) of each `spyreshim report` view reading
# synthetic traces of 1M and 10M events (bench/trace_synth.py), for the
# package in $NEW (default: this checkout's) and optionally an older copy in
# $OLD (e.g. `git archive b9b98b2 scripts/package | tar -x -C /tmp/old`,
# OLD=/tmp/old/scripts/package). One run each: a figure, not a test.
# memory-viz holds every event as a dict (about 700 bytes an event: some
# 7 GB at 10M); VIEWS="peak stats peak-html timeline" leaves it out.
#   bench/trace_read_memory.sh [DIR]   (DIR holds 1m.trace and 10m.trace; made if missing)
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
NEW=${NEW:-$HERE/scripts/package}
DIR=${1:-/tmp/spyreshim-trace-memory}
mkdir -p "$DIR" && cd "$DIR" || exit 2
[ -f 1m.trace ] || python3 "$HERE/bench/trace_synth.py" 1m.trace 1000000
[ -f 10m.trace ] || python3 "$HERE/bench/trace_synth.py" 10m.trace 10000000
for n in ${SIZES:-1m 10m}; do
 for ver in ${VERS:-new old}; do
  if [ $ver = new ]; then P=$NEW; else P=${OLD:-}; [ -n "$P" ] || continue; fi
  for view in ${VIEWS:-peak stats peak-html timeline memory-viz}; do
   case $view in
    peak) args="";;
    stats) args="--view stats";;
    peak-html) args="--html $DIR/o.html";;
    timeline) args="--view timeline --html $DIR/o.html";;
    memory-viz) args="--memory-viz $DIR/o.pickle";;
   esac
   /usr/bin/time -f "%M KiB %e s" -o $DIR/tm nice python3 -c "import sys; sys.path.insert(0, '$P'); from spyreshim import cli; sys.exit(cli.main(sys.argv[1:]))" report $args $n.trace >/dev/null 2>$DIR/err
   echo "$n $ver $view rc=$? $(cat $DIR/tm) $(tail -c 200 $DIR/err | tr '\n' ' ')"
  done
 done
done
