"""CUDA virtual memory management under the shim, on the stand-in driver
(tests/cudadrv/vmm.c): the stand-in's reservations, physical allocations,
mappings, access and POSIX fd handles behave like the driver's, errors
included; the shim passes them through and watches cuMemCreate's physical
allocations as the family cuda-vmm: counted, under the device's
SPYRESHIM_LIMIT (out-of-memory after the pressure event), in leak reports
with their stack and the range they are mapped at, and in traces
(pseudo-device 0xfc). Nothing is served from the shim's regions."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cuda_driver import _trace_module, built_tests, run, shim_env, stats  # noqa: E402
from test_cuda_passthrough import callbacks, run_pt  # noqa: E402

MiB = 1 << 20


def test_the_stand_ins_vmm_behaves_like_the_driver_without_the_shim(tmp_path):
    env = shim_env(tmp_path)
    del env["LD_PRELOAD"]
    r = run([built_tests() / "cuda_passthrough", "vmm"], env)
    assert r.returncode == 0 and "vmm ok" in r.stdout, r.stdout + r.stderr


def test_vmm_is_passed_through_counted_and_traced(shim_lib, tmp_path):
    """Reserve, create, map, access, copies, address ranges, export and
    import under the shim, with a trace: one physical allocation (the
    import is the exporter's memory), freed when released and unmapped;
    no block of the shim's; the trace shows its allocation and free on
    the cuda-vmm pseudo-device with the site that made it."""
    tr = tmp_path / "t.trace"
    r, s = run_pt("vmm", tmp_path, SPYRESHIM_LIMIT="4M", SPYRESHIM_TRACE=tr)
    assert (s["vmm_allocs"], s["vmm_frees"], s["vmm_bytes"]) == (1, 1, 0), s
    assert s["allocs"] == 0, s
    fam = {(f["family"], f["device"]): f for f in s["passthrough"]}
    assert fam[("cuda-vmm", 0)]["peak_bytes"] == 2 * MiB, s["passthrough"]
    trace = _trace_module()
    t = trace.load(str(tr))
    vmm = [i for i in range(len(t)) if t.dev[i] == 0xfc]
    assert [t.kind[i] for i in vmm] == [trace.ALLOC, trace.FREE], [t.kind[i] for i in vmm]
    assert t.device_name(0xfc) == "cuda-vmm"
    assert all(t.size[i] == 2 * MiB for i in vmm)
    assert "check_vmm" in t.site_label(t.site[vmm[0]])


def test_vmm_physical_memory_is_under_the_limit_after_the_pressure_event(shim_lib, tmp_path):
    r, s = run_pt("vmmlimit", tmp_path, SPYRESHIM_LIMIT="4M")
    assert callbacks(r) >= 2, r.stdout
    assert (s["vmm_allocs"], s["vmm_frees"], s["vmm_bytes"]) == (3, 3, 0), s


def test_leaked_vmm_memory_is_reported_with_its_stack_and_mapped_range(shim_lib, tmp_path):
    report = tmp_path / "leaks.json"
    r = run([built_tests() / "cuda_passthrough", "vmmleak"],
            shim_env(tmp_path, SPYRESHIM_LEAK_CHECK=1, SPYRESHIM_REPORT=report))
    assert "vmmleak ok" in r.stdout, r.stdout + r.stderr
    va = int(next(l.split()[-1] for l in r.stdout.splitlines() if l.startswith("mapped at")), 16)
    assert r.returncode != 0 and "detected device memory leaks" in r.stderr, r.stderr
    groups = json.loads(report.read_text())["groups"]
    got = sorted((g["runtime"], g["bytes"]) for g in groups)
    assert got == [("cuda-vmm", 2 * MiB), ("cuda-vmm mapped at %#x+%#x" % (va, 4 * MiB), 4 * MiB)], \
        got
    for g in groups:
        assert g["frames"][0]["function"] == "check_vmmleak", g
    assert "of cuda-vmm mapped at %#x+0x400000 memory" % va in r.stderr, r.stderr


def test_an_exported_vmm_allocation_is_the_same_bytes_in_another_process(shim_lib, tmp_path):
    """cuMemExportToShareableHandle's POSIX fd, imported in a second
    process (exec'd): it maps and reads what the exporter wrote, writes
    back, and the exporter reads that. The import is the exporter's memory:
    counted once, in the exporter."""
    r, s = run_pt("vmmshare", tmp_path)
    assert (s["vmm_allocs"], s["vmm_frees"], s["vmm_bytes"]) == (1, 1, 0), s


def test_vmm_entry_points_reach_the_shim_by_every_route(shim_lib, tmp_path):
    r = run([built_tests() / "cuda_passthrough", "vmmroutes"], shim_env(tmp_path))
    assert r.returncode == 0 and "vmmroutes ok" in r.stdout, r.stdout + r.stderr
    got = dict(l.split() for l in r.stdout.splitlines() if ":" in l and " " in l)
    for name in ["cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap"]:
        assert got[f"procaddr:{name}"] == "libspyreshim.so", (name, got)
        assert got[f"dlsym:{name}"] == "libspyreshim.so", (name, got)
    # Reservations go to the driver untouched.
    assert got["procaddr:cuMemAddressReserve"] == "libcuda.so.1", got
