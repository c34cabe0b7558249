"""The shim's CUDA layer (hooks/cuda_driver.c, hooks/dlsym.c,
hooks/cuda_runtime.c) on the stand-in driver (tests/cudadrv): the three
routes to the driver, per-device arenas, the driver's free semantics,
address ranges, IPC, pitch, dlsym's RTLD_NEXT kept for other objects, and
numba's device arrays in reference cycles rescued by garbage collection."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pythons  # noqa: E402
from test_cudadrv_numba import driver, numba_env  # noqa: E402,F401  (fixture)

HERE = Path(__file__).resolve().parent


def built_tests():
    return pythons.builddir() / "tests"


def shim_env(tmp_path=None, **extra):
    env = {k: v for k, v in os.environ.items()
           if k != "LD_PRELOAD" and not k.startswith(("SPYRESHIM_", "CUDASTANDIN_"))}
    env.update(LD_PRELOAD=str(pythons.shim_lib()), CUDASTANDIN_DEVICES="2",
               CUDASTANDIN_MEMORY="64M,32M")
    if tmp_path is not None:
        env["SPYRESHIM_STATS"] = str(tmp_path / "stats.json")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(argv, env):
    return subprocess.run([str(a) for a in argv], env=env, capture_output=True, text=True,
                          timeout=pythons.HANG_S)


def stats(tmp_path):
    return json.loads((tmp_path / "stats.json").read_text())


def test_runtime_style_client_is_served_once_per_allocation(shim_lib, tmp_path):
    """cuGetProcAddress_v2 -> cuGetProcAddress at 12000 -> cuMemAlloc at
    3020, as the CUDA runtime does: every allocation is the shim's, counted
    once, on the device that was current."""
    r = run([built_tests() / "cudadrv_client"], shim_env(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    s = stats(tmp_path)
    assert s["allocs"] == 4 and s["frees"] == 4, s
    names = {d["name"]: d for d in s["runtimes"]}
    assert set(names) == {"cuda:0", "cuda:1"}
    assert names["cuda:0"]["allocs"] == 2 and names["cuda:1"]["allocs"] == 2


def test_without_the_shim_the_client_allocates_from_the_driver(tmp_path):
    env = shim_env(tmp_path)
    del env["LD_PRELOAD"]
    r = run([built_tests() / "cudadrv_client"], env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (tmp_path / "stats.json").exists()


@pytest.mark.parametrize("check", ["devices", "range", "ipc", "pitch"])
def test_served_blocks(shim_lib, tmp_path, check):
    r = run([built_tests() / "cuda_checks", check], shim_env(tmp_path))
    assert r.returncode == 0 and f"{check} ok" in r.stdout, r.stdout + r.stderr
    s = stats(tmp_path)
    assert s["allocs"] > 0 and s["allocs"] == s["frees"], s
    if check == "ipc":
        assert "cuIpcGetMemHandle" in r.stderr and "refused" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    if check == "devices":
        names = {d["name"]: d for d in s["runtimes"]}
        assert names["cuda:0"]["allocs"] == 64 and names["cuda:1"]["allocs"] == 64, names


def test_a_freed_block_is_not_reused_before_the_work_queued_on_it(shim_lib, tmp_path):
    """Six memsets queued on a non-blocking stream with a delay each, then
    the block is freed and eight blocks of the same size allocated and
    written at once through the legacy stream: were one of them the freed
    block, the memsets would overwrite its new owner's data, and the data
    check in cuda_checks fails (it does when release_block reuses at once)."""
    r = run([built_tests() / "cuda_checks", "streams"],
            shim_env(tmp_path, CUDASTANDIN_OP_DELAY_US=20000))
    assert r.returncode == 0 and "streams ok" in r.stdout, r.stdout + r.stderr
    s = stats(tmp_path)
    assert s["allocs"] == 8 * 11 and s["frees"] == 8 * 11, s
    assert s["device_waits"] >= 1, s


def run_check(check, tmp_path, **env):
    r = run([built_tests() / "cuda_checks", check], shim_env(tmp_path, **env))
    assert r.returncode == 0 and f"{check} ok" in r.stdout, r.stdout + r.stderr
    return r, stats(tmp_path)


def test_primary_context_reset_forgets_its_blocks(shim_lib, tmp_path):
    """cuDevicePrimaryCtxReset frees the context's memory in the driver:
    afterwards every block is live driver memory and keeps its bytes (the
    shim no longer serves from the regions the driver took back), and the
    block live at the reset is counted as freed by the teardown."""
    r, s = run_check("reset", tmp_path)
    assert s["context_teardown_blocks"] == 1, s
    assert s["context_teardown_bytes"] == 1 << 20, s
    assert s["allocs"] == s["frees"] + s["context_teardown_blocks"], s
    assert s["used_bytes"] == 0, s


def test_created_context_destroyed(shim_lib, tmp_path):
    r, s = run_check("destroy", tmp_path, SPYRESHIM_LEAK_CHECK=1)
    assert s["context_teardown_blocks"] == 2, s
    assert s["context_teardown_bytes"] == (1 << 20) + (1 << 18), s
    assert s["allocs"] == s["frees"] + 2, s
    # The leak check: the two blocks the driver freed with the context are
    # told as such, not as leaks.
    assert "2 block(s), 1310720 B (1.2 MiB), were freed by their context's teardown" in r.stderr, \
        r.stderr
    assert "leak" not in r.stderr.replace("(not leaks)", ""), r.stderr


def test_a_block_of_a_destroyed_context_stays_dead(shim_lib, tmp_path):
    """The stale pointer is rejected with the driver's 'invalid value' even
    though its address lies in a region the driver handed out again, and
    a trim after a failed large request leaves the new blocks alive."""
    r, s = run_check("stale", tmp_path)
    assert s["invalid_frees"] == 1, s
    assert s["context_teardown_blocks"] == 2, s


def test_the_wait_covers_every_context_of_the_device(shim_lib, tmp_path):
    """A block freed from the primary context while a created context's
    stream still writes it: reused in either context only after that work
    ran (the new owner's bytes survive)."""
    r, s = run_check("cross", tmp_path, SPYRESHIM_LIMIT="1M", CUDASTANDIN_OP_DELAY_US=20000)
    assert s["device_waits"] >= 2, s


def test_pointer_queries_describe_the_block(shim_lib, tmp_path):
    """cuPointerGetAttribute(s) and cuMemGetAddressRange agree on the block;
    buffer ids are unique and never reused; a freed block is not found and
    cannot be exported through IPC."""
    run_check("attrs", tmp_path)


def test_mem_free_async_of_a_served_block_is_served(shim_lib, tmp_path):
    r, s = run_check("freeasync", tmp_path)
    assert s["allocs"] == 1 and s["frees"] == 1 and s["invalid_frees"] == 1, s


def test_teardown_and_pointer_queries_are_served_through_cuGetProcAddress(shim_lib, tmp_path):
    """The CUDA runtime's route: every function the shim watches or answers
    comes from the shim at its ABI version (cuMemFreeAsync's per-thread
    stream variant too); a function it does not serve stays the driver's."""
    r = run([built_tests() / "cuda_checks", "procaddr"], shim_env())
    assert r.returncode == 0 and "procaddr ok" in r.stdout, r.stdout + r.stderr
    got = dict(l.split() for l in r.stdout.splitlines() if "@" in l)
    for name in ["cuCtxDestroy@4000", "cuCtxDestroy@2000", "cuDevicePrimaryCtxReset@11000",
                 "cuDevicePrimaryCtxRelease@11000", "cuDevicePrimaryCtxRetain@7000",
                 "cuPointerGetAttribute@4000", "cuPointerGetAttributes@7000",
                 "cuMemFreeAsync@11020", "cuMemFreeAsync@11020/ptds"]:
        assert got[name] == "libspyreshim.so", (name, got)
    assert got["cuMemsetD8@3020"] == "libcuda.so.1", got


def test_peak_used_is_the_peak_of_the_sum_over_devices(shim_lib, tmp_path):
    r, s = run_check("peak", tmp_path)
    assert s["peak_used_bytes"] == 1 << 20, s
    names = {d["name"]: d for d in s["runtimes"]}
    assert names["cuda:0"]["peak_used_bytes"] == 1 << 20, names
    assert names["cuda:1"]["peak_used_bytes"] == 1 << 20, names


def test_peak_used_counts_devices_holding_memory_at_once(shim_lib, tmp_path):
    """1 MiB held on each device at once, both freed before exit: the
    process's peak is 2 MiB, above either device's peak and what is live
    at exit (the peak is the process's own, not rebuilt from those)."""
    r, s = run_check("peaksum", tmp_path)
    assert s["peak_used_bytes"] == 2 << 20 and s["used_bytes"] == 0, s
    names = {d["name"]: d for d in s["runtimes"]}
    assert names["cuda:0"]["peak_used_bytes"] == names["cuda:1"]["peak_used_bytes"] == 1 << 20


def test_dlsym_on_a_driver_leaves_dlerror_clean(shim_lib):
    """The POSIX idiom on a driver that exports only the three memory
    functions: the shim's probes of the names it lacks leave no error."""
    mini = built_tests() / "libminidriver.so"
    r = run([built_tests() / "dlsym_checks", "", mini], shim_env())
    assert r.returncode == 0, r.stdout + r.stderr
    got = {l.split()[0]: l.split()[1:] for l in r.stdout.splitlines()}
    assert got["idiom"] == ["libspyreshim.so", "none"], r.stdout
    # dlvsym is covered like dlsym where the driver has the name at that
    # version, and answers as the C library where it does not.
    assert got["vsym"] == ["libspyreshim.so", "none"], r.stdout
    assert got["vsym-wrong"] == ["NULL", "error"], r.stdout


def test_dlsym_next_of_an_object_preloaded_before_the_shim(shim_lib):
    probe = built_tests() / "librtldprobe.so"
    env = shim_env(LD_PRELOAD=f"{probe}:{shim_lib}")
    r = run([built_tests() / "dlsym_checks"], env)
    assert r.returncode == 0, r.stderr
    # RTLD_NEXT from the probe: the next object after it is the shim.
    assert "next libspyreshim.so" in r.stdout, r.stdout
    assert "missing 1" in r.stdout


def test_dlsym_next_of_an_object_preloaded_after_the_shim(shim_lib):
    probe = built_tests() / "librtldprobe.so"
    env = shim_env(LD_PRELOAD=f"{shim_lib}:{probe}")
    r = run([built_tests() / "dlsym_checks"], env)
    assert r.returncode == 0, r.stderr
    assert "next libsimdev.so" in r.stdout, r.stdout
    assert "missing 1" in r.stdout


def test_dlsym_on_a_driver_handle_gets_the_served_functions_only(shim_lib):
    lib = built_tests() / "cudadrv" / "libcuda.so.1"
    r = run([built_tests() / "dlsym_checks", lib], shim_env())
    assert r.returncode == 0, r.stdout + r.stderr
    got = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    for name in ["cuMemAlloc_v2", "cuMemFree_v2", "cuMemGetInfo_v2", "cuMemAllocPitch_v2",
                 "cuGetProcAddress_v2"]:
        assert got[f"driver:{name}"] == "libspyreshim.so", (name, got)
    for name in ["cuMemsetD8_v2", "cuMemAlloc", "cuInit"]:
        assert got[f"driver:{name}"] == "libcuda.so.1", (name, got)
    assert got["driver-missing"] == "1"


def test_runtime_level_hooks_still_serve_a_runtime_without_a_driver_table(shim_lib, tmp_path):
    """The stand-in libcudart (tests/cuda_standin) has no driver behind it:
    the runtime route serves it, on device 0."""
    r = run([built_tests() / "test_cuda_hook"],
            shim_env(tmp_path, SPYRESHIM_LIMIT="64M"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_numba_device_arrays_in_cycles_complete_under_the_shim(driver, shim_lib, tmp_path):
    """With gc.disable(), numba's arrays kept by cycles: without the shim the
    loop ends in numba's out-of-memory error (test_cudadrv_numba.py); with it
    the shim's collections give the memory back and the loop completes."""
    env = numba_env(driver, CUDASTANDIN_MEMORY="64M", CUDASTANDIN_DEVICES="1",
                    LD_PRELOAD=shim_lib, SPYRESHIM_STATS=tmp_path / "stats.json")
    r = pythons.run(["/usr/bin/python3", HERE / "cudadrv_numba_cycles.py", "--iterations", "300"],
                    env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["outcome"] == "completed" and out["iterations"] == 300, out
    s = stats(tmp_path)
    assert s["gc_collections"] > 0 and s["allocs"] >= 300, s
    assert [d["name"] for d in s["runtimes"]] == ["cuda:0"]


def _trace_module():
    sys.path.insert(0, str(HERE.parent.parent))
    from spyreshim.reading import trace
    return trace


def test_managed_and_host_pinned_memory_are_passed_through_and_counted(shim_lib, tmp_path):
    """cuMemAllocManaged on each device, cuMemHostAlloc, cuMemAllocHost,
    cuMemHostRegister_v2, and cuMemAllocHost_v2 fetched through
    cuGetProcAddress and through dlsym on the driver's handle: the driver
    serves them (no region of the shim), the statistics count each family
    (managed per device, host-pinned as host memory: over 4 MiB of it under a
    4 MiB device limit), the trace shows every allocation and free with its
    site, and the frees take them off. Frees of pointers the shim has no
    record of get the driver's answer (the program checks the codes)."""
    tr = tmp_path / "t.trace"
    r, s = run_check("hostmem", tmp_path, SPYRESHIM_LIMIT="4M", SPYRESHIM_TRACE=tr)
    assert (s["managed_allocs"], s["managed_frees"], s["managed_bytes"]) == (2, 2, 0), s
    assert (s["host_pinned_allocs"], s["host_pinned_frees"], s["host_pinned_bytes"]) == \
        (5, 5, 0), s
    # The devices are there (managed memory is charged to their limit),
    # with nothing served.
    assert s["allocs"] == 0 and s["foreign_frees"] == 0, s
    assert all(d["allocs"] == 0 for d in s["runtimes"]), s["runtimes"]
    fam = {(f["family"], f["device"]): f for f in s["passthrough"]}
    assert sorted(fam) == [("cuda-host-pinned", -1), ("cuda-managed", 0),
                           ("cuda-managed", 1)], s["passthrough"]
    assert fam[("cuda-managed", 0)]["peak_bytes"] == 1 << 20
    assert fam[("cuda-managed", 1)]["peak_bytes"] == 2 << 20
    assert fam[("cuda-host-pinned", -1)]["peak_bytes"] == (4 << 20) + 8192 + 65536 + 16384 + 32768

    trace = _trace_module()
    t = trace.load(str(tr))
    names = {t.device_name(t.dev[i]) for i in range(len(t))}
    assert names == {"cuda-managed", "cuda-host-pinned"}, names
    kinds = [t.kind[i] for i in range(len(t))]
    assert kinds.count(trace.ALLOC) == 7 and kinds.count(trace.FREE) == 7, kinds
    assert all("hostmem_leaked_here" in t.site_label(t.site[i]) for i in range(len(t)))
    p = trace.peaks(t)
    assert p.bytes == 0  # watched memory is not in the devices' overall peak
    assert p.per_device[0xfe][0] == fam[("cuda-host-pinned", -1)]["peak_bytes"]


def test_leaked_managed_and_host_pinned_memory_reported_with_family_and_stack(
        shim_lib, tmp_path):
    """One allocation of each family left live at exit: each is in the leak
    report, named by its family, with the stack of the call that made it."""
    report = tmp_path / "leaks.json"
    r = run([built_tests() / "cuda_checks", "hostleak"],
            shim_env(tmp_path, SPYRESHIM_LEAK_CHECK=1, SPYRESHIM_REPORT=report))
    assert "hostleak ok" in r.stdout, r.stdout + r.stderr
    assert r.returncode != 0 and "detected device memory leaks" in r.stderr, r.stderr
    groups = json.loads(report.read_text())["groups"]
    by_family = {}
    for g in groups:
        assert g["frames"][0]["function"] == "hostmem_leaked_here", g
        by_family.setdefault(g["runtime"], []).append(g["bytes"])
    assert sorted(by_family["cuda-managed"]) == [1 << 20, 2 << 20], by_family
    assert sorted(by_family["cuda-host-pinned"]) == [8192, 16384, 32768, 65536, 4 << 20], \
        by_family


def test_an_oom_the_program_gives_up_on_keeps_its_status_and_prints_each_stack_once(
        shim_lib, tmp_path):
    """A program that runs out of device memory and exits with an error of
    its own (3) without freeing, under `spyreshim run --leak-check`: its
    status and output are what they are bare (not the leak verdict's 23);
    the out-of-memory report prints the holders' stack, and the leak
    report after it names the same blocks with their first frame only (the
    JSON keeps every frame). A program that succeeds but leaks still gets
    23."""
    prog = built_tests() / "cuda_checks"
    env = shim_env(tmp_path, CUDASTANDIN_MEMORY="8M,8M", SPYRESHIM_LIB=pythons.shim_lib())
    bare = dict(env)
    del bare["LD_PRELOAD"]
    b = run([prog, "oomexit"], bare)
    assert b.returncode == 3 and b.stdout == "oomexit: 2\n", b
    del env["LD_PRELOAD"]       # `spyreshim run` preloads it
    report = tmp_path / "r.json"
    r = run([pythons.REPO / "scripts" / "spyreshim", "run", "--leak-check", "--report", report,
             "--", prog, "oomexit"], env)
    assert (r.returncode, r.stdout) == (3, b.stdout), r
    err = r.stderr
    assert "out of cuda memory: a request of 1048576 B (1.0 MiB) failed" in err, err
    assert "ERROR: spyreshim: detected device memory leaks" in err, err
    assert err.count(" in check_oomexit ") == 2, err         # once in each report
    assert err.count(" in main ") == 1, err                  # the rest of the stack: once
    assert err.count("(the same stack as in the out-of-memory report above)") == 1, err
    assert "the program exits with status 3, kept" in err.splitlines()[-1], err
    assert len([ln for ln in err.splitlines() if "status 3" in ln]) == 1, err
    d = json.loads(report.read_text())
    assert [f["function"] for f in d["groups"][0]["frames"][:2]] == ["check_oomexit", "main"], d
    oom = json.loads((tmp_path / "r.json.oom").read_text())
    assert oom["groups"][0]["frames"][:2] == d["groups"][0]["frames"][:2], oom
    # Succeeding with leaks: the verdict's status, as LeakSanitizer's.
    r = run([pythons.REPO / "scripts" / "spyreshim", "run", "--leak-check", "--",
             prog, "hostleak"], env)
    assert "hostleak ok" in r.stdout and r.returncode == 23, r
