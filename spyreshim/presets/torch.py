"""PyTorch preset (docs/frameworks.md).

environment(): adds `release_lock_on_cudamalloc:True` to
PYTORCH_CUDA_ALLOC_CONF where the installed PyTorch has the option (2.2 and
later, except 2.5, where it was broken: the lock was taken again before
cudaMalloc). With it the caching allocator drops its lock around
cudaMalloc, so the shim's in-call collection is safe and the shim's policy
collects there (python_gc/gc/policy.c reads the same variable).

install(): wraps torch.autograd.backward and torch.autograd.grad in
spyreshim.origin(), so that what the autograd engine allocates on its
device threads (no Python frame there) is labelled by the backward() call
that started it (docs/python-stacks.md); and registers an out-of-memory observer
(torch._C._cuda_attach_out_of_memory_observer) that collects garbage after
PyTorch has released its lock and before it raises OutOfMemoryError, so
that the program's next allocation (a retry) finds the memory free.
"""
import gc
import os
import re

FRAMEWORK_MODULE = "torch"
OPTION = "release_lock_on_cudamalloc:True"
IPC_MIN = "2M"
_installed = False


def installed_version():
    """The installed PyTorch's version as (major, minor), read from its
    files without importing it; None when absent or unreadable."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for d in spec.submodule_search_locations:
        try:
            with open(os.path.join(d, "version.py")) as f:
                m = re.search(r"""__version__\s*=\s*['"](\d+)\.(\d+)""", f.read())
        except OSError:
            continue
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def has_release_lock_option(version):
    return version is not None and version >= (2, 2) and version[:2] != (2, 5)


def environment(env):
    notes = []
    # torch.multiprocessing shares a CUDA tensor by an IPC handle of its
    # caching allocator's segment (2 MiB, 20 MiB or larger): such segments
    # need a region of their own to be exportable (docs/cuda.md, "IPC").
    # PyTorch keeps its segments cached, so the driver allocation each one
    # then costs is paid once, not per tensor; not so without its cache
    # (PYTORCH_NO_CUDA_MEMORY_CACHING: every tensor a cudaMalloc of its own).
    if "SPYRESHIM_CUDA_IPC_MIN" not in env and not env.get("PYTORCH_NO_CUDA_MEMORY_CACHING"):
        env["SPYRESHIM_CUDA_IPC_MIN"] = IPC_MIN
        notes.append("SPYRESHIM_CUDA_IPC_MIN=" + IPC_MIN)
    v = installed_version()
    if not has_release_lock_option(v):
        return notes
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "release_lock_on_cudamalloc" in conf:
        return notes        # the user decided
    env["PYTORCH_CUDA_ALLOC_CONF"] = conf + ("," if conf else "") + OPTION
    return notes + ["PYTORCH_CUDA_ALLOC_CONF=" + env["PYTORCH_CUDA_ALLOC_CONF"]]


def _observer(device, alloc, device_allocated, device_free):
    # PyTorch calls this with its allocator lock released and the GIL held,
    # right before raising OutOfMemoryError: garbage freed now goes back to
    # its cache, which the program's retry (or next allocation) reuses.
    gc.collect()


def _with_origin(fn):
    """fn (torch.autograd.backward or grad) inside spyreshim.origin(): the
    autograd engine runs the graph on its device threads, which have no
    Python frame; their allocations then name this call's Python stack."""
    import functools
    import spyreshim

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with spyreshim.origin():
            return fn(*args, **kwargs)
    call._spyreshim_origin = True
    return call


def install_origin(torch):
    """Wraps torch.autograd.backward (Tensor.backward calls it) and
    torch.autograd.grad once; True when done now or before."""
    ag = torch.autograd
    for name in ("backward", "grad"):
        fn = getattr(ag, name, None)
        if fn is not None and not getattr(fn, "_spyreshim_origin", False):
            setattr(ag, name, _with_origin(fn))
    return True


def install():
    global _installed
    if _installed:
        return True, "already installed"
    try:
        import torch
    except ImportError as e:
        return False, "PyTorch is not installed (%s)" % e
    install_origin(torch)
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None:
        return False, ("this PyTorch (%s) has no out-of-memory observer API (a build without "
                       "CUDA, or older than 2.0)" % torch.__version__)
    attach(_observer)
    _installed = True
    return True, "out-of-memory observer attached"
