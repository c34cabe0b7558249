"""The design note's execution paths and deadlock scenarios, with real
threads, on every interpreter of the matrix: Python threads allocating under
pressure; a C thread without the GIL allocating under pressure while Python
threads run; and the foreign-lock case (a C thread holds lock L and
allocates under pressure while the GIL holder blocks on L), which must end
within the bound with one out-of-memory error and the program going on.
Each case runs in its own process with a hard timeout: a deadlock fails the
test by the timeout, never hangs it."""
import textwrap

import pytest

import gc_support
import pythons

PRELUDE = """
import gc, sys, threading, time, simdev
HANG_S = %d  # pythons.HANG_S: a wait longer than that is a hang
gc.disable()
class Fin:
    # Python code in a finalizer: a collection running it lets other threads
    # take the GIL in the middle (and they may hit pressure meanwhile).
    def __del__(self):
        sum(range(200))
def garbage(n, release_gil=False, nbytes=1 << 20):
    for i in range(n):
        t = simdev.Tensor(nbytes, release_gil=release_gil)
        t.me = t
        t.fin = Fin()
        t.fin.t = t
        del t
def fill_with_garbage(nbytes=1 << 20):
    # Exactly full, without a pressure event: the next request needs one.
    while simdev.mem_info()[0] >= nbytes:
        garbage(1, nbytes=nbytes)
""" % pythons.HANG_S

PY_THREADS = PRELUDE + """
# One pressure event on the main thread first. PyPy only: until the shim has
# seen the interpreter from the main thread or a thread holding the GIL, it
# cannot tell a Python thread from a foreign one without the GIL, and making
# a foreign thread wait for a GIL PyPy never initialized aborts the process;
# such requests are skipped (gc_skipped_by_reason.pypy_threads).
fill_with_garbage(); garbage(2)
errors = []
def worker(k):
    try:
        garbage(150, release_gil={release_gil})
    except BaseException as e:
        errors.append(repr(e))
threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
for t in threads: t.start()
for t in threads: t.join(HANG_S)
assert not any(t.is_alive() for t in threads), "a worker is stuck"
assert not errors, errors
print("threads ok")
"""


@pytest.mark.parametrize("release_gil", [False, True], ids=["gil-held", "gil-released"])
def test_python_threads_allocating_under_pressure(interpreter, tmp_path, release_gil):
    # Several rounds: with four threads producing garbage (without the GIL,
    # or truly in parallel when free-threaded), a thread can lose the memory
    # a collection freed to the others more than the default three times in
    # a row; the retry count is the allocator's policy, not the collector's.
    res, stats = gc_support.run(interpreter, textwrap.dedent(PY_THREADS.format(
        release_gil=release_gil)), tmp_path, memory="48M",
        env={"SPYRESHIM_PRESSURE_ROUNDS": "16"})
    res.check()
    assert "threads ok" in res.stdout
    assert stats["gc_collections"] > 0 and stats["failed_allocs"] == 0, stats


C_THREAD = PRELUDE + """
import gchelper
fill_with_garbage(); garbage(2)  # pressure seen from Python first (see PY_THREADS)
fill_with_garbage()              # the C thread's first request needs a collection
stop = False
def producer():
    while not stop:
        garbage(5)
        time.sleep(0.001)
tid = gchelper.start_c_thread(1 << 20, 60)
deadline = time.monotonic() + HANG_S
while gchelper.c_thread_attempts(tid) == 0 and time.monotonic() < deadline:
    time.sleep(0.001)            # the first request is served by the GC thread
producers = [threading.Thread(target=producer) for _ in range(2)]
for p in producers: p.start()
res = gchelper.join_c_thread(tid, HANG_S)
stop = True
for p in producers: p.join(HANG_S)
assert res is not None, "the C thread is stuck"
ok, oom, other, bad = res
print("c thread", ok, oom, other, bad)
assert (ok, oom, other, bad) == (60, 0, 0, 0), res
"""


def test_c_thread_without_gil_gets_its_memory(interpreter, tmp_path):
    res, stats = gc_support.run(interpreter, textwrap.dedent(C_THREAD), tmp_path,
                                memory="32M", helper=True)
    res.check()
    assert stats["gc_thread_collections"] > 0, stats


FOREIGN_LOCK = PRELUDE + """
import gchelper
fill_with_garbage(); garbage(2)  # pressure seen from Python first (see PY_THREADS)
fill_with_garbage()              # the device is now full of garbage
# C thread: takes L, waits until the GIL holder blocks on L, then allocates:
# that needs a collection, which needs the GIL, which waits for L.
tid = gchelper.start_c_thread(1 << 20, 1, hold_lock=True)
gchelper.wait_c_holds_lock()
t0 = time.monotonic()
gchelper.block_on_lock()         # holds the GIL while blocked on L
waited = time.monotonic() - t0
res = gchelper.join_c_thread(tid, HANG_S)
assert res is not None, "the C thread is stuck"
ok, oom, other, bad = res
print("foreign lock", ok, oom, round(waited, 3))
assert (ok, oom) == (0, 1), res  # that one request failed...
garbage(40)                      # ...and the program goes on, collecting again
free, total = simdev.mem_info()
print("after", free, total)
"""


def test_foreign_lock_ends_within_the_bound(interpreter, tmp_path):
    # Short, to keep the test quick; ThreadSanitizer slows collections ~10x.
    bound_ms = "2000" if gc_support.tsan_runtime() else "300"
    res, stats = gc_support.run(interpreter, textwrap.dedent(FOREIGN_LOCK), tmp_path,
                                memory="16M", helper=True,
                                env={"SPYRESHIM_GC_TIMEOUT_MS": bound_ms})
    res.check()
    assert "foreign lock 0 1" in res.stdout, res.describe()
    assert stats["gc_timeouts"] >= 1, stats
    # The timed-out collection completed later: it counts, and it recovered.
    assert stats["gc_collections"] >= 2 and stats["gc_recovered_bytes"] > 0, stats


def test_thread_sanitizer_run_fails_on_a_report(tmp_path):
    """Under scripts/tsan_gc.sh only: a deliberate lock-order inversion must
    make the process fail, or the runs above prove nothing."""
    if not gc_support.tsan_runtime():
        pythons.need("tsan", "only under ThreadSanitizer (scripts/tsan_gc.sh)")
    interp = pythons.get("cpython3.11-shared").require()
    res, _ = gc_support.run(interp, "import gchelper\ngchelper.lock_order_inversion()\n",
                            tmp_path, helper=True)
    assert res.returncode == 66 and "lock-order-inversion" in res.stderr, res.describe()
