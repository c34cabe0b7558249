"""IPC across two real processes on the CUDA stand-in driver (docs/cuda.md,
"IPC"): tests/programs/cuda_ipc runs a pattern as the exporter and itself
again (fork + exec) as the peer, passing the handles over a pipe. Each
pattern runs without the shim (the stand-in's own IPC) and with it (the
exporter and the peer both preloaded)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pythons  # noqa: E402

# 64 MiB devices: regions of 2 MiB (docs/allocator.md), so a small block
# shares its region and the six sizes of the offset pattern straddle
# SPYRESHIM_CUDA_IPC_MIN=2M, which the runs under the shim set (what
# `spyreshim run --preset torch` sets; the default, 0, is tested alone).
MEMORY = "64M"
IPC_MIN = "2M"


def program():
    return pythons.builddir() / "tests" / "cuda_ipc"


def env_for(shim, tmp_path=None, **extra):
    env = {k: v for k, v in os.environ.items()
           if k != "LD_PRELOAD" and not k.startswith(("SPYRESHIM_", "CUDASTANDIN_"))}
    env.update(CUDASTANDIN_DEVICES="1", CUDASTANDIN_MEMORY=MEMORY)
    if shim:
        env["LD_PRELOAD"] = str(pythons.shim_lib())
        env["SPYRESHIM_CUDA_IPC_MIN"] = IPC_MIN
        if tmp_path is not None:
            env["SPYRESHIM_STATS"] = str(tmp_path / "stats.%p.json")
    env.update({k: str(v) for k, v in extra.items() if v is not None})
    for k in [k for k, v in extra.items() if v is None]:
        env.pop(k, None)        # None: the variable unset (its default)
    return env


def run(pattern, shim, tmp_path=None, **extra):
    r = subprocess.run([str(program()), pattern], env=env_for(shim, tmp_path, **extra),
                       capture_output=True, text=True, timeout=pythons.HANG_S)
    return r, r.stdout + r.stderr


def all_stats(tmp_path):
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob("stats.*.json"))]


@pytest.fixture(params=[False, True], ids=["standin", "shim"])
def shim(request, shim_lib):
    return request.param


def test_nccl_pattern_peer_reads_and_writes_the_buffer(shim):
    """cuMemAlloc_v2 of a 4 MiB buffer, cuIpcGetMemHandle, the peer opens
    it with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS and reads the exporter's
    bytes, then writes and the exporter reads the peer's."""
    r, out = run("nccl", shim)
    assert r.returncode == 0 and "all ok" in r.stdout, out
    assert "peer read 4194304 at +0: ok" in r.stdout, out
    assert "exporter read the peer's bytes: ok" in r.stdout, out


def test_offset_pattern_six_tensors_read_through_their_segment(shim):
    """Mooncake #1622: base from cuMemGetAddressRange_v2(ptr) (a caching
    allocator's segment), export base, send ptr - base; the peer adds the
    offset. Six tensors, 64 B to 4 MiB."""
    r, out = run("offset", shim)
    assert r.returncode == 0 and "all ok" in r.stdout, out
    assert r.stdout.count("peer read") == 6 and "wrong" not in r.stdout, out


def test_torch_pattern_through_the_runtime(shim):
    """torch.multiprocessing: the segment's base exported through the
    runtime's cudaIpcGetMemHandle (which reaches the driver through
    cuGetProcAddress), the storage's offset sent, the peer's
    cudaIpcOpenMemHandle + offset reads the storage."""
    r, out = run("torch", shim)
    assert r.returncode == 0 and "all ok" in r.stdout, out
    assert "peer read 1048576 at +3146240: ok" in r.stdout, out
    # The runtime's call reaches the shim's cuIpcGetMemHandle: a block
    # sharing its region is refused there as on the driver route.
    assert f"runtime export of a 64 KiB block: rc={801 if shim else 0}" in r.stdout, out


