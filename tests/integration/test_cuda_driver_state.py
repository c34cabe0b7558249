"""The driver's state (contexts, pools, mappings) is what the shim answers
from: tests/programs/cuda_driver_state.c on the stand-in driver, run
without and with the shim, prints the same answers and exits the same
(issue 44). Only the shim's own stderr lines ("spyreshim: ...") and, where
the test asks for one, a limit may tell the two runs apart."""
import sys
from pathlib import Path

import pytest

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


def test_a_popped_context_and_its_teardown(shim_lib, tmp_path):
    """A created context popped (none current): allocation refused, its
    block freed with no context current, then its destroy; the same
    answers."""
    bare, shim = both("popped", tmp_path)
    assert "pop: 0, the created one: 1" in bare.stdout, bare.stdout
    assert_same(bare, shim, "popped")
    s = stats(tmp_path)
    assert s["allocs"] == s["frees"] == 1 and s["context_teardown_blocks"] == 0, s


def test_a_context_destroyed_while_current_on_another_thread(shim_lib, tmp_path):
    """There, calls that need it answer 709 (cuCtxDestroy's documentation;
    the stand-in said 201) and the free of its block is refused; the same
    answers with the shim, which forgot the context's block."""
    bare, shim = both("elsewhere", tmp_path)
    assert "there: alloc 709, info 709, synchronize 709, free of its block 1" in bare.stdout, \
        bare.stdout
    assert_same(bare, shim, "elsewhere")
    s = stats(tmp_path)
    assert s["context_teardown_blocks"] == 1 and s["invalid_frees"] == 1, s


@pytest.mark.parametrize("check", ["vmmtwice", "vmmpartial"])
def test_a_handle_mapped_twice_is_freed_with_its_last_mapping(shim_lib, tmp_path, check):
    """Mapped at two addresses, unmapped (one by one, or in one call), and
    released (before or after): no leak at exit (the shim reported a
    cuda-vmm leak, exit 23), every record gone."""
    bare, shim = both(check, tmp_path)
    assert_same(bare, shim, check)
    s = stats(tmp_path)
    assert s["vmm_allocs"] == s["vmm_frees"] and s["vmm_bytes"] == 0, s


def test_a_retained_handle_keeps_its_memory_until_released_and_unmapped(shim_lib, tmp_path):
    """cuMemRetainAllocationHandle of a mapped address, both references
    released: the memory lives until the unmapping. Without a limit the
    same answers; under SPYRESHIM_LIMIT=4M 4 MiB more while it is mapped is
    out of memory, after the unmapping it is not (the shim dropped the
    record at the second release and allowed 6 MiB)."""
    bare, shim = both("vmmretain", tmp_path)
    assert "retain: 0, the same handle: 1" in bare.stdout, bare.stdout
    assert_same(bare, shim, "vmmretain")
    bare, shim = both("vmmretain", tmp_path, SPYRESHIM_LIMIT="4M")
    assert answers(bare, "vmmretain") == [0, 0], bare.stdout
    assert answers(shim, "vmmretain") == [2, 0], shim.stdout + shim.stderr
    s = stats(tmp_path)
    assert s["vmm_allocs"] == s["vmm_frees"] and s["vmm_bytes"] == 0, s


@pytest.mark.parametrize("check", ["vmmadjacent", "vmmretainlate"])
def test_a_handle_lives_while_a_mapping_or_a_reference_holds_it(shim_lib, tmp_path, check):
    """Two handles mapped side by side, the first unmapped (the range ends
    where the second mapping begins); or a handle released while mapped,
    retained from its mapping, then unmapped: 2 MiB still live, so under
    SPYRESHIM_LIMIT=4M 4 MiB more is out of memory (2) until the last
    unmapping or release, then not; the bare device serves both. Without
    a limit the same answers as bare and nothing left at exit."""
    bare, shim = both(check, tmp_path)
    assert_same(bare, shim, check)
    s = stats(tmp_path)
    assert s["vmm_allocs"] == s["vmm_frees"] and s["vmm_bytes"] == 0, s
    bare, shim = both(check, tmp_path, SPYRESHIM_LIMIT="4M")
    assert answers(bare, check) == [0, 0], bare.stdout
    assert answers(shim, check) == [2, 0], shim.stdout + shim.stderr
    assert shim.returncode == 0 and f"{check} ok" in shim.stdout, shim.stdout + shim.stderr


