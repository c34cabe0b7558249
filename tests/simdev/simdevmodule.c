/* The `simdev` Python module: device tensors that free their memory in
 * their deallocator, as a framework's storage deleter does.
 *
 * Owns: the Tensor heap type and the OutOfMemoryError class, both in module
 * state (multi-phase init, PEP 489), so the module can be imported again
 * after Py_Finalize/Py_Initialize and once per subinterpreter. A Tensor's
 * fields are written only while it is created and destroyed, so it needs no
 * lock of its own on free-threaded builds; the device runtime has its own.
 * Tensors carry an instance __dict__ and take part in cyclic GC, so tests
 * can hide device memory in reference cycles (`t.me = t`).
 * Never touches device memory except through simdevMemset/simdevMemcpy. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pthread.h>

#include "simdev.h"

#if PY_VERSION_HEX >= 0x03090000 || defined(PYPY_VERSION)
#define HAVE_TYPE_MODULE 1
#else
#define HAVE_TYPE_MODULE 0
#endif

typedef struct {
    PyObject *tensor_type;
    PyObject *oom_error;
} module_state;

typedef struct {
    PyObject_HEAD
    void *ptr;
    Py_ssize_t nbytes;
    PyObject *dict;
    PyObject *weakrefs;
} Tensor;

static module_state *state_of_module(PyObject *m)
{
    return (module_state *)PyModule_GetState(m);
}

/* New reference to the OutOfMemoryError class that goes with `type`. */
static PyObject *oom_error_for(PyTypeObject *type)
{
#if HAVE_TYPE_MODULE
    PyObject *m = PyType_GetModule(type);
    if (!m)
        return NULL;
    PyObject *err = state_of_module(m)->oom_error;
    Py_XINCREF(err);
    return err;
#else
    /* 3.8 has no way from a type to its module: the class is stored on the
     * type itself by the module's exec function. */
    return PyObject_GetAttrString((PyObject *)type, "_OutOfMemoryError");
#endif
}

static PyObject *Tensor_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = { "nbytes", "release_gil", NULL };
    Py_ssize_t nbytes;
    int release_gil = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n|p:Tensor", kwlist, &nbytes, &release_gil))
        return NULL;
    if (nbytes < 0) {
        PyErr_SetString(PyExc_ValueError, "Tensor: nbytes must be >= 0");
        return NULL;
    }
    Tensor *self = (Tensor *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;

    void *ptr = NULL;
    simdevError_t err;
    if (release_gil) {
        Py_BEGIN_ALLOW_THREADS
        err = simdevMalloc(&ptr, (size_t)nbytes);
        Py_END_ALLOW_THREADS
    } else {
        err = simdevMalloc(&ptr, (size_t)nbytes);
    }
    if (err != simdevSuccess) {
        Py_DECREF(self);
        if (err == simdevErrorMemoryAllocation) {
            PyObject *cls = oom_error_for(type);
            if (cls) {
                PyErr_Format(cls, "simdev: out of memory allocating %zd bytes", nbytes);
                Py_DECREF(cls);
            }
        } else {
            PyErr_Format(PyExc_RuntimeError, "simdevMalloc(%zd): %s", nbytes,
                         simdevGetErrorString(err));
        }
        return NULL;
    }
    self->ptr = ptr;
    self->nbytes = nbytes;
    return (PyObject *)self;
}

static int Tensor_traverse(Tensor *self, visitproc visit, void *arg)
{
    Py_VISIT(self->dict);
#ifndef PYPY_VERSION
    Py_VISIT(Py_TYPE(self));
#endif
    return 0;
}

static int Tensor_clear(Tensor *self)
{
    Py_CLEAR(self->dict);
    return 0;
}

static void Tensor_dealloc(Tensor *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    Tensor_clear(self);
    if (self->ptr) {
        simdevFree(self->ptr);
        self->ptr = NULL;
    }
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(self);
    Py_DECREF(tp);
}

static PyObject *Tensor_get_ptr(Tensor *self, void *closure)
{
    (void)closure;
    return PyLong_FromVoidPtr(self->ptr);
}

static PyObject *Tensor_get_nbytes(Tensor *self, void *closure)
{
    (void)closure;
    return PyLong_FromSsize_t(self->nbytes);
}

static PyObject *Tensor_repr(Tensor *self)
{
    return PyUnicode_FromFormat("<simdev.Tensor nbytes=%zd ptr=%p>", self->nbytes, self->ptr);
}

