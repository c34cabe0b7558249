"""numba preset (docs/frameworks.md): an External Memory Management plugin
(numba.cuda.set_memory_manager) that, when numba's own retry (flush the
pending deallocations, allocate again) still fails with out-of-memory,
collects garbage (device arrays held by reference cycles), flushes the
deallocations that collection queued and tries once more. numba holds no
lock there; the GIL is held. Install before the first CUDA context.
"""
import gc

FRAMEWORK_MODULE = "numba"
_installed = False


def environment(env):
    return []


def _plugin_class():
    from numba.cuda.cudadrv import driver as drv

    base = getattr(drv, "NumbaCUDAMemoryManager", None)
    if base is None:
        return None

    class GCRetryMemoryManager(base):
        """numba's own manager, plus one collection before giving up."""

        def _attempt_allocation(self, allocator):
            try:
                return super()._attempt_allocation(allocator)
            except drv.CudaAPIError as e:
                if not _is_oom(e):
                    raise
                gc.collect()
                self.deallocations.clear()
                return allocator()

    return GCRetryMemoryManager


def _is_oom(e):
    code = getattr(e, "code", None)
    return code == 2 or getattr(code, "value", None) == 2 or str(code).endswith("OUT_OF_MEMORY")


def install():
    global _installed
    if _installed:
        return True, "already installed"
    try:
        from numba import cuda
    except ImportError as e:
        return False, "numba is not installed (%s)" % e
    cls = _plugin_class()
    if cls is None:
        return False, "this numba has no NumbaCUDAMemoryManager to extend"
    cuda.set_memory_manager(cls)
    _installed = True
    return True, "EMM plugin set (collect, flush, retry on out-of-memory)"