def test_a_peer_cannot_read_a_neighbouring_block(shim):
    """The handle's range in the peer is the exported block's size exactly:
    none of the neighbour's bytes, and a read one byte past it fails. A
    small block that the shim carved out of a shared region is refused with
    one warning line and 801 (never a handle to the region); the stand-in
    alone exports it and the same holds."""
    r, out = run("neighbour", shim)
    assert r.returncode == 0 and "all ok" in r.stdout, out
    assert "peer neighbour 4194304: range 4194304, neighbour unreadable, past the end refused" \
        in r.stdout, out
    if shim:
        assert "refused C rc=801" in r.stdout, out
        warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("spyreshim:")]
        assert len(warnings) == 1 and "cuIpcGetMemHandle" in warnings[0] \
            and "shares its region" in warnings[0], r.stderr
    else:
        assert "peer neighbour 65536: range 65536, neighbour unreadable" in r.stdout, out


def test_what_a_program_sees_exporting_blocks_of_every_size(shim):
    """Six blocks of 64 B to 4 MiB, each its own cuMemAlloc_v2, exported
    directly: under the shim the blocks below SPYRESHIM_CUDA_IPC_MIN (which
    share their region) are refused with 801 and a warning, the others are
    read right by the peer; without it, every one is."""
    r, out = run("direct", shim)
    assert r.returncode == 0 and "all ok" in r.stdout, out
    sizes = [64, 4096, 65536, 1 << 20, 2 << 20, 4 << 20]
    for n in sizes:
        refused = shim and n < (2 << 20)
        assert (f"refused {n} rc=801" if refused else f"exported {n}") in r.stdout, out
    assert "wrong" not in r.stdout, out
    if shim:
        assert r.stderr.count("cannot be exported") == 3, r.stderr  # at most three a process


def test_by_default_only_blocks_alone_by_chance_are_exported(shim_lib):
    """SPYRESHIM_CUDA_IPC_MIN unset (0): no request is given a region of
    its own for IPC, so blocks that share a region are refused (801) with a
    line that names the options; the 2 and 4 MiB blocks, above half the
    device's 2 MiB regions, have dedicated regions and are exported."""
    r, out = run("direct", True, SPYRESHIM_CUDA_IPC_MIN=None)
    assert r.returncode == 0 and "all ok" in r.stdout, out
    for n in [64, 4096, 65536, 1 << 20]:
        assert f"refused {n} rc=801" in r.stdout, out
    for n in [2 << 20, 4 << 20]:
        assert f"exported {n}" in r.stdout, out
    assert "wrong" not in r.stdout, out
    assert r.stderr.count("set SPYRESHIM_CUDA_IPC_MIN (e.g. 2M) or SPYRESHIM_CUDA_IPC_CALLERS") == 3, \
        r.stderr


def test_smaller_threshold_exports_every_size(shim_lib):
    """SPYRESHIM_CUDA_IPC_MIN=64: every request gets a region of its own,
    so every block is exported and read right."""
    r, out = run("direct", True, SPYRESHIM_CUDA_IPC_MIN="64")
    assert r.returncode == 0 and "all ok" in r.stdout, out
    assert "refused" not in r.stdout and r.stdout.count("peer read") == 6, out


@pytest.mark.parametrize("callers", ["", "libnothing,libipccaller"])
def test_blocks_of_a_named_calling_object_get_a_region_of_their_own(shim_lib, callers):
    """SPYRESHIM_CUDA_IPC_CALLERS: a library's small buffers (NCCL's
    connection structures) are exported when it names the library, the
    peer reads them and nothing of the block next to them; else refused."""
    r, out = run("caller", True, SPYRESHIM_CUDA_IPC_CALLERS=callers)
    assert r.returncode == 0 and "all ok" in r.stdout, out
    if callers:
        assert "the library's block: exported rc=0" in r.stdout, out
        assert "peer neighbour 65536: range 65536, neighbour unreadable, past the end refused" \
            in r.stdout, out
    else:
        assert "the library's block: refused rc=801" in r.stdout, out


def test_regions_of_their_own_are_under_the_limit(shim_lib):
    """SPYRESHIM_LIMIT=10M: two 4 MiB blocks (regions of their own), the
    third fails with out-of-memory (2), as any request past the limit."""
    r, out = run("limit", True, SPYRESHIM_LIMIT="10M", SPYRESHIM_OOM_REPORT=0)
    assert r.returncode == 0 and "4 MiB blocks: 2, then rc=2" in r.stdout, out