static PyObject *Tensor_fill(Tensor *self, PyObject *arg)
{
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    if (v < 0 || v > 255) {
        PyErr_SetString(PyExc_ValueError, "fill: byte must be in 0..255");
        return NULL;
    }
    simdevError_t err = simdevMemset(self->ptr, (int)v, (size_t)self->nbytes);
    if (err != simdevSuccess)
        return PyErr_Format(PyExc_RuntimeError, "simdevMemset: %s", simdevGetErrorString(err));
    Py_RETURN_NONE;
}

static PyObject *Tensor_read(Tensor *self, PyObject *unused)
{
    (void)unused;
    PyObject *out = PyBytes_FromStringAndSize(NULL, self->nbytes);
    if (!out)
        return NULL;
    simdevError_t err = simdevMemcpy(PyBytes_AS_STRING(out), self->ptr, (size_t)self->nbytes,
                                     simdevMemcpyDeviceToHost);
    if (err != simdevSuccess) {
        Py_DECREF(out);
        return PyErr_Format(PyExc_RuntimeError, "simdevMemcpy: %s", simdevGetErrorString(err));
    }
    return out;
}

static PyObject *Tensor_write(Tensor *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (view.len > self->nbytes) {
        PyErr_Format(PyExc_ValueError, "write: %zd bytes do not fit in a tensor of %zd",
                     view.len, self->nbytes);
        PyBuffer_Release(&view);
        return NULL;
    }
    simdevError_t err = simdevMemcpy(self->ptr, view.buf, (size_t)view.len,
                                     simdevMemcpyHostToDevice);
    PyBuffer_Release(&view);
    if (err != simdevSuccess)
        return PyErr_Format(PyExc_RuntimeError, "simdevMemcpy: %s", simdevGetErrorString(err));
    Py_RETURN_NONE;
}

static PyMethodDef Tensor_methods[] = {
    { "fill", (PyCFunction)Tensor_fill, METH_O, "fill(byte): set every byte of the tensor." },
    { "read", (PyCFunction)Tensor_read, METH_NOARGS, "read() -> bytes: the tensor's contents." },
    { "write", (PyCFunction)Tensor_write, METH_O,
      "write(data): copy a bytes-like object to the start of the tensor." },
    { NULL, NULL, 0, NULL },
};

