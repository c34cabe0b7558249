"""The Python interpreters of this machine, and how to run scripts with them.

Shared by every Python integration test. Import it from a pytest file in
tests/integration/ (conftest.py puts this directory on sys.path):

    import pythons

The API (keep it stable; add, do not change):

Interpreter (frozen dataclass), one per expected interpreter, present or not:
    name           "cpython3.8" .. "cpython3.13" (pyenv, shared libpython;
                   3.11 is "cpython3.11-shared"), "cpython3.11-static"
                   (Debian's /usr/bin/python3.11, libpython linked in),
                   "cpython3.11-dbg" (Debian's debug build), "cpython3.13t"
                   (free-threaded, unpacked from shared/pythons), "pypy3",
                   "cpython3.14", "cpython3.14-dbg", "cpython3.15" (Debian
                   unstable's builds, static executables with their own C
                   library, fetched by scripts/pythons.sh into its cache).
    exe            path of the executable ("" when absent)
    kind           "cpython" or "pypy"
    version        (major, minor, micro); () when absent
    free_threaded  True for a --disable-gil build
    static         True when libpython is linked into the executable
    debug          True for a Py_DEBUG build
    skip_reason    None when usable, else why not (absent, broken, ...)
    include_dirs   every -I an extension needs (include, plus the folder of
                   pyconfig.h where the headers are Debian's multiarch ones)
    libpython      path of the interpreter's shared libpython ("" if none)
    loader         "" for this system's C library; else the dynamic loader
                   of the interpreter's own one (Debian unstable's builds):
                   a C program of ours that loads its libpython must run
                   under it (native_argv)
    available      property: skip_reason is None
    require()      need(name, skip_reason) unless available; returns self

NAMES                       every expected name, in a stable order (use it to
                            parametrize: absent ones then skip, with a reason)
interpreters()              all Interpreter objects, in NAMES order (cached)
get(name)                   one of them, by name (KeyError if unknown)
builddir()                  Path of the meson build dir: $SPYRESHIM_BUILD, else
                            <repo>/build
shim_lib()                  <builddir>/libspyreshim.so (Path; may not exist)
libsimdev()                 <builddir>/tests/simdev/libsimdev.so
native_argv(interp, argv)   argv to run a native program (one of ours, built
                            here) that loads `interp`'s libpython: unchanged,
                            or prefixed with the interpreter's own loader and
                            its library folder
build_module(interp)        builds the simdev extension module for `interp`
                            (cached in <builddir>/pythons/<name>/, rebuilt when
                            a source is newer) and returns that directory;
                            raises BuildError with the compiler's output
module_env(interp, env=None, simdev_memory=None)
                            a clean environment dict for running `interp` with
                            `import simdev` working (PYTHONPATH), the caller's
                            PYTHON*/LD_PRELOAD variables removed, `env` merged
                            last
run_python(interp, source=None, path=None, args=(), preload=True,
           simdev_memory="1G", env=None, timeout=HANG_S, cwd=None, simdev=True)
                            runs a script (source text, written to a file
                            named script.py in a fresh temp dir, or an existing
                            `path`) in its own process group, with
                            LD_PRELOAD=<shim_lib()> when preload, and returns a
                            Result; on timeout the whole group is killed
run(argv, env=None, timeout=HANG_S, cwd=None)
                            the same for any program (returns a Result)
Result                      returncode, stdout, stderr (str), timed_out (bool),
                            argv; .check() raises AssertionError showing all
                            of it unless returncode == 0
HANG_S                      seconds a child may run before a test calls it
                            hung and kills it: the one bound of every
                            subprocess a test runs (a multiple of it for a
                            whole suite), never a bound on speed
need(what, reason)          a dependency `what` (a key of DEPENDENCIES) is
                            missing: skips with `reason`, or fails under
                            CI=true where a script of ours installs it; every
                            skip of the integration tests goes through it
DEPENDENCIES                what a test may miss -> the script that installs
                            it, or None where none does (those always skip)

The free-threaded tarball is searched in $SPYRESHIM_PYTHONS, then
shared/pythons in the repo or one or two levels above it, and unpacked
once into <builddir>/pythons/_dist/. Debian unstable's builds are looked
for in $SPYRESHIM_PYTHONS_CACHE, else ~/.cache/spyreshim/pythons (where
scripts/pythons.sh, run by scripts/test.sh, puts them).
"""

