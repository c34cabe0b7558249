#!/usr/bin/env python3
"""Time from the failing driver call to its answer, per framework model
(tests/frameworks/model.c), before and after the per-call GC policy
(python_gc/gc/policy.c, docs/frameworks.md).

"before" is SPYRESHIM_GC=thread: what the shim did for every caller
without the GIL before the policy (the collection on the shim's thread,
waited for up to SPYRESHIM_GC_TIMEOUT_MS; for a caller holding its lock the
finalizers wait for that lock, so the wait is the whole timeout). "after"
is the default, SPYRESHIM_GC=auto. The GIL is released across the call
(ctypes.CDLL), as PyTorch's bindings, RMM, XLA and numba do.

    SPYRESHIM_BUILD=build /usr/bin/python3 bench/gc_policy.py [--runs N] [--timeout-ms MS]

Prints one line per model: the median and the largest answer time in ms,
and the outcome (rescued: the allocation succeeded; refused: out-of-memory
returned, the framework's own retry follows).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("SPYRESHIM_BUILD", REPO / "build")).resolve()
RUNNER = REPO / "tests" / "integration" / "framework_model_run.py"

MODELS = [
    ("PyTorch caching (recursive mutex)", "libc10_cuda.so", {}),
    ("PyTorch release_lock_on_cudamalloc", "libc10_cuda.so",
     {"PYTORCH_CUDA_ALLOC_CONF": "release_lock_on_cudamalloc:True"}),
    ("PyTorch uncached (no lock)", "libc10_cuda.so", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}),
    ("RMM pool (plain mutex)", "librmm.so", {}),
    ("XLA BFC (plain mutex)", "xla_extension.so", {}),
    ("XLA platform (no lock)", "xla_extension.so", {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}),
    ("numba / cuda.bindings (no lock)", "cuda.bindings", {}),
]


def run(model, env, runs, timeout_ms, mode):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("SPYRESHIM_", "PYTORCH_", "XLA_", "CUDASTANDIN_"))}
    e.update({"LD_PRELOAD": str(BUILD / "libspyreshim.so"), "CUDASTANDIN_MEMORY": "16M",
              "SPYRESHIM_GC": mode, "SPYRESHIM_GC_TIMEOUT_MS": str(timeout_ms),
              "SPYRESHIM_OOM_REPORT": "0", "SPYRESHIM_LOG": "off"})
    e.update(env)
    r = subprocess.run([sys.executable, str(RUNNER), str(model), "--driver",
                        str(BUILD / "tests" / "cudadrv" / "libcuda.so.1"), "--runs", str(runs)],
                       env=e, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"{model}: {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--timeout-ms", type=int, default=2000, help="SPYRESHIM_GC_TIMEOUT_MS")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "cuda" / "bindings"
        d.mkdir(parents=True)
        bindings = d / "cydriver.cpython-311-x86_64-linux-gnu.so"
        shutil.copy(BUILD / "tests" / "libnolock_model.so", bindings)
        print(f"{'model':38} {'before (thread)':>30}   {'after (auto)':>30}")
        for name, lib, env in MODELS:
            model = bindings if lib == "cuda.bindings" else BUILD / "tests" / lib
            cells = []
            for mode in ("thread", "auto"):
                out = run(model, env, a.runs, a.timeout_ms, mode)
                ns = out["answer_ns"] or [0]
                what = ("rescued" if out["rescued"] == a.runs else
                        "refused" if out["refused"] == a.runs else "mixed")
                cells.append(f"{statistics.median(ns) / 1e6:9.3f} ms (max {max(ns) / 1e6:8.3f}) "
                             f"{what:7}")
            print(f"{name:38} {cells[0]:>30}   {cells[1]:>30}", flush=True)


if __name__ == "__main__":
    main()
