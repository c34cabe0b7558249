"""Running Debian's PyTorch (python3-torch 1.13, /usr/bin/python3) with the
simdev device of tests/torch/simdev_torch, with or without the shim, for
the test_torch_*.py files.

require() skips where Debian's torch or the built package is absent (under
CI=true it fails instead: scripts/deps.sh installs torch and meson builds
the package wherever it is installed)."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pythons  # noqa: E402

PYTHON = "/usr/bin/python3"
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "spyreshim"
PKG = REPO
DEMO = REPO / "scripts" / "demo_torch.py"

_state = {}


def _has_torch():
    if "torch" not in _state:
        _state["torch"] = os.path.exists(PYTHON) and subprocess.run(
            [PYTHON, "-c", "import torch"], capture_output=True).returncode == 0
    return _state["torch"]


def package_dir():
    """build/tests/torch: the folder holding the simdev_torch package."""
    return pythons.builddir() / "tests" / "torch"


def require():
    if not _has_torch():
        reason = ("Debian's python3-torch is not installed (scripts/deps.sh installs "
                  "python3-torch and libtorch-dev)")
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    lib = package_dir() / "simdev_torch" / "libsimdev_torch.so"
    if not lib.exists():
        pytest.fail(f"{lib} is missing although torch is installed: "
                    f"meson setup --reconfigure {pythons.builddir()} && ninja -C {pythons.builddir()}")
    return package_dir()


def env(preload=False, simdev_memory="1G", **extra):
    """A clean environment for the child: one thread for PyTorch's CPU
    kernels (deterministic, and fair on a shared machine), the package and
    the spyreshim Python package on the path, the shim preloaded or not."""
    e = {k: v for k, v in os.environ.items()
         if k not in ("LD_PRELOAD", "PYTHONPATH", "SIMDEV_MEMORY", "SIMDEV_TORCH_OMIT")
         and not k.startswith(("SPYRESHIM_", "PYENV_"))}
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


def run(source=None, path=None, args=(), timeout=300, cwd=None, argv=None, **env_kw):
    """Runs a script (source text or path) under Debian's python3, or argv."""
    with tempfile.TemporaryDirectory(prefix="spyreshim-torch.") as tmp:
        if argv is None:
            if source is not None:
                path = Path(cwd or tmp) / "script.py"
                path.write_text(source)
            argv = [PYTHON, str(path), *args]
        return pythons.run(argv, env=env(**env_kw), timeout=timeout, cwd=cwd or tmp)
