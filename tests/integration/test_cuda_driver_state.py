"""The driver's state (contexts, pools, mappings) is what the shim answers
from: tests/programs/cuda_driver_state.c on the stand-in driver, run
without and with the shim, prints the same answers and exits the same
(issue 44). Only the shim's own stderr lines ("spyreshim: ...") and, where
the test asks for one, a limit may tell the two runs apart."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cuda_driver import built_tests, run, shim_env, stats  # noqa: E402

MiB = 1 << 20


def both(check, tmp_path, **env):
    """The check without and with the shim (the leak check on), the same
    environment otherwise."""
    with_shim = shim_env(tmp_path, SPYRESHIM_LEAK_CHECK=1, **env)
    bare = dict(with_shim)
    del bare["LD_PRELOAD"]
    prog = built_tests() / "cuda_driver_state"
    return run([prog, check], bare), run([prog, check], with_shim)


def foreign_stderr(r):
    """stderr without the shim's own lines."""
    return [l for l in r.stderr.splitlines() if l and not l.startswith("spyreshim:")]


def assert_same(bare, shim, check):
    assert bare.returncode == 0 and f"{check} ok" in bare.stdout, bare.stdout + bare.stderr
    assert (shim.returncode, shim.stdout) == (bare.returncode, bare.stdout), \
        f"without the shim:\n{bare.stdout}\nwith it (rc {shim.returncode}):\n" \
        f"{shim.stdout}{shim.stderr}"
    assert foreign_stderr(shim) == foreign_stderr(bare), shim.stderr


def test_a_free_waits_for_a_context_where_nothing_was_served(shim_lib, tmp_path):
    """Memsets queued in a created context that never allocated, on a
    block of the primary context, then its free and a new 1 MiB block
    written at once: under a 1 MiB limit only the freed block can serve
    it, so the shim must wait for that context's work too (it read 0x11
    where its owner wrote 0x22)."""
    bare, shim = both("unserved", tmp_path, SPYRESHIM_LIMIT="1M",
                      CUDASTANDIN_OP_DELAY_US=300000)
    assert_same(bare, shim, "unserved")
    s = stats(tmp_path)
    assert s["device_waits"] >= 1 and s["allocs"] == s["frees"] == 2, s


def test_a_pool_allocation_where_a_destroyed_context_was_is_the_drivers(shim_lib, tmp_path):
    """The pool's chunk lies where the destroyed context's region was: its
    range, attribute and stream-ordered free are the driver's answers (the
    shim said 500, 1 and 1)."""
    bare, shim = both("poolinold", tmp_path)
    assert "in the old range: 1" in bare.stdout, bare.stdout
    assert "cuMemGetAddressRange: 0, base p, size 65536" in bare.stdout, bare.stdout
    assert_same(bare, shim, "poolinold")
    s = stats(tmp_path)
    assert (s["async_allocs"], s["async_frees"]) == (1, 1), s
    assert s["context_teardown_blocks"] == 1, s


def test_a_refused_destroy_of_a_primary_context_keeps_its_blocks(shim_lib, tmp_path):
    """cuCtxDestroy of a primary context: 201 from the driver, and the
    block stays live (its bytes, range and free: the shim answered the
    free with 1)."""
    bare, shim = both("destroyprim", tmp_path)
    assert "cuCtxDestroy_v2 of the primary context: 201" in bare.stdout, bare.stdout
    assert_same(bare, shim, "destroyprim")
    s = stats(tmp_path)
    assert s["context_teardown_blocks"] == 0 and s["allocs"] == s["frees"] == 1, s


def test_releases_and_resets_that_leave_the_context(shim_lib, tmp_path):
    """A release that leaves the primary context retained, another
    device's reset, and refused resets and releases keep the blocks."""
    bare, shim = both("releaseextra", tmp_path)
    assert_same(bare, shim, "releaseextra")
    s = stats(tmp_path)
    assert s["context_teardown_blocks"] == 0 and s["allocs"] == s["frees"] == 1, s
