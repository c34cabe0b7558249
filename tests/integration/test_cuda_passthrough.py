"""Memory the shim passes through to the CUDA driver and watches, under
its limits (shim/alloc/charge.c, docs/cuda.md): managed memory under the
device's SPYRESHIM_LIMIT together with the served blocks, host-pinned
memory under SPYRESHIM_HOST_LIMIT, each failing with out-of-memory only
after the pressure event; managed memory dropped with its context and by
cuMemFreeAsync. On the stand-in driver (tests/cudadrv)."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cuda_driver import built_tests, run, shim_env, stats  # noqa: E402


def run_pt(check, tmp_path, **env):
    r = run([built_tests() / "cuda_passthrough", check], shim_env(tmp_path, **env))
    assert r.returncode == 0 and f"{check} ok" in r.stdout, r.stdout + r.stderr
    return r, stats(tmp_path)


def callbacks(r):
    return int(next(l.split()[1] for l in r.stdout.splitlines() if l.startswith("callbacks")))


def test_managed_memory_is_under_the_device_limit_after_the_pressure_event(shim_lib, tmp_path):
    """3 MiB managed, then 2 MiB more under a 4 MiB limit: the pressure
    callback frees the first and the second succeeds; 3 MiB more fails with
    CUDA_ERROR_OUT_OF_MEMORY after callbacks that free nothing; a served
    block shares the same limit (the program checks the codes)."""
    r, s = run_pt("managedlimit", tmp_path, SPYRESHIM_LIMIT="4M")
    assert callbacks(r) >= 2, r.stdout
    # The served request that failed next to the managed memory: the limit
    # stopped it, managed bytes included.
    assert "(verdict: limit)" in r.stderr, r.stderr
    assert (s["managed_allocs"], s["managed_frees"], s["managed_bytes"]) == (3, 3, 0), s
    fam = {(f["family"], f["device"]): f for f in s["passthrough"]}
    assert fam[("cuda-managed", 0)]["peak_bytes"] == 3 << 20, s["passthrough"]


def test_host_pinned_memory_is_under_the_host_limit_not_the_device_limit(shim_lib, tmp_path):
    """The same with cuMemHostAlloc, cuMemAllocHost_v2 and
    cuMemHostRegister_v2 under SPYRESHIM_HOST_LIMIT=4M, with a device limit
    of 1 MiB that host memory is not under."""
    r, s = run_pt("hostlimit", tmp_path, SPYRESHIM_LIMIT="1M", SPYRESHIM_HOST_LIMIT="4M")
    assert callbacks(r) >= 2, r.stdout
    assert (s["host_pinned_allocs"], s["host_pinned_frees"], s["host_pinned_bytes"]) == \
        (3, 3, 0), s


# Without a host limit the second request needs no pressure event: the
# check stops there, at its first expectation of one.
NO_LIMIT = "hostlimit FAIL: the callback ran and freed (0)"


def test_without_a_host_limit_host_pinned_memory_is_not_limited(shim_lib, tmp_path):
    r = run([built_tests() / "cuda_passthrough", "hostlimit"],
            shim_env(tmp_path, SPYRESHIM_LIMIT="1M"))
    assert NO_LIMIT in r.stdout, r.stdout + r.stderr


def test_a_bad_host_limit_falls_back_to_none_with_a_warning(shim_lib, tmp_path):
    r = run([built_tests() / "cuda_passthrough", "hostlimit"],
            shim_env(tmp_path, SPYRESHIM_HOST_LIMIT="lots"))
    assert 'SPYRESHIM_HOST_LIMIT="lots" is invalid' in r.stderr, r.stderr
    assert len([l for l in r.stderr.splitlines() if "SPYRESHIM_HOST_LIMIT" in l]) == 1, r.stderr
    assert NO_LIMIT in r.stdout, r.stdout + r.stderr


def test_a_pressure_callbacks_own_requests_past_the_limits_fail_at_once(shim_lib, tmp_path):
    """Managed and host-pinned requests made by a pressure callback (a
    finalizer during a collection) past SPYRESHIM_LIMIT and
    SPYRESHIM_HOST_LIMIT: out-of-memory at once, no pressure event of
    their own, no wait for the account's lock."""
    run_pt("nested", tmp_path, SPYRESHIM_LIMIT="4M", SPYRESHIM_HOST_LIMIT="4M")


def test_context_teardown_drops_its_managed_memory(shim_lib, tmp_path):
    """Managed memory of a destroyed context and of a reset primary context
    is freed by the driver: not a leak at exit, counted as freed, its
    charge given back."""
    report = tmp_path / "leaks.json"
    r, s = run_pt("teardown", tmp_path, SPYRESHIM_LEAK_CHECK=1, SPYRESHIM_REPORT=report)
    assert "detected device memory leaks" not in r.stderr, r.stderr
    assert json.loads(report.read_text())["groups"] == []
    assert (s["managed_allocs"], s["managed_frees"], s["managed_bytes"]) == (2, 2, 0), s


def test_free_async_of_managed_memory_drops_its_record(shim_lib, tmp_path):
    report = tmp_path / "leaks.json"
    r, s = run_pt("freeasync", tmp_path, SPYRESHIM_LEAK_CHECK=1, SPYRESHIM_REPORT=report)
    assert json.loads(report.read_text())["groups"] == [], r.stderr
    assert (s["managed_allocs"], s["managed_frees"], s["managed_bytes"]) == (1, 1, 0), s


def cudart_env(tmp_path, **extra):
    env = shim_env(tmp_path, CUDASTANDIN_DEVICES="1", SPYRESHIM_LIMIT="4M", **extra)
    env["LD_LIBRARY_PATH"] = str(built_tests() / "cudadrv")
    return env


def test_the_runtimes_host_and_managed_memory_reach_the_hooks_through_the_driver(
        shim_lib, tmp_path):
    """The stand-in runtime (tests/cuda_standin) fetches the driver's
    functions through cuGetProcAddress, as the real runtime does: its
    cudaHostAlloc, cudaMallocHost, cudaMallocManaged are counted, freed by
    cudaFreeHost and cudaFree, and managed memory is under the limit."""
    r = run([built_tests() / "cudart_hostmem"], cudart_env(tmp_path))
    assert r.returncode == 0 and "cudart ok" in r.stdout, r.stdout + r.stderr
    s = stats(tmp_path)
    assert (s["managed_allocs"], s["managed_frees"], s["managed_bytes"]) == (1, 1, 0), s
    assert (s["host_pinned_allocs"], s["host_pinned_frees"], s["host_pinned_bytes"]) == \
        (2, 2, 0), s


def test_the_runtimes_leaked_host_and_managed_memory_is_reported(shim_lib, tmp_path):
    report = tmp_path / "leaks.json"
    r = run([built_tests() / "cudart_hostmem", "leak"],
            cudart_env(tmp_path, SPYRESHIM_LEAK_CHECK=1, SPYRESHIM_REPORT=report))
    assert "cudart ok" in r.stdout, r.stdout + r.stderr
    groups = json.loads(report.read_text())["groups"]
    got = sorted((g["runtime"], g["bytes"]) for g in groups)
    assert got == [("cuda-host-pinned", 65536), ("cuda-host-pinned", 1 << 20),
                   ("cuda-managed", 2 << 20)], got
    for g in groups:
        assert any(f["function"] == "cudart_allocated_here" for f in g["frames"]), g
