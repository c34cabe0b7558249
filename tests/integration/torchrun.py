"""Running PyTorch with the simdev device of tests/torch/simdev_torch, with
or without the shim, for the test_torch_*.py files, on two PyTorch versions:

  "1.13": Debian's python3-torch, /usr/bin/python3, build/tests/torch;
  "2":    PyPI's torch==2.15.0 in scripts/torch2_venv.sh's venv, with the
          CUDA toolkit's lib64 on LD_LIBRARY_PATH (the wheel links against
          it; no GPU is used), build/tests/torch2.

The test files parametrize a module fixture over VERSIONS and call
require(version), which selects it: PYTHON, NAME (the device's name in that
version) and ALLOCATE (the allocator's demangled name) follow.

require() skips where that torch or the built package is absent (under
CI=true it fails instead: scripts/deps.sh installs Debian's torch,
scripts/test.sh makes the 2.x venv, and meson builds the package for each
torch it finds)."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pythons  # noqa: E402

VERSIONS = ("1.13", "2")
PYTHON = "/usr/bin/python3"
#: the device's name: PrivateUse1 is renamed "simdev" from 2.0 on
NAME = "privateuseone"
#: the device allocator's allocate(), demangled: const before 2.x
ALLOCATE = "(anonymous namespace)::SimdevAllocator::allocate(unsigned long) const"
ALLOCATE_RAW = "_ZNK12_GLOBAL__N_115SimdevAllocator8allocateEm"
VERSION = "1.13"
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "spyreshim"
PKG = REPO
DEMO = REPO / "scripts" / "demo_torch.py"

_state = {}


def _torch2():
    """(python, LD_LIBRARY_PATH entry) of the 2.x venv, or None."""
    if "torch2" not in _state:
        def sh(*a):
            r = subprocess.run([str(REPO / "scripts" / "torch2_venv.sh"), *a],
                               capture_output=True, text=True)
            return r.stdout.strip() if r.returncode == 0 else None
        py, lib = sh("--if-present"), sh("--ld-library-path")
        _state["torch2"] = (py, lib) if py and lib else None
    return _state["torch2"]


def _has_torch(version):
    key = "has-torch-" + version
    if key not in _state:
        if version == "2":
            _state[key] = _torch2() is not None
        else:
            _state[key] = os.path.exists("/usr/bin/python3") and subprocess.run(
                ["/usr/bin/python3", "-c", "import torch"], capture_output=True).returncode == 0
    return _state[key]


def package_dir():
    """build/tests/torch (1.13) or build/tests/torch2 (2.x): the folder
    holding the simdev_torch package."""
    return pythons.builddir() / "tests" / ("torch2" if VERSION == "2" else "torch")


def select(version):
    global VERSION, PYTHON, NAME, ALLOCATE, ALLOCATE_RAW
    VERSION = version
    if version == "2":
        PYTHON = _torch2()[0]
        NAME = "simdev"
        ALLOCATE = "(anonymous namespace)::SimdevAllocator::allocate(unsigned long)"
        ALLOCATE_RAW = "_ZN12_GLOBAL__N_115SimdevAllocator8allocateEm"
    else:
        PYTHON = "/usr/bin/python3"
        NAME = "privateuseone"
        ALLOCATE = "(anonymous namespace)::SimdevAllocator::allocate(unsigned long) const"
        ALLOCATE_RAW = "_ZNK12_GLOBAL__N_115SimdevAllocator8allocateEm"


def require(version="1.13"):
    if not _has_torch(version):
        reason = ("Debian's python3-torch is not installed (scripts/deps.sh installs "
                  "python3-torch and libtorch-dev)" if version == "1.13" else
                  "PyTorch 2.x's venv is absent (scripts/torch2_venv.sh makes it; it needs "
                  "the CUDA toolkit's lib64 and PyPI)")
        pythons.need("torch" if version == "1.13" else "torch2", reason)
    select(version)
    lib = package_dir() / "simdev_torch" / "libsimdev_torch.so"
    if not lib.exists():
        pytest.fail(f"{lib} is missing although torch {version} is installed: "
                    f"scripts/build.sh (configures -Dtorch2_python for 2.x)")
    return package_dir()


def env(preload=False, simdev_memory="1G", **extra):
    """A clean environment for the child: one thread for PyTorch's CPU
    kernels (deterministic, and fair on a shared machine), the package and
    the spyreshim Python package on the path, the shim preloaded or not."""
    e = {k: v for k, v in os.environ.items()
         if k not in ("LD_PRELOAD", "PYTHONPATH", "SIMDEV_MEMORY", "SIMDEV_TORCH_OMIT")
         and not k.startswith(("SPYRESHIM_", "PYENV_"))}
    if VERSION == "2":
        lib = _torch2()[1]
        e["LD_LIBRARY_PATH"] = os.pathsep.join([lib] + ([e["LD_LIBRARY_PATH"]]
                                                       if e.get("LD_LIBRARY_PATH") else []))
    e.update(OMP_NUM_THREADS="1", PYTHONNOUSERSITE="1", PYTHONDONTWRITEBYTECODE="1",
             PYTHONPATH=os.pathsep.join([str(package_dir()), str(PKG)]),
             SIMDEV_MEMORY=str(simdev_memory))
    if preload:
        lib = pythons.shim_lib()
        assert lib.exists(), f"{lib} is not built"
        e["LD_PRELOAD"] = str(lib)
        e["SPYRESHIM_LIB"] = str(lib)
    e.update({k: str(v) for k, v in extra.items()})
    return e


def run(source=None, path=None, args=(), cwd=None, argv=None, **env_kw):
    """Runs a script (source text or path) under the selected torch's Python, or argv."""
    with tempfile.TemporaryDirectory(prefix="spyreshim-torch.") as tmp:
        if argv is None:
            if source is not None:
                path = Path(cwd or tmp) / "script.py"
                path.write_text(source)
            argv = [PYTHON, str(path), *args]
        return pythons.run(argv, env=env(**env_kw), cwd=cwd or tmp)
