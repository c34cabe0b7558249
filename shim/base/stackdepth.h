/* SPYRESHIM_STACK_DEPTH's defaults, kept once: the leak check's capture
 * (shim/leak/leak.c), the options table's text (options.c) and `spyreshim
 * run --help` (spyreshim/cli/main.py reads the two #define lines below: keep
 * their form; meson installs this file next to the Python package).
 *
 * Unset, the native frames recorded per allocation, and the same number of
 * Python frames; the second once a Python stack was recorded. A framework's
 * allocation is deep: a PyTorch tensor allocated in an nn.Module's forward
 * is 50-60 native frames below main (an MLP with Adam, measured in
 * docs/leaks.md), most of them the dispatcher's, and every Python call
 * entered from C adds the interpreter's frames; cut there, the Python
 * frames cannot be spliced in (shim/leak/report.c). Walking costs only the
 * frames a stack has, so the larger depth costs nothing where stacks are
 * shallow. */
#ifndef SHIM_STACKDEPTH_H
#define SHIM_STACKDEPTH_H

#define SHIM_STACK_DEPTH_DEFAULT 32
#define SHIM_STACK_DEPTH_DEFAULT_PYTHON 128

#endif
