"""Cost of capturing a 20-frame Python stack (python_gc/pystack.c), the
part of leak checking that Python frames add to each device allocation.

    python3 bench/pystack_capture.py [build/tests/libpystackhook.so ...] [--depth 20] [--iters 200000]

Run it with any CPython of the matrix (pyenv's, /usr/bin/python3.11,
python3.11-dbg, the free-threaded 3.13t, Debian unstable's 3.14 and 3.15). The loop runs in C
(pystack_test_bench in tests/pystack/hook.c) from a Python stack of
exactly --depth frames; it prints nanoseconds per capture with the GIL held
(ctypes.PyDLL) and released (ctypes.CDLL, as PyTorch's bindings and
simdev.Tensor(n, release_gil=True) call in). Every capture after the first
finds its stack already interned: the steady state of a training loop.
Target: <= 1500 ns per capture (issue 4).

Several hooks (builds of different commits) are measured in the same run,
their repeats interleaved, so that a before/after comparison sees the same
machine load (issue 12: the entry marks' budget is +20 ns). Each hook is a
separate library with its own tables; ctypes loads them side by side.
"""
import argparse
import ctypes
import os
import platform
import sys

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("hooks", nargs="*", default=[os.path.join(
    os.environ.get("SPYRESHIM_BUILD") or os.path.join(here, "..", "build"), "tests", "libpystackhook.so")])
ap.add_argument("--depth", type=int, default=20)
ap.add_argument("--iters", type=int, default=200000)
ap.add_argument("--repeat", type=int, default=5)
args = ap.parse_args()


def load(path):
    libs = {"gil": ctypes.PyDLL(path), "nogil": ctypes.CDLL(path)}
    for lib in libs.values():
        lib.pystack_test_bench.restype = ctypes.c_double
        lib.pystack_test_bench.argtypes = [ctypes.c_uint, ctypes.c_uint]
        lib.pystack_test_capture.restype = ctypes.c_uint
        lib.pystack_test_frames.restype = ctypes.c_size_t
        lib.pystack_test_frames.argtypes = [ctypes.c_uint, ctypes.c_char_p, ctypes.c_size_t]
    return libs


hooks = [(path, load(path)) for path in args.hooks]


def frames_now():
    n, f = 0, sys._getframe(1)
    while f is not None:
        n, f = n + 1, f.f_back
    return n


def at_depth(want, fn):
    """Calls fn from a stack of exactly `want` Python frames."""
    if frames_now() + 1 >= want:
        return fn()
    return at_depth(want, fn)


print(f"{platform.python_implementation()} {platform.python_version()} "
      f"({'free-threaded' if not getattr(sys, '_is_gil_enabled', lambda: True)() else 'GIL'}), "
      f"{args.depth} frames, {args.iters} captures x {args.repeat}")
for path, libs in hooks:
    # The stack really is --depth frames deep (and no deeper: the bound is the depth asked).
    sid = at_depth(args.depth, lambda: libs["gil"].pystack_test_capture(1000))
    got = libs["gil"].pystack_test_frames(sid, ctypes.create_string_buffer(1 << 16), 1 << 16)
    if got != args.depth:
        sys.exit(f"{path}: the stack has {got} frames, not {args.depth}")
best = {}
for _ in range(args.repeat):
    for path, libs in hooks:
        for mode, lib in libs.items():
            ns = at_depth(args.depth, lambda: lib.pystack_test_bench(args.depth, args.iters))
            if ns < 0:
                sys.exit("no stack captured: is this CPython 3.8-3.15?")
            key = (path, mode)
            best[key] = ns if key not in best else min(best[key], ns)
for path, _ in hooks:
    if len(hooks) > 1:
        print(f" {path}")
    for mode in ("gil", "nogil"):
        print(f"  {mode:6} {best[(path, mode)]:8.1f} ns per capture (best of {args.repeat})")
