"""PyTorch's PrivateUse1 device backed by the simulated accelerator.

    import torch, simdev_torch
    x = torch.ones(4, device=simdev_torch.device)  # "privateuseone:0" (1.13), "simdev:0" (2.x)

Importing the package loads libsimdev_torch.so with torch.ops.load_library
(its static registrations: the allocator, the device guard, the kernels, the
CPU fallback and, on 2.x, the PrivateUse1 hooks). Tensors on the device live
in simdev memory, allocated with simdevMalloc and freed with simdevFree when
their storage dies: under LD_PRELOAD=libspyreshim.so the shim serves them.

On PyTorch 2.x the backend is renamed "simdev" and registered as the device
module torch.simdev (device_module.py), with the generated Tensor/Module
methods (x.simdev(), x.is_simdev); torch.accelerator names it where that
exists. PyTorch 1.13 has none of this: the device is "privateuseone".

Built by meson from one source for Debian's 1.13 (build/tests/torch) and for
a PyTorch 2.x wheel (build/tests/torch2, -Dtorch2_python); each build
imports only in the Python whose torch it was built against.
"""
import atexit
import os

import torch

_LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libsimdev_torch.so")
torch.ops.load_library(_LIB)

if hasattr(torch.utils, "rename_privateuse1_backend"):
    from . import device_module

    # A process has one PrivateUse1 backend: renaming twice is refused
    # (a second import of this package, under another name, finds it done).
    if torch._C._get_privateuse1_backend_name() != "simdev":
        torch.utils.rename_privateuse1_backend("simdev")
        torch._register_device_module("simdev", device_module)
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True)
    NAME = "simdev"

    def _autograd_worker_running():
        # PyTorch names its autograd worker threads pt_autograd_<device>.
        try:
            tasks = os.listdir("/proc/self/task")
        except OSError:
            return True
        for tid in tasks:
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    if f.read().startswith("pt_autograd_"):
                        return True
            except OSError:
                pass
        return False

    def _drain_autograd_worker():
        # PyTorch 2.x's backward stashes a copy of the caller's
        # contextvars.Context in the thread-local state that each GraphTask
        # captures (torch.autograd.graph._engine_run_backward), so a
        # GraphTask holds a Python object. The device's autograd worker
        # drops its reference to the GraphTask at the end of the task's last
        # iteration, after it has woken the caller: when the caller's
        # reference went first, the worker destroys the GraphTask and takes
        # the GIL for the decref. A program that ends right after a backward
        # (or whose last backward raised) races that with Py_FinalizeEx: a
        # worker still waiting for the GIL when finalization begins is ended
        # by pthread_exit inside a noexcept destructor, "terminate called
        # without an active exception" and SIGABRT (PyTorch's own issue; a
        # CUDA device has it too). An empty backward queued behind it makes
        # the worker finish that last iteration while this thread waits
        # without the GIL; it goes to the engine directly, not through
        # _engine_run_backward, so its own GraphTask holds no Python object
        # and may be destroyed on the worker at any time. It runs only where
        # the worker exists (starting one at exit brings the same race) and
        # allocates nothing (zero-size tensors).
        if not _autograd_worker_running():
            return
        with torch.enable_grad():
            x = torch.empty(0, device=device, requires_grad=True)
            torch.autograd.Variable._execution_engine.run_backward(
                (x,), (torch.empty(0, device=device),), False, False, (),
                allow_unreachable=True, accumulate_grad=True)

    atexit.register(_drain_autograd_worker)
else:
    #: the device's name in PyTorch 1.13 (no renaming before 2.0)
    NAME = "privateuseone"

#: the one simdev device
device = torch.device(NAME, 0)

__all__ = ["NAME", "device"]
