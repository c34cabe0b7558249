"""Stream-ordered allocation (cuMemAllocAsync, cuMemAllocFromPoolAsync,
their _ptsz forms, cuMemFreeAsync, pools: family cuda-async) and stream
capture under the shim, on the stand-in driver (tests/cudadrv), and the
random model test of every family (docs/cuda.md). The C programs check the
driver's answers (tests/programs/cuda_async.c, cuda_model.c); these tests
check what the shim made of them: statistics, leak report, trace."""
import json
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cuda_driver import _trace_module, built_tests, run, shim_env, stats  # noqa: E402


def run_async(check, tmp_path, **env):
    r = run([built_tests() / "cuda_async", check], shim_env(tmp_path, **env))
    assert r.returncode == 0 and f"{check} ok" in r.stdout, r.stdout + r.stderr
    return r, stats(tmp_path)


def callbacks(r):
    return int(next(l.split()[1] for l in r.stdout.splitlines() if l.startswith("callbacks")))


def family(s, name, device):
    fam = {(f["family"], f["device"]): f for f in s["passthrough"]}
    return fam[(name, device)]


def test_async_memory_is_under_the_device_limit_after_the_pressure_event(shim_lib, tmp_path):
    """3 MiB by cuMemAllocAsync, then 2 MiB more under a 4 MiB limit: the
    pressure callback frees the first (cuMemFreeAsync) and the second
    succeeds; 3 MiB more from the pool fails with out-of-memory after
    callbacks that free nothing (the program checks the codes)."""
    r, s = run_async("limit", tmp_path, SPYRESHIM_LIMIT="4M")
    assert callbacks(r) >= 2, r.stdout
    assert (s["async_allocs"], s["async_frees"], s["async_bytes"]) == (3, 3, 0), s
    assert family(s, "cuda-async", 0)["peak_bytes"] == 3 << 20, s["passthrough"]
    assert s["allocs"] == 0, "nothing served: the driver's pools serve it"


def test_without_a_limit_no_pressure_event(shim_lib, tmp_path):
    r = run([built_tests() / "cuda_async", "limit"], shim_env(tmp_path))
    assert "limit FAIL" in r.stdout and "the callback ran and freed (0)" in r.stdout, r.stdout


def test_leaked_async_memory_reported_with_family_and_stack(shim_lib, tmp_path):
    report = tmp_path / "leaks.json"
    r = run([built_tests() / "cuda_async", "leak"],
            shim_env(tmp_path, SPYRESHIM_LEAK_CHECK=1, SPYRESHIM_REPORT=report))
    assert "leak ok" in r.stdout, r.stdout + r.stderr
    assert r.returncode != 0 and "detected device memory leaks" in r.stderr, r.stderr
    groups = json.loads(report.read_text())["groups"]
    assert sorted(g["bytes"] for g in groups if g["runtime"] == "cuda-async") == \
        [64 << 10, 1 << 20], groups
    for g in groups:
        assert g["runtime"] == "cuda-async", g
        assert g["frames"][0]["function"] == "leak_async_here", g
    s = stats(tmp_path)
    assert (s["async_allocs"], s["async_frees"], s["async_bytes"]) == \
        (3, 1, (1 << 20) + (64 << 10)), s


def test_trace_shows_async_memory_and_the_pool_trim(shim_lib, tmp_path):
    """Each stream-ordered allocation and free on the pseudo-device
    cuda-async with its site, and cuMemPoolTrimTo as a pool trim event
    (kind 9) with the bytes the pool gave back."""
    tr = tmp_path / "t.trace"
    r, s = run_async("trim", tmp_path, SPYRESHIM_TRACE=tr)
    trimmed = int(next(l.split()[1] for l in r.stdout.splitlines() if l.startswith("trimmed")))
    assert trimmed == (1 << 20) + (256 << 10)
    trace = _trace_module()
    t = trace.load(str(tr))
    assert trace.KIND_NAMES[9] == "pool trim"
    events = [(t.kind[i], t.device_name(t.dev[i]), t.size[i]) for i in range(len(t))]
    assert [e for e in events if e[0] == 9] == [(9, "cuda-async", trimmed)], events
    allocs = [i for i in range(len(t)) if t.kind[i] == trace.ALLOC]
    frees = [i for i in range(len(t)) if t.kind[i] == trace.FREE]
    assert sorted(t.size[i] for i in allocs) == [256 << 10, 1 << 20], events
    assert len(frees) == 2 and all(t.dev[i] == 0xfb for i in allocs + frees), events
    assert all("check_trim" in t.site_label(t.site[i]) for i in allocs), \
        [t.site_label(t.site[i]) for i in allocs]
    # The trim comes after the frees in the allocator's order.
    trim = next(i for i in range(len(t)) if t.kind[i] == 9)
    assert all(t.seq[trim] > t.seq[i] for i in frees)


