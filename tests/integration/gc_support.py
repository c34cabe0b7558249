"""Helpers for the Python GC integration tests (test_gc_*.py): the gchelper
extension module (tests/programs/gchelper.c) built for each interpreter, next
to its simdev module, and reading the shim's SPYRESHIM_STATS file."""
import json
import os
import subprocess
from pathlib import Path

import pythons

GCHELPER_SRC = pythons.REPO / "tests" / "programs" / "gchelper.c"
TSAN_SUPP = pythons.REPO / "tests" / "tsan.supp"

# The interpreters CI must never skip.
MUST_RUN = tuple(pythons.REQUIRED_IN_CI)


def build_gchelper(interp):
    """Builds gchelper<EXT_SUFFIX> for `interp` beside its simdev module,
    once: under the folder's lock, since test files running in parallel
    (pytest-xdist) ask for the same interpreter's helper at once."""
    out_dir = pythons.build_module(interp)
    target = out_dir / ("gchelper" + interp.ext_suffix)
    lib = pythons.libsimdev()
    srcs = [GCHELPER_SRC, lib, Path(__file__)]
    with pythons.locked(out_dir / ".gchelper.lock"):
        if target.exists() and all(target.stat().st_mtime >= s.stat().st_mtime for s in srcs):
            return out_dir
        argv = [os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O1", "-g", "-std=gnu11",
                "-Wall", "-Wextra", "-Werror", "-Wno-missing-field-initializers",
                *pythons.include_args(interp), "-I", str(pythons.SIMDEV_SRC), str(GCHELPER_SRC),
                "-o", str(target) + ".tmp", "-L", str(lib.parent), "-lsimdev",
                f"-Wl,-rpath,{lib.parent}", "-lpthread"]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=pythons.HANG_S)
        if res.returncode != 0:
            raise pythons.BuildError(f"building gchelper for {interp.name} failed:\n"
                                     f"{' '.join(argv)}\n{res.stderr}")
        os.replace(str(target) + ".tmp", target)
    return out_dir


def tsan_runtime():
    """With SPYRESHIM_TSAN=1 (a build with -Dtsan=true, see scripts/tsan_gc.sh)
    the ThreadSanitizer runtime must be loaded before everything else."""
    if os.environ.get("SPYRESHIM_TSAN") != "1":
        return None
    out = subprocess.run([os.environ.get("CC", "cc"), "-print-file-name=libtsan.so"],
                         capture_output=True, text=True).stdout.strip()
    return str(Path(out).resolve())


def preload_env(shim_lib):
    """LD_PRELOAD (and TSAN_OPTIONS under ThreadSanitizer) for the shim: any
    report (a race, a lock-order inversion) makes the process exit 66."""
    tsan = tsan_runtime()
    if not tsan:
        return {"LD_PRELOAD": str(shim_lib)}
    return {"LD_PRELOAD": f"{tsan} {shim_lib}",
            "TSAN_OPTIONS": "detect_deadlocks=1 second_deadlock_stack=1 exitcode=66 "
                            "report_signal_unsafe=0 report_thread_leaks=0 "
                            f"suppressions={TSAN_SUPP}"}


def run(interp, source, tmp_path, memory="32M", preload=True, env=None,
        helper=False, path=None):
    """Runs `source` (or the script at `path`) under the shim; returns
    (Result, stats dict or None)."""
    if helper:
        build_gchelper(interp)
    stats = tmp_path / f"stats-{interp.name}-{int(preload)}.json"
    e = {"SPYRESHIM_STATS": str(stats)}
    if preload:
        e.update(preload_env(pythons.shim_lib()))
    e.update(env or {})
    res = pythons.run_python(interp, source, path=path, preload=preload,
                             simdev_memory=memory, env=e)
    data = None
    if preload and stats.exists():
        data = json.loads(stats.read_text())
    return res, data
