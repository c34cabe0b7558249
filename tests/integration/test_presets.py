"""The framework presets (spyreshim/{presets,torch,numba,jax,
cupy,rmm}.py, docs/frameworks.md): `spyreshim run --preset NAME` sets the
environment each documents and installs the framework's own hook when the
framework is imported; `import spyreshim.NAME; spyreshim.NAME.install()`
does the same in-process. Tests run with Debian's /usr/bin/python3 (its
torch 1.13 is CPU-only, its numba 0.56 runs on the stand-in driver)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPT = REPO / "scripts" / "spyreshim"
PKG = REPO
PYTHON = "/usr/bin/python3"
sys.path.insert(0, str(PKG))
sys.path.insert(0, str(HERE))

import pythons  # noqa: E402
from spyreshim import presets  # noqa: E402
from spyreshim.presets import torch as sp_torch  # noqa: E402

# Harmless to preload for tests that only look at the environment.
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"

SHOW_ENV = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in "
            "('PYTORCH_CUDA_ALLOC_CONF', 'XLA_PYTHON_CLIENT_ALLOCATOR', 'SPYRESHIM_PRESETS', "
            "'PYTHONPATH', 'SPYRESHIM_CUDA_IPC_MIN')}))")


def has(module):
    r = subprocess.run([PYTHON, "-c", f"import {module}"], capture_output=True)
    return r.returncode == 0


def run_cli(*args, env=None):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("SPYRESHIM_", "PYTORCH_", "XLA_", "NUMBA_", "CUDASTANDIN_"))
         and k not in ("LD_PRELOAD", "PYTHONPATH")}
    e["SPYRESHIM_LIB"] = LIBC
    e.update(env or {})
    return subprocess.run([str(SCRIPT), "run", *[str(a) for a in args]], env=e,
                          capture_output=True, text=True, timeout=pythons.HANG_S)


def child_env(*presets_, env=None):
    r = run_cli(*[a for p in presets_ for a in ("--preset", p)], "--", PYTHON, "-c", SHOW_ENV,
                env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("version,has_it", [((1, 13), False), ((2, 1), False), ((2, 2), True),
                                            ((2, 5), False), ((2, 6), True), (None, False)])
def test_torch_release_lock_option_by_version(version, has_it):
    assert sp_torch.has_release_lock_option(version) is has_it


def test_torch_preset_environment():
    env = child_env("torch")
    assert env["SPYRESHIM_PRESETS"] == "torch"
    # torch.multiprocessing exports its segments: they get regions of their own.
    assert env["SPYRESHIM_CUDA_IPC_MIN"] == "2M", env
    assert env["PYTHONPATH"].split(os.pathsep)[0] == presets.SITE_DIR
    v = sp_torch.installed_version() if has("torch") else None
    if sp_torch.has_release_lock_option(v):
        assert "release_lock_on_cudamalloc:True" in env["PYTORCH_CUDA_ALLOC_CONF"], env
    else:
        # Debian's 1.13 refuses options it does not know: nothing is added.
        assert env["PYTORCH_CUDA_ALLOC_CONF"] is None, env


def test_torch_preset_keeps_the_users_choice():
    env = child_env("torch", env={"PYTORCH_CUDA_ALLOC_CONF": "release_lock_on_cudamalloc:False",
                                  "SPYRESHIM_CUDA_IPC_MIN": "64"})
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "release_lock_on_cudamalloc:False"
    assert env["SPYRESHIM_CUDA_IPC_MIN"] == "64"
    # Without PyTorch's cache every tensor would pay a driver allocation.
    env = child_env("torch", env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
    assert env["SPYRESHIM_CUDA_IPC_MIN"] is None, env


def test_torch_observer_registers_when_torch_is_imported():
    if not has("torch"):
        pythons.need("torch", "PyTorch is not installed for /usr/bin/python3 (scripts/deps.sh)")
    src = ("import torch, spyreshim.presets.torch as t; "
           "print('API', hasattr(torch._C, '_cuda_attach_out_of_memory_observer')); "
           "print('INSTALLED', t._installed); print(t.install())")
    r = run_cli("--preset", "torch", "--", PYTHON, "-c", src)
    assert r.returncode == 0, r.stderr
    assert "spyreshim: preset" not in r.stderr, r.stderr
    api = "API True" in r.stdout
    if not api:
        # The import went through and install() says why, in one line.
        assert "INSTALLED False" in r.stdout and "no out-of-memory observer API" in r.stdout, r.stdout
        pythons.need("torch-cuda", "this PyTorch build lacks CUDA: no torch._C._cuda_attach_out_of_memory_observer")
    assert "INSTALLED True" in r.stdout, r.stdout


def test_jax_preset_environment():
    assert child_env("jax")["XLA_PYTHON_CLIENT_ALLOCATOR"] == "platform"
    env = child_env("jax", env={"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async"})
    assert env["XLA_PYTHON_CLIENT_ALLOCATOR"] == "cuda_async"


def test_jax_install_in_process_before_import(tmp_path):
    src = ("import os, spyreshim.presets.jax as j; print(j.install()); "
           "print(os.environ['XLA_PYTHON_CLIENT_ALLOCATOR'])")
    e = {k: v for k, v in os.environ.items() if not k.startswith("XLA_")}
    e["PYTHONPATH"] = str(PKG)
    r = subprocess.run([PYTHON, "-c", src], env=e, capture_output=True, text=True,
                       timeout=pythons.HANG_S)
    assert r.returncode == 0 and r.stdout.strip().endswith("platform"), r


def test_cupy_and_rmm_presets_change_nothing_in_the_environment():
    env = child_env("cupy", "rmm")
    assert env["SPYRESHIM_PRESETS"] == "cupy,rmm"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] is None and env["XLA_PYTHON_CLIENT_ALLOCATOR"] is None


@pytest.mark.parametrize("name", ["cupy", "rmm"])
def test_cupy_and_rmm_hooks(name):
    if not has(name):
        r = subprocess.run([PYTHON, "-c", f"import spyreshim.presets.{name} as m; print(m.install())"],
                           env={**os.environ, "PYTHONPATH": str(PKG)}, capture_output=True,
                           text=True, timeout=pythons.HANG_S)
        assert r.returncode == 0 and "(False," in r.stdout and "not installed" in r.stdout, r
        pythons.need(name, f"{name} is not installed for /usr/bin/python3: install() says so")
    r = subprocess.run([PYTHON, "-c", f"import spyreshim.presets.{name} as m; print(m.install())"],
                       env={**os.environ, "PYTHONPATH": str(PKG)}, capture_output=True,
                       text=True, timeout=pythons.HANG_S)
    assert r.returncode == 0 and "(True," in r.stdout, r


def test_a_shadowed_sitecustomize_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    r = run_cli("--preset", "jax", "--", PYTHON, "-c",
                "import os; print(os.environ.get('USER_SITE_RAN'))",
                env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0 and r.stdout.strip() == "1", r


def test_unknown_preset_is_one_line_of_error():
    r = run_cli("--preset", "tensorflow", "--", "true")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "invalid choice" in r.stderr


def test_numba_preset_rescues_cycles_without_the_shims_collection(tmp_path):
    """The EMM plugin alone (the shim preloaded with SPYRESHIM_GC=off): device
    arrays held by cycles are collected by numba's own failing allocation,
    and the loop that ends in numba's out-of-memory without it completes."""
    if not has("numba"):
        pythons.need("numba", "Debian's python3-numba is not installed (scripts/deps.sh)")
    drv = pythons.builddir() / "tests" / "cudadrv" / "libcuda.so.1"
    lib = pythons.shim_lib()
    if not drv.exists() or not lib.exists():
        pytest.fail(f"build first: ninja -C {pythons.builddir()}")
    env = {"NUMBA_CUDA_DRIVER": str(drv), "LD_LIBRARY_PATH": str(drv.parent),
           "CUDASTANDIN_MEMORY": "64M", "SPYRESHIM_LIB": str(lib), "SPYRESHIM_GC": "off",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"}
    args = [PYTHON, HERE / "cudadrv_numba_cycles.py", "--array-bytes", 1 << 20,
            "--iterations", 300]
    without = run_cli("--", *args, env=env)
    assert without.returncode == 0, without.stderr
    assert json.loads(without.stdout.strip().splitlines()[-1])["outcome"] == "oom"
    with_preset = run_cli("--preset", "numba", "--", *args, env=env)
    assert with_preset.returncode == 0, with_preset.stderr
    out = json.loads(with_preset.stdout.strip().splitlines()[-1])
    assert out["outcome"] == "completed" and out["iterations"] == 300, out
