"""A small training-like loop on the simulated device (simdev) whose steps
leave reference cycles holding device tensors, as real models do through
autograd-style closures and saved tracebacks, with Python's cyclic
collector disabled, as many training scripts do.

Without spyreshim the device fills up with unreachable tensors and the loop
dies with simdev.OutOfMemoryError; with LD_PRELOAD=libspyreshim.so the
shim's pressure callback runs the collector when the device is full and the
loop completes. Prints one line per few steps and, at the end, the shim's
statistics when the shim is loaded.

    SIMDEV_MEMORY=256M [LD_PRELOAD=build/libspyreshim.so] python3 scripts/demo_train.py
"""
import gc
import os
import sys
import time

os.environ.setdefault("SIMDEV_MEMORY", "256M")  # read by libsimdev on first use
import simdev  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import spyreshim  # noqa: E402  (the ctypes wrapper of the public API; never loads the shim)

MiB = 1 << 20
STEPS = int(os.environ.get("DEMO_STEPS", "60"))
BATCH = 4 * MiB          # one activation
LAYERS = 4


class Node:
    """An autograd-like graph node: its backward closure refers to the node
    itself and to the activation it saved, so each step's graph is a cycle
    that only the cyclic collector frees."""

    def __init__(self, saved, parent):
        self.saved = saved
        self.parent = parent
        self.backward = lambda grad: (self, self.saved, grad)


class Overflow(Exception):
    pass


def forward(params, step):
    x = simdev.Tensor(BATCH)
    x.fill(step % 256)
    node = None
    for w in params:
        act = simdev.Tensor(BATCH)          # the layer's output
        node = Node(act, node)
        x = act
    return x, node


def check_overflow(act, step, log):
    """Every few steps a numerical check raises and the handler keeps the
    exception: its traceback's frames hold the step's activation, and the
    frame holds the list that holds the exception."""
    try:
        if step % 3 == 0:
            raise Overflow(f"loss scale overflow at step {step}")
    except Overflow as e:
        log.append(e)                       # e -> traceback -> frame -> log -> e


def main():
    gc.disable()
    free, total = simdev.mem_info()
    params = [simdev.Tensor(8 * MiB) for _ in range(LAYERS)]
    for i, p in enumerate(params):
        p.fill(i + 1)
    print(f"demo: {STEPS} steps, device {total // MiB} MiB, {LAYERS} layers of "
          f"{BATCH // MiB} MiB activations, gc.disable()d")
    t0 = time.monotonic()
    for step in range(1, STEPS + 1):
        try:
            out, graph = forward(params, step)
            check_overflow(out, step, [])
            del out, graph                  # unreachable now, but still in cycles
        except simdev.OutOfMemoryError as e:
            free, total = simdev.mem_info()
            print(f"step {step:3d}: {type(e).__module__}.{type(e).__name__}: {e} "
                  f"({(total - free) // MiB} of {total // MiB} MiB in use, "
                  f"most of it unreachable garbage)")
            return 1
        if step % 10 == 0 or step == 1:
            free, total = simdev.mem_info()
            print(f"step {step:3d}/{STEPS}: device {(total - free) // MiB:4d}/{total // MiB} MiB "
                  f"in use, {time.monotonic() - t0:6.2f} s")
    for i, p in enumerate(params):
        assert p.read()[:1] == bytes([i + 1]), "a parameter lost its contents"
    print(f"demo: completed {STEPS} steps in {time.monotonic() - t0:.2f} s; parameters intact")
    if spyreshim.available():
        s = spyreshim.stats()
        print(f"spyreshim: {s['pressure_events']} pressure events, {s['gc_collections']} "
              f"collections ({s['gc_time_ns'] / 1e6:.1f} ms), "
              f"{s['gc_recovered_bytes'] / MiB:.0f} MiB recovered, {s['gc_timeouts']} timeouts, "
              f"{s['gc_skipped']} skipped, {s['gc_backoff_skips']} back-off skips, "
              f"{s['failed_allocs']} failed allocations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
