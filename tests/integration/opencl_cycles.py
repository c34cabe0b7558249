"""PyOpenCL arrays held only by reference cycles, made with the garbage
collector off, until memory runs out or the loop completes.

Run with /usr/bin/python3 (Debian's python3-pyopencl) on PoCL. Prints one
JSON line and exits 0 when the loop completes or OpenCL answers
CL_MEM_OBJECT_ALLOCATION_FAILURE, so that callers decide what they expect.
PoCL itself enforces no limit: it allocates at a buffer's first use and,
when host memory runs out (under `ulimit -v`), aborts the process in an
assertion, which is what the test sees without the shim. With the shim its
SPYRESHIM_LIMIT is enforced in clCreateBuffer, where the pressure path
collects the cycles and the loop completes.

    {"outcome": "oom" | "completed", "iterations": <arrays made>,
     "array_bytes": N, "global_mem_size": <the device's answer>, "error": ...}
"""
import argparse
import gc
import json
import sys


class Node:
    """Keeps its array alive through a cycle: only the collector frees it."""

    def __init__(self, array):
        self.array = array
        self.me = self


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--array-bytes", type=int, default=32 << 20)
    p.add_argument("--iterations", type=int, default=64)
    args = p.parse_args()

    import numpy as np
    import pyopencl as cl
    import pyopencl.array as cla

    ctx = cl.create_some_context(interactive=False)
    queue = cl.CommandQueue(ctx)
    dev = ctx.devices[0]
    n = args.array_bytes // 4
    gc.disable()
    result = {"outcome": "completed", "iterations": 0, "array_bytes": args.array_bytes,
              "global_mem_size": dev.global_mem_size, "error": None}
    try:
        for i in range(args.iterations):
            a = cla.empty(queue, n, dtype=np.float32)
            a.fill(float(i))          # a kernel writes it: PoCL backs it now
            if i % 16 == 0:           # the values are the kernel's
                assert float(a[n - 1].get()) == float(i)
            Node(a)
            del a
            result["iterations"] = i + 1
        queue.finish()
    except cl.MemoryError as e:
        result.update(outcome="oom", error=str(e))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