def test_the_drivers_answers_the_shim_asks(shim_lib, tmp_path):
    """The stand-in answers as the driver documents what the shim asks it:
    a pool's own device has read-write access, another none, no device is
    101; a stream's context, the default stream's (the current one); no
    handle at an unmapped address (1)."""
    bare, shim = both("queries", tmp_path)
    for line in ("access of device 0 to device 1's pool: 0, flags 0",
                 "access of device 1 to device 1's pool: 0, flags 3",
                 "access of device 2 to device 1's pool: 101, flags 99",
                 "the stream's context: 0, device 1's: 1",
                 "the default stream's context: 0, the current one: 1",
                 "retain at an unmapped address: 1"):
        assert line in bare.stdout, bare.stdout
    assert_same(bare, shim, "queries")


def answers(r, key):
    """The return codes of the lines "<key> <bytes> <rc>"."""
    rows = [l.split() for l in r.stdout.splitlines()]
    return [int(w[2]) for w in rows if len(w) == 3 and w[0] == key and w[1].isdigit()]


def test_pool_memory_of_another_device_is_that_devices(shim_lib, tmp_path):
    """Without a limit, 4 MiB from device 1's default pool, from a pool made
    there and on a stream of device 1 while device 0's context is current:
    the same answers (the context stack too after the stream's),
    and counted on device 1."""
    bare, shim = both("poolother", tmp_path)
    # The stream's device is asked of its context, which the shim pushes
    # and pops: the thread's context stack is the program's.
    assert "contexts on the stack after it: 1" in bare.stdout, bare.stdout
    assert_same(bare, shim, "poolother")
    s = stats(tmp_path)
    fam = {(f["family"], f["device"]): f for f in s["passthrough"]}
    assert fam[("cuda-async", 1)]["peak_bytes"] == 4 * MiB, s["passthrough"]
    assert ("cuda-async", 0) not in fam, s["passthrough"]


def test_pool_memory_of_another_device_is_under_that_devices_limit(shim_lib, tmp_path):
    """Under SPYRESHIM_LIMIT=4M with 1 MiB served on device 1: 4 MiB more
    there (from its pools, or on its stream, with device 0's context
    current) is out of memory (2), 1 MiB is not; the bare device serves
    all (the shim allowed 5 MiB on device 1)."""
    bare, shim = both("poolother", tmp_path, SPYRESHIM_LIMIT="4M")
    assert answers(bare, "other") == [0, 0] and answers(bare, "stream") == [0], bare.stdout
    assert answers(bare, "made") == [0], bare.stdout
    assert answers(shim, "other") == [2, 0] and answers(shim, "stream") == [2], shim.stdout
    assert answers(shim, "made") == [2], shim.stdout
    assert shim.returncode == 0 and "poolother ok" in shim.stdout, shim.stdout + shim.stderr


def test_a_pool_two_devices_write_is_charged_to_the_calling_contexts_device(shim_lib, tmp_path):
    """A pool made on device 1 that device 0 was given read-write access
    to: the driver does not say whose its memory is, so the calling
    context's device (0, 1 MiB served) is charged. Without a limit the same
    answers as bare; under SPYRESHIM_LIMIT=4M 4 MiB from it is out of
    memory (2) where the bare device serves it (charged to device 1, the
    last device with access, it was allowed)."""
    bare, shim = both("poolpeer", tmp_path)
    assert "access given: 0" in bare.stdout and "access of device 0: 0, flags 3" in bare.stdout, \
        bare.stdout
    assert_same(bare, shim, "poolpeer")
    bare, shim = both("poolpeer", tmp_path, SPYRESHIM_LIMIT="4M")
    assert answers(bare, "poolpeer") == [0], bare.stdout
    assert answers(shim, "poolpeer") == [2], shim.stdout + shim.stderr
    assert shim.returncode == 0 and "poolpeer ok" in shim.stdout, shim.stdout + shim.stderr


def test_vmm_memory_of_another_device_is_under_that_devices_limit(shim_lib, tmp_path):
    """cuMemCreate of device 1 with device 0's context current: counted
    and limited on device 1, as the pools' memory."""
    bare, shim = both("vmmother", tmp_path, SPYRESHIM_LIMIT="4M")
    assert answers(bare, "vmmother") == [0, 0], bare.stdout
    assert answers(shim, "vmmother") == [2, 0], shim.stdout
    assert shim.returncode == 0 and "vmmother ok" in shim.stdout, shim.stdout + shim.stderr
