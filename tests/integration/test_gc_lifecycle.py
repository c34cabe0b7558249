"""The interpreter's lifecycle around the pressure callback, on every
interpreter of the matrix: threads that outlive the interpreter and keep
allocating while it finalizes (the exit gate), a collection already running
when pressure hits, fork() after the GC thread started, and
subinterpreters. Each case is its own process with a hard timeout."""
import ast
import textwrap

import gc_support
import pythons

PRELUDE = """
import gc, os, sys, threading, time, simdev
gc.disable()
def garbage(n, release_gil=False, nbytes=1 << 20):
    for i in range(n):
        t = simdev.Tensor(nbytes, release_gil=release_gil)
        t.me = t
        del t
def fill_with_garbage(nbytes=1 << 20):
    while simdev.mem_info()[0] >= nbytes:
        garbage(1, nbytes=nbytes)
"""

EXIT_WHILE_ALLOCATING = PRELUDE + """
import gchelper
fill_with_garbage(); garbage(2)
def daemon(release_gil):
    while True:
        try:
            garbage(1, release_gil=release_gil)
        except simdev.OutOfMemoryError:
            pass
for rg in (False, True, True):
    threading.Thread(target=daemon, args=(rg,), daemon=True).start()
gchelper.start_c_thread(1 << 20, 1000000)   # never joined: runs past finalization
time.sleep(0.2)
try:
    fill_with_garbage()                      # contended: may lose to the daemons
except simdev.OutOfMemoryError:
    pass
print("exiting", flush=True)
sys.exit(3)                                  # finalization with all of them allocating
"""


def test_threads_allocating_through_interpreter_exit(interpreter, tmp_path):
    res, stats = gc_support.run(interpreter, textwrap.dedent(EXIT_WHILE_ALLOCATING), tmp_path,
                                memory="16M", helper=True,
                                env={"SPYRESHIM_GC_TIMEOUT_MS": "500"})
    assert not res.timed_out and res.returncode == 3, res.describe()
    assert "exiting" in res.stdout
    assert stats and stats["gc_collections"] > 0, stats


ALREADY_COLLECTING = PRELUDE + """
allocated = []
class AllocatesInDel:
    # Runs inside a collection the program started; the device is full, so
    # this allocation hits pressure while a collection is already running.
    def __del__(self):
        try:
            allocated.append(simdev.Tensor(1 << 20))
        except simdev.OutOfMemoryError:
            allocated.append(None)
fill_with_garbage(); garbage(2)                 # arms the gate (and its gc.callbacks hook)
fill_with_garbage()
for i in range(3):
    a = AllocatesInDel(); a.me = a; del a
gc.collect()
print("outcomes", ["ok" if t is not None else "oom" for t in allocated])
garbage(30)                                  # and collecting still works afterwards
print("done")
"""


def test_pressure_during_a_running_collection(interpreter, tmp_path):
    res, stats = gc_support.run(interpreter, textwrap.dedent(ALREADY_COLLECTING), tmp_path,
                                memory="16M")
    res.check()
    assert "done" in res.stdout and "outcomes" in res.stdout, res.describe()
    line = [l for l in res.stdout.splitlines() if l.startswith("outcomes ")][0]
    outcomes = ast.literal_eval(line.split(" ", 1)[1])
    # Every finalizer's request has an answer, and collecting still works
    # afterwards ("done": 30 more collections' worth of garbage).
    assert len(outcomes) == 3 and set(outcomes) <= {"ok", "oom"}, res.describe()
    if interpreter.kind == "cpython":
        # docs/python-gc.md: pressure raised by a finalizer of a collection on
        # the same thread fails that one request without starting another
        # collection. CPython runs the finalizers before it frees the cycles'
        # tensors, so the device is still full: each one is out-of-memory,
        # noticed through the gc.callbacks hook, every round.
        assert outcomes == ["oom", "oom", "oom"], res.describe()
        assert stats["gc_skipped_by_reason"]["collector_running"] >= 3, stats


FORK = PRELUDE + """
fill_with_garbage(); garbage(4, release_gil=True)    # the GC thread exists now
pid = os.fork()
if pid == 0:
    try:
        fill_with_garbage(); garbage(20, release_gil=True)  # a new GC thread, in the child
        os._exit(0)
    except BaseException as e:
        print("child:", repr(e), flush=True)
        os._exit(1)
_, status = os.waitpid(pid, 0)
print("child status", status)
assert status == 0
garbage(20, release_gil=True)
print("parent ok")
"""


def test_fork_after_the_gc_thread_started(interpreter, tmp_path):
    if gc_support.tsan_runtime():
        pythons.need("no-tsan", "ThreadSanitizer cannot start threads after a multi-threaded fork")
    res, stats = gc_support.run(interpreter, textwrap.dedent(FORK), tmp_path, memory="16M",
                                env={"PYTHONWARNINGS": "ignore"})
    res.check()
    assert "parent ok" in res.stdout, res.describe()


SUBINTERP = PRELUDE + """
try:
    import _interpreters as interpreters           # 3.13+
    def run_in(interp, code): return interpreters.run_string(interp, code)
except ImportError:
    import _xxsubinterpreters as interpreters      # 3.8 - 3.12
    def run_in(interp, code): return interpreters.run_string(interp, code)
fill_with_garbage(); garbage(2)                    # arms the exit gate from the main interpreter
sub = interpreters.create()
code = '''
import gc, simdev
gc.disable()
ok = oom = 0
for i in range(40):
    try:
        t = simdev.Tensor(1 << 20); t.me = t; del t
        ok += 1
    except simdev.OutOfMemoryError:
        oom += 1
print("sub", ok, oom, flush=True)
'''
r = run_in(sub, code)
if r is not None and not isinstance(r, tuple):
    print("run_string:", r)
interpreters.destroy(sub)
garbage(40)                                        # the main interpreter still collects
print("main ok", sys.version_info[:2])
"""


def test_subinterpreters_never_deadlock(interpreter, tmp_path):
    if interpreter.kind != "cpython":
        pythons.need("subinterpreters", f"{interpreter.name}: no subinterpreters")
    res, stats = gc_support.run(interpreter, textwrap.dedent(SUBINTERP), tmp_path,
                                memory="16M", env={"SPYRESHIM_GC_TIMEOUT_MS": "500"})
    res.check()
    assert "main ok" in res.stdout, res.describe()
    sub = [line for line in res.stdout.splitlines() if line.startswith("sub ")]
    assert sub, res.describe()
    ok, oom = map(int, sub[0].split()[1:])
    if interpreter.version >= (3, 12):
        # A caller attached to a subinterpreter collects that interpreter.
        assert (ok, oom) == (40, 0), res.describe()
    else:
        # 3.11 and older: such a caller is skipped (waiting for the GIL from
        # there would deadlock); its requests fail, nothing hangs.
        assert stats["gc_skipped_by_reason"]["subinterpreter"] > 0, stats