import fcntl
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A child that has run this long makes no progress: the test kills it and
# fails. The only time bound of the tests, sized for a hang on a loaded
# 2-core machine (a cold cache, a sanitizer build), never for speed: how
# fast a workload runs belongs in bench/. A subprocess that runs a whole
# suite of workloads gets a multiple of it.
HANG_S = 900

# Interpreters whose cases CI must run: under CI=true their absence fails
# the test instead of skipping it.
REQUIRED_IN_CI = {
    "cpython3.11-shared": "the CI image's pyenv",
    "cpython3.11-static": "scripts/deps.sh (Debian's python3)",
    "cpython3.13t": "the shared/pythons tarball",
    "pypy3": "scripts/deps.sh",
    "cpython3.14": "scripts/pythons.sh",
    "cpython3.14-dbg": "scripts/pythons.sh",
    "cpython3.15": "scripts/pythons.sh",
}
SIMDEV_SRC = REPO / "tests" / "simdev"

NAMES = (
    "cpython3.8",
    "cpython3.9",
    "cpython3.10",
    "cpython3.11-shared",
    "cpython3.12",
    "cpython3.13",
    "cpython3.11-static",
    "cpython3.11-dbg",
    "cpython3.13t",
    "pypy3",
    "cpython3.14",
    "cpython3.14-dbg",
    "cpython3.15",
)

# Debian unstable's builds: name -> executable under <cache>/debian-unstable/root/usr/bin.
DEBIAN_UNSTABLE = {"cpython3.14": "python3.14", "cpython3.14-dbg": "python3.14d",
                   "cpython3.15": "python3.15"}

FREE_THREADED_TARBALL = "cpython-3.13.*t-*.tar.xz"


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class Interpreter:
    name: str
    exe: str = ""
    kind: str = "cpython"
    version: tuple = ()
    free_threaded: bool = False
    static: bool = False
    debug: bool = False
    skip_reason: object = None
    include: str = ""
    ext_suffix: str = ""
    include_dirs: tuple = ()
    libpython: str = ""
    loader: str = ""

    @property
    def available(self):
        return self.skip_reason is None

    def require(self):
        if not self.available:
            need(self.name, f"{self.name}: {self.skip_reason}")
        return self

    def __str__(self):
        return self.name


@dataclass
class Result:
    argv: list
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False

    def check(self):
        if self.returncode != 0:
            raise AssertionError(self.describe())
        return self

    def describe(self):
        what = "timed out and was killed" if self.timed_out else f"exit {self.returncode}"
        return (f"{' '.join(map(str, self.argv))}: {what}\n"
                f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}")


# ---- what a test may lack ----------------------------------------------

# Every dependency a test may skip for -> what installs it. Under CI=true
# the absence of one that something of ours installs is a failure (CI ran
# that script: the test would go green without testing anything); one that
# nothing of ours installs (None: NVIDIA's toolkit, a GPU, root, a build
# option, a feature an interpreter lacks) skips, saying why.
DEPENDENCIES = {
    **{name: REQUIRED_IN_CI.get(name) for name in NAMES},
    "/usr/bin/python3": "scripts/deps.sh",
    "chromium": "scripts/deps.sh",
    "go": "scripts/deps.sh",
    "g++": "scripts/deps.sh",
    "meson": "scripts/deps.sh",
    "numba": "scripts/deps.sh",
    "numpy": "scripts/deps.sh",
    "numpy-off": None,         # SPYRESHIM_NO_NUMPY: the run without numpy
    "opencl": "scripts/deps.sh (PoCL, PyOpenCL)",
    "torch": "scripts/deps.sh",
    "torch2": "scripts/torch2_venv.sh",
    "numba-cuda": "scripts/numba_cuda_venv.sh",
    "hta": "scripts/hta_venv.sh",   # HolisticTraceAnalysis (test_categories)
    "pytest-memray": None,     # PyPI's, into a cached venv by test_pytest_plugin.py
    "cuda-toolkit": None,
    "torch-cuda": None,        # Debian's torch is built without CUDA
    "cupy": None,
    "rmm": None,
    "root": None,              # setuid programs
    "setuid": None,            # a mount or a process that ignores the bit
    "symbol-table": None,      # an unstripped libspyreshim.so
    "tsan": None,              # a -Dtsan=true build (scripts/tsan_gc.sh)
    "no-tsan": None,           # what ThreadSanitizer cannot run
    "cpython": None,           # what only CPython has (PyPy lacks it)
    "libpython": None,         # a shared libpython to embed
    "subinterpreters": None,
    "py-debug": None,          # a Py_DEBUG interpreter
    "debug-offsets": None,     # CPython 3.13+'s _Py_DebugOffsets
    "torch-rename": None,      # torch.utils.rename_privateuse1_backend (2.x)
    "torch-storage": None,     # 1.13's bindings take no PrivateUse1 storage
    "mount": None,             # a tmpfs or read-only mount (root, a mount namespace)
}


