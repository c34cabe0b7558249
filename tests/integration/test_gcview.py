"""`spyreshim report --view gc` (issue 24, item 5): on the demo's trace
(scripts/demo_train.py: reference cycles that hold simdev tensors, freed
by the collections the shim runs under pressure), each collection's frees
are attributed to the sites that allocated them, and the sites add up to
the bytes each collection recovered (at least 99%; here all of them), and
over the run to the statistics' recovered bytes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pythons

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
from spyreshim.views import gcview  # noqa: E402
from spyreshim.reading import trace as tr


def test_demo_collections_are_attributed_to_their_sites(tmp_path, builddir):
    trace, stats = tmp_path / "demo.trace", tmp_path / "s.json"
    env = dict(os.environ, LD_PRELOAD=str(pythons.shim_lib()), SIMDEV_MEMORY="256M",
               SPYRESHIM_TRACE=str(trace), SPYRESHIM_STATS=str(stats),
               PYTHONPATH=str(builddir / "tests" / "simdev"))
    r = pythons.run([sys.executable, REPO / "scripts" / "demo_train.py"], env=env)
    assert r.returncode == 0, r.stderr
    t = tr.load(str(trace))
    cols = gcview.collections(t)
    assert len(cols) >= 2
    for c in cols:
        assert c["freed"] > 0
        got = sum(b for b, _n in c["sites"].values())
        assert got == c["attributed"] and got >= 0.99 * c["freed"], c
        assert got == c["freed"]
    s = json.loads(stats.read_text())
    assert len(cols) == s["gc_collections"]
    assert sum(c["freed"] for c in cols) == s["gc_recovered_bytes"]
    p = subprocess.run([sys.executable, REPO / "scripts" / "spyreshim", "report", "--view", "gc",
                        str(trace)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "Collections in %s: %d" % (trace, len(cols)) in out
    assert "(100.0%)" in out.splitlines()[1]
    assert "The cycles that held device memory" in out
    cyc = out.split("The cycles that held device memory")[1]
    assert "Tensor_new, from forward (demo_train.py:" in cyc
    # The cycle's stack in call order: the allocator, then the Python frames.
    lines = [ln.strip() for ln in cyc.splitlines()[2:6]]
    assert lines[0] == "Tensor_new" and lines[1].startswith("forward (demo_train.py:"), lines


def test_only_the_frees_inside_a_collection_are_its(tmp_path):
    # A synthetic trace (docs/trace-format.md): frees outside pressure
    # events, two collections in one event, and a free between them.
    import struct
    from test_trace_views import _rec
    A, F, PB, PE, GC = tr.ALLOC, tr.FREE, tr.PRESSURE_BEGIN, tr.PRESSURE_END, tr.GC
    ev = [(A, 0, 0x1000, 100, 1), (A, 0, 0x2000, 200, 2), (A, 0, 0x3000, 400, 1),
          (A, 0, 0x4000, 800, 2),
          (F, 0, 0x1000, 100, 1),                       # an ordinary free
          (PB, 0xFF, 0, 5000, 0), (F, 0, 0x2000, 200, 2), (GC, 0xFF, 7000, 200, 0),
          (F, 0, 0x3000, 400, 1), (GC, 0xFF, 9000, 400, 0), (PE, 0xFF, 0, 600, 0),
          (F, 0, 0x4000, 800, 2)]                       # after the event
    meta = b"".join(_rec(1, struct.pack("<IIII", s, s, 0, 0)) for s in (1, 2))
    meta += b"".join(_rec(2, struct.pack("<IIQ", s, 1, 0x400000 + s)) for s in (1, 2))
    meta += _rec(3, struct.pack("<II", 0, 0) + b"simdev\0")
    for s in (1, 2):
        meta += _rec(5, struct.pack("<QiI", 0x400000 + s, s, 0) + b"site%d\0f.c\0/bin/p\0" % s)
    body = b"".join(struct.pack("<QQQII", a, sz | (k << 48) | (d << 56), (i + 1) * 1000, i + 1, st)
                    for i, (k, d, a, sz, st) in enumerate(ev))
    path = tmp_path / "g.trace"
    path.write_bytes(struct.pack("<8sIIQQ", b"SPYTRACE", 1, 1, 0, 0) +
                     struct.pack("<IIIIQQ", 0x4B4E4843, len(ev), len(meta), 0, 1, 0) + body + meta)
    t = tr.load(str(path))
    cols = gcview.collections(t)
    assert [(c["freed"], c["attributed"], {s: v for (_d, s), v in c["sites"].items()})
            for c in cols] == [(200, 200, {2: [200, 1]}), (400, 400, {1: [400, 1]})]
    assert {s: v for (_d, s), v in gcview.cycles(cols).items()} == {2: [200, 1, 1],
                                                                     1: [400, 1, 1]}
    text = gcview.text(t)
    assert "#1 at 0.000 s (0.0 ms): freed 200 B in 1 block(s), 100.0% attributed" in text
