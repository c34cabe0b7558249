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
sys.path.insert(0, str(REPO / "scripts" / "package"))
from spyreshim import gcview, trace as tr  # noqa: E402


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
