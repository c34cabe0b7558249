#!/bin/bash
# Peak RSS (KiB) and CPU time (user + system, s) of each `spyreshim report`
# view and export reading synthetic traces of 1M and 10M events
# (bench/trace_synth.py), for the package in $NEW (the folder holding spyreshim/; default: this
# checkout's) and optionally an older copy in $OLD (e.g. `git archive
# a4681fa scripts/package | tar -x -C /tmp/old`, OLD=/tmp/old/scripts/package).
# One run each: a figure, not a test (the 10M runs take minutes).
#   bench/trace_read_memory.sh [DIR]   (DIR holds 1m.trace and 10m.trace; made if missing)
#   SIZES="1m" VERS="new" VIEWS="timeline memory-viz" bench/trace_read_memory.sh
# PYTHON (default /usr/bin/python3, Debian's, with its python3-numpy: the
# reader's vectorized path; SPYRESHIM_NO_NUMPY=1 measures the pure-Python one).
# The old reader's memory-viz holds every event as a dict (about 700 bytes
# an event: some 7 GB at 10M): leave it out with VIEWS.
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
NEW=${NEW:-$HERE}
PY=${PYTHON:-/usr/bin/python3}
DIR=${1:-/tmp/spyreshim-trace-memory}
mkdir -p "$DIR" && cd "$DIR" || exit 2
for n in ${SIZES:-1m 10m}; do
 case $n in 1m) count=1000000;; 10m) count=10000000;; *) echo "size $n: 1m or 10m" >&2; exit 2;; esac
 [ -f $n.trace ] || $PY "$HERE/bench/trace_synth.py" $n.trace $count
 for ver in ${VERS:-new old}; do
  if [ $ver = new ]; then P=$NEW; else P=${OLD:-}; [ -n "$P" ] || continue; fi
  for view in ${VIEWS:-peak stats peak-html timeline gc pprof diff memory-viz}; do
   case $view in
    peak) args="";;
    stats) args="--view stats";;
    peak-html) args="--html $DIR/o.html";;
    timeline) args="--view timeline --html $DIR/o.html";;
    gc) args="--view gc";;
    pprof) args="--pprof $DIR/o.pb.gz";;
    diff) args="--diff --at 1 --at $((count / 2))";;
    memory-viz) args="--memory-viz $DIR/o.pickle";;
    *) echo "view $view?" >&2; exit 2;;
   esac
   /usr/bin/time -f "%M KiB, CPU %U s user + %S s system, %e s wall" -o $DIR/tm nice $PY -c "import sys; sys.path.insert(0, '$P'); from spyreshim.cli import main as cli; sys.exit(cli.main(sys.argv[1:]))" report $args $n.trace >/dev/null 2>$DIR/err
   echo "$n $ver $view rc=$? $(cat $DIR/tm) $(tail -c 200 $DIR/err | tr '\n' ' ')"
  done
 done
done
