"""JAX preset (docs/frameworks.md): XLA_PYTHON_CLIENT_ALLOCATOR=platform.
XLA's default BFC allocator holds its (non re-entrant) mutex across the
driver call and keeps freed memory in its pool, so a collection can neither
run there nor help; the platform allocator calls the driver directly and
frees back to it, and the shim's policy then collects (it reads the same
variable). JAX has no out-of-memory hook.
"""
import os
import sys

FRAMEWORK_MODULE = "jax"
VALUE = "platform"


def environment(env):
    if "XLA_PYTHON_CLIENT_ALLOCATOR" in env:
        return []           # the user decided
    env["XLA_PYTHON_CLIENT_ALLOCATOR"] = VALUE
    return ["XLA_PYTHON_CLIENT_ALLOCATOR=" + VALUE]


def install():
    if os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR") == VALUE:
        return True, "XLA_PYTHON_CLIENT_ALLOCATOR=platform"
    if "jaxlib" in sys.modules or "jax" in sys.modules:
        return False, ("JAX is already imported: set XLA_PYTHON_CLIENT_ALLOCATOR=platform "
                       "before the program starts (spyreshim run --preset jax)")
    os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", VALUE)
    return True, "XLA_PYTHON_CLIENT_ALLOCATOR=" + os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"]
