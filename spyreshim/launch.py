"""The environment that puts a process under the shim, for `spyreshim run`
and for launchers (torchrun, Ray, multiprocessing's spawn, subprocess):
one place that composes LD_PRELOAD and PYTHONPATH.

LD_PRELOAD stays a list: ours first (its hooks must win over anything
else preloaded), every other entry kept in its order; ld.so separates
entries by spaces or colons, we write colons. A copy of ours already there
(a nested `spyreshim run`, a worker of a launcher run under the shim) is
dropped rather than loaded twice.
"""

import os
import re

# What the child gets on PYTHONPATH: a folder holding only the package
# (spyreshim/_child_path/spyreshim/__init__.py says why).
PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_child_path")


def compose_preload(lib, current):
    """LD_PRELOAD's value with `lib` first and the entries of `current`
    (a value of LD_PRELOAD, or None) after it, without another copy of it."""
    real = os.path.realpath(lib)
    old = [e for e in re.split(r"[:\s]+", current or "") if e and os.path.realpath(e) != real]
    return ":".join([lib] + old)


def compose_python_path(current):
    """PYTHONPATH with the package's child folder appended (the program's
    own entries keep precedence), once."""
    if not PYTHON_DIR or PYTHON_DIR in (current or "").split(os.pathsep):
        return current or ""
    return (current + os.pathsep if current else "") + PYTHON_DIR


def _initial_environ():
    """This process's environment as it started (what the shim read), or {}."""
    try:
        with open("/proc/self/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[os.fsdecode(k)] = os.fsdecode(v)
    return out


def child_env(env=None, full=True):
    """The environment a launcher should give its workers so that each runs
    under the shim as this process does: `env` (default os.environ) with
    LD_PRELOAD composed (the shim loaded here, else the installed one first),
    the SPYRESHIM_* settings this process started with where `env` lacks
    them, and the package on PYTHONPATH. full=False: those variables only
    (Ray's runtime_env={"env_vars": ...}, which adds them to the workers'
    own environment)."""
    from . import library_path
    base = dict(os.environ if env is None else env)
    lib = library_path()
    if lib is None:
        from .cli import find_library
        lib = find_library(base)
    lib = os.path.abspath(lib)
    ours = {k: v for k, v in _initial_environ().items()
            if k.startswith("SPYRESHIM_") and k not in base}
    ours.update({k: v for k, v in base.items() if k.startswith("SPYRESHIM_")})
    ours["LD_PRELOAD"] = compose_preload(lib, base.get("LD_PRELOAD"))
    ours["PYTHONPATH"] = compose_python_path(base.get("PYTHONPATH", ""))
    if not full:
        return ours
    base.update(ours)
    return base
