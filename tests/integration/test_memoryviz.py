"""The memory_viz export read as PyTorch's page reads it (issue 24, item 2;
torch/utils/viz/MemoryViz.js: annotate_snapshot, process_alloc_data,
MemoryView's simulate_memory, formatEvent; torch/cuda/_memory_viz.py):
field by field, on a real run under the shim that reserves regions, frees,
reuses and runs out of memory:
- every active block has its frames in `frames` and in `history[0]` (the
  older layout), with history[0].addr the address annotate_snapshot gives it;
- frames innermost first, in true call order (Python frames where the
  interpreter ran them: Tensor_new, then the Python functions, <module> last);
- time_us on the Unix epoch;
- segment_alloc/segment_free per region, and the final segments are exactly
  the regions the shim holds (their total is the statistics' reserved bytes);
- the OOM event carries the runtime's free bytes and the failing request's stack;
- replaying the events backwards as MemoryView does finds every block and
  segment it must remove;
- --from/--to cut a page whose segments are the state at its end."""
import json
import os
import pickle
import pickletools
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pythons
from test_trace_views import VIZ_OPCODES

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "scripts" / "spyreshim"
sys.path.insert(0, str(ROOT))
from spyreshim.exports import memoryviz  # noqa: E402
from spyreshim.reading import trace as tr

SCRIPT = '''import ctypes, simdev
def keep(n, held):
    t = simdev.Tensor(n)
    if held:   # live at exit: the snapshot's blocks
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))
    return t
def layer(n, held=True):
    return keep(n, held)
def model():
    layer(1 << 20)
    tmp = layer(3 << 20, False)
    layer(512 << 10)
    del tmp
    layer(2 << 20)
    try:
        layer(200 << 20)
    except Exception as e:
        print("oom", e)
model()
'''


