"""CuPy preset (docs/frameworks.md): nothing to change. CuPy's pool releases
its lock and the GIL before cudaMalloc, and on out-of-memory it frees its
cached blocks, collects garbage twice itself and retries; the shim's
policy collects on its own thread for CuPy's calls (safe: CuPy's free never
blocks), which also rescues CuPy without a pool (set_allocator(None)).
"""
FRAMEWORK_MODULE = "cupy"


def environment(env):
    return []


def install():
    try:
        import cupy  # noqa: F401
    except ImportError as e:
        return False, "CuPy is not installed (%s)" % e
    return True, "nothing to install: CuPy collects on out-of-memory itself"
