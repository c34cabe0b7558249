"""The shim's OpenCL layer (hooks/opencl_*.c) on a real runtime: PoCL on
this machine's CPU, through the ICD loader. Every memory object is the
runtime's, watched: the project's own programs for the cases a program
must see as without the shim (opencl_same.c, opencl_dlopen.c, a ctypes
binding) run without and with it, identical output; PyOpenCL's own test
suite run with and without the shim (no test worse); PyOpenCL arrays in
reference cycles and a C program's buffer cache that run out without the
shim and complete with it; the limit per device; the leak report, the
views; the shim's declarations checked against the Khronos headers.

Skips with the reason where there is no OpenCL platform; under CI=true
(scripts/deps.sh installs PoCL) that is a failure."""
import json
import os
import pickle
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import opencl_suite  # noqa: E402
import pythons  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MiB = 1 << 20


def _unavailable(reason):
    pythons.need("opencl", reason)


def base_env(tmp_path=None, **extra):
    env = {k: v for k, v in os.environ.items()
           if k != "LD_PRELOAD" and not k.startswith("SPYRESHIM_")}
    # PoCL's compiled kernels, kept between runs (a cold cache costs each
    # kernel a compile by LLVM).
    env["POCL_CACHE_DIR"] = str(opencl_suite.cache_dir().parent / "pocl-kcache")
    if tmp_path is not None:
        env["SPYRESHIM_STATS"] = str(tmp_path / "stats.json")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def shim_env(tmp_path=None, **extra):
    return base_env(tmp_path, LD_PRELOAD=pythons.shim_lib(), **extra)


def stats(tmp_path):
    return json.loads((tmp_path / "stats.json").read_text())


def family(s, name="opencl"):
    """The statistics of a watched family on device 0 (every OpenCL memory
    object is the runtime's: "opencl"; SVM: "opencl-svm")."""
    return next(p for p in s["passthrough"] if p["family"] == name and p["device"] == 0)


def limited(kib, argv):
    """argv under `ulimit -v kib`: host memory that runs out, as PoCL's
    buffers are host memory."""
    return ["bash", "-c", f'ulimit -v {kib} && exec "$@"', "limited", *map(str, argv)]


@pytest.fixture(scope="module")
def program(builddir):
    exe = Path(builddir) / "tests" / "opencl_cache"
    if not exe.exists():
        _unavailable(f"{exe} was not built: libOpenCL or CL/cl.h is absent "
                     f"(apt-get install ocl-icd-opencl-dev)")
    r = pythons.run([exe, "info"], env=base_env())
    if r.returncode != 0:
        _unavailable(f"no OpenCL platform ({exe} info: {r.stderr.strip()[-300:]}); "
                     f"apt-get install pocl-opencl-icd")
    return exe


def info(out):
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


# ---- the shim's declarations ---------------------------------------------

