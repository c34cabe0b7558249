"""Device arrays held only by reference cycles, allocated by numba with the
garbage collector off, until the device runs out or the loop completes.

Run with /usr/bin/python3 (Debian's numba) and NUMBA_CUDA_DRIVER pointing
at a driver (the stand-in: <build>/tests/cudadrv/libcuda.so.1). Prints one
JSON line and exits 0 whatever the outcome, so that callers decide what
they expect: without the shim numba raises its out-of-memory CudaAPIError
(code 2; its own retry only flushes deallocations it already knows of, and
garbage in cycles is not among them); with a shim that collects garbage
under pressure the loop completes.

    {"outcome": "oom" | "completed", "error_code": 2 | null,
     "iterations": <arrays made>, "array_bytes": N, "total": <device bytes>,
     "free_before": ..., "error": "<message>" | null}

Exits 1 (with a traceback) only on something else going wrong.
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
    p.add_argument("--array-bytes", type=int, default=1 << 20)
    p.add_argument("--iterations", type=int, default=1000)
    args = p.parse_args()

    import numpy as np
    from numba import cuda
    from numba.cuda.cudadrv.driver import CudaAPIError

    free_before, total = cuda.current_context().get_memory_info()
    gc.disable()
    result = {"outcome": "completed", "error_code": None, "iterations": 0,
              "array_bytes": args.array_bytes, "total": total,
              "free_before": free_before, "error": None}
    try:
        for i in range(args.iterations):
            Node(cuda.device_array(args.array_bytes, dtype=np.uint8))
            result["iterations"] = i + 1
    except CudaAPIError as e:
        result.update(outcome="oom" if e.code == 2 else "error", error_code=e.code,
                      error=str(e))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