def test_freeing_an_exported_block_never_hands_it_to_another_owner(shim):
    """The exporter frees a block the peer has open and allocates the same
    size again with other bytes: the peer still reads the old bytes (the
    driver keeps the memory while it is mapped; the shim gives an exported
    region back to the driver, never to the next block)."""
    r, out = run("reuse", shim)
    assert r.returncode == 0 and "all ok" in r.stdout, out
    assert "peer after the exporter's free: old bytes" in r.stdout, out


def test_standin_refuses_a_handle_of_a_freed_allocation(shim_lib):
    r, out = run("freed", False)
    assert r.returncode == 0 and "peer open of a freed allocation: 400" in r.stdout, out


def test_standin_refuses_a_handle_of_an_exporter_that_exited(shim_lib):
    r, out = run("gone", False)
    assert r.returncode == 0 and "peer open after the exporter exited: 205" in r.stdout, out


def test_exported_block_stays_counted_and_leak_tracked(shim_lib, tmp_path):
    """Under SPYRESHIM_LIMIT and the leak check: the exporter's exported
    block is its allocation (counted, in the leak report with its stack);
    the peer's opened mapping is not the peer's allocation (nothing
    counted, no leak)."""
    report = tmp_path / "leaks.%p.json"
    r, out = run("keep", True, tmp_path, SPYRESHIM_LIMIT="32M", SPYRESHIM_LEAK_CHECK=1,
                 SPYRESHIM_REPORT=report)
    assert "peer read 4194304 at +0: ok" in r.stdout, out
    assert r.returncode != 0 and "detected device memory leaks" in r.stderr, out
    stats = all_stats(tmp_path)
    exporter = [s for s in stats if s["allocs"] > 0]
    assert len(exporter) == 1, stats
    assert exporter[0]["allocs"] == 1 and exporter[0]["frees"] == 0, exporter
    assert all(s["allocs"] == 0 for s in stats if s is not exporter[0]), stats
    reports = [json.loads(p.read_text()) for p in tmp_path.glob("leaks.*.json")]
    groups = [g for rep in reports for g in rep["groups"]]
    assert [g["bytes"] for g in groups] == [4 << 20], groups
    assert any(f.get("function") == "keep" for f in groups[0]["frames"]), groups[0]


LOOP = r"""
import ctypes, sys
cu = ctypes.CDLL(sys.argv[1])
ctx = ctypes.c_void_p()
p = ctypes.c_uint64()
assert cu.cuInit(0) == 0 and cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cu.cuCtxSetCurrent(ctx) == 0
for _ in range(200):          # a training step's buffers: 3, 5 and 7 MiB, freed each step
    ptrs = []
    for mib in (3, 5, 7):
        assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(mib << 20)) == 0
        ptrs.append(p.value)
    for q in ptrs:
        assert cu.cuMemFree_v2(ctypes.c_uint64(q)) == 0
"""


@pytest.mark.parametrize("ipc_min", [None, "2M"])
def test_large_buffers_reallocated_each_step_cost_the_driver_nothing_by_default(
        shim_lib, tmp_path, ipc_min):
    """Regions of their own cost a driver allocation (and on a real GPU a
    cuMemFree that synchronizes) whenever no cached region has the exact
    size: a loop over three buffer sizes pays one per buffer per step with
    SPYRESHIM_CUDA_IPC_MIN=2M; by default (0) they are carved from shared
    regions and the loop reserves a handful of regions in all."""
    lib = pythons.builddir() / "tests" / "cudadrv" / "libcuda.so.1"
    env = env_for(True, tmp_path, SPYRESHIM_CUDA_IPC_MIN=ipc_min)
    env["CUDASTANDIN_MEMORY"] = "1G"
    r = subprocess.run(["/usr/bin/python3", "-c", LOOP, str(lib)], env=env,
                       capture_output=True, text=True, timeout=pythons.HANG_S)
    assert r.returncode == 0, r.stderr
    (s,) = all_stats(tmp_path)
    if ipc_min is None:
        assert s["regions_reserved"] < 10, s["regions_reserved"]
    else:
        assert s["regions_reserved"] >= 200, s["regions_reserved"]   # the cost the default avoids
