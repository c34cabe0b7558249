"""Whose frame is it: the user's own code, or a library's (the interpreter,
a framework, the device runtime, the C and C++ runtimes, anything installed
under site-packages/dist-packages, the standard library). The one place that
decides it, for every view: the text and HTML reports (report.py,
flamegraph.py), the trace's views through callorder.label, and the labels of
sites (`report --view stats`, the timeline's legend, `--view gc`).

Two things are built on it:

- fold(): the frames a reader sees by default. Every run of library frames
  (the device allocator's own included, so that the first frame not in
  brackets is the user's line) becomes one frame named after the library
  with the most frames in it ("[libtorch_cpu.so: 22 frames]", "[pyopencl]"),
  as memray shows the Python frames first and the native ones on request;
  `spyreshim report --native-frames=all` shows every frame.
- first_user(): the frame a site is labelled by, its innermost frame in the
  user's own code.

Reads report frames only (report.py's shape: kind, function, file, line,
object, plus "interpreter" where callorder.py set it); no state. The C
report writer labels no sites (its text lists frames as recorded), so this
list has no second copy in C.
"""

import os
import re

# Shared objects that belong to a framework, a device runtime or the
# language runtimes, by the start of their file name (any version suffix).
# The interpreter's own executable is recognised by callorder.py's
# "interpreter" mark (its evaluation loop's object) and by its name.
LIBRARY_PREFIXES = (
    "libtorch", "libc10", "libshm", "libcaffe2", "libgomp", "libiomp", "libomp",
    "libpocl", "libOpenCL", "libcuda", "libcudart", "libcublas", "libcudnn", "libnvrtc",
    "libnccl", "libnvidia", "libhip", "libamdhip", "librocm", "libze_", "libsycl",
    "libsimdev",          # the simulated device's runtime and its PyTorch backend (tests)
    "libspyreshim", "libpython",
    "libc.so", "libc-", "libstdc++", "libgcc_s", "libm.so", "libm-", "libpthread", "libdl.",
    "libdl-", "librt.", "ld-linux", "ld64.so", "libffi",
)
# The interpreter's executable (a static build, or the frames below main).
_INTERPRETER_EXE = re.compile(r"^(python|pypy)\d*(\.\d+)*[a-z]*$")
_SITE = re.compile(r"/(?:site|dist)-packages/([^/]+)")
# The standard library: .../lib/python3.11/x.py (not under site-packages),
# or a frozen module.
_STDLIB = re.compile(r"/lib(?:64)?/(?:python|pypy)\d+(?:\.\d+)*[a-z]*/")


_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _package(name):
    """site-packages' top-level entry as a package name: "torch",
    "pyopencl", "numpy.libs" -> "numpy", "six.py" -> "six"."""
    for suffix in (".py", ".libs", ".dist-info", ".egg"):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name.split(".", 1)[0] if name.endswith(".so") else name


def library(f):
    """The library a frame belongs to, or None when it is the user's own.
    A native frame's object file name ("libtorch_cpu.so"), the package of
    anything under site-packages or dist-packages ("pyopencl", "torch"),
    "python" for the interpreter's own native frames and the standard
    library's Python ones."""
    kind = f.get("kind")
    if kind == "library":
        return f.get("library")
    if kind == "python":
        path = f.get("file") or ""
        if path.startswith(_OWN):
            return "spyreshim"      # this package's wrappers (spyreshim.origin in the presets)
        m = _SITE.search(path)
        if m:
            return _package(m.group(1))
        if path.startswith("<frozen ") or _STDLIB.search(path):
            return "python"
        return None
    obj = f.get("object") or ""
    m = _SITE.search(obj)
    if m:
        base = obj.rsplit("/", 1)[-1]
        pkg = _package(m.group(1))
        # A framework's own shared object keeps its file name (torch/lib/
        # libtorch_cpu.so is "libtorch_cpu.so"), an extension module is
        # its package ("pyopencl/_cl.cpython-311-x86_64-linux-gnu.so").
        return base if base.startswith(LIBRARY_PREFIXES) else pkg
    base = obj.rsplit("/", 1)[-1]
    if base.startswith(LIBRARY_PREFIXES):
        return base
    if f.get("interpreter") or (base and _INTERPRETER_EXE.match(base)):
        return base or "python"
    if _STDLIB.search(obj):
        return "python"        # lib-dynload's extension modules
    return None


def is_user(f):
    """The frame is in the user's own code (library() is None)."""
    return library(f) is None


def first_user(frames):
    """The innermost of `frames` (innermost first) in the user's code that
    has a name, else None."""
    for f in frames:
        if library(f) is None and (f.get("function") or f.get("file") or f.get("object")):
            return f
    return None


def folded_frame(counts):
    """One frame standing for a run of library frames: `counts` is
    [(library, frames)] in the order met, innermost first. It is named
    after the library with the most frames ("[libtorch_cpu.so: 22
    frames]"), with how many other libraries the run passed through
    ("[libtorch_cpu.so +3 more: 26 frames]")."""
    n = sum(c for _l, c in counts)
    top = max(counts, key=lambda lc: lc[1])[0]
    more = " +%d more" % (len(counts) - 1) if len(counts) > 1 else ""
    label = "[%s%s%s]" % (top, more, ": %d frames" % n if n > 1 else "")
    return {"kind": "library", "function": label, "file": None, "line": None,
            "object": None, "address": None, "offset": None,
            "library": ", ".join("%s (%d)" % lc for lc in counts), "libraries": counts,
            "frames": n, "folded": False, "interpreter": False}


def fold(frames):
    """The frames a reader sees by default (innermost first): the user's
    frames as they are, each run of consecutive library frames (the
    allocator's own included) as one folded_frame."""
    out = []
    run = []
    for f in frames:
        lib = library(f)
        if lib is None:
            if run:
                out.append(folded_frame(run))
                run = []
            out.append(f)
            continue
        parts = f["libraries"] if f.get("kind") == "library" else [(lib, 1)]
        for name, c in parts:
            for i, (have, k) in enumerate(run):
                if have == name:
                    run[i] = (name, k + c)
                    break
            else:
                run.append((name, c))
    if run:
        out.append(folded_frame(run))
    return out
