"""The environment that puts a process under the shim, for `spyreshim run`
and for launchers (torchrun, Ray, multiprocessing's spawn, subprocess):
one place that composes LD_PRELOAD and PYTHONPATH.

LD_PRELOAD stays a list: ours first (its hooks must win over anything
else preloaded), every other entry kept in its order; ld.so separates
entries by spaces or colons, we write colons. A copy of ours already there
(a nested `spyreshim run`, a worker of a launcher run under the shim) is
dropped rather than loaded twice.

ld.so has no quoting: a library installed under a folder whose name holds
a space or a colon ("/home/me/My Envs/...") would be split into two
entries, neither of them the library, and the program would run without
the shim. Such a library is preloaded through a symbolic link whose path
holds neither, made once per library in a folder of the user's own
(preload_path): a file, so it is there for every exec and child of the
program, however long it runs.
"""

import os
import re

# What the child gets on PYTHONPATH: a folder holding only the package
# (spyreshim/_child_path/spyreshim/__init__.py says why).
PYTHON_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_child_path")


class PreloadError(Exception):
    """The library cannot be named in LD_PRELOAD (one line)."""


# What ld.so splits LD_PRELOAD at.
_SPLITS = re.compile(r"[:\s]")


def _link_dirs():
    """(folder for the links, the folder of this user's it is in where that
    is in one every user writes, or None): the cache folder, then one under
    /tmp (for a home whose path holds a space itself)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    yield os.path.join(cache, "spyreshim", "preload"), None
    mine = os.path.join("/tmp", "spyreshim-%d" % os.getuid())
    yield os.path.join(mine, "preload"), mine


def _own_dir(path, mine):
    """Makes `path` (mode 0700); `mine` (a folder in /tmp, or None) must be
    a real folder of this user's that no one else may write."""
    import stat
    if mine is not None:
        try:
            os.mkdir(mine, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(mine)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise OSError("%s is not a folder of this user's alone" % mine)
    os.makedirs(path, 0o700, exist_ok=True)


def preload_path(lib):
    """`lib` as LD_PRELOAD can name it: itself, or, when its path holds a
    space or a colon, a symbolic link to it whose path holds neither
    (<cache>/spyreshim/preload/<hash of its real path>/libspyreshim.so,
    kept: every later exec of the program needs it). PreloadError when no
    such link can be made."""
    if not _SPLITS.search(lib):
        return lib
    import hashlib
    real = os.path.realpath(lib)
    digest = hashlib.sha256(os.fsencode(real)).hexdigest()[:16]
    why = []
    for folder, mine in _link_dirs():
        link = os.path.join(folder, digest, os.path.basename(real))
        if _SPLITS.search(link):
            why.append("%s holds one too" % folder)
            continue
        try:
            if os.path.islink(link) and os.readlink(link) == real:
                return link
            _own_dir(os.path.dirname(link), mine)
            tmp = "%s.%d" % (link, os.getpid())
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.symlink(real, tmp)
            os.replace(tmp, link)      # whole or not at all, for a run beside this one
            return link
        except OSError as e:
            why.append("%s: %s" % (folder, e.strerror or e))
    raise PreloadError("%s: ld.so splits LD_PRELOAD at spaces and colons, and no link to it "
                       "without one could be made (%s); install spyreshim in a folder "
                       "without them" % (lib, "; ".join(why)))


def compose_preload(lib, current):
    """LD_PRELOAD's value with `lib` first (preload_path: through a link
    where its path holds a space or colon) and the entries of `current` (a
    value of LD_PRELOAD, or None) after it, without another copy of it."""
    real = os.path.realpath(lib)
    old = [e for e in re.split(r"[:\s]+", current or "") if e and os.path.realpath(e) != real]
    return ":".join([preload_path(lib)] + old)


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
    from .. import library_path
    base = dict(os.environ if env is None else env)
    lib = library_path()
    if lib is None:
        from .main import find_library
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
