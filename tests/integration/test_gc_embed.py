"""Python GC in an embedding program (tests/programs/embed_cycles.c) that
dlopen()s libpython with RTLD_LOCAL, runs many Py_Initialize/Py_FinalizeEx
cycles, and keeps a C thread allocating before, during and after each
finalization: every cycle must be served by a collection, and the program
must exit 0 (no crash, no hang, no thread killed)."""
import json
import os
import subprocess
from pathlib import Path

import pytest

import gc_support
import pythons

CYCLES = 8

PROBE = ("import sys, sysconfig, os; "
         "print(os.path.join(sysconfig.get_config_var('LIBDIR') or '', "
         "sysconfig.get_config_var('INSTSONAME') or '')); print(sys.prefix)")


def libpython_of(interp):
    if interp.kind != "cpython":
        pythons.need("cpython", f"{interp.name}: embedding PyPy is a different API (rpython_startup_code)")
    res = subprocess.run([interp.exe, "-c", PROBE], capture_output=True, text=True,
                         timeout=pythons.HANG_S)
    lib, prefix = res.stdout.split("\n")[:2]
    # pythons.py knows where a relocated build (the free-threaded tarball,
    # Debian unstable's builds) keeps it.
    lib = interp.libpython or lib
    if not lib or not Path(lib).exists():
        pythons.need("libpython", f"{interp.name}: no shared libpython found ({lib!r})")
    return lib, prefix


def build_glue(interp, lib, tmp_path):
    """A library that depends on libpython and the simdev module: opening it
    RTLD_LOCAL resolves the module's Py* symbols against the local libpython."""
    moddir = pythons.build_module(interp)
    module = moddir / ("simdev" + interp.ext_suffix)
    src = tmp_path / "glue.c"
    src.write_text("int embed_glue;\n")
    out = tmp_path / "libglue.so"
    argv = [os.environ.get("CC", "cc"), "-shared", "-fPIC", str(src), "-o", str(out),
            "-Wl,--no-as-needed", lib, str(module)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=pythons.HANG_S)
    assert res.returncode == 0, res.stderr
    return out, moddir


@pytest.mark.parametrize("preload", [True], ids=["shim"])
def test_embedder_init_fini_cycles(interpreter, tmp_path, builddir, shim_lib, preload):
    lib, prefix = libpython_of(interpreter)
    glue, moddir = build_glue(interpreter, lib, tmp_path)
    env = pythons._clean_env()
    stats = tmp_path / "stats.json"
    env.update({"PYTHONHOME": prefix, "PYTHONPATH": str(moddir), "SIMDEV_MEMORY": "16M",
                "SPYRESHIM_GC_TIMEOUT_MS": "500",
                "SPYRESHIM_STATS": str(stats)})
    env.update(gc_support.preload_env(shim_lib))
    prog = builddir / "tests" / "embed_cycles"
    # Debian unstable's libpython needs its own C library: the program runs
    # under that library's loader.
    res = pythons.run(pythons.native_argv(interpreter, [prog, lib, glue, CYCLES]), env=env)
    res.check()
    assert f"{CYCLES} cycles" in res.stdout, res.describe()
    data = json.loads(stats.read_text())
    # Pressure while no interpreter existed was seen and left alone...
    assert data["gc_skipped_by_reason"]["not_initialized"] > 0, data
    # ...the exit gate closed and re-armed in every cycle...
    assert data["gc_interpreter_cycles"] == CYCLES, data
    # ...and in every cycle the C thread, meeting a device full of garbage
    # while Python slept, was served by a collection on the shim's thread.
    assert data["gc_thread_collections"] >= CYCLES, data


def test_embedder_fails_without_the_shim(tmp_path, builddir):
    """The same program without the shim: the first cycle runs out of memory
    (so the test above is meaningful)."""
    interp = pythons.get("cpython3.12").require()
    lib, prefix = libpython_of(interp)
    glue, moddir = build_glue(interp, lib, tmp_path)
    env = pythons._clean_env()
    env.update({"PYTHONHOME": prefix, "PYTHONPATH": str(moddir), "SIMDEV_MEMORY": "16M"})
    res = pythons.run([builddir / "tests" / "embed_cycles", lib, glue, 2], env=env)
    assert res.returncode == 1 and "OutOfMemoryError" in res.stderr, res.describe()
