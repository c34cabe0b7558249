"""Four ways to run out of simdev memory, for test_oom_verdict.py: argv[1]
is the scenario, argv[2] the path of libsimdev.so. "foreign" holds most of
the device through libsimdev's own entry point (a dlopen handle's symbol,
which the preloaded shim does not interpose), as another process would."""
import ctypes, sys
scenario, lib = sys.argv[1], sys.argv[2]
shim = ctypes.CDLL(None)             # the interposed entry points (the shim's)
direct = ctypes.CDLL(lib)            # libsimdev's own: memory the shim never sees
M = 1 << 20
def alloc(api, n):
    p = ctypes.c_void_p()
    rc = api.simdevMalloc(ctypes.byref(p), ctypes.c_size_t(n))
    return p.value if rc == 0 else None
def free(p):
    shim.simdevFree(ctypes.c_void_p(p))
kept = []
if scenario == "exhausted":
    while True:
        p = alloc(shim, 4 * M)
        if p is None:
            break
        kept.append(p)
elif scenario == "fragmentation":
    while True:
        p = alloc(shim, 1 * M)
        if p is None:
            break
        kept.append(p)
    for p in kept[::2]:
        free(p)
    assert alloc(shim, 4 * M) is None
elif scenario == "limit":
    while alloc(shim, 4 * M) is not None:
        pass
elif scenario == "foreign":
    assert alloc(direct, 56 * M) is not None
    assert alloc(shim, 16 * M) is None
print("done", len(kept))
