"""`spyreshim doctor`: what this install sees, on one screen.

The library and whether it loads (preloaded into a child interpreter, the
way `run` does it, so that a loader error is the loader's own line), the
libunwind the leak check will get, the device runtimes the dynamic loader
would find for a program, this interpreter and those the shim collects
garbage in, and which `--preset` frameworks are importable here.

Nothing here loads a runtime or a framework into this process: the runtimes
are looked up the way the loader searches (LD_LIBRARY_PATH, its cache, the
default folders), the frameworks with importlib.util.find_spec. Anything
missing is a line saying so, never a traceback.
"""
import fnmatch
import glob
import importlib.util
import os
import platform
import re
import subprocess
import sys

from .. import presets

# The runtimes whose entry points the shim intercepts (hooks/), one row
# each: (name, sonames or glob patterns the loader would be asked for,
# what the row means when found, what it is when not: a name a user may
# not know says what it is).
SIMDEV = "the project's simulated device, for trying the shim without a GPU"
RUNTIMES = [
    ("simdev", ["libsimdev.so"], SIMDEV,
     "(%s: tests/simdev/ in a checkout)" % SIMDEV),
    ("CUDA driver", ["libcuda.so.1"], "cuMemAlloc & co.", ""),
    ("CUDA runtime", ["libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                      "libcudart.so.*"], "cudaMalloc & co., where a program loads it shared", ""),
    ("OpenCL", ["libOpenCL.so.1"], "clCreateBuffer & co. through the ICD loader (docs/opencl.md)",
     ""),
]

# What the shim collects garbage in and reads Python stacks of
# (docs/testing.md, "Python interpreters").
INTERPRETERS = ("CPython 3.8 to 3.15 (3.13t free-threaded too): garbage collection and "
                "Python stacks; PyPy 3: garbage collection, native stacks only")

DEFAULT_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
                "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")


def _ldconfig_cache():
    for exe in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            r = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if r.returncode == 0:
            out = {}
            for line in r.stdout.splitlines():
                m = re.match(r"\s+(\S+) \(([^)]*)\) => (\S+)", line)
                if m and ("x86-64" in m.group(2)) == (platform.machine() == "x86_64"):
                    out.setdefault(m.group(1), m.group(3))
            return out
    return {}


class Finder:
    """The loader's search for a soname, without loading it."""

    def __init__(self, env=None):
        env = os.environ if env is None else env
        self.dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
        self.cache = None

    def find(self, pattern):
        for d in self.dirs:
            hits = sorted(glob.glob(os.path.join(d, pattern)))
            if hits:
                return hits[0]
        if self.cache is None:
            self.cache = _ldconfig_cache()
        hits = sorted(p for name, p in self.cache.items() if fnmatch.fnmatch(name, pattern))
        if hits:
            return hits[0]
        for d in DEFAULT_DIRS:
            hits = sorted(glob.glob(os.path.join(d, pattern)))
            if hits:
                return hits[0]
        return None


def find_library(candidates, env=None):
    env = os.environ if env is None else env
    explicit = env.get("SPYRESHIM_LIB")
    if explicit:
        return explicit, "SPYRESHIM_LIB"
    for c in candidates:
        if os.path.isfile(c):
            return os.path.abspath(c), None
    return None, None


def probe(lib, python_dir, timeout=60):
    """Preloads `lib` into a child of this interpreter, as `run` does, and
    asks the package there whether it bound to it: (ok, one line)."""
    from . import launch
    try:
        preload = launch.preload_path(lib)
    except launch.PreloadError as e:
        return False, "does not load: %s" % e
    env = dict(os.environ, LD_PRELOAD=preload, SPYRESHIM_LOG="warn",
               PYTHONPATH=os.pathsep.join([python_dir] + [p for p in os.environ.get(
                   "PYTHONPATH", "").split(os.pathsep) if p]))
    for k in ("SPYRESHIM_LEAK_CHECK", "SPYRESHIM_TRACE", "SPYRESHIM_REPORT", "SPYRESHIM_STATS",
              "SPYRESHIM_CONTROL"):
        env.pop(k, None)
    code = ("import spyreshim\n"
            "print('OK' if spyreshim.available() else 'NO', spyreshim.library_path() or "
            "spyreshim.unavailable_reason())\n")
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        return False, "cannot run %s: %s" % (sys.executable, e)
    out = r.stdout.strip().splitlines()
    err = [ln for ln in r.stderr.strip().splitlines() if ln]
    if r.returncode == 0 and out and out[-1].startswith("OK "):
        return True, "loads (preloaded into %s)" % os.path.basename(sys.executable)
    why = err[-1] if err else (out[-1] if out else "exit status %d" % r.returncode)
    return False, "does not load: " + why


def runpath(path):
    """The DT_RUNPATH (or DT_RPATH) entries of an ELF file: a small reader,
    since readelf need not be installed. [] for anything it cannot read."""
    import struct
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    try:
        if data[:4] != b"\x7fELF" or data[4] != 2:          # 64-bit only
            return []
        e = "<" if data[5] == 1 else ">"
        phoff, = struct.unpack_from(e + "Q", data, 0x20)
        phentsize, phnum = struct.unpack_from(e + "HH", data, 0x36)
        loads, dyn = [], None
        for i in range(phnum):
            p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from(
                e + "IIQQQQ", data, phoff + i * phentsize)
            if p_type == 1:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == 2:
                dyn = (p_offset, p_filesz)
        if dyn is None:
            return []
        tags = {}
        for off in range(dyn[0], dyn[0] + dyn[1], 16):
            tag, val = struct.unpack_from(e + "qQ", data, off)
            if tag == 0:
                break
            tags.setdefault(tag, val)
        strtab = next(off + tags[5] - va for va, off, sz in loads if va <= tags[5] < va + sz)
        at = tags.get(29, tags.get(15))                       # DT_RUNPATH, DT_RPATH
        if at is None:
            return []
        end = data.index(b"\0", strtab + at)
        return [p for p in data[strtab + at:end].decode("utf-8", "replace").split(":") if p]
    except (struct.error, KeyError, ValueError, StopIteration, IndexError):
        return []


def unwind_line(lib, finder):
    """Which libunwind.so.8 the leak check will dlopen: the wheel's own
    (the library's RUNPATH), else the system's."""
    if lib:
        for d in runpath(lib):
            own = os.path.join(d.replace("$ORIGIN", os.path.dirname(os.path.abspath(lib))),
                               "libunwind.so.8")
            if "$ORIGIN" in d and os.path.isfile(own):
                return "libunwind.so.8 %s (carried by the wheel)" % os.path.normpath(own)
    sysp = finder.find("libunwind.so.8")
    if sysp:
        return "libunwind.so.8 %s (the system's)" % sysp
    return ("libunwind.so.8 not found: leak checks record Python frames only (install it: "
            "apt-get install libunwind8, dnf install libunwind)")


def interpreter_line():
    impl = platform.python_implementation()
    v = "%d.%d.%d" % sys.version_info[:3]
    extra = ""
    try:
        import sysconfig
        if sysconfig.get_config_var("Py_GIL_DISABLED"):
            extra = " free-threaded"
    except Exception:
        pass
    return "%s %s%s %s" % (impl, v, extra, sys.executable)


def preset_rows():
    rows = []
    for name in presets.NAMES:
        try:
            top = presets.module(name).FRAMEWORK_MODULE
        except Exception as e:      # a preset module that does not import: say so
            rows.append((name, "unusable: %s" % e))
            continue
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError) as e:
            spec, err = None, e
        else:
            err = None
        if spec is None:
            rows.append((name, "%s not importable here%s" % (top, " (%s)" % err if err else "")))
        else:
            where = spec.origin or (list(spec.submodule_search_locations or []) or ["?"])[0]
            rows.append((name, "%s importable here (%s)" % (top, where)))
    return rows


