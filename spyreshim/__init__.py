"""Python side of spyreshim: the public API of a preloaded libspyreshim.

    import spyreshim
    if spyreshim.available():
        with spyreshim.track() as t:
            work()
        if t.snapshot.count:
            t.snapshot.print()          # grouped stacks on stderr

This module never loads the library itself: the shim only makes sense when
it was preloaded before the program started (LD_PRELOAD, `spyreshim run`),
so it binds to the copy already in the process or reports it absent. Calls
keep the GIL held (ctypes.PyDLL): the shim resolves Python frames for
print/write_json only on a thread that holds it. On PyPy (no PyDLL, native
stacks only) a plain CDLL is used.

The report module (reading, merging and printing report files) needs no
shim and is what the `spyreshim` command line uses.
"""

import collections
import gc
import os
import sys

from .reading import report

__all__ = [
    "available", "unavailable_reason", "library_path", "stats", "reset_peak",
    "thread_reset_peak", "thread_used", "thread_peak", "mark", "snapshot", "track",
    "Snapshot", "Allocation", "Tracker", "Unavailable", "report", "child_env",
]



def _version():
    """The project's version, kept in one place: meson.build's project().
    Installed, meson wrote it to _version.py; in the source tree it is read
    from ../meson.build."""
    try:
        from ._version import version
        return version
    except ImportError:
        pass
    import re
    try:
        with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "meson.build"), encoding="utf-8") as f:
            m = re.search(r"project\(\s*'spyreshim'[^)]*?\bversion\s*:\s*'([^']+)'", f.read())
        return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"


__version__ = _version()


class Unavailable(RuntimeError):
    """libspyreshim is not preloaded into this process."""


# The binding (ctypes) is imported on first use, in each function: the
# command line imports this package too, and `spyreshim run` only execs.

def _bind():
    from . import _preloaded
    return _preloaded.bind()


def _need():
    lib = _bind()
    if lib is None:
        from . import _preloaded
        raise Unavailable("%s (run under `spyreshim run -- ...` or LD_PRELOAD=libspyreshim.so)"
                          % _preloaded.why)
    return lib


def available():
    """True when libspyreshim is loaded in this process (never loads it)."""
    return _bind() is not None


def unavailable_reason():
    """Why available() is False (None when it is True)."""
    from . import _preloaded
    return None if _preloaded.bind() is not None else _preloaded.why


def library_path():
    """File name of the preloaded library, or None."""
    from . import _preloaded
    _preloaded.bind()
    return _preloaded.lib_path


def child_env(env=None, full=True):
    """The environment a launcher should give its workers to put each under
    the shim (Ray's runtime_env, subprocess.Popen(env=...), multiprocessing's
    spawn): spyreshim.cli.launch.child_env says what it holds."""
    from .cli import launch
    return launch.child_env(env, full)


def stats():
    """The shim's counters (spyreshim_get_stats) as a dict."""
    from . import _preloaded
    return _preloaded.stats(_need())


def reset_peak():
    """stats()["peak_used_bytes"] restarts from the bytes in use now, so
    that it gives the device peak of what follows."""
    lib = _need()
    if not hasattr(lib, "spyreshim_reset_peak"):
        raise RuntimeError("the preloaded libspyreshim has no spyreshim_reset_peak")
    lib.spyreshim_reset_peak()


class origin(object):
    """`with spyreshim.origin(): ...`: the work this block hands to threads
    without Python frames (a framework's own threads: PyTorch's autograd
    engine runs backward() on one) records this thread's Python stack as its
    origin, which reports show after those threads' native frames and label
    them by (spyreshim_origin_begin/end, docs/python-stacks.md). Does
    nothing where the shim is not loaded."""
    __slots__ = ("_lib", "_token")

    def __enter__(self):
        lib = _bind()
        self._lib = lib if lib is not None and hasattr(lib, "spyreshim_origin_begin") else None
        self._token = self._lib.spyreshim_origin_begin() if self._lib is not None else 0
        return self

    def __exit__(self, *exc):
        if self._lib is not None:
            self._lib.spyreshim_origin_end(self._token)
        return False


def thread_reset_peak():
    """Counts the calling thread's device memory from now on, if it was not
    counted yet, and restarts its peak (thread_peak()) from its bytes live
    now, which it returns: the device bytes this thread allocated (since its
    first call) that are still live, whichever thread frees them."""
    lib = _need()
    if not hasattr(lib, "spyreshim_thread_reset_peak"):
        raise RuntimeError("the preloaded libspyreshim has no spyreshim_thread_reset_peak")
    if lib.spyreshim_thread_reset_peak() != 0:
        raise RuntimeError("spyreshim_thread_reset_peak: this thread cannot be counted "
                           "(65535 counted threads alive, or out of host memory)")
    return int(lib.spyreshim_thread_used())


def thread_used():
    """The device bytes the calling thread allocated that are still live
    (counted from its first thread_reset_peak(); 0 before)."""
    return int(_need().spyreshim_thread_used())


def thread_peak():
    """The most of thread_used() since the calling thread's last
    thread_reset_peak()."""
    return int(_need().spyreshim_thread_peak())


