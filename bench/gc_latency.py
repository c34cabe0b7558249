"""Pressure-event latency of the Python GC callback, split into the
collection itself and the shim's own overhead, for the inline path (the
allocating thread holds the GIL) and the GC-thread path (it released it),
with 10^4 and 10^6 live Python objects; compared with gc.collect() called
from Python directly on the same heap. A benchmark: it prints numbers and
asserts nothing.

    SPYRESHIM_BUILD=build scripts/... or:
    PYTHONPATH=build/tests/simdev SIMDEV_MEMORY=64M \\
        LD_PRELOAD=build/libspyreshim.so python3 bench/gc_latency.py [--repeat 15]

Each measured event: the device is filled with unreachable reference cycles
holding tensors, then one more tensor is requested; that request hits
pressure, the shim collects, and the request succeeds. `event` is the wall
time of that request as Python sees it; `collect` is the time spent inside
the interpreter's gc.collect() (the shim's gc_time_ns counter); `overhead`
is the difference: releasing and re-taking the allocator lock, finding the
interpreter, the hand-off to the GC thread and back, the retry.
"""
import argparse
import gc
import os
import statistics
import sys
import time

os.environ.setdefault("SIMDEV_MEMORY", "64M")
import simdev  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import spyreshim  # noqa: E402  (the ctypes wrapper of the public API)

MiB = 1 << 20


def fill_with_garbage(nbytes=MiB):
    while simdev.mem_info()[0] >= nbytes:
        t = simdev.Tensor(nbytes)
        t.me = t
        del t


def measure_event(get_stats, release_gil):
    fill_with_garbage()
    before = get_stats()
    t0 = time.perf_counter_ns()
    t = simdev.Tensor(MiB, release_gil=release_gil)
    wall = time.perf_counter_ns() - t0
    after = get_stats()
    del t
    if after["gc_collections"] != before["gc_collections"] + 1:
        return None                          # not exactly one collection: discard
    return wall, after["gc_time_ns"] - before["gc_time_ns"]


def measure_direct():
    fill_with_garbage()
    t0 = time.perf_counter_ns()
    gc.collect()
    return time.perf_counter_ns() - t0


def ms(ns):
    return f"{ns / 1e6:9.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--objects", type=int, nargs="*", default=[10**4, 10**6])
    args = ap.parse_args()
    if not spyreshim.available():
        sys.exit("gc_latency: run it with LD_PRELOAD=libspyreshim.so")
    get_stats = spyreshim.stats
    gc.disable()
    impl = f"{sys.implementation.name} {sys.version.split()[0]}"
    print(f"gc_latency: {impl}, device {simdev.mem_info()[1] // MiB} MiB, "
          f"median of {args.repeat} events (ms)")
    print(f"{'live objects':>12} {'path':>10} {'event':>9} {'collect':>9} {'overhead':>9} "
          f"{'gc.collect() from Python':>26}")
    for n in args.objects:
        live = [[] for _ in range(n)]        # n tracked containers the collector walks
        direct = statistics.median(measure_direct() for _ in range(args.repeat))
        for path, release_gil in (("inline", False), ("gc-thread", True)):
            rows = [r for r in (measure_event(get_stats, release_gil)
                                for _ in range(args.repeat)) if r]
            if not rows:
                print(f"{n:>12} {path:>10}  (no clean measurement)")
                continue
            wall = statistics.median(r[0] for r in rows)
            coll = statistics.median(r[1] for r in rows)
            over = statistics.median(r[0] - r[1] for r in rows)
            print(f"{n:>12} {path:>10} {ms(wall)} {ms(coll)} {ms(over)} {ms(direct):>26}")
        del live


if __name__ == "__main__":
    main()
