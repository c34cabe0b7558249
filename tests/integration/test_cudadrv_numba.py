"""numba (Debian's, under /usr/bin/python3) on the CUDA driver stand-in
(tests/cudadrv), without the shim: memory functions work, and device
arrays kept alive by reference cycles with the collector off end in
numba's own out-of-memory error (code 2).

numba loads the driver named by NUMBA_CUDA_DRIVER with ctypes and binds
functions by name (_v2 first); kernels need libNVVM and are not tried."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pythons  # noqa: E402

PYTHON = "/usr/bin/python3"
HERE = Path(__file__).resolve().parent


def _has_numba():
    if not os.path.exists(PYTHON):
        return False
    return subprocess.run([PYTHON, "-c", "import numba.cuda"],
                          capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def driver():
    if not _has_numba():
        pythons.need("numba", "Debian's python3-numba is not installed (scripts/deps.sh installs it)")
    lib = pythons.builddir() / "tests" / "cudadrv" / "libcuda.so.1"
    if not lib.exists():
        pytest.fail(f"{lib} is missing: ninja -C {pythons.builddir()}")
    return lib


def numba_env(driver, **extra):
    """The caller's environment without anything that would change the
    process under test (preloads, the shim's or the stand-in's settings,
    Python paths), pointed at the stand-in."""
    env = {k: v for k, v in os.environ.items()
           if k != "LD_PRELOAD" and not k.startswith(("SPYRESHIM_", "CUDASTANDIN_",
                                                      "PYTHON", "NUMBA_"))}
    env.update(NUMBA_CUDA_DRIVER=str(driver),
               LD_LIBRARY_PATH=str(driver.parent),
               PYTHONDONTWRITEBYTECODE="1",
               PYTHONNOUSERSITE="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_source(driver, source, **env):
    return pythons.run([PYTHON, "-c", source], env=numba_env(driver, **env))


def last_json(result):
    lines = [l for l in result.stdout.splitlines() if l.startswith("{")]
    assert lines, f"no JSON line in the output:\n{result.stdout}\n{result.stderr}"
    return json.loads(lines[-1])


ROUNDTRIP = r"""
import json
import numpy as np
from numba import cuda
a = cuda.to_device(np.arange(1000))
assert (a.copy_to_host() == np.arange(1000)).all()
free, total = cuda.current_context().get_memory_info()
d = cuda.device_array((16, 8), dtype=np.float32)
d.copy_to_device(np.ones((16, 8), dtype=np.float32))
back = d.copy_to_host()
free2, _ = cuda.current_context().get_memory_info()
print(json.dumps({"total": total, "free": free, "free_after_second": free2,
                  "sum": float(back.sum()), "shape": list(d.shape),
                  "name": cuda.get_current_device().name.decode()}))
"""


def test_numba_copies_through_the_stand_in(driver):
    r = run_source(driver, ROUNDTRIP, CUDASTANDIN_MEMORY="256M")
    r.check()
    out = last_json(r)
    assert out["total"] == 256 << 20
    assert out["free"] <= out["total"] - 8000      # the 1000 int64 are allocated
    assert out["free_after_second"] < out["free"]
    assert out["sum"] == 128.0
    assert out["shape"] == [16, 8]
    assert out["name"].startswith("CUDA stand-in device")


def test_cycles_without_gc_end_in_numbas_out_of_memory(driver):
    r = pythons.run([PYTHON, HERE / "cudadrv_numba_cycles.py", "--array-bytes", 1 << 20,
                     "--iterations", 1000],
                    env=numba_env(driver, CUDASTANDIN_MEMORY="64M"))
    r.check()
    out = last_json(r)
    assert out["outcome"] == "oom", out
    assert out["error_code"] == 2
    assert out["total"] == 64 << 20
    # Everything made before the error is still held by cycles: the device
    # filled up, it did not fail early.
    assert out["iterations"] * out["array_bytes"] >= 60 << 20
    assert out["iterations"] < 1000


# ---- numba's own driver tests, without and with the shim -----------------

DATA = HERE / "data"
SUITE = HERE / "numba_cudadrv_suite.py"
REPO = HERE.parent.parent


def expected_failures(name):
    """The written-down list: test id -> why it fails on the stand-in."""
    out = {}
    for line in (DATA / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            tid, why = line.split(None, 1)
            out[tid] = why
    return out


def run_suite(python, driver, preload):
    env = numba_env(driver)
    if preload:
        env["LD_PRELOAD"] = str(pythons.shim_lib())
    # A whole suite in one child: a multiple of the hang bound.
    r = pythons.run([python, SUITE], env=env, timeout=3 * pythons.HANG_S)
    r.check()
    return last_json(r)


def check_suite(python, driver, listing):
    expected = expected_failures(listing)
    plain = run_suite(python, driver, preload=False)
    shim = run_suite(python, driver, preload=True)
    # The stand-in keeps up: only the written-down tests fail without the shim.
    unexpected = {t: plain["why"][t] for t in plain["failed"] if t not in expected}
    assert not unexpected, f"fail on the stand-in without the shim: {unexpected}"
    assert len(plain["passed"]) >= 100, plain  # the suite ran at all
    # No test is worse under the shim.
    lost = {t: shim["why"].get(t, "not run") for t in plain["passed"]
            if t not in shim["passed"]}
    assert not lost, f"pass without the shim, not with it: {lost}"
    print(f"{listing}: {len(plain['passed'])} passed without the shim, "
          f"{len(shim['passed'])} with it; {len(plain['failed'])} expected failures, "
          f"{len(plain['skipped'])} skipped")


def test_numbas_own_driver_tests_pass_under_the_shim(driver, shim_lib):
    """Debian's numba: numba.cuda.tests.cudadrv on the stand-in. Context
    resets (cuda.close() between tests) and pointer queries are where the
    shim used to differ from the driver."""
    check_suite(PYTHON, driver, "numba_cudadrv_expected_failures.txt")


@pytest.fixture(scope="module")
def numba_cuda_python():
    """numba-cuda from PyPI in the project's own virtual environment
    (scripts/numba_cuda_venv.sh, under the cache folder)."""
    r = subprocess.run([str(REPO / "scripts" / "numba_cuda_venv.sh")], capture_output=True,
                       text=True, timeout=pythons.HANG_S)
    if r.returncode != 0:
        pythons.need("numba-cuda",
                     f"numba-cuda could not be installed from PyPI: {r.stderr.strip()[-300:]}")
    return r.stdout.strip().splitlines()[-1]


def test_numba_cudas_own_driver_tests_pass_under_the_shim(driver, shim_lib, numba_cuda_python):
    check_suite(numba_cuda_python, driver, "numba_cuda_cudadrv_expected_failures.txt")
