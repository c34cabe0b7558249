"""Every view of a trace in true call order (issue 24, item 1): the
stacks a trace's views draw (peak text and flame graph, the timeline's
"live at", --view stats, memory_viz) are the leak report's, spliced and
folded the same way (spyreshim/reading/callorder.py reads the
evaluation-loop and interpreter marks of the symbol records and the Python
stacks' entry marks, docs/trace-format.md). One run records both a leak
report and a trace of the same allocations; each leaked block's stack in
the trace must equal the report's, frame by frame."""
import pickle
import sys
from pathlib import Path

import pytest

import pythons
from test_hybrid_stacks import CALLBACK, MODEL, SCRIPT, by_size, key_frames

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from spyreshim.reading import callorder, report as rpt, trace as tr  # noqa: E402,E501
from spyreshim.exports import memoryviz
from spyreshim.views import timeline, tracepeak

# A static build, a shared one, one before 3.11 (one loop call per frame),
# one after 3.12 (the entry frame below the chain).
NAMES = ["cpython3.11-static", "cpython3.11-shared", "cpython3.10", "cpython3.13"]


def frame_key(f):
    return (f["kind"], f["function"], f["line"] if f["kind"] == "python" else None,
            bool(f.get("interpreter")), bool(f.get("folded")))


def run(name, tmp_path):
    interp = pythons.get(name).require()
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    report, trace = tmp_path / "r.json", tmp_path / "r.trace"
    r = pythons.run_python(interp, path=script, args=[],
                           env={"SPYRESHIM_LEAK_CHECK": "held", "SPYRESHIM_REPORT": str(report),
                                "SPYRESHIM_EXITCODE": "7", "SPYRESHIM_TRACE": str(trace)})
    assert r.returncode == 7, r.describe()
    return script, by_size(report), tr.load(str(trace))


def sites_by_size(t):
    live = tr.live_at(t, len(t) - 1)
    return {sz: site for (sz, site, _i) in live.values()}


@pytest.mark.parametrize("name", NAMES)
def test_trace_stacks_are_the_leak_reports(name, builddir, shim_lib, tmp_path):
    script, groups, t = run(name, tmp_path)
    sites = sites_by_size(t)
    for size, expected in ((1000, MODEL), (1001, MODEL), (2000, CALLBACK), (2001, CALLBACK)):
        g = callorder.group(t, sites[size])
        assert g["order"] == "hybrid" and g["unspliced"] is None, (size, g["unspliced"])
        # Every frame where the leak report has it, folded as it folds.
        assert [frame_key(f) for f in g["frames"]] == \
            [frame_key(f) for f in groups[size]["frames"]], size
        assert key_frames(callorder.visible(t, sites[size]), script) == expected
    # The views: the extension's frame innermost, <module> outermost, no
    # interpreter frame between them.
    text = tracepeak.peak_text(t)
    block = text[text.index("1000 B"):]
    block = block[:block.index("\n\n")] if "\n\n" in block else block
    lines = [ln for ln in block.splitlines() if ln.strip().startswith("#")]
    assert "Tensor_new" in lines[0] and "mlp" in lines[1] and "<module>" in lines[-1], lines
    assert "interpreter frame" in block and "folded" in block
    assert callorder.label(t, sites[1000]) == "Tensor_new, from mlp (script.py:5)"
    assert "Tensor_new" in tracepeak.stats_text(t)
    labels = timeline._site_frames(t, sites[2000])
    assert labels[0].startswith("<module>") and labels[-1] == "Tensor_new", labels
    assert not [x for x in labels if x.startswith("_PyEval") or x in ("_start", "type_call")]
    html = tracepeak.peak_html(t)
    assert "Tensor_new" in html and "_PyEval_EvalFrameDefault" not in html
    snap = memoryviz.snapshot(t)
    allocs = [e for d in snap["device_traces"] for e in d if e["action"] == "alloc"
              and e["size"] == 2000]
    names = [f["name"] for f in allocs[0]["frames"]]
    assert names[0] == "Tensor_new" and names[1] == "cb" and names[-1] == "<module>", names
    pickle.loads(pickle.dumps(snap))


def test_a_trace_without_entry_marks_keeps_python_first_and_says_why(builddir, shim_lib,
                                                                    tmp_path):
    script, groups, t = run("cpython3.11-static", tmp_path)
    site = sites_by_size(t)[1000]
    t.pymarks.clear()         # as a file written before record 7 existed
    t.__dict__.pop("_callorder", None)
    g = callorder.group(t, site)
    assert g["order"] == "python-first" and "entry marks" in g["unspliced"]
    assert g["frames"][0]["kind"] == "python"
    r = callorder.live_report(t, tr.live_at(t, len(t) - 1), "peak")
    assert "(unspliced, Python frames first: the trace has no entry marks" in rpt.text(
        rpt.merge([r]))
