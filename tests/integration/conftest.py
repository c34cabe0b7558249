"""Fixtures shared by the Python integration tests (see pythons.py for the
interpreter matrix and the run helpers). Keep this minimal: a test file's
own fixtures belong in that file."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pythons  # noqa: E402


@pytest.fixture(scope="session")
def builddir():
    d = pythons.builddir()
    if not pythons.libsimdev().exists():
        pytest.fail(f"{pythons.libsimdev()} is missing: run `meson setup {d} && ninja -C {d}` "
                    f"(or point SPYRESHIM_BUILD at a build dir)")
    return d


@pytest.fixture(scope="session")
def shim_lib(builddir):
    lib = pythons.shim_lib()
    if not lib.exists():
        pytest.fail(f"{lib} is missing: ninja -C {builddir}")
    return lib


@pytest.fixture(params=pythons.NAMES)
def interpreter(request, builddir):
    """Every interpreter of pythons.NAMES; absent ones skip with the reason."""
    return pythons.get(request.param).require()
