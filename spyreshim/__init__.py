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
import ctypes
import gc
import json
import os
import sys
import tempfile
import threading

from . import report

__all__ = [
    "available", "unavailable_reason", "library_path", "stats", "mark", "snapshot", "track",
    "Snapshot", "Allocation", "Tracker", "Unavailable", "report",
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


_U64 = ctypes.c_uint64
_STATS_FIELDS = [
    "reserved_bytes", "used_bytes", "peak_reserved_bytes", "peak_used_bytes",
    "allocs", "frees", "failed_allocs", "regions", "regions_reserved",
    "regions_released", "invalid_frees", "foreign_frees", "pressure_events",
    "pressure_waits", "callback_runs", "callback_recovered_bytes",
    "gc_collections", "gc_time_ns", "gc_recovered_bytes", "gc_timeouts",
    "gc_skipped", "gc_backoff_skips", "device_waits", "pressure_wait_timeouts",
    "arenas", "context_teardown_blocks", "context_teardown_bytes",
    "managed_bytes", "managed_allocs", "managed_frees",
    "host_pinned_bytes", "host_pinned_allocs", "host_pinned_frees",
    "vmm_bytes", "vmm_allocs", "vmm_frees",
    "async_bytes", "async_allocs", "async_frees",
]


class _Stats(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t)] + [(n, _U64) for n in _STATS_FIELDS]


class _AllocInfo(ctypes.Structure):
    _fields_ = [
        ("ptr", ctypes.c_size_t),        # uintptr_t
        ("size", ctypes.c_size_t),
        ("seq", _U64),
        ("native_stack", ctypes.c_uint32),
        ("python_stack", ctypes.c_uint32),
        ("runtime", ctypes.c_char_p),
    ]


# PyDLL keeps the GIL across calls (CPython); PyPy has no PyDLL, and no
# Python stacks in the shim either, so a plain CDLL serves there.
_DLL = getattr(ctypes, "PyDLL", ctypes.CDLL)

_lock = threading.Lock()
_lib = None          # the bound library, once found
_lib_path = None
_probed = False
_why = "libspyreshim is not preloaded into this process"


def _preloaded_path():
    """Path of a libspyreshim mapped into this process, from /proc."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[-1]
                if os.path.basename(path).startswith("libspyreshim") and ".so" in path:
                    return path
    except OSError:
        pass
    return None


def _bind():
    """The already-loaded library with its prototypes set, or None."""
    global _lib, _lib_path, _probed, _why
    with _lock:
        if _probed:
            return _lib
        _probed = True
        path = _preloaded_path()
        lib = None
        try:
            # The global scope: a preloaded library's exports are there.
            lib = _DLL(None, use_errno=True)
            lib.spyreshim_get_stats
        except (OSError, AttributeError):
            lib = None
        if lib is None and path:
            # Mapped but not in the global scope (dlopen'ed RTLD_LOCAL):
            # RTLD_NOLOAD returns the existing handle and never loads a copy.
            try:
                lib = _DLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL, use_errno=True)
                lib.spyreshim_get_stats
            except (OSError, AttributeError):
                lib = None
        if lib is None:
            return None
        try:
            lib.spyreshim_get_stats.argtypes = [ctypes.POINTER(_Stats)]
            lib.spyreshim_get_stats.restype = ctypes.c_int
            lib.spyreshim_mark_now.argtypes = []
            lib.spyreshim_mark_now.restype = _U64
            lib.spyreshim_snapshot_take.argtypes = [_U64]
            lib.spyreshim_snapshot_take.restype = ctypes.c_void_p
            lib.spyreshim_snapshot_count.argtypes = [ctypes.c_void_p]
            lib.spyreshim_snapshot_count.restype = ctypes.c_size_t
            lib.spyreshim_snapshot_bytes.argtypes = [ctypes.c_void_p]
            lib.spyreshim_snapshot_bytes.restype = _U64
            lib.spyreshim_snapshot_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            lib.spyreshim_snapshot_get.restype = ctypes.POINTER(_AllocInfo)
            lib.spyreshim_snapshot_print.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
            lib.spyreshim_snapshot_print.restype = ctypes.c_int
            lib.spyreshim_snapshot_write_json.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
            lib.spyreshim_snapshot_write_json.restype = ctypes.c_int
            lib.spyreshim_snapshot_free.argtypes = [ctypes.c_void_p]
            lib.spyreshim_snapshot_free.restype = None
        except AttributeError as e:
            # An older library without the snapshot API.
            _why = "%s has no snapshot API (%s)" % (path or "the preloaded libspyreshim", e)
            return None
        _lib, _lib_path = lib, path
        return lib


def _need():
    lib = _bind()
    if lib is None:
        raise Unavailable("%s (run under `spyreshim run -- ...` or LD_PRELOAD=libspyreshim.so)"
                          % _why)
    return lib


def available():
    """True when libspyreshim is loaded in this process (never loads it)."""
    return _bind() is not None


def unavailable_reason():
    """Why available() is False (None when it is True)."""
    return None if _bind() is not None else _why


def library_path():
    """File name of the preloaded library, or None."""
    _bind()
    return _lib_path


def stats():
    """The shim's counters (spyreshim_get_stats) as a dict."""
    lib = _need()
    s = _Stats()
    s.size = ctypes.sizeof(_Stats)
    if lib.spyreshim_get_stats(ctypes.byref(s)) != 0:
        raise OSError("spyreshim_get_stats failed")
    return {n: int(getattr(s, n)) for n in _STATS_FIELDS}


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

    def __init__(self, since=0):
        self._lib = _need()
        self.since = int(since)
        h = self._lib.spyreshim_snapshot_take(self.since)
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
        return "<spyreshim.Snapshot %d allocations, %d bytes%s>" % (
            self.count, self.bytes, ", since %d" % self.since if self.since else "")

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
            e = ctypes.get_errno()
            raise OSError(e, "cannot write spyreshim report %s" % path)

    def report(self):
        """The snapshot as a parsed report (spyreshim.report), with stacks
        resolved; for formatting in Python."""
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


def snapshot(since=0):
    """Live allocations now; with `since` (a mark()), only those made after it."""
    return Snapshot(since)


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
