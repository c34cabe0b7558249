/* Prints, from an interpreter's own headers, the offsets python_gc/pyframes.c
 * must use for it, "name value" per line with the names of
 * pystack_test_layout() (tests/pystack/hook.c). Built by
 * tests/integration/test_pystack.py against each interpreter's include
 * directory; never part of the shim (which is built without Python
 * headers). */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>
#elif PY_VERSION_HEX < 0x030E0000
#include "internal/pycore_frame.h"
#else
#include "internal/pycore_interpframe_structs.h"   /* 3.14 moved the frame struct */
#endif

#define SHOW(name, value) printf("%s %td\n", name, (ptrdiff_t)(value))

int main(void)
{
    SHOW("ob_type", offsetof(PyObject, ob_type));
    SHOW("ts_interp", offsetof(PyThreadState, interp));
    SHOW("str_hash", offsetof(PyASCIIObject, hash));
    SHOW("co_firstlineno", offsetof(PyCodeObject, co_firstlineno));
    SHOW("co_filename", offsetof(PyCodeObject, co_filename));
    SHOW("co_name", offsetof(PyCodeObject, co_name));
#if PY_VERSION_HEX < 0x030B0000
    SHOW("ts_frame", offsetof(PyThreadState, frame));
    SHOW("cf_current", -1);
    SHOW("fr_back", offsetof(PyFrameObject, f_back));
    SHOW("fr_code", offsetof(PyFrameObject, f_code));
    SHOW("fr_instr", offsetof(PyFrameObject, f_lasti));
    SHOW("fr_owner", -1);
    SHOW("co_qualname", -1);
    SHOW("co_code_adaptive", 0);
    SHOW("co_firsttraceable", 0);
#else
    SHOW("co_qualname", offsetof(PyCodeObject, co_qualname));
    SHOW("co_code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
    SHOW("co_firsttraceable", offsetof(PyCodeObject, _co_firsttraceable));
    SHOW("fr_back", offsetof(_PyInterpreterFrame, previous));
    SHOW("fr_owner", offsetof(_PyInterpreterFrame, owner));
#if PY_VERSION_HEX < 0x030D0000
    SHOW("ts_frame", offsetof(PyThreadState, cframe));
    SHOW("cf_current", offsetof(_PyCFrame, current_frame));
    SHOW("fr_code", offsetof(_PyInterpreterFrame, f_code));
    SHOW("fr_instr", offsetof(_PyInterpreterFrame, prev_instr));
#else
    SHOW("ts_frame", offsetof(PyThreadState, current_frame));
    SHOW("cf_current", -1);
    SHOW("fr_code", offsetof(_PyInterpreterFrame, f_executable));
    SHOW("fr_instr", offsetof(_PyInterpreterFrame, instr_ptr));
#endif
#endif
    return 0;
}