def test_frees_on_other_streams_wait_for_their_event(shim_lib, tmp_path):
    """A block freed on stream 1 while stream 1 still has work queued is not
    handed to stream 2; stream 1 reuses it at once; stream 2 once the
    free's event completed (the program checks the addresses), with the
    shim watching every call."""
    r, s = run_async("streams", tmp_path, CUDASTANDIN_OP_DELAY_US="300000")
    assert (s["async_allocs"], s["async_frees"], s["async_bytes"]) == (4, 4, 0), s


def test_capture_serves_from_what_it_has_and_never_waits_or_collects(shim_lib, tmp_path):
    """During a global capture begun on this thread: a served request the
    shim's region can hold is served, one that needs a region gets the
    driver's capture error (900), a served free waits for nothing, async
    allocation is legal, async over the limit is out-of-memory without a
    pressure callback, pinned and managed memory get the driver's 900;
    the stand-in counts no synchronizing call during the capture (the
    program checks all that); afterwards regions and waits again."""
    r, s = run_async("capture", tmp_path, SPYRESHIM_LIMIT="4M")
    assert callbacks(r) == 0, r.stdout
    assert s["async_allocs"] == 1 and s["async_bytes"] == 0, s
    assert s["managed_allocs"] == 0 and s["host_pinned_allocs"] == 0, s


def test_capture_in_relaxed_mode_is_out_of_memory_without_a_collection(shim_lib, tmp_path):
    r, s = run_async("relaxed", tmp_path, SPYRESHIM_LIMIT="4M")
    assert callbacks(r) == 0, r.stdout


ROUTES = textwrap.dedent("""
    import ctypes, sys
    cu = ctypes.CDLL(sys.argv[1])
    assert cu.cuInit(0) == 0
    ctx = ctypes.c_void_p()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    P = ctypes.c_uint64
    ALLOC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(P), ctypes.c_size_t, ctypes.c_void_p)
    FREE = ctypes.CFUNCTYPE(ctypes.c_int, P, ctypes.c_void_p)
    def fetch(name, proto, flags):
        fn = ctypes.c_void_p()
        st = ctypes.c_int()
        assert cu.cuGetProcAddress_v2(name.encode(), ctypes.byref(fn), 12000,
                                      ctypes.c_uint64(flags), ctypes.byref(st)) == 0, name
        return proto(fn.value)
    p = P()
    routes = [cu.cuMemAllocAsync, cu.cuMemAllocAsync_ptsz,
              fetch("cuMemAllocAsync", ALLOC, 0), fetch("cuMemAllocAsync", ALLOC, 2)]
    frees = [cu.cuMemFreeAsync, fetch("cuMemFreeAsync", FREE, 2)]
    for i, alloc in enumerate(routes):
        assert alloc(ctypes.byref(p), 4096 << i, None) == 0
        assert frees[i % 2](p, None) == 0
    assert cu.cuMemAllocAsync(ctypes.byref(p), 1 << 20, None) == 0   # live at exit
    print("routes ok")
    """)


def test_every_route_reaches_the_watched_functions(shim_lib, tmp_path):
    """cuMemAllocAsync by dlsym on the driver's handle (plain and _ptsz)
    and by cuGetProcAddress_v2 (default and per-thread stream flags), freed
    by dlsym's and the per-thread cuMemFreeAsync: each counted once."""
    prog = tmp_path / "routes.py"
    prog.write_text(ROUTES)
    driver = built_tests() / "cudadrv" / "libcuda.so.1"
    r = run(["/usr/bin/python3", prog, driver], shim_env(tmp_path))
    assert r.returncode == 0 and "routes ok" in r.stdout, r.stdout + r.stderr
    s = stats(tmp_path)
    assert (s["async_allocs"], s["async_frees"], s["async_bytes"]) == (5, 4, 1 << 20), s


