"""The garbage-collection policy (python_gc/gc/policy.c, docs/frameworks.md)
against models of each framework allocator's lock discipline at the driver
call (tests/frameworks/model.c), each built under its framework's object
name, called through ctypes on the CUDA stand-in driver with the shim
preloaded. Reference cycles hold the device memory; their finalizers call
the model's free, which takes the model's lock.

Where the policy says not to collect, the request is answered with
out-of-memory and no collection ran (the answer comes at once: the process
ends well inside the hang detector); where it says collect, the rescue
works as it always did. SPYRESHIM_MODEL_RUNS (default 40) sets the runs per
case; the closing note's 1,000-run figure is this file with
SPYRESHIM_MODEL_RUNS=1000 and both CPUs busy."""
import json
import os
import shutil
import sys

import pytest

import pythons

HERE = pythons.Path(__file__).resolve().parent
PYTHON = "/usr/bin/python3"
RUNS = int(os.environ.get("SPYRESHIM_MODEL_RUNS", "40"))


def model_path(builddir, tmp_path, name):
    t = builddir / "tests"
    if name == "cuda.bindings":
        d = tmp_path / "site" / "cuda" / "bindings"
        d.mkdir(parents=True)
        dst = d / "cydriver.cpython-311-x86_64-linux-gnu.so"
        shutil.copy(t / "libnolock_model.so", dst)
        return dst
    return t / {"torch": "libc10_cuda.so", "rmm": "librmm.so", "jax": "xla_extension.so",
                "unknown": "libnolock_model.so"}[name]


def run_model(builddir, shim_lib, tmp_path, name, env=(), args=(), runs=RUNS, python=PYTHON):
    stats = tmp_path / "stats.json"
    e = pythons._clean_env()
    e.update({"LD_PRELOAD": str(shim_lib), "CUDASTANDIN_MEMORY": "16M",
              "SPYRESHIM_STATS": str(stats), "SPYRESHIM_GC_TIMEOUT_MS": "60000",
              "SPYRESHIM_OOM_REPORT": "0"})
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING",
              "XLA_PYTHON_CLIENT_ALLOCATOR"):
        e.pop(k, None)
    e.update(dict(env))
    res = pythons.run([python, HERE / "framework_model_run.py",
                       model_path(builddir, tmp_path, name),
                       "--driver", builddir / "tests" / "cudadrv" / "libcuda.so.1",
                       "--runs", runs, *args], env=e)
    assert not res.timed_out, res.describe()
    res.check()
    out = json.loads(res.stdout.strip().splitlines()[-1])
    return out, json.loads(stats.read_text())


def shim_collections(st):
    return st["gc_inline_collections"] + st["gc_thread_collections"]


