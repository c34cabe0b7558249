"""Leak-checking overhead per allocation with Python stacks: replays the
shared trace (bench/trace.h, "loguniform", the same seed and sizes) through
the simdev module's Tensor, every allocation made from a Python stack of
exactly --depth frames (default 20).

    LD_PRELOAD=build/libspyreshim.so PYTHONPATH=build/tests/simdev \\
        python3 bench/leak_overhead.py [--depth 20] [--pairs 200000] [--release-gil]

Prints "python depth gil|nogil ns_per_pair". Run it with SPYRESHIM_LEAK_CHECK
off, on with SPYRESHIM_PYTHON_STACKS=0, and on with Python stacks: the
differences are the overheads (bench/leak_overhead.sh does all of it).
Figures, not a test."""
import argparse
import math
import sys
import time

import simdev

ap = argparse.ArgumentParser()
ap.add_argument("--depth", type=int, default=20)
ap.add_argument("--pairs", type=int, default=200000)
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--release-gil", action="store_true")
# cpu: the thread's own CPU time (time.thread_time_ns), less sensitive than
# the default wall clock to other load on the machine.
ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
args = ap.parse_args()

LIVE = 10000
M64 = (1 << 64) - 1


class Rng:
    """trace.h's generator (splitmix64), bit for bit."""

    def __init__(self, seed):
        self.s = seed

    def next(self):
        self.s = (self.s + 0x9e3779b97f4a7c15) & M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
        z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
        return z ^ (z >> 31)

    def unit(self):
        return (self.next() >> 11) * (1.0 / 9007199254740992.0)


def log_uniform(rng, lo=256.0, hi=4.0 * 1024 * 1024):
    v = math.exp(math.log(lo) + rng.unit() * (math.log(hi) - math.log(lo)))
    r = (math.ceil(v) + 255) & ~255
    return int(min(r, hi))


rng = Rng(0x1057a11c)
init = [log_uniform(rng) for _ in range(LIVE)]
victim, size = [], []
for _ in range(args.pairs):
    victim.append(rng.next() % LIVE)
    size.append(log_uniform(rng))


def replay():
    T = simdev.Tensor
    rg = args.release_gil
    live = [T(n, release_gil=rg) for n in init]
    clock = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns
    t0 = clock()
    for k, n in zip(victim, size):
        live[k] = None
        live[k] = T(n, release_gil=rg)
    dt = clock() - t0
    del live
    return dt / args.pairs


def frames_now():
    n, f = 0, sys._getframe(1)
    while f is not None:
        n, f = n + 1, f.f_back
    return n


def at_depth(want, fn):
    # replay() itself is the innermost frame: call it from want - 1 frames.
    if frames_now() + 1 >= want - 1:
        return fn()
    return at_depth(want, fn)


best = min(at_depth(args.depth, replay) for _ in range(args.reps))
print(f"python {args.depth} {'nogil' if args.release_gil else 'gil'} {best:.1f}")