def mark():
    """A point in the sequence of allocations: snapshot(since=mark()) lists
    what was allocated after it and is still live."""
    return int(_need().spyreshim_mark_now())


Allocation = collections.namedtuple(
    "Allocation", ["ptr", "size", "seq", "native_stack", "python_stack", "runtime"])
Allocation.__doc__ = """One live allocation of a snapshot: device address, bytes, sequence
number (compares with marks), interned stack ids (0: none) and runtime."""


class Snapshot(object):
    """Live allocations at one moment (optionally only those after a mark).

    Holds the shim's snapshot until close() (or garbage collection), so that
    print() and write_json() resolve the same stacks later."""

    def __init__(self, since=0, current_thread_only=False):
        self._lib = _need()
        self.since = int(since)
        if current_thread_only and not hasattr(self._lib, "spyreshim_snapshot_take_thread"):
            raise RuntimeError("the preloaded libspyreshim has no spyreshim_snapshot_take_thread")
        take = (self._lib.spyreshim_snapshot_take_thread if current_thread_only
                else self._lib.spyreshim_snapshot_take)
        h = take(self.since)
        if not h:
            raise MemoryError("spyreshim_snapshot_take failed")
        self._h = h
        self.count = int(self._lib.spyreshim_snapshot_count(h))
        self.bytes = int(self._lib.spyreshim_snapshot_bytes(h))
        allocs = []
        for i in range(self.count):
            p = self._lib.spyreshim_snapshot_get(h, i)
            if not p:
                break
            a = p.contents
            allocs.append(Allocation(int(a.ptr), int(a.size), int(a.seq), int(a.native_stack),
                                     int(a.python_stack),
                                     a.runtime.decode("utf-8", "replace") if a.runtime else "?"))
        self.allocations = allocs

    def _handle(self):
        if self._h is None:
            raise ValueError("snapshot is closed")
        return self._h

    def __len__(self):
        return self.count

    def __bool__(self):
        return self.count > 0

    __nonzero__ = __bool__

    def __repr__(self):
        from .reading.units import format_size
        return "<spyreshim.Snapshot %d allocations, %s%s>" % (
            self.count, format_size(self.bytes), ", since %d" % self.since if self.since else "")

    def print(self, max_groups=0, file=None):
        """The grouped LeakSanitizer-style view, on stderr by default
        (`file`: any object with fileno(), or an fd)."""
        if file is None:
            fd = 2
            sys.stderr.flush()
        elif isinstance(file, int):
            fd = file
        else:
            file.flush()
            fd = file.fileno()
        if self._lib.spyreshim_snapshot_print(self._handle(), fd, int(max_groups)) != 0:
            raise OSError("spyreshim_snapshot_print failed")

    def write_json(self, path):
        """The report JSON (docs/report-format.md) at `path`."""
        if self._lib.spyreshim_snapshot_write_json(self._handle(), os.fsencode(path)) != 0:
            from . import _preloaded
            e = _preloaded.errno()
            raise OSError(e, "cannot write spyreshim report %s" % path)

    def report(self):
        """The snapshot as a parsed report (spyreshim.report), with stacks
        resolved; for formatting in Python."""
        # Imported here, not by every `spyreshim run` (which imports this
        # package and execs).
        import json
        import tempfile
        d = tempfile.mkdtemp(prefix="spyreshim-")
        path = os.path.join(d, "snapshot.json")
        try:
            self.write_json(path)
            with open(path, "rb") as f:
                return report.parse(json.loads(f.read().decode("utf-8")), "snapshot")
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass
            os.rmdir(d)

    def text(self, top=0):
        """The grouped view as a string (from report())."""
        return report.text(report.merge([self.report()]), top=top)

    def close(self):
        if self._h is not None:
            self._lib.spyreshim_snapshot_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def snapshot(since=0, current_thread_only=False):
    """Live allocations now; with `since` (a mark()), only those made after
    it; with current_thread_only, only those the calling thread made while
    counted (thread_reset_peak(); device blocks the shim serves alone)."""
    return Snapshot(since, current_thread_only)


def collect(rounds=3):
    """gc.collect() until a round frees nothing (at most `rounds`)."""
    for _ in range(max(1, rounds)):
        if gc.collect() == 0:
            break


class Tracker(object):
    """Context manager: what the block allocated and still holds at its end.

        with spyreshim.track() as t:
            ...
        t.snapshot.count, t.snapshot.bytes, t.snapshot.print()

    With gc_rounds > 0 (the default) cyclic garbage is collected first, so
    only memory that is really still referenced counts."""

    def __init__(self, gc_rounds=3):
        self.gc_rounds = gc_rounds
        self.mark = None
        self.snapshot = None

    def __enter__(self):
        if self.gc_rounds:
            collect(self.gc_rounds)
        self.mark = mark()
        return self

    def __exit__(self, *exc):
        if self.gc_rounds:
            collect(self.gc_rounds)
        self.snapshot = Snapshot(self.mark)
        return False

    @property
    def count(self):
        return self.snapshot.count if self.snapshot is not None else 0

    @property
    def bytes(self):
        return self.snapshot.bytes if self.snapshot is not None else 0


def track(gc_rounds=3):
    """See Tracker."""
    return Tracker(gc_rounds)
