"""A ctypes binding of OpenCL that looks clCreateBuffer up (sets its
restype) before it asks the loader for platforms, then makes and releases
one buffer: run by test_opencl.py without and with the shim, the same
output both ways."""
import ctypes

cl = ctypes.CDLL("libOpenCL.so.1")
create = cl.clCreateBuffer          # looked up first
create.restype = ctypes.c_void_p
create.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_int32)]
n = ctypes.c_uint32()
rc = cl.clGetPlatformIDs(0, None, ctypes.byref(n))
print("clGetPlatformIDs rc=%d platforms=%d" % (rc, n.value))
if rc == 0 and n.value:
    plat, dev = ctypes.c_void_p(), ctypes.c_void_p()
    cl.clGetPlatformIDs(1, ctypes.byref(plat), None)
    print("devices rc=%d" % cl.clGetDeviceIDs(plat, ctypes.c_uint64(0xFFFFFFFF), 1,
                                               ctypes.byref(dev), None))
    err = ctypes.c_int32()
    cl.clCreateContext.restype = ctypes.c_void_p
    ctx = cl.clCreateContext(None, 1, ctypes.byref(dev), None, None, ctypes.byref(err))
    m = create(ctx, 1, 1 << 20, None, ctypes.byref(err))
    print("buffer err=%d release=%d" % (err.value, cl.clReleaseMemObject(ctypes.c_void_p(m))))
    cl.clReleaseContext(ctypes.c_void_p(ctx))
