"""The preloaded libspyreshim bound with ctypes: the structures of its
API (spyreshim.h), the prototypes, and the copy already in the process,
found once (never loaded: the shim only makes sense preloaded).

Apart from spyreshim/__init__.py, which imports it on first use: the
command line imports the package too, and `spyreshim run` (which only
execs the program) must not pay for ctypes on every launch.
"""

import ctypes
import os
import threading

_U64 = ctypes.c_uint64
STATS_FIELDS = [
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
    _fields_ = [("size", ctypes.c_size_t)] + [(n, _U64) for n in STATS_FIELDS]


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
lib_path = None      # its file name, once found
_probed = False
why = "libspyreshim is not preloaded into this process"


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


def bind():
    """The already-loaded library with its prototypes set, or None."""
    global _lib, lib_path, _probed, why
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
            why = "%s has no snapshot API (%s)" % (path or "the preloaded libspyreshim", e)
            return None
        try:
            lib.spyreshim_reset_peak.argtypes = []
            lib.spyreshim_reset_peak.restype = None
        except AttributeError:
            pass   # an older library: spyreshim.reset_peak() says so
        try:
            lib.spyreshim_origin_begin.argtypes = []
            lib.spyreshim_origin_begin.restype = ctypes.c_uint32
            lib.spyreshim_origin_end.argtypes = [ctypes.c_uint32]
            lib.spyreshim_origin_end.restype = None
        except AttributeError:
            pass   # an older library: spyreshim.origin() does nothing
        try:
            lib.spyreshim_thread_reset_peak.argtypes = []
            lib.spyreshim_thread_reset_peak.restype = ctypes.c_int
            lib.spyreshim_thread_used.argtypes = []
            lib.spyreshim_thread_used.restype = _U64
            lib.spyreshim_thread_peak.argtypes = []
            lib.spyreshim_thread_peak.restype = _U64
            lib.spyreshim_snapshot_take_thread.argtypes = [_U64]
            lib.spyreshim_snapshot_take_thread.restype = ctypes.c_void_p
        except AttributeError:
            pass   # an older library: spyreshim.thread_reset_peak() says so
        _lib, lib_path = lib, path
        return lib


def stats(lib):
    """The counters (spyreshim_get_stats) of the bound `lib`, as a dict."""
    s = _Stats()
    s.size = ctypes.sizeof(_Stats)
    if lib.spyreshim_get_stats(ctypes.byref(s)) != 0:
        raise OSError("spyreshim_get_stats failed")
    return {n: int(getattr(s, n)) for n in STATS_FIELDS}


def errno():
    return ctypes.get_errno()