def ci():
    return os.environ.get("CI") == "true"


def need(what, reason):
    """`what` (a key of DEPENDENCIES) is missing: the test skips with
    `reason`, or fails under CI=true where something of ours installs it."""
    __tracebackhide__ = True    # pytest names the test's line, not this one
    import pytest
    if what not in DEPENDENCIES:
        raise KeyError(f"pythons.need: {what!r} is not in pythons.DEPENDENCIES")
    by = DEPENDENCIES[what]
    if by and ci():
        pytest.fail(f"{reason} [{what} must not be missing in CI: {by} installs it]",
                    pytrace=False)
    pytest.skip(reason)


def builddir():
    return Path(os.environ.get("SPYRESHIM_BUILD") or REPO / "build").resolve()


def shim_lib():
    return builddir() / "libspyreshim.so"


def libsimdev():
    return builddir() / "tests" / "simdev" / "libsimdev.so"


# ---- finding the interpreters ------------------------------------------

_PROBE = r"""
import json, os, sys, sysconfig
try:
    maps = open("/proc/self/maps").read()
except OSError:
    maps = ""
paths = sysconfig.get_paths()
print(json.dumps({
    "impl": sys.implementation.name,
    "version": list(sys.version_info[:3]),
    "gil_disabled": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    "debug": hasattr(sys, "gettotalrefcount"),
    "libpython_loaded": "libpython" in maps,
    "include": paths.get("include") or "",
    "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX") or "",
    "libdir": sysconfig.get_config_var("LIBDIR") or "",
    "soname": sysconfig.get_config_var("INSTSONAME") or "",
    "multiarch": sysconfig.get_config_var("MULTIARCH") or "",
    "prefix": sys.prefix,
}))
"""


def _pyenv_exe(minor):
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    found = []
    for d in (root / "versions").glob(f"3.{minor}.*"):
        rest = d.name[len(f"3.{minor}."):]
        if rest.isdigit() and (d / "bin" / "python3").exists():
            found.append((int(rest), d / "bin" / "python3"))
    return str(max(found)[1]) if found else None


def _shared_pythons_dirs():
    dirs = []
    if os.environ.get("SPYRESHIM_PYTHONS"):
        dirs.append(Path(os.environ["SPYRESHIM_PYTHONS"]))
    for up in (REPO, REPO.parent, REPO.parent.parent):
        dirs.append(up / "shared" / "pythons")
    return dirs


def _free_threaded_exe():
    """Unpacks the free-threaded tarball once; returns (exe, reason)."""
    tarballs = [t for d in _shared_pythons_dirs() for t in sorted(d.glob(FREE_THREADED_TARBALL))]
    if not tarballs:
        where = ", ".join(str(d) for d in _shared_pythons_dirs())
        return None, f"no {FREE_THREADED_TARBALL} in {where}"
    tarball = tarballs[-1]
    dist = builddir() / "pythons" / "_dist"
    dist.mkdir(parents=True, exist_ok=True)
    stamp = dist / (tarball.name + ".done")
    with locked(dist / ".lock"):
        if not stamp.exists():
            tmp = Path(tempfile.mkdtemp(prefix="unpack.", dir=dist))
            with tarfile.open(tarball) as tf:
                # Our own tarball: trusted (3.12+ would warn without a filter).
                kw = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
                tf.extractall(tmp, **kw)
            for top in tmp.iterdir():
                target = dist / top.name
                if target.exists():
                    shutil.rmtree(target)
                top.rename(target)
            shutil.rmtree(tmp)
            stamp.write_text(str(tarball) + "\n")
    exes = sorted(p for p in dist.glob("cpython-3.13*t/bin/python3.13t") if p.is_file())
    if not exes:
        return None, f"{tarball} has no bin/python3.13t"
    return str(exes[-1]), None