def main(candidates, python_dir, write):
    from .. import __version__
    finder = Finder()
    lib, source = find_library(candidates)
    status = 0
    write("spyreshim %s (package %s)\n" % (__version__, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    write("\nlibrary\n")
    if lib is None:
        looked = ", ".join(os.path.normpath(c) for c in candidates) or "nowhere"
        write("  %-16s not found (looked in: %s); set SPYRESHIM_LIB\n" % ("libspyreshim.so", looked))
        status = 1
    elif not os.path.isfile(lib):
        write("  %-16s %s (%s): no such file\n" % ("libspyreshim.so", lib, source))
        status = 1
    else:
        ok, line = probe(lib, python_dir)
        write("  %-16s %s%s\n" % ("libspyreshim.so", lib, " (%s)" % source if source else ""))
        write("  %-16s %s\n" % ("", line))
        status = 0 if ok else 1
    write("  %-16s %s\n" % ("leak check", unwind_line(lib, finder)))
    dw = finder.find("libdw.so.1")
    write("  %-16s %s\n" % ("native lines", "libdw.so.1 %s" % dw if dw else
                            "libdw.so.1 not found: native frames get names, not file:line "
                            "(apt-get install libdw1)"))
    write("\nruntimes (what the loader would give a program)\n")
    for name, patterns, what, absent in RUNTIMES:
        path = None
        for p in patterns:
            path = finder.find(p)
            if path:
                break
        write("  %-16s %s\n" % (name, "%s: %s" % (path, what) if path else
                                ("not found " + absent).rstrip()))
    write("\ninterpreters\n")
    write("  %-16s %s\n" % ("this one", interpreter_line()))
    write("  %-16s %s\n" % ("in programs", INTERPRETERS))
    write("\npresets (spyreshim run --preset NAME; docs/frameworks.md)\n")
    for name, line in preset_rows():
        write("  %-16s %s\n" % (name, line))
    return status
