"""How deep allocation stacks are: the native frames of each allocation
site of a trace recorded with a generous depth, and how many reach the
program's main or their thread's start (an uncut stack). What
SPYRESHIM_STACK_DEPTH's defaults were chosen from (docs/leaks.md).

    SPYRESHIM_STACK_DEPTH=256 SPYRESHIM_TRACE=d.trace LD_PRELOAD=build/libspyreshim.so \\
        PYTHONPATH=build/tests/torch OMP_NUM_THREADS=1 SIMDEV_MEMORY=1G \\
        /usr/bin/python3 scripts/demo_torch.py --steps 5 --gc
    python3 bench/stack_depth.py d.trace [DEPTH...]

Prints the distribution of native depths and, for each DEPTH given (32 and
128 by default), how many sites a capture that deep would leave uncut.
Figures, not a test."""
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from spyreshim.reading import trace  # noqa: E402

STARTS = ("main", "__libc_start_call_main", "start_thread", "clone3", "clone")


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    t = trace.load(argv[0])
    depths = [int(d) for d in argv[1:]] or [32, 128]
    sites = []
    for site, (ns, _ps) in t.sites.items():
        frames = t.nstacks.get(ns, ())
        names = [(t.symbols.get(a) or ("",))[0] or "" for a in frames]
        ends = [i for i, n in enumerate(names) if n in STARTS]
        sites.append((len(frames), ends[0] + 1 if ends else None))
    if not sites:
        print("no allocation sites in", argv[0])
        return 1
    n = [s[0] for s in sites]
    print("%d sites; native frames min %d, max %d" % (len(sites), min(n), max(n)))
    print("depths:", sorted(collections.Counter(n).items()))
    whole = [s[1] for s in sites if s[1] is not None]
    print("stacks reaching main or their thread's start: %d of %d" % (len(whole), len(sites)))
    for d in depths:
        print("at depth %d: %d of %d sites uncut" % (d, sum(1 for w in whole if w <= d), len(sites)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