MODEL_OPS = 100000


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_model_of_every_family(shim_lib, tmp_path, seed):
    """10^5 seeded operations over two devices: served, stream-ordered on
    three streams, managed, host-pinned and VMM physical allocations and frees, pool
    trims, synchronizations, captures begun and ended in between, against a
    model of live bytes per family and device (tests/programs/cuda_model.c
    checks after every operation that nothing escapes SPYRESHIM_LIMIT or
    SPYRESHIM_HOST_LIMIT and that the shim's statistics equal the model,
    and at the end that no synchronizing call was made during a capture).
    Here: the statistics file per family and device agrees with the
    model's counts, and no region was given back during a capture."""
    r = run([built_tests() / "cuda_model", seed, MODEL_OPS, "8M", "8M"],
            shim_env(tmp_path, SPYRESHIM_LIMIT="8M", SPYRESHIM_HOST_LIMIT="8M"))
    assert r.returncode == 0 and f"ok after {MODEL_OPS} operations" in r.stdout, \
        r.stdout[-3000:] + r.stderr[-3000:]
    assert "refused to free region" not in r.stderr, r.stderr[-3000:]
    s = stats(tmp_path)
    model = {}
    for line in r.stdout.splitlines():
        if line.startswith("model "):
            _, fam, dev, allocs, frees = line.split()
            model[(fam, int(dev))] = (int(allocs), int(frees))
    assert {k for k in model if k[0] != "served"} == \
        {("cuda-async", 0), ("cuda-async", 1), ("cuda-managed", 0), ("cuda-managed", 1),
         ("cuda-host-pinned", -1), ("cuda-vmm", 0), ("cuda-vmm", 1)}, model
    for f in s["passthrough"]:
        assert (f["allocs"], f["frees"]) == model[(f["family"], f["device"])], f
        assert f["bytes"] == 0, f
        if f["family"] != "cuda-host-pinned":
            assert f["peak_bytes"] <= 8 << 20, f
    served = {int(d["name"].split(":")[1]): (d["allocs"], d["frees"]) for d in s["runtimes"]}
    assert served == {0: model[("served", 0)], 1: model[("served", 1)]}, (served, model)


RUNTIME = textwrap.dedent("""
    import ctypes, sys
    rt = ctypes.CDLL(sys.argv[1])
    p, q, pool = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    assert rt.cudaMallocAsync(ctypes.byref(p), ctypes.c_size_t(1 << 20), None) == 0
    assert rt.cudaDeviceGetDefaultMemPool(ctypes.byref(pool), 0) == 0
    assert rt.cudaMallocFromPoolAsync(ctypes.byref(q), ctypes.c_size_t(4096), pool, None) == 0
    assert rt.cudaFreeAsync(p, None) == 0
    print("runtime ok")
    """)


def test_the_runtime_reaches_the_watched_driver_functions(shim_lib, tmp_path):
    """The stand-in runtime's cudaMallocAsync, cudaMallocFromPoolAsync and
    cudaFreeAsync reach the driver as the real runtime does (dlopen of
    libcuda.so.1, cuGetProcAddress_v2 for everything): the shim counts them
    and the one left live is a leak of family cuda-async."""
    prog = tmp_path / "rt.py"
    prog.write_text(RUNTIME)
    report = tmp_path / "leaks.json"
    # The block a ctypes program never frees is live when the interpreter
    # begins to shut down: held until exit, which "held" counts as leaked.
    env = shim_env(tmp_path, SPYRESHIM_LEAK_CHECK="held", SPYRESHIM_REPORT=report,
                   LD_LIBRARY_PATH=built_tests() / "cudadrv")
    r = run(["/usr/bin/python3", prog, built_tests() / "libcudart_standin.so"], env)
    assert "runtime ok" in r.stdout, r.stdout + r.stderr
    s = stats(tmp_path)
    assert (s["async_allocs"], s["async_frees"], s["async_bytes"]) == (2, 1, 4096), s
    groups = json.loads(report.read_text())["groups"]
    assert [(g["runtime"], g["bytes"]) for g in groups] == [("cuda-async", 4096)], groups
