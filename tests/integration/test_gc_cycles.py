"""Python GC as a pressure callback: reference cycles holding device tensors
exhaust the simulated device; without the shim the script dies with
OutOfMemoryError, with it the script completes. Every case is a separate
process under LD_PRELOAD with a small SIMDEV_MEMORY and a hard timeout, on
every interpreter of the matrix (absent ones skip, saying why)."""
import json
import textwrap

import pytest

import gc_support
import pythons

CYCLES = """
import gc, sys, simdev
gc.disable()                      # as many training scripts do
RELEASE_GIL = {release_gil}
keep = []
for i in range(120):
    t = simdev.Tensor(1 << 20, release_gil=RELEASE_GIL)   # 1 MiB of a 16 MiB device
    t.fill(i % 256)
    t.me = t                      # a cycle: only the collector frees it
    if i % 10 == 0:
        k = simdev.Tensor(4096, release_gil=RELEASE_GIL)
        k.fill(i % 256)
        keep.append((i % 256, k))  # live tensors, checked at the end
    del t
for b, k in keep:
    assert k.read() == bytes([b]) * 4096, "a live tensor lost its contents"
print("completed", len(keep))
"""


def script(release_gil):
    return textwrap.dedent(CYCLES.format(release_gil=release_gil))


@pytest.mark.parametrize("release_gil", [False, True], ids=["gil-held", "gil-released"])
def test_cycles_exhaust_device_without_shim_and_complete_with_it(interpreter, tmp_path,
                                                                 release_gil):
    src = script(release_gil)
    res, _ = gc_support.run(interpreter, src, tmp_path, memory="16M", preload=False)
    assert res.returncode != 0 and "OutOfMemoryError" in res.stderr, res.describe()

    res, stats = gc_support.run(interpreter, src, tmp_path, memory="16M")
    res.check()
    assert "completed 12" in res.stdout
    assert stats and stats["gc_collections"] > 0 and stats["gc_recovered_bytes"] > 0, stats
    assert stats["failed_allocs"] == 0, stats
    path = "gc_thread_collections" if release_gil else "gc_inline_collections"
    assert stats[path] > 0, stats


def test_gc_off_leaves_the_failure(interpreter, tmp_path):
    res, stats = gc_support.run(interpreter, script(False), tmp_path, memory="16M",
                                env={"SPYRESHIM_GC": "0"})
    assert res.returncode != 0 and "OutOfMemoryError" in res.stderr, res.describe()
    assert stats is None or stats["gc_collections"] == 0


def test_no_python_means_no_collection(tmp_path, builddir, shim_lib):
    """A process without Python: the callback finds no interpreter, does
    nothing, and the request fails as it would without the callback."""
    ops = builddir / "tests" / "simdev_ops"
    stats = tmp_path / "s.json"
    env = pythons._clean_env()
    env.update({"LD_PRELOAD": str(shim_lib), "SIMDEV_MEMORY": "4M",
                "SPYRESHIM_STATS": str(stats)})
    res = pythons.run([ops, "fill:1M", "F"], env=env)
    res.check()
    assert "filled 4" in res.stdout, res.describe()
    data = json.loads(stats.read_text())
    assert data["gc_interpreter"] is None, data
    assert data["gc_events_without_python"] > 0 and data["gc_collections"] == 0, data


BACKOFF = """
import simdev, time
live, failures = [], 0
for i in range(400):
    try:
        live.append(simdev.Tensor(1 << 20))   # nothing is garbage: truly out of memory
    except simdev.OutOfMemoryError:
        failures += 1
print("failures", failures)
"""


def test_fruitless_collections_back_off(interpreter, tmp_path):
    res, stats = gc_support.run(interpreter, textwrap.dedent(BACKOFF), tmp_path, memory="16M")
    res.check()
    failures = int(res.stdout.split()[-1])
    assert failures > 300
    # Every failure was a pressure event; not every one paid a collection:
    # after the fruitless one, no allocation succeeded and nothing was
    # freed, so the thread's episode goes on (gc_episode_skips) or the
    # back-off holds (gc_backoff_skips).
    assert stats["gc_backoff_skips"] + stats["gc_episode_skips"] > 0, stats
    assert stats["gc_collections"] < failures, stats


ERRSTATE = """
import gc, sys, simdev
gc.disable()
class Fin:
    def __del__(self):
        raise ValueError("from a finalizer")   # reported as unraisable, not raised
def alloc_inside_except():
    try:
        raise KeyError("pending")
    except KeyError as e:
        for i in range(40):
            t = simdev.Tensor(1 << 20); t.me = t; t.f = Fin(); t.f.t = t
            del t
        assert sys.exc_info()[0] is KeyError, sys.exc_info()
alloc_inside_except()
print("ok")
"""


def test_error_indicator_survives_a_collection(interpreter, tmp_path):
    res, stats = gc_support.run(interpreter, textwrap.dedent(ERRSTATE), tmp_path, memory="16M")
    res.check()
    assert "ok" in res.stdout and stats["gc_collections"] > 0, stats


@pytest.mark.parametrize("name", gc_support.MUST_RUN)
def test_required_interpreters_are_present(name):
    """CI must exercise CPython 3.11 static and shared, the free-threaded
    3.13t, PyPy, and Debian unstable's 3.14, 3.14-dbg and 3.15 (fetched by
    scripts/pythons.sh): their absence is a failure here, not a skip."""
    interp = pythons.get(name)
    assert interp.available, f"{name}: {interp.skip_reason}"


def test_demo_dies_without_the_shim_and_completes_with_it(interpreter, tmp_path):
    """scripts/demo_train.py, the minimal demo (scripts/demo.sh --minimal, docs/testing.md)."""
    demo = pythons.REPO / "scripts" / "demo_train.py"
    res = pythons.run_python(interpreter, path=demo, preload=False, simdev_memory="256M")
    assert res.returncode == 1 and "OutOfMemoryError" in res.stdout, res.describe()
    res, stats = gc_support.run(interpreter, None, tmp_path, memory="256M", path=demo)
    res.check()
    assert "completed 60 steps" in res.stdout and "parameters intact" in res.stdout
    assert "spyreshim:" in res.stdout and stats["gc_collections"] > 0, res.describe()