@pytest.fixture(scope="module")
def run(tmp_path_factory, builddir):
    tmp = tmp_path_factory.mktemp("mviz")
    interp = pythons.get("cpython3.11-static").require()
    script = tmp / "script.py"
    script.write_text(SCRIPT)
    trace, stats = tmp / "r.trace", tmp / "s.json"
    before = time.time()
    r = pythons.run_python(interp, path=script, args=[],
                           env={"SPYRESHIM_TRACE": str(trace), "SPYRESHIM_STATS": str(stats),
                                "SIMDEV_MEMORY": "64M"})
    after = time.time()
    assert r.returncode == 0 and "oom" in r.stdout, r.describe()
    out = tmp / "r.pickle"
    p = subprocess.run([sys.executable, CLI, "report", "--memory-viz", str(out), str(trace)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    raw = out.read_bytes()
    return {"t": tr.load(str(trace)), "raw": raw, "snap": pickle.loads(raw), "before": before,
            "after": after, "stats": json.loads(stats.read_text()), "trace": trace, "tmp": tmp}


def names(frames):
    return [f["name"] for f in frames]


def test_the_page_can_unpickle_it(run):
    ops = {op.name for op, _a, _p in pickletools.genops(run["raw"])}
    assert ops <= VIZ_OPCODES, ops - VIZ_OPCODES


def test_blocks_have_frames_and_history_innermost_first(run):
    snap = run["snap"]
    active = 0
    for seg in snap["segments"]:
        addr = seg["address"]
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                active += 1
                h = b["history"][0]
                assert h["frames"] == b["frames"] and h["real_size"] == b["size"]
                assert h["addr"] == addr     # what annotate_snapshot computes
                n = names(b["frames"])
                assert n[0] == "Tensor_new" and n[1:4] == ["keep", "layer", "model"], n
                assert n[-1] == "<module>" and not [x for x in n if x.startswith("_PyEval")]
            addr += b["size"]
    assert active == 3     # 1 MiB, 512 KiB, 2 MiB are live at the end


def test_times_are_on_the_unix_epoch(run):
    evs = [e for d in run["snap"]["device_traces"] for e in d]
    assert evs
    for e in evs:
        assert run["before"] * 1e6 - 1e6 <= e["time_us"] <= run["after"] * 1e6 + 1e6, e
    ts = [e["time_us"] for e in evs]
    assert ts == sorted(ts)


def test_segments_are_the_regions(run):
    snap, t = run["snap"], run["t"]
    ev = snap["device_traces"][0]
    held = {}
    for e in ev:
        if e["action"] == "segment_alloc":
            assert e["addr"] not in held
            held[e["addr"]] = e["size"]
        elif e["action"] == "segment_free":
            assert held.pop(e["addr"]) == e["size"]
    assert held, "no segment events"
    segs = {s["address"]: s["total_size"] for s in snap["segments"]}
    assert segs == held
    reserved = run["stats"]["reserved_bytes"]
    assert sum(segs.values()) == reserved
    # Every block of every event lies in a region held at that moment.
    held = {}
    for e in ev:
        if e["action"] == "segment_alloc":
            held[e["addr"]] = e["size"]
        elif e["action"] == "segment_free":
            del held[e["addr"]]
        elif e["action"] == "alloc":
            assert any(a <= e["addr"] and e["addr"] + e["size"] <= a + s for a, s in held.items())


def test_oom_has_free_bytes_and_the_requests_stack(run):
    ooms = [e for d in run["snap"]["device_traces"] for e in d if e["action"] == "oom"]
    assert len(ooms) == 1
    o = ooms[0]
    assert o["size"] == 200 << 20
    # simdev has 64 MiB; the shim held its regions then (nothing else did).
    held = 0
    for e in run["snap"]["device_traces"][0]:
        if e is o:
            break
        held += e["size"] if e["action"] == "segment_alloc" else 0
        held -= e["size"] if e["action"] == "segment_free" else 0
    assert o["device_free"] == (64 << 20) - held and o["device_free"] > 0
    n = names(o["frames"])
    assert n[0] == "Tensor_new" and n[1:4] == ["keep", "layer", "model"] and n[-1] == "<module>"


def replay_backwards(snap, device, idx):
    """MemoryView.simulate_memory: from the segments and blocks at the end,
    undo events down to idx; raises where the page would find nothing."""
    segs = {s["address"]: s["total_size"] for s in snap["segments"] if s["device"] == device}
    blocks = {}
    for s in snap["segments"]:
        a = s["address"]
        for b in s["blocks"]:
            if b["state"] == "active_allocated":
                blocks[a] = b["size"]
            a += b["size"]
    ev = snap["device_traces"][device]
    for i in range(len(ev) - 1, idx, -1):
        e = ev[i]
        act = e["action"]
        if act == "free_completed":
            assert e["addr"] not in blocks
            blocks[e["addr"]] = e["size"]
        elif act == "alloc":
            assert blocks.pop(e["addr"]) == e["size"], e
        elif act == "segment_free":
            segs[e["addr"]] = e["size"]
        elif act == "segment_alloc":
            assert segs.pop(e["addr"]) == e["size"], e
    return segs, blocks


def test_the_page_replays_every_event(run):
    segs, blocks = replay_backwards(run["snap"], 0, -1)
    assert segs == {} and blocks == {}, "the trace began with nothing held"


def test_from_to_cut_a_page(run):
    t = run["t"]
    n = len(t)
    half = n // 2
    out = run["tmp"] / "cut.pickle"
    p = subprocess.run([sys.executable, CLI, "report", "--memory-viz", str(out), "--from", "3",
                        "--to", str(half), str(run["trace"])], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    snap = pickle.loads(out.read_bytes())
    full = memoryviz.snapshot(t)
    first = memoryviz.snapshot(t, None, ("n", half))
    assert snap["segments"] == first["segments"]
    # The page holds events 3..half only; replaying it backwards ends on
    # the state just before event 3.
    assert sum(len(d) for d in snap["device_traces"]) < sum(len(d) for d in full["device_traces"])
    before = memoryviz.snapshot(t, None, ("n", 2))
    segs, blocks = replay_backwards(snap, 0, -1)
    assert segs == {s["address"]: s["total_size"] for s in before["segments"]}
    assert blocks == replay_backwards(before, 0, len(before["device_traces"][0]))[1]
    # The last event of a device (a shutdown marker, kind 10, may follow).
    last_s = t.time[max(i for i in range(n) if t.dev[i] != tr.DEVICE_NONE)] / 1e9
    p = subprocess.run([sys.executable, CLI, "report", "--memory-viz", str(out), "--from",
                        "%.9fs" % last_s, str(run["trace"])], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert 1 <= sum(len(d) for d in pickle.loads(out.read_bytes())["device_traces"]) <= 3
    p = subprocess.run([sys.executable, CLI, "report", "--memory-viz", str(out), "--from", "x",
                        str(run["trace"])], capture_output=True, text=True)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    p = subprocess.run([sys.executable, CLI, "report", "--from", "3", str(run["trace"])],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--memory-viz" in p.stderr
