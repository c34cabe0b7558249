"""A PyOpenCL buffer never released (a reference nobody gives back, as a C
extension's bug would leave it), made in make_leak: run by test_opencl.py
under the shim with SPYRESHIM_LEAK_CHECK=1, whose report names this
file's lines."""
import ctypes

import pyopencl as cl


def make_leak(ctx):
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 1 << 20)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(buf))


ctx = cl.create_some_context(interactive=False)
make_leak(ctx)
print("leak made")
