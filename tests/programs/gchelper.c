/* gchelper: a test extension module that plays the C++ side of a framework
 * for the Python GC integration tests (tests/integration/test_gc_*.py):
 *
 *  - a C thread, unknown to Python, that allocates device memory under
 *    pressure (start_c_thread / join_c_thread);
 *  - the foreign-lock scenario of the design note: that C thread holds a
 *    lock L while it allocates, and the GIL holder blocks on L without
 *    releasing the GIL (block_on_lock).
 *
 * Built per interpreter by tests/integration/gc_support.py. Multi-phase init
 * and Py_mod_gil so that a free-threaded interpreter stays free-threaded. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "simdev.h"

static pthread_mutex_t lock_L = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int c_holds_L, main_waits_L;

typedef struct {
    pthread_t tid;
    size_t nbytes;
    int count;
    int hold_lock;
    int keep;              /* keep the last allocation (its contents are checked) */
    _Atomic int done;
    int ok, oom, other, bad_contents;
    _Atomic int attempts;
} cthread;

#define MAX_THREADS 16
static cthread threads[MAX_THREADS];
static int nthreads;

static void *c_thread_main(void *arg)
{
    cthread *t = arg;
    if (t->hold_lock) {
        pthread_mutex_lock(&lock_L);
        atomic_store(&c_holds_L, 1);
        /* Allocate only once the GIL holder is (about to be) blocked on L
         * with the GIL held: it sets the flag right before locking. */
        while (!atomic_load(&main_waits_L)) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < t->count; i++) {
        void *p = NULL;
        int err = simdevMalloc(&p, t->nbytes);
        if (err == simdevSuccess) {
            t->ok++;
            unsigned char pattern = (unsigned char)(0x40 + i % 64), back[64];
            simdevMemset(p, pattern, t->nbytes);
            simdevMemcpy(back, p, sizeof back < t->nbytes ? sizeof back : t->nbytes,
                         simdevMemcpyDeviceToHost);
            for (size_t k = 0; k < sizeof back && k < t->nbytes; k++)
                if (back[k] != pattern) {
                    t->bad_contents++;
                    break;
                }
            simdevFree(p);
        } else if (err == simdevErrorMemoryAllocation) {
            t->oom++;
        } else {
            t->other++;
        }
        atomic_fetch_add(&t->attempts, 1);
    }
    if (t->hold_lock) {
        atomic_store(&c_holds_L, 0);
        pthread_mutex_unlock(&lock_L);
    }
    atomic_store(&t->done, 1);
    return NULL;
}

static PyObject *start_c_thread(PyObject *m, PyObject *args, PyObject *kw)
{
    (void)m;
    static char *kwlist[] = {"nbytes", "count", "hold_lock", NULL};
    Py_ssize_t nbytes;
    int count, hold = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ni|p", kwlist, &nbytes, &count, &hold))
        return NULL;
    if (nthreads >= MAX_THREADS) {
        PyErr_SetString(PyExc_RuntimeError, "too many C threads");
        return NULL;
    }
    cthread *t = &threads[nthreads];
    memset(t, 0, sizeof *t);
    t->nbytes = (size_t)nbytes;
    t->count = count;
    t->hold_lock = hold;
    if (hold)
        atomic_store(&main_waits_L, 0);
    if (pthread_create(&t->tid, NULL, c_thread_main, t) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "pthread_create failed");
        return NULL;
    }
    return PyLong_FromLong(nthreads++);
}

/* Waits (GIL released) at most `timeout` seconds; returns (ok, oom, other,
 * bad_contents) or None when the thread is still running. */
static PyObject *join_c_thread(PyObject *m, PyObject *args)
{
    (void)m;
    int id;
    double timeout;
    if (!PyArg_ParseTuple(args, "id", &id, &timeout))
        return NULL;
    if (id < 0 || id >= nthreads) {
        PyErr_SetString(PyExc_ValueError, "no such thread");
        return NULL;
    }
    cthread *t = &threads[id];
    int done;
    Py_BEGIN_ALLOW_THREADS
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        done = atomic_load(&t->done);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (done || (now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 > timeout)
            break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (done)
        pthread_join(t->tid, NULL);
    Py_END_ALLOW_THREADS
    if (!done)
        Py_RETURN_NONE;
    return Py_BuildValue("(iiii)", t->ok, t->oom, t->other, t->bad_contents);
}

/* Requests the C thread has completed so far. */
static PyObject *c_thread_attempts(PyObject *m, PyObject *args)
{
    (void)m;
    int id;
    if (!PyArg_ParseTuple(args, "i", &id))
        return NULL;
    if (id < 0 || id >= nthreads) {
        PyErr_SetString(PyExc_ValueError, "no such thread");
        return NULL;
    }
    return PyLong_FromLong(atomic_load(&threads[id].attempts));
}

/* Waits (GIL released) until the C thread holds L. */
static PyObject *wait_c_holds_lock(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    while (!atomic_load(&c_holds_L)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* The GIL holder blocks on L WITHOUT releasing the GIL, as framework code
 * that takes its own mutex inside a binding does. */
static PyObject *block_on_lock(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    atomic_store(&main_waits_L, 1);
    pthread_mutex_lock(&lock_L);
    pthread_mutex_unlock(&lock_L);
    Py_RETURN_NONE;
}

/* Takes two mutexes in both orders (one thread, no actual deadlock): the
 * canary that shows a ThreadSanitizer run fails on a lock-order report. */
static PyObject *lock_order_inversion(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    static pthread_mutex_t a = PTHREAD_MUTEX_INITIALIZER, b = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&a);
    pthread_mutex_lock(&b);
    pthread_mutex_unlock(&b);
    pthread_mutex_unlock(&a);
    pthread_mutex_lock(&b);
    pthread_mutex_lock(&a);
    pthread_mutex_unlock(&a);
    pthread_mutex_unlock(&b);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"lock_order_inversion", lock_order_inversion, METH_NOARGS, NULL},
    {"start_c_thread", (PyCFunction)(void (*)(void))start_c_thread, METH_VARARGS | METH_KEYWORDS,
     "start_c_thread(nbytes, count, hold_lock=False) -> id"},
    {"join_c_thread", join_c_thread, METH_VARARGS,
     "join_c_thread(id, timeout) -> (ok, oom, other, bad_contents) or None"},
    {"c_thread_attempts", c_thread_attempts, METH_VARARGS, "c_thread_attempts(id) -> int"},
    {"wait_c_holds_lock", wait_c_holds_lock, METH_NOARGS, NULL},
    {"block_on_lock", block_on_lock, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot slots[] = {
#if defined(Py_mod_multiple_interpreters) && !defined(PYPY_VERSION)
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#if defined(Py_mod_gil) && !defined(PYPY_VERSION)
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef def = {
    PyModuleDef_HEAD_INIT, .m_name = "gchelper", .m_size = 0, .m_methods = methods,
    .m_slots = slots,
};

__attribute__((visibility("default"))) PyMODINIT_FUNC PyInit_gchelper(void)
{
    return PyModuleDef_Init(&def);
}
