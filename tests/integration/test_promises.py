"""The threaded promises of issue 7 (tests/programs/promises.c), each run a
few times; a generous timeout is the hang detector, nothing is timed.
bench/promises_stress.sh runs the same scenarios by the thousand with the
CPUs busy.
- loader: a library constructor (under the loader's lock) allocates while
  the main thread makes its first allocation: both finish;
- foreign lock, both orders: a thread holding the lock another thread's
  pressure callback needs gets out-of-memory instead of waiting forever,
  and the timeout is counted (pressure_wait_timeouts);
- unregister: returns only once the callback stopped running elsewhere;
- fork: 200 forks while threads allocate under pressure, leak checking on,
  no Python in the process: every child finishes;
- fork during another thread's pressure event: the child allocates under
  pressure, runs its own event and gets its block, without waiting for the
  parent's event (which does not run in the child) or a false out-of-memory;
- fork while a thread publishes the runtime (its first call, held there by
  the hook of the shim's test build, libspyreshim_testhooks.so: the
  product has no test hook): the child's own first call finishes."""
import gc_support
import pythons
import pytest


def promises(shim_lib, *args, env=None):
    e = {"SIMDEV_MEMORY": "1G", "SPYRESHIM_LIMIT": "8M", "SPYRESHIM_OOM_REPORT": "0",
         **gc_support.preload_env(shim_lib), **(env or {})}
    return pythons.run([str(pythons.builddir() / "tests" / "promises"), *args],
                       env=e, timeout=pythons.HANG_S)


def test_library_constructor_allocating_during_the_first_allocation(shim_lib):
    lib = pythons.builddir() / "tests" / "libctor_alloc.so"
    for _ in range(5):
        r = promises(shim_lib, "loader", lib)
        assert not r.timed_out, r
        assert r.returncode == 0 and "loader ok" in r.stdout, r


@pytest.mark.parametrize("order", ["1", "2"])
def test_waiting_for_an_event_that_needs_our_lock_ends_in_oom(shim_lib, order):
    for _ in range(3):
        r = promises(shim_lib, "foreign", order,
                     env={"SPYRESHIM_GC": "0", "SPYRESHIM_GC_TIMEOUT_MS": "200"})
        assert not r.timed_out, r
        assert r.returncode == 0 and f"foreign {order} ok rc=2" in r.stdout, r


def test_unregister_waits_for_runs_on_other_threads(shim_lib):
    r = promises(shim_lib, "unregister", "100",
                 env={"SPYRESHIM_GC": "0", "SPYRESHIM_PRESSURE_ROUNDS": "1"})
    assert not r.timed_out, r
    assert r.returncode == 0 and "saw_poison=0" in r.stdout, r


def test_fork_while_threads_allocate_under_pressure(shim_lib):
    tsan = gc_support.tsan_runtime()
    n = "60" if tsan else "200"
    # Under ThreadSanitizer without leak checking: libunwind's per-thread
    # trace cache is freed by a thread-specific-data destructor when a
    # thread exits, after TSan has torn that thread down, and TSan crashes
    # in it (not the shim's code). The walks leak checking adds are covered
    # by the plain run.
    r = promises(shim_lib, "fork", n,
                 env={"SPYRESHIM_LEAK_CHECK": "0" if tsan else "1", "SPYRESHIM_EXITCODE": "0"})
    assert not r.timed_out, r
    assert r.returncode == 0 and "hangs=0 failed=0" in r.stdout, r


def test_a_child_forked_during_a_pressure_event_runs_its_own(shim_lib):
    # Behaviour, not time: the child's request succeeds, its own copy of
    # the callback ran, and it never waited for the parent's event.
    for _ in range(3):
        r = promises(shim_lib, "fork-in-event", env={"SPYRESHIM_GC": "0"})
        assert not r.timed_out, r
        assert "child rc=0 own_callback_runs=1 waits_for_parent_event=0" in r.stdout, r
        assert r.returncode == 0 and "fork-in-event ok hangs=0 failed=0 parent_rc=0" in r.stdout, r


def test_fork_while_a_thread_makes_the_first_call(shim_lib):
    # Deterministic: without the hook resolution lock in the fork policy
    # every run hangs the child (it inherits the lock held).
    if gc_support.tsan_runtime():
        # Under ThreadSanitizer the child then waits forever in libsimdev's
        # pthread_once, which the parent's held thread had in progress:
        # glibc's pthread_once recognizes an initialization a fork
        # interrupted (its fork generation), TSan's interceptor does not.
        # The plain run covers the scenario.
        pythons.need("no-tsan", "ThreadSanitizer's pthread_once does not survive a fork during an init")
    testhooks = pythons.builddir() / "tests" / "libspyreshim_testhooks.so"
    if not testhooks.exists():
        pytest.fail(f"{testhooks} is missing: ninja -C {pythons.builddir()}")
    for _ in range(3):
        r = promises(testhooks, "fork-publish")
        assert not r.timed_out, r
        assert r.returncode == 0 and "fork-publish ok hangs=0 failed=0" in r.stdout, r
