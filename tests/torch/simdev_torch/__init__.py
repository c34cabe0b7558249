"""PyTorch's PrivateUse1 device backed by the simulated accelerator.

    import torch, simdev_torch
    x = torch.ones(4, device=simdev_torch.device)   # "privateuseone:0"

Importing the package loads libsimdev_torch.so with torch.ops.load_library
(its static registrations: the allocator, the device guard, the kernels and
the CPU fallback). Tensors on the device live in simdev memory, allocated
with simdevMalloc and freed with simdevFree when their storage dies: under
LD_PRELOAD=libspyreshim.so the shim serves them. Built by meson where
Debian's libtorch-dev is installed (tests/torch/meson.build); only the
Python that torch was built for (Debian's /usr/bin/python3) imports it.
"""
import os

import torch

_LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libsimdev_torch.so")
torch.ops.load_library(_LIB)

#: the device's name in PyTorch 1.13 (no renaming before 2.0)
NAME = "privateuseone"
#: the one simdev device
device = torch.device(NAME, 0)

__all__ = ["NAME", "device"]