def debian_unstable_root():
    """The folder scripts/pythons.sh unpacks Debian unstable's packages into."""
    cache = os.environ.get("SPYRESHIM_PYTHONS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "spyreshim", "pythons")
    return Path(cache) / "debian-unstable" / "root"


def _debian_unstable_exe(name):
    root = debian_unstable_root()
    exe = root / "usr" / "bin" / DEBIAN_UNSTABLE[name]
    if not (root.parent / "done").exists() or not exe.exists():
        return None, f"no {exe}: run scripts/pythons.sh (fetches Debian unstable's CPython 3.14/3.15)"
    return str(exe), None


def _candidate(name):
    """(exe or None, reason when None, expected kind)."""
    if name in DEBIAN_UNSTABLE:
        exe, reason = _debian_unstable_exe(name)
        return exe, reason, "cpython"
    if name == "pypy3":
        exe = shutil.which("pypy3") or ("/usr/bin/pypy3" if os.path.exists("/usr/bin/pypy3") else None)
        return exe, "pypy3 is not installed (apt-get install pypy3 pypy3-dev)", "pypy"
    if name == "cpython3.13t":
        exe, reason = _free_threaded_exe()
        return exe, reason, "cpython"
    if name == "cpython3.11-static":
        exe = "/usr/bin/python3.11"
        return (exe if os.path.exists(exe) else None), "no /usr/bin/python3.11 (Debian's python3.11)", "cpython"
    if name == "cpython3.11-dbg":
        exe = "/usr/bin/python3.11-dbg"
        return (exe if os.path.exists(exe) else None), "no /usr/bin/python3.11-dbg (apt-get install python3.11-dbg)", "cpython"
    minor = int(name[len("cpython3."):].split("-")[0])
    exe = _pyenv_exe(minor)
    return exe, f"no pyenv CPython 3.{minor} (~/.pyenv/versions/3.{minor}.*)", "cpython"


def _probe(name):
    try:
        exe, reason, kind = _candidate(name)
    except Exception as e:  # a broken tarball must not break collection
        return Interpreter(name=name, skip_reason=f"cannot set up: {e}")
    if not exe:
        return Interpreter(name=name, kind=kind, skip_reason=reason)
    try:
        out = subprocess.run([exe, "-c", _PROBE], capture_output=True, text=True,
                             timeout=HANG_S, env=_clean_env())
    except (OSError, subprocess.TimeoutExpired) as e:
        return Interpreter(name=name, exe=exe, kind=kind, skip_reason=f"{exe} does not run: {e}")
    if out.returncode != 0:
        return Interpreter(name=name, exe=exe, kind=kind,
                           skip_reason=f"{exe} does not run: {out.stderr.strip()[-300:]}")
    info = json.loads(out.stdout.strip().splitlines()[-1])
    header = Path(info["include"]) / "Python.h"
    skip = None if header.exists() else f"no {header} (install the -dev package)"
    include_dirs = [info["include"]]
    # Debian's multiarch headers: Python.h's pyconfig.h includes
    # <x86_64-linux-gnu/python3.X/pyconfig.h>, found under the prefix's include.
    if info["multiarch"] and not (Path(info["include"]) / info["multiarch"]).exists():
        top = str(Path(info["include"]).parent)
        if top not in include_dirs and (Path(top) / info["multiarch"]).is_dir():
            include_dirs.append(top)
    libpython, loader = "", ""
    if name in DEBIAN_UNSTABLE:
        # Built for unstable's C library: LIBDIR names the system's folder
        # (where the package would be installed), the files are under our root.
        libdir = Path(info["prefix"]) / "lib" / (info["multiarch"] or "x86_64-linux-gnu")
        cand = libdir / info["soname"] if info["soname"] else None
        libpython = str(cand) if cand and cand.exists() else ""
        ld = libdir / "ld-linux-x86-64.so.2"
        loader = str(ld) if ld.exists() else ""
    elif info["soname"]:
        for d in (Path(info["libdir"]), Path(exe).resolve().parent.parent / "lib"):
            if (d / info["soname"]).exists():
                libpython = str(d / info["soname"])
                break
    return Interpreter(
        name=name, exe=exe, kind="pypy" if info["impl"] == "pypy" else "cpython",
        version=tuple(info["version"]), free_threaded=info["gil_disabled"],
        static=info["impl"] == "cpython" and not info["libpython_loaded"],
        debug=info["debug"], skip_reason=skip, include=info["include"],
        ext_suffix=info["ext_suffix"], include_dirs=tuple(include_dirs),
        libpython=libpython, loader=loader)


@functools.lru_cache(maxsize=None)
def interpreters():
    return tuple(_probe(n) for n in NAMES)


def get(name):
    for i in interpreters():
        if i.name == name:
            return i
    raise KeyError(name)


# ---- building the module -----------------------------------------------

class locked:
    """An exclusive flock on `path` (parallel test runs build once)."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def include_args(interp):
    """The -I arguments for building an extension for `interp`."""
    return [a for d in (interp.include_dirs or (interp.include,)) for a in ("-I", d)]


def native_argv(interp, argv):
    """argv for a native program built here that loads `interp`'s libpython
    (dlopen): run under the interpreter's own C library where it has one."""
    argv = [str(a) for a in argv]
    if not interp.loader:
        return argv
    return [interp.loader, "--library-path", str(Path(interp.loader).parent), *argv]


def build_module(interp):
    """Builds simdev<EXT_SUFFIX> for `interp`; returns its directory."""
    interp.require()
    lib = libsimdev()
    if not lib.exists():
        raise BuildError(f"{lib} is missing: build first (meson setup {builddir()} && ninja -C {builddir()})")
    out_dir = builddir() / "pythons" / interp.name
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / ("simdev" + interp.ext_suffix)
    sources = [SIMDEV_SRC / "simdevmodule.c", SIMDEV_SRC / "simdev.h", lib, Path(__file__)]
    with locked(out_dir / ".lock"):
        if target.exists() and all(target.stat().st_mtime >= s.stat().st_mtime for s in sources):
            return out_dir
        cc = os.environ.get("CC", "cc")
        argv = [cc, "-shared", "-fPIC", "-O1", "-g", "-std=gnu11",
                "-Wall", "-Wextra", "-Werror",
                *include_args(interp), "-I", str(SIMDEV_SRC),
                str(SIMDEV_SRC / "simdevmodule.c"),
                "-o", str(target) + ".tmp",
                "-L", str(lib.parent), "-lsimdev", f"-Wl,-rpath,{lib.parent}"]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_S)
        if res.returncode != 0:
            raise BuildError(f"building simdev for {interp.name} failed:\n{' '.join(argv)}\n{res.stderr}")
        os.replace(str(target) + ".tmp", target)
    return out_dir


