/* An embedder that initializes and finalizes Python several times, leaking
 * one device tensor from a differently named Python function in each
 * cycle, half of them with the GIL released around the allocation. Run
 * under the shim with leak checking by tests/integration/test_pystack.py:
 * each cycle's leak must be reported with its own function, so frames of
 * one interpreter lifetime are resolved before it ends and never confused
 * with the next one's (code addresses are reused across cycles).
 * Usage: embed_cycles N */
#include <Python.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    int cycles = argc > 1 ? atoi(argv[1]) : 3;
    for (int i = 0; i < cycles; i++) {
        Py_Initialize();
        char src[512];
        snprintf(src, sizeof src,
                 "import ctypes, simdev\n"
                 "def leak_in_cycle_%d():\n"
                 "    t = simdev.Tensor(%d, release_gil=%s)\n"
                 "    ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))\n"
                 "leak_in_cycle_%d()\n",
                 i, (i + 1) << 16, i % 2 ? "True" : "False", i);
        if (PyRun_SimpleString(src) != 0)
            return 2;
        if (Py_FinalizeEx() != 0)
            return 3;
    }
    return 0;
}
