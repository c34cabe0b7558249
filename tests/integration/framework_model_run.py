"""One framework model (tests/frameworks/model.c) driven through ctypes on
the CUDA stand-in driver, under the shim: device memory held only by
reference cycles whose finalizers call the model's free, until one request
finds the device full. Used by test_gc_frameworks.py and bench/gc_policy.py.

    python framework_model_run.py MODEL.so --driver libcuda.so.1
        [--gil] [--runs N] [--buffers K] [--bytes B] [--busy-thread]

Each run: gc off; K buffers of B bytes made and dropped into cycles (the
device holds fewer than K: a request finds it full); then gc.collect() to
start the next run clean. Prints one JSON line:

    {"runs": N, "rescued": <runs where every request succeeded>,
     "refused": <runs where a request got an error>, "codes": [<errors seen>],
     "collections": <collections seen by gc.callbacks, all threads>,
     "fail_ns": [<per refused run: ns from the failing call to its answer>],
     "answer_ns": [<per call that found the device full (failed, or a
                   collection ran during it): ns from the call to its answer>],
     "retry_ok": <refused runs whose retry after the framework's own
                  collection (what an OOM observer does) succeeded>,
     "lock_kind": <model_lock_kind()>}

--live keeps every buffer alive (the device is truly full) and --again N
repeats the failing call N times, as a framework's own release-and-retry
does (PyTorch and CuPy make 3 driver calls for one allocation).

--capture begins a capture (global mode) on a new stream before the runs;
relaxed also puts this thread in relaxed mode, as PyTorch does around its
allocations while capturing.

--gil calls through ctypes.PyDLL (the GIL held across the call, as under
torch.compile); otherwise ctypes.CDLL (released). --busy-thread runs a
second thread allocating and freeing through the model meanwhile.
"""
import argparse
import ctypes
import gc
import json
import sys
import threading
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--driver", required=True)
    p.add_argument("--gil", action="store_true")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--buffers", type=int, default=24)
    p.add_argument("--bytes", type=int, default=1 << 20)
    p.add_argument("--busy-thread", action="store_true")
    p.add_argument("--live", action="store_true",
                   help="keep the buffers alive (nothing is garbage: truly out of memory)")
    p.add_argument("--capture", choices=["none", "global", "relaxed"], default="none",
                   help="begin a stream capture first; relaxed: this thread's mode relaxed too")
    p.add_argument("--again", type=int, default=0,
                   help="driver calls repeated after a failure, as a framework's own retries")
    a = p.parse_args()

    cu = ctypes.CDLL(a.driver)
    assert cu.cuInit(0) == 0
    ctx = ctypes.c_void_p()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    if a.capture != "none":
        stream = ctypes.c_void_p()
        assert cu.cuStreamCreate(ctypes.byref(stream), 0) == 0
        assert cu.cuStreamBeginCapture_v2(stream, 0) == 0          # global
        if a.capture == "relaxed":
            mode = ctypes.c_int(2)                                  # as PyTorch's allocator does
            assert cu.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0
    model = (ctypes.PyDLL if a.gil else ctypes.CDLL)(a.model)
    model.model_alloc.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64)]
    model.model_free.argtypes = [ctypes.c_uint64]

    collections = [0]

    def on_gc(phase, info):
        if phase == "start":
            collections[0] += 1
    gc.callbacks.append(on_gc)

    class Buf:
        def __init__(self, ptr):
            self.ptr = ptr
            self.me = self          # only the collector frees it

        def __del__(self):
            model.model_free(self.ptr)

    stop = threading.Event()

    def busy():
        cu.cuCtxSetCurrent(ctx)
        p = ctypes.c_uint64()
        while not stop.is_set():
            if model.model_alloc(4096, ctypes.byref(p)) == 0:
                model.model_free(p.value)

    t = None
    if a.busy_thread:
        t = threading.Thread(target=busy, daemon=True)
        t.start()

    out = {"runs": a.runs, "rescued": 0, "refused": 0, "codes": [], "collections": 0,
           "fail_ns": [], "answer_ns": [], "retry_ok": 0, "lock_kind": model.model_lock_kind()}
    ptr = ctypes.c_uint64()
    for _ in range(a.runs):
        gc.disable()
        failed = False
        live = []
        for _ in range(a.buffers):
            c0 = collections[0]
            t0 = time.perf_counter_ns()
            rc = model.model_alloc(a.bytes, ctypes.byref(ptr))
            t1 = time.perf_counter_ns()
            if rc != 0 or collections[0] != c0:
                out["answer_ns"].append(t1 - t0)
            if rc != 0:
                failed = True
                out["fail_ns"].append(t1 - t0)
                if rc not in out["codes"]:
                    out["codes"].append(rc)
                for _ in range(a.again):
                    if model.model_alloc(a.bytes, ctypes.byref(ptr)) == 0:
                        model.model_free(ptr.value)
                live.clear()
                # The framework's own rescue (an OOM observer): collect after
                # the call returned, with no lock held, and retry once.
                gc.collect()
                if model.model_alloc(a.bytes, ctypes.byref(ptr)) == 0:
                    out["retry_ok"] += 1
                    Buf(ptr.value)
                break
            b = Buf(ptr.value)
            if a.live:
                live.append(b)
            del b
        out["refused" if failed else "rescued"] += 1
        live.clear()
        gc.enable()
        gc.collect()
    stop.set()
    if t:
        t.join()
    out["collections"] = collections[0]
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