static PyGetSetDef Tensor_getset[] = {
    { "ptr", (getter)Tensor_get_ptr, NULL, "device address (int; 0 for an empty tensor)", NULL },
    { "nbytes", (getter)Tensor_get_nbytes, NULL, "size in bytes", NULL },
    { "__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL },
    { NULL, NULL, NULL, NULL, NULL },
};

#if PY_VERSION_HEX >= 0x03090000 || defined(PYPY_VERSION)
static PyMemberDef Tensor_members[] = {
    { "__dictoffset__", T_PYSSIZET, offsetof(Tensor, dict), READONLY, NULL },
    { "__weaklistoffset__", T_PYSSIZET, offsetof(Tensor, weakrefs), READONLY, NULL },
    { NULL, 0, 0, 0, NULL },
};
#endif

static PyType_Slot Tensor_slots[] = {
    { Py_tp_doc, (void *)"Tensor(nbytes, release_gil=False): nbytes of device memory, "
                         "freed when the object is." },
    { Py_tp_new, (void *)Tensor_new },
    { Py_tp_dealloc, (void *)Tensor_dealloc },
    { Py_tp_traverse, (void *)Tensor_traverse },
    { Py_tp_clear, (void *)Tensor_clear },
    { Py_tp_repr, (void *)Tensor_repr },
    { Py_tp_methods, Tensor_methods },
    { Py_tp_getset, Tensor_getset },
#if PY_VERSION_HEX >= 0x03090000 || defined(PYPY_VERSION)
    { Py_tp_members, Tensor_members },
#endif
    { 0, NULL },
};

static PyType_Spec Tensor_spec = {
    .name = "simdev.Tensor",
    .basicsize = sizeof(Tensor),
    .itemsize = 0,
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = Tensor_slots,
};

static PyObject *mem_info(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    size_t free_bytes = 0, total = 0;
    simdevError_t err = simdevMemGetInfo(&free_bytes, &total);
    if (err != simdevSuccess)
        return PyErr_Format(PyExc_RuntimeError, "simdevMemGetInfo: %s", simdevGetErrorString(err));
    return Py_BuildValue("(KK)", (unsigned long long)free_bytes, (unsigned long long)total);
}

/* call(fn, *args) -> fn(*args): Python -> C -> Python, as frameworks' hooks,
 * autograd functions and custom ops call back; the callback may call into
 * C again (hybrid stacks in leak reports). */
static PyObject *call(PyObject *module, PyObject *args)
{
    (void)module;
    Py_ssize_t n = PyTuple_Size(args);
    if (n < 1) {
        PyErr_SetString(PyExc_TypeError, "call(fn, *args): fn missing");
        return NULL;
    }
    PyObject *rest = PyTuple_GetSlice(args, 1, n);
    if (!rest)
        return NULL;
    PyObject *r = PyObject_CallObject(PyTuple_GET_ITEM(args, 0), rest);
    Py_DECREF(rest);
    return r;
}

static void *c_thread_main(void *arg)
{
    void *ptr = NULL;
    return simdevMalloc(&ptr, *(size_t *)arg) == simdevSuccess ? ptr : NULL;
}

/* leak_in_c_thread(nbytes) -> ptr: a thread that C created and that never
 * ran Python allocates (and leaks) nbytes. */
static PyObject *leak_in_c_thread(PyObject *module, PyObject *arg)
{
    (void)module;
    size_t nbytes = PyLong_AsSize_t(arg);
    if (PyErr_Occurred())
        return NULL;
    pthread_t t;
    void *ptr = NULL;
    if (pthread_create(&t, NULL, c_thread_main, &nbytes) != 0 || pthread_join(t, &ptr) != 0 || !ptr)
        return PyErr_Format(PyExc_RuntimeError, "leak_in_c_thread(%zu) failed", nbytes);
    return PyLong_FromVoidPtr(ptr);
}

static PyMethodDef module_methods[] = {
    { "mem_info", mem_info, METH_NOARGS, "mem_info() -> (free, total): device memory in bytes." },
    { "call", call, METH_VARARGS, "call(fn, *args) -> fn(*args), called from C." },
    { "leak_in_c_thread", leak_in_c_thread, METH_O,
      "leak_in_c_thread(nbytes) -> ptr: a C thread allocates nbytes and never frees them." },
    { NULL, NULL, 0, NULL },
};

static int module_exec(PyObject *m)
{
    module_state *st = state_of_module(m);
    st->oom_error = PyErr_NewException("simdev.OutOfMemoryError", PyExc_MemoryError, NULL);
    if (!st->oom_error)
        return -1;
#if HAVE_TYPE_MODULE
    st->tensor_type = PyType_FromModuleAndSpec(m, &Tensor_spec, NULL);
#else
    st->tensor_type = PyType_FromSpec(&Tensor_spec);
#endif
    if (!st->tensor_type)
        return -1;
#if !HAVE_TYPE_MODULE
    /* 3.8 ignores __dictoffset__/__weaklistoffset__ members in a spec. */
    ((PyTypeObject *)st->tensor_type)->tp_dictoffset = offsetof(Tensor, dict);
    ((PyTypeObject *)st->tensor_type)->tp_weaklistoffset = offsetof(Tensor, weakrefs);
    if (PyObject_SetAttrString(st->tensor_type, "_OutOfMemoryError", st->oom_error) < 0)
        return -1;
#endif
    Py_INCREF(st->oom_error);
    if (PyModule_AddObject(m, "OutOfMemoryError", st->oom_error) < 0) {
        Py_DECREF(st->oom_error);
        return -1;
    }
    Py_INCREF(st->tensor_type);
    if (PyModule_AddObject(m, "Tensor", st->tensor_type) < 0) {
        Py_DECREF(st->tensor_type);
        return -1;
    }
    return 0;
}

static int module_traverse(PyObject *m, visitproc visit, void *arg)
{
    module_state *st = state_of_module(m);
    if (st) {
        Py_VISIT(st->tensor_type);
        Py_VISIT(st->oom_error);
    }
    return 0;
}

static int module_clear(PyObject *m)
{
    module_state *st = state_of_module(m);
    if (st) {
        Py_CLEAR(st->tensor_type);
        Py_CLEAR(st->oom_error);
    }
    return 0;
}

static void module_free(void *m)
{
    module_clear((PyObject *)m);
}

static PyModuleDef_Slot module_slots[] = {
    { Py_mod_exec, (void *)module_exec },
#if defined(Py_mod_multiple_interpreters) && !defined(PYPY_VERSION)
    { Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED },
#endif
#if defined(Py_mod_gil) && !defined(PYPY_VERSION)
    { Py_mod_gil, Py_MOD_GIL_NOT_USED },
#endif
    { 0, NULL },
};

static struct PyModuleDef simdev_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "simdev",
    .m_doc = "Tensors on the simulated device (libsimdev).",
    .m_size = sizeof(module_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

/* Spelled out: 3.8's PyMODINIT_FUNC does not override -fvisibility=hidden. */
__attribute__((visibility("default"))) PyMODINIT_FUNC PyInit_simdev(void)
{
    return PyModuleDef_Init(&simdev_module);
}