# ---- running -----------------------------------------------------------

_SCRUB = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHON_GIL",
          "PYTHONMALLOC", "PYTHONDEVMODE", "LD_PRELOAD", "SIMDEV_MEMORY")


def _clean_env():
    env = {k: v for k, v in os.environ.items()
           if k not in _SCRUB and not k.startswith("SPYRESHIM_") and not k.startswith("PYENV_")}
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def module_env(interp, env=None, simdev_memory=None, simdev=True):
    e = _clean_env()
    if simdev:
        e["PYTHONPATH"] = str(build_module(interp))
    if simdev_memory is not None:
        e["SIMDEV_MEMORY"] = str(simdev_memory)
    if env:
        e.update({k: str(v) for k, v in env.items()})
    return e


def run(argv, env=None, timeout=HANG_S, cwd=None):
    argv = [str(a) for a in argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                            start_new_session=True, text=True, errors="replace")
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        err += f"\n[pythons.run: killed the process group after {timeout} s]\n"
    return Result(argv=argv, returncode=proc.returncode, stdout=out, stderr=err, timed_out=timed_out)


def run_python(interp, source=None, path=None, args=(), preload=True, simdev_memory="1G",
               env=None, timeout=HANG_S, cwd=None, simdev=True):
    interp.require()
    if (source is None) == (path is None):
        raise ValueError("run_python: give exactly one of source and path")
    e = module_env(interp, env=None, simdev_memory=simdev_memory, simdev=simdev)
    if preload:
        lib = shim_lib()
        if not lib.exists():
            raise BuildError(f"{lib} is missing: build first (ninja -C {builddir()})")
        e["LD_PRELOAD"] = str(lib)
    if env:
        e.update({k: str(v) for k, v in env.items()})
    with tempfile.TemporaryDirectory(prefix="spyreshim-py.") as tmp:
        if source is not None:
            path = Path(tmp) / "script.py"
            path.write_text(source)
        return run([interp.exe, str(path), *args], env=e, timeout=timeout, cwd=cwd or tmp)


if __name__ == "__main__":
    for i in interpreters():
        flags = [f for f, on in (("free-threaded", i.free_threaded), ("static", i.static),
                                 ("debug", i.debug)) if on]
        state = "ok" if i.available else f"SKIP: {i.skip_reason}"
        print(f"{i.name:20} {'.'.join(map(str, i.version)):8} {i.kind:8} {','.join(flags):24} {state}  {i.exe}")
    sys.exit(0)