def test_the_shims_declarations_are_the_khronos_headers():
    if not Path("/usr/include/CL/cl.h").exists():
        _unavailable("/usr/include/CL/cl.h is absent (apt-get install opencl-c-headers)")
    cc = shutil.which("cc") or shutil.which("gcc")
    r = subprocess.run([cc, "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
                        "-iquote", REPO / "hooks", REPO / "tests/programs/opencl_header_check.c"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# ---- a C program linked to libOpenCL --------------------------------------

def test_what_the_runtime_answers_is_the_same_under_the_shim_but_the_capped_sizes(program,
                                                                              tmp_path):
    """Buffer info, a second reference, and the runtime's own errors (size
    0, two access flags) are unchanged; GLOBAL_MEM_SIZE and
    MAX_MEM_ALLOC_SIZE are capped to SPYRESHIM_LIMIT and a request over the
    cap is CL_INVALID_BUFFER_SIZE, as for a device of that size."""
    bare = pythons.run([program, "info"], env=base_env())
    r = pythons.run([program, "info"], env=shim_env(tmp_path, SPYRESHIM_LIMIT="256M"))
    assert bare.returncode == 0 and r.returncode == 0, bare.describe() + r.describe()
    a, b = info(bare.stdout), info(r.stdout)
    assert int(a["global_mem_size"]) > 256 * MiB
    assert int(b["global_mem_size"]) == int(b["max_mem_alloc_size"]) == 256 * MiB
    for k in ("mem_base_addr_align", "flags", "size", "offset", "associated", "host_ptr",
              "refs", "zero_size", "bad_flags"):
        assert a[k] == b[k], (k, a[k], b[k])
    assert a["zero_size"] == "-61" and a["bad_flags"] == "-30"
    assert a["over_max"] == b["over_max"] == "-61"   # CL_INVALID_BUFFER_SIZE
    assert a["at_max"] == b["at_max"] == "0"         # the largest size it said is made
    s = stats(tmp_path)
    assert [d["name"] for d in s["runtimes"]] == ["opencl:0"]
    f = family(s)
    assert f["allocs"] >= 1 and f["allocs"] == f["frees"], s
    assert s["allocs"] == 0, "nothing is served from a region"


def test_the_three_routes_to_clCreateBuffer_are_watched(program, tmp_path):
    """As linked, by dlsym on libOpenCL's handle (ctypes, cffi), and through
    clGetExtensionFunctionAddressForPlatform where the runtime hands the
    function out: each watched, a kernel's writes read back."""
    r = pythons.run([program, "routes"], env=shim_env(tmp_path))
    assert r.returncode == 0 and "routes ok" in r.stdout, r.describe()
    got = info(r.stdout)
    assert got["dlsym_is_linked"] == "1"
    assert got["icd"] in ("none", "linked"), got
    f = family(stats(tmp_path))
    assert f["allocs"] == f["frees"] == 2 + (got["icd"] == "linked"), f


def test_a_buffer_cache_runs_out_without_the_shim_and_completes_with_it(program, tmp_path):
    """A framework-style cache of buffers (parked, not released) of 40 x 32
    MiB under 1 GiB of address space: PoCL backs buffers at first use and,
    out of host memory, aborts the process. Under the shim, SPYRESHIM_LIMIT
    is met in clCreateBuffer, where the program's pressure callback empties
    its cache, and every buffer's kernel writes read back."""
    argv = limited(1 << 20, [program, "cache", 40, 32])
    bare = pythons.run(argv, env=base_env())
    assert bare.returncode != 0 and "cache ok" not in bare.stdout, bare.describe()
    r = pythons.run(argv, env=shim_env(tmp_path, SPYRESHIM_LIMIT="256M"))
    assert r.returncode == 0, r.describe()
    assert "cache ok made=40 shim=1" in r.stdout, r.stdout
    s = stats(tmp_path)
    assert s["pressure_events"] > 0 and s["callback_runs"] > 0, s
    f = family(s)
    assert f["allocs"] == f["frees"] == 40, s
    assert f["peak_bytes"] <= 256 * MiB, s


def test_past_the_limit_clCreateBuffer_answers_allocation_failure(program, tmp_path):
    """Every buffer kept: after the pressure event the 9th 32 MiB buffer is
    refused with CL_MEM_OBJECT_ALLOCATION_FAILURE in clCreateBuffer (the
    program goes on), and the shim says why."""
    r = pythons.run([program, "keep", 40, 32], env=shim_env(tmp_path, SPYRESHIM_LIMIT="256M"))
    assert r.returncode == 0 and "keep oom made=8" in r.stdout, r.describe()
    assert "out of opencl memory for 33554432 B (32.0 MiB)" in r.stderr, r.stderr
    assert "verdict: limit" in r.stderr
    s = stats(tmp_path)
    assert s["failed_allocs"] >= 1 and s["pressure_events"] >= 1, s


def test_host_pointer_buffers_and_svm_are_watched(program, tmp_path):
    """CL_MEM_USE_HOST_PTR (the host's memory, mapped where it is),
    CL_MEM_ALLOC_HOST_PTR and SVM are the runtime's, counted per family."""
    bare = pythons.run([program, "watched"], env=base_env())
    assert bare.returncode == 0 and "watched ok" in bare.stdout, bare.describe()
    r = pythons.run([program, "watched"], env=shim_env(tmp_path))
    assert r.returncode == 0 and "watched ok" in r.stdout, r.describe()
    fam = {p["family"]: p for p in stats(tmp_path)["passthrough"]}
    assert fam["opencl"]["allocs"] == fam["opencl"]["frees"] == 2, fam
    assert fam["opencl"]["peak_bytes"] == 2 * MiB
    if "svm=1" in r.stdout:
        assert fam["opencl-svm"]["allocs"] == fam["opencl-svm"]["frees"] == 1, fam
    assert stats(tmp_path)["allocs"] == 0, "nothing of these is served from a region"


def test_a_leaked_buffer_is_reported_at_its_line(program, tmp_path):
    report = tmp_path / "leaks.json"
    r = pythons.run([program, "leak"], env=shim_env(tmp_path, SPYRESHIM_LEAK_CHECK=1,
                                                    SPYRESHIM_REPORT=report))
    assert "leak ok" in r.stdout, r.describe()
    assert r.returncode != 0, "leaks fail the process by default"
    err = r.stderr
    assert "Leak of 1048576 B (1.0 MiB) in 1 allocation(s) of opencl:0 memory" in err, err
    assert " in leak_one_buffer" in err and "opencl_cache.c:" in err, err
    assert "SUMMARY: spyreshim: 1048576 B (1.0 MiB) leaked in 1 allocation(s)." in err
    data = json.loads(report.read_text())
    (g,) = data["groups"]
    assert g["runtime"].startswith("opencl"), g
    assert g["frames"][0]["function"].startswith("leak_one_buffer")
    assert g["frames"][0]["file"].endswith("opencl_cache.c") and g["frames"][0]["line"] > 0


def test_the_trace_and_its_views_name_the_runtime_opencl(program, tmp_path):
    trace = tmp_path / "t.trace"
    r = pythons.run([program, "cache", 20, 32],
                    env=shim_env(tmp_path, SPYRESHIM_LIMIT="256M", SPYRESHIM_TRACE=trace))
    assert r.returncode == 0, r.describe()
    cli = [sys.executable, REPO / "scripts" / "spyreshim", "report"]
    v = pythons.run([*cli, "--view", "stats", trace])
    assert v.returncode == 0, v.describe()
    assert "peak of opencl:0: 268435456 B (256.0 MiB)" in v.stdout, v.stdout
    assert "Total allocations:\n\t20" in v.stdout
    peak = pythons.run([*cli, "--view", "peak", trace])
    assert peak.returncode == 0 and "opencl:0" in peak.stdout, peak.describe()
    viz = tmp_path / "t.pickle"
    m = pythons.run([*cli, "--memory-viz", viz, trace])
    assert m.returncode == 0, m.describe()
    snap = pickle.loads(viz.read_bytes())
    assert snap["spyreshim_devices"] == ["opencl:0"]
    acts = [e["action"] for e in snap["device_traces"][0]]
    assert acts.count("alloc") == 20 and acts.count("free_completed") == 20, acts
    assert acts.count("segment_alloc") == 0, "the shim reserves nothing in OpenCL"


# ---- what a program sees: the same with and without the shim ----------------

def built(builddir, name):
    exe = Path(builddir) / "tests" / name
    if not exe.exists():
        _unavailable(f"{exe} was not built: libOpenCL or CL/cl.h is absent "
                     f"(apt-get install ocl-icd-opencl-dev)")
    return exe


def same_both_ways(argv, tmp_path, **shim_extra):
    """argv run without and with the shim: the same output and status
    (the shim's own stderr lines aside); returns the run under the shim."""
    bare = pythons.run(argv, env=base_env())
    r = pythons.run(argv, env=shim_env(tmp_path, **shim_extra))
    assert (r.returncode, r.stdout) == (bare.returncode, bare.stdout), bare.describe() + r.describe()
    return r


SAME = ["rect", "range", "hostflags", "image1d", "release", "contexts", "svmfree", "threads",
        "migrate"]


@pytest.mark.parametrize("check", SAME)
def test_an_opencl_program_sees_what_it_sees_without_the_shim(program, builddir, tmp_path,
                                                               check):
    """tests/programs/opencl_same.c, each case of issue 43 printing what it
    observes: rectangle copies between buffers (different pitches behind a
    user event on an out-of-order queue: the copy's data and event type;
    a whole-buffer rectangle between disjoint buffers), out-of-range
    copies refused with the neighbouring buffer untouched, COPY_HOST_PTR
    with the host access flags, IMAGE1D_BUFFER over a buffer, releases
    that return while a user event is incomplete (with the destructor
    callback after the command), contexts released while a queue holds
    them, clEnqueueSVMFree, 4 threads in a context held by its queue only,
    clEnqueueMigrateMemObjects (to the host and back with the contents
    kept, CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED on one buffer written
    again after, the runtime's errors). Identical output and status
    without and with the shim."""
    r = same_both_ways([built(builddir, "opencl_same"), check], tmp_path)
    assert f"{check} ok" in r.stdout or "svmfree none" in r.stdout, r.describe()
    assert "gate_status=2 destroyed=0" in r.stdout or check != "release", r.stdout
    s = stats(tmp_path)
    assert s["allocs"] == 0, "nothing is served from a region"
    if check != "svmfree":
        f = family(s)
        assert f["allocs"] == f["frees"] > 0 and f["bytes"] == 0, s
    # Images are charged their size, an image over a buffer nothing: range
    # makes 3 buffers of 4 KiB and a 64 x 64 RGBA image (16 KiB), image1d a
    # buffer of 4 KiB and an image over it.
    if check in ("range", "image1d"):
        want = {"range": (4, 3 * 4096 + 64 * 64 * 4), "image1d": (2, 4096)}[check]
        assert (f["allocs"], f["peak_bytes"]) == want, f


def test_the_limit_is_per_device_whatever_the_contexts(program, builddir, tmp_path):
    """40 contexts, each released while its queue holds it: under a 64 MiB
    limit the 48 MiB buffer of the 40th context is refused while the
    39th's is kept (the limit is the device's, not a context's), and
    nothing is left charged at exit."""
    r = pythons.run([built(builddir, "opencl_same"), "contexts"],
                    env=shim_env(tmp_path, SPYRESHIM_LIMIT="64M", SPYRESHIM_LEAK_CHECK=1))
    assert r.returncode == 0, r.describe()
    assert "contexts round=38 err=0\ncontexts round=39 err=-4\n" in r.stdout, r.stdout
    assert "out of opencl memory for 50331648 B (48.0 MiB)" in r.stderr, r.stderr
    assert [d["name"] for d in stats(tmp_path)["runtimes"]] == ["opencl:0"]



def test_a_retained_buffer_is_charged_until_its_last_release(program, builddir, tmp_path):
    """A 24 MiB buffer retained once more and released once is alive: under
    a 64 MiB limit a 48 MiB buffer is refused until its last release, then
    made; without the shim both are made, and the other answers are the
    same (the shim that counted only the program's creates dropped the
    record at the first release and allowed 72 MiB)."""
    argv = [built(builddir, "opencl_same"), "retained"]
    bare = pythons.run(argv, env=base_env())
    assert bare.returncode == 0 and "retained ok" in bare.stdout, bare.describe()
    assert "retained round=0 err=0\nlast release=0\nretained round=1 err=0\n" in bare.stdout
    r = pythons.run(argv, env=shim_env(tmp_path, SPYRESHIM_LIMIT="64M", SPYRESHIM_LEAK_CHECK=1))
    assert r.returncode == 0, r.describe()
    assert r.stdout == bare.stdout.replace("retained round=0 err=0", "retained round=0 err=-4"), \
        bare.describe() + r.describe()
    f = family(stats(tmp_path))
    assert f["allocs"] == f["frees"] and f["bytes"] == 0, f


def test_what_the_runtime_refuses_is_not_charged(program, builddir, tmp_path):
    """8 x 16 MiB buffers the runtime refuses (CL_INVALID_HOST_PTR), then a
    48 MiB buffer, and the same with SVM (an alignment of 3), under a 64 MiB
    limit: the same answers as without the
    shim (the shim that kept the charge of a refused create answered
    out of memory from the 5th on)."""
    r = same_both_ways([built(builddir, "opencl_same"), "refused"], tmp_path,
                       SPYRESHIM_LIMIT="64M", SPYRESHIM_LEAK_CHECK=1)
    assert "refused" + " -37" * 8 + "\nthen 48 MiB err=0\n" in r.stdout, r.stdout
    if "refused svm" in r.stdout:
        assert "refused svm" + " 0" * 8 + "\nthen 48 MiB of svm: 1\n" in r.stdout, r.stdout

def test_arguments_the_runtime_refuses_get_its_error_under_a_limit(program, builddir,
                                                                   tmp_path):
    """Buffers of 128 MiB with flags that exclude each other, a host pointer
    without its flag or the flag without one, size 0, a size above the
    device's (with and without bad flags), and pipes with a flag that is no
    pipe's: under a 64 MiB limit each gets the runtime's own error, as
    without the shim (the shim that charged before the runtime looked at
    the arguments answered CL_INVALID_BUFFER_SIZE for the cap, or
    CL_MEM_OBJECT_ALLOCATION_FAILURE above the device), and nothing is
    charged or recorded."""
    r = same_both_ways([built(builddir, "opencl_same"), "badargs"], tmp_path,
                       SPYRESHIM_LIMIT="64M")
    assert "badargs read_only|write_only: -30 -30\n" in r.stdout, r.stdout
    assert "badargs copy_host_ptr without one: -37 -37\n" in r.stdout, r.stdout
    assert "badargs above the device: -61 -61\n" in r.stdout, r.stdout
    assert "(made)" not in r.stdout and "badargs ok" in r.stdout, r.stdout
    assert "out of opencl memory" not in r.stderr, r.stderr
    s = stats(tmp_path)
    assert not [p for p in s["passthrough"] if p["family"] == "opencl" and p["allocs"]], s


def test_a_valid_pipe_over_the_limit_gets_the_runtimes_answer(program, builddir, tmp_path):
    """A valid pipe of 128 MiB under a 64 MiB limit: the runtime is asked
    first, so a runtime without pipes (PoCL: CL_INVALID_OPERATION, -59)
    answers as without the shim (the shim that charged first answered
    CL_MEM_OBJECT_ALLOCATION_FAILURE, -4) and nothing is charged or
    recorded; a runtime that makes it sees it refused by the limit (-4)."""
    argv = [built(builddir, "opencl_same"), "pipe"]
    bare = pythons.run(argv, env=base_env())
    r = pythons.run(argv, env=shim_env(tmp_path, SPYRESHIM_LIMIT="64M"))
    assert r.returncode == bare.returncode == 0, bare.describe() + r.describe()
    if "(made)" in bare.stdout:
        assert "pipe valid: -4\n" in r.stdout, r.stdout
    else:
        assert r.stdout == bare.stdout, bare.describe() + r.describe()
        # Nothing made, nothing recorded (no statistics at all: the shim
        # wrote none for a run it saw allocate nothing).
        if (tmp_path / "stats.json").exists():
            s = stats(tmp_path)
            assert not [p for p in s["passthrough"] if p["family"] == "opencl" and p["allocs"]], s


def test_svm_freed_by_the_queue_is_uncharged(program, builddir, tmp_path):
    """120 x 1 MiB clSVMAlloc under a 64 MiB limit, each given back with
    clEnqueueSVMFree: none refused, nothing reported leaked, the same
    output as without the shim."""
    r = same_both_ways([built(builddir, "opencl_same"), "svmfree"], tmp_path,
                       SPYRESHIM_LIMIT="64M", SPYRESHIM_LEAK_CHECK=1)
    if "svmfree none" in r.stdout:
        _unavailable("the OpenCL device has no SVM")
    assert "svmfree failed=0" in r.stdout, r.stdout
    f = family(stats(tmp_path), "opencl-svm")
    assert f["allocs"] == f["frees"] == 120 and f["bytes"] == 0, f


@pytest.mark.parametrize("how", ["c", "ctypes"])
def test_a_program_that_loads_the_loader_itself_finds_its_platform(program, builddir, tmp_path,
                                                                   how):
    """clCreateBuffer looked up on the loader's handle before
    clGetPlatformIDs (hashcat's order; a ctypes binding that sets restype
    first): the loader's own lookups in PoCL get PoCL's functions, so the
    platform is found as without the shim; the program's lookups get the
    shim's (its buffer is watched)."""
    argv = ([built(builddir, "opencl_dlopen")] if how == "c"
            else ["/usr/bin/python3", HERE / "opencl_ctypes.py"])
    r = same_both_ways(argv, tmp_path)
    assert r.returncode == 0 and "platforms=1" in r.stdout, r.describe()
    assert "buffer err=0 release=0" in r.stdout, r.stdout
    f = family(stats(tmp_path))
    assert f["allocs"] == f["frees"] == 1, f


# ---- PyOpenCL ---------------------------------------------------------------

@pytest.fixture(scope="module")
def pyopencl(program):
    try:
        return opencl_suite.installed_version()
    except opencl_suite.SuiteUnavailable as e:
        _unavailable(str(e))


def test_pyopencl_arrays_in_cycles_run_out_without_the_shim_and_complete_with_it(pyopencl,
                                                                               tmp_path):
    """With gc.disable(), 64 arrays of 32 MiB kept by reference cycles under
    1.5 GiB of address space: without the shim PoCL aborts the process when
    host memory runs out (PyOpenCL's own collect-and-retry never starts:
    clCreateBuffer does not fail); with it the 512 MiB limit is met in
    clCreateBuffer, the shim's collections free the cycles, and every array
    holds what its kernel wrote."""
    argv = limited(3 << 19, ["/usr/bin/python3", HERE / "opencl_cycles.py"])
    bare = pythons.run(argv, env=base_env())
    assert bare.returncode != 0 and '"completed"' not in bare.stdout, bare.describe()
    r = pythons.run(argv, env=shim_env(tmp_path, SPYRESHIM_LIMIT="512M"))
    assert r.returncode == 0, r.describe()
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["outcome"] == "completed" and out["iterations"] == 64, out
    assert out["global_mem_size"] == 512 * MiB, "the device PyOpenCL sees is the limit's"
    s = stats(tmp_path)
    assert s["gc_collections"] > 0 and s["gc_recovered_bytes"] > 0, s
    f = family(s)
    assert f["allocs"] == f["frees"] >= 64 and f["peak_bytes"] <= 512 * MiB, s


def test_a_leaked_pyopencl_buffer_is_reported_with_its_python_stack(pyopencl, tmp_path):
    """A pyopencl.Buffer never released: the leak report names it as
    opencl:0 memory with the Python frames that made it."""
    report = tmp_path / "leaks.json"
    r = pythons.run(["/usr/bin/python3", HERE / "opencl_leak.py"],
                    # never released: held by Python until exit, a leak under "held"
                    env=shim_env(tmp_path, SPYRESHIM_LEAK_CHECK="held", SPYRESHIM_REPORT=report))
    assert "leak made" in r.stdout and r.returncode != 0, r.describe()
    assert "Leak of 1048576 B (1.0 MiB) in 1 allocation(s) of opencl:0 memory" in r.stderr, r.stderr
    assert "in make_leak " in r.stderr and "opencl_leak.py:" in r.stderr, r.stderr
    (g,) = json.loads(report.read_text())["groups"]
    assert g["runtime"] == "opencl:0", g


def test_pyopencl_suite_with_the_shim_is_no_worse_than_without(pyopencl, tmp_path_factory,
                                                               builddir):
    """PyOpenCL's own tests (its sdist's test/, opencl_suite.py) run under
    the shim, each compared with its outcome without the shim: recorded in
    data/opencl_suite_outcomes.json for these PoCL and PyOpenCL versions and
    this suite, else (said in a warning) run here too. No test does worse;
    one worse than the recording is run again here without the shim, and
    if it does as badly, this machine is the cause, not the shim (reported,
    as are the tests that do better). SPYRESHIM_OPENCL_SUITE=all runs every
    file."""
    try:
        tests = opencl_suite.suite_dir(pyopencl)
        here = opencl_suite.environment(base_env())
    except opencl_suite.SuiteUnavailable as e:
        _unavailable(str(e))
    groups = opencl_suite.files(tests)
    work = tmp_path_factory.mktemp("pyopencl-suite")
    recorded, why = opencl_suite.recorded(opencl_suite.key(tests, groups, here))
    # One statistics file per process: the groups run side by side.
    r1 = opencl_suite.run(tests, groups, work / "with",
                          shim_env(SPYRESHIM_STATS=work / "stats-%p.json"), here)
    assert r1.outcomes and not r1.hung, f"the suite under the shim: {r1.describe()}"
    with_shim = r1.outcomes
    if recorded is None:
        warnings.warn(f"PyOpenCL's suite run without the shim too: {why}")
        r0 = opencl_suite.run(tests, groups, work / "without", base_env(), here)
        assert r0.outcomes and not r0.hung, f"the suite without the shim: {r0.describe()}"
        without = r0.outcomes
    else:
        without = recorded
    bad = opencl_suite.worse(without, with_shim)
    machine = []
    if bad and recorded is not None:
        # Their groups whole, as a test's outcome may depend on those before.
        again = [g for g in groups if any(t.split("::")[0] in g for t, _, _ in bad)]
        r0 = opencl_suite.run(tests, again, work / "without", base_env(), here)
        assert not r0.hung, f"the suite without the shim: {r0.describe()}"
        bare_here = {t: r0.outcomes.get(t, "missing") for t, _, _ in bad}
        shims = {t for t, _, _ in opencl_suite.worse(bare_here, with_shim)}
        machine = [b for b in bad if b[0] not in shims]
        bad = [b for b in bad if b[0] in shims]
    better = opencl_suite.better(without, with_shim)
    for what, tids in (("better with the shim than without", better),
                       ("worse than recorded, without the shim too here", machine)):
        if tids:
            warnings.warn(f"PyOpenCL's suite: {len(tids)} {what}: {tids}")
    per_process = [json.loads(f.read_text()) for f in work.glob("stats-*.json")]
    summary = {"files": groups, "compared with": "the recording" if recorded else why,
               "without": opencl_suite.totals(without),
               "with": opencl_suite.totals(with_shim),
               "seconds with the shim": round(r1.seconds), "better": better,
               "worse without the shim too": machine,
               # watched, not served: the suite's memory objects are the
               # "opencl" family's (a process that made none has no row)
               "shim": {"gc_collections": sum(s["gc_collections"] for s in per_process),
                        **{k: sum(family(s)[k] for s in per_process
                                  if any(p["family"] == "opencl" and p["device"] == 0
                                         for p in s["passthrough"]))
                           for k in ("allocs", "frees")}},
               "passthrough": [e for s in per_process for e in s["passthrough"]]}
    (Path(builddir) / "opencl-suite.json").write_text(json.dumps(summary, indent=1))
    assert not bad, f"worse with the shim: {bad}\n{r1.describe()}"
    assert summary["with"].get("passed", 0) > 50, summary
    shim = summary["shim"]
    assert shim["allocs"] > 100 and shim["allocs"] == shim["frees"], shim