# (model, its configuration, GIL held across the call, the policy's verdict)
CASES = [
    ("torch", {}, False, "refuse"),            # recursive mutex, GIL released
    ("torch", {}, True, "inline"),             # recursive mutex, GIL held (torch.compile)
    ("torch", {"PYTORCH_CUDA_ALLOC_CONF": "release_lock_on_cudamalloc:True"}, False, "thread"),
    ("torch", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, False, "thread"),
    ("rmm", {}, False, "refuse"),              # plain mutex
    ("rmm", {}, True, "refuse"),
    ("jax", {}, False, "refuse"),              # plain mutex (BFC)
    ("jax", {}, True, "refuse"),
    ("jax", {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, False, "thread"),
    ("cuda.bindings", {}, False, "thread"),    # no lock (numba)
    ("cuda.bindings", {}, True, "inline"),
    ("unknown", {}, False, "thread"),          # today's behaviour
    ("unknown", {}, True, "inline"),
]


def case_id(c):
    name, env, gil, verdict = c
    conf = ",".join(f"{k}={v}" for k, v in env.items())
    return f"{name}{'[' + conf + ']' if conf else ''}-{'gil' if gil else 'nogil'}-{verdict}"


@pytest.fixture(autouse=True)
def _python():
    if not os.path.exists(PYTHON):
        pythons.need("/usr/bin/python3", f"{PYTHON} is not installed")


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_policy_per_model(builddir, shim_lib, tmp_path, case):
    name, env, gil, verdict = case
    out, st = run_model(builddir, shim_lib, tmp_path, name, env,
                        ["--gil"] if gil else [], runs=RUNS)
    if verdict == "refuse":
        # Every run: out-of-memory answered, and no collection in the call.
        assert out["refused"] == RUNS and out["codes"] == [2], out
        assert shim_collections(st) == 0 and st["gc_timeouts"] == 0, st
        assert st["gc_refused_by_caller"][name] >= RUNS, st
        # The framework's own rescue after the call (the OOM observer's).
        assert out["retry_ok"] == RUNS, out
    else:
        # The rescue works as it always did, where the policy says.
        assert out["rescued"] == RUNS, out
        assert st["gc_timeouts"] == 0, st
        key = "gc_inline_collections" if verdict == "inline" else "gc_thread_collections"
        assert st[key] >= RUNS and shim_collections(st) == st[key], st


@pytest.mark.parametrize("name", ["torch", "rmm", "jax"])
def test_no_deadlock_with_a_busy_thread(builddir, shim_lib, tmp_path, name):
    """A second thread allocates and frees through the model meanwhile
    (taking its lock): the failing request is still answered, every run."""
    out, st = run_model(builddir, shim_lib, tmp_path, name, {}, ["--busy-thread"], runs=RUNS)
    assert out["refused"] + out["rescued"] == RUNS, out
    assert st["gc_timeouts"] == 0 and st["pressure_wait_timeouts"] == 0, st


def test_one_collection_per_episode(builddir, shim_lib, tmp_path):
    """Truly out of memory (every buffer live), and the framework repeats
    the failing call twice (as PyTorch and CuPy do): one collection per
    failing allocation, the repeated calls answered without one."""
    runs = 5
    out, st = run_model(builddir, shim_lib, tmp_path, "cuda.bindings", {},
                        ["--live", "--again", "2"], runs=runs)
    assert out["refused"] == runs, out
    assert shim_collections(st) == runs, st
    assert st["gc_episode_skips"] >= 2 * runs, st


def test_override_thread_is_todays_stall(builddir, shim_lib, tmp_path):
    """SPYRESHIM_GC=thread forces the GC thread on the caching-allocator
    model: its finalizer waits for the lock the caller holds, so the
    request is answered only when SPYRESHIM_GC_TIMEOUT_MS passes (what auto
    avoids)."""
    out, st = run_model(builddir, shim_lib, tmp_path, "torch",
                        {"SPYRESHIM_GC": "thread", "SPYRESHIM_GC_TIMEOUT_MS": "200"}, runs=1)
    assert out["refused"] == 1, out
    assert st["gc_timeouts"] >= 1 and st["gc_mode"] == "thread", st


@pytest.mark.parametrize("mode,expect", [("off", 0), ("inline", 0), ("0", 0)])
def test_override_without_collection(builddir, shim_lib, tmp_path, mode, expect):
    """off (or 0) collects nothing; inline on a thread without the GIL
    collects nothing either (no wait for the GC thread)."""
    out, st = run_model(builddir, shim_lib, tmp_path, "cuda.bindings",
                        {"SPYRESHIM_GC": mode}, runs=2)
    assert out["refused"] == 2, out
    if mode == "inline":
        assert shim_collections(st) == expect and st["gc_mode"] == "inline", st


def test_bad_mode_warns_and_uses_auto(builddir, shim_lib, tmp_path):
    stats = tmp_path / "stats.json"
    e = pythons._clean_env()
    e.update({"LD_PRELOAD": str(shim_lib), "SPYRESHIM_GC": "sometimes",
              "SPYRESHIM_STATS": str(stats), "CUDASTANDIN_MEMORY": "16M"})
    res = pythons.run([PYTHON, HERE / "framework_model_run.py",
                       model_path(builddir, tmp_path, "torch"),
                       "--driver", builddir / "tests" / "cudadrv" / "libcuda.so.1"],
                      env=e)
    res.check()
    warn = [l for l in res.stderr.splitlines() if "SPYRESHIM_GC=" in l]
    assert len(warn) == 1 and "using the default auto" in warn[0], res.stderr
    assert json.loads(stats.read_text())["gc_mode"] == "auto"


@pytest.mark.parametrize("capture,code", [("global", 900), ("relaxed", 2)])
def test_no_collection_during_capture(builddir, shim_lib, tmp_path, capture, code):
    """During a stream capture no collection runs and the driver's answer
    stands: in global mode the driver refuses the region itself
    (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); in relaxed mode (PyTorch's,
    while capturing) the device is full and the answer is out-of-memory,
    without a collection, even for a caller the policy would collect for."""
    out, st = run_model(builddir, shim_lib, tmp_path, "unknown", {},
                        ["--capture", capture], runs=3)
    assert out["refused"] == 3 and out["codes"] == [code], out
    assert shim_collections(st) == 0, st
    if capture == "relaxed":
        assert st["gc_capture_refusals"] >= 3, st


@pytest.mark.parametrize("name,verdict", [("torch", "refuse"), ("rmm", "refuse"),
                                          ("cuda.bindings", "inline")])
def test_free_threaded_inline_only_without_a_framework_lock(builddir, shim_lib, tmp_path,
                                                          name, verdict):
    """A free-threaded build: an inline collection stops the world, so a
    caller holding a framework lock (even PyTorch's recursive one, with the
    thread attached) gets out-of-memory at once; a caller without one is
    rescued inline as before."""
    interp = pythons.get("cpython3.13t").require()
    out, st = run_model(builddir, shim_lib, tmp_path, name, {}, ["--gil"], runs=5,
                        python=interp.exe)
    assert "free-threaded" in st["gc_interpreter"], st
    if verdict == "refuse":
        assert out["refused"] == 5 and out["codes"] == [2], out
        assert shim_collections(st) == 0 and st["gc_refused_by_caller"][name] >= 5, st
    else:
        assert out["rescued"] == 5 and st["gc_inline_collections"] >= 5, st
