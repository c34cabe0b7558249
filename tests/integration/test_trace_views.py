"""The views of a trace: the timeline page (well-formed, self-contained,
exact peak, markers; rendered and clicked in headless Chromium), the peak
flame graph, and the memory_viz export checked against what PyTorch's
page reads (torch/utils/viz/MemoryViz.js: annotate_snapshot,
process_alloc_data, MemoryView, and its own unpickle()).

Set SPYRESHIM_SCREENSHOT_DIR to keep the screenshot for a look."""
import json
import os
import pickle
import pickletools
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "scripts" / "package"))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(HERE))
import trace_synth  # noqa: E402
from spyreshim import memoryviz, timeline, trace as tr, tracepeak  # noqa: E402
from test_html_report import Page, chromium, png_size  # noqa: E402

# The opcodes MemoryViz.js's unpickle() handles (its switch statement).
VIZ_OPCODES = {"PROTO", "APPEND", "APPENDS", "LIST", "TUPLE", "NEWFALSE", "NEWTRUE", "NONE",
               "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME",
               "LONG1", "LONG_BINGET", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "SETITEMS",
               "SETITEM", "DICT", "SHORT_BINUNICODE", "BINUNICODE", "STOP", "EMPTY_TUPLE",
               "TUPLE1", "TUPLE2", "TUPLE3", "BINFLOAT"}


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "s.trace"
    trace_synth.write(str(path), 60000)
    return tr.load(str(path))


def parse(text):
    p = Page()
    p.feed(text)
    p.close()
    assert not p.errors and not p.stack, (p.errors, p.stack)
    return p


def test_timeline_page_is_self_contained_with_the_exact_peak(synth):
    text = timeline.page(synth, buckets=300)
    p = parse(text)
    assert not re.search(r"(src|href)=\"https?:", text)
    peak = tr.peaks(synth)
    assert "peak %s (%d bytes)" % (tracepeak.rpt.format_size(peak.bytes), peak.bytes) in text
    layers = [a for tag, a in p.tags if tag == "polygon" and a.get("class") == "layer"]
    assert len(layers) == 5                      # 4 sites + other
    gcs = [a for tag, a in p.tags if tag == "line" and "gc" in a.get("class", "")]
    assert len(gcs) == sum(1 for k in synth.kind if k == tr.GC) > 0
    data = json.loads(re.search(r'id="data">(.*?)</script>', text, re.S).group(1))
    assert len(data["snaps"]) == 300
    # The peak column's snapshot is the exact peak.
    assert sum(v for _s, v in data["snaps"][data["peak_bucket"]]) == peak.bytes


def test_timeline_escapes_program_text(synth, monkeypatch):
    hostile = "</script><script>alert(1)</script>"
    monkeypatch.setitem(synth.symbols, 0x400000 + 16, (hostile, "f.c", 1, "/bin/x"))
    synth._frames.clear()
    try:
        text = timeline.page(synth, buckets=50)
    finally:
        synth._frames.clear()
    assert "<script>alert(1)" not in text and "</script><script>" not in text
    parse(text)


def test_timeline_in_chromium_draws_and_clicks(tmp_path, synth):
    out = tmp_path / "timeline.html"
    out.write_text(timeline.page(synth, buckets=400))
    r = chromium(tmp_path, "--dump-dom", "--virtual-time-budget=3000", out.as_uri())
    dom = r.stdout.decode()
    # The script ran: the cursor is shown and the flame graph of the peak drawn.
    assert "the peak" in dom
    boxes = re.findall(r'<div class="b[^"]*"[^>]*>([^<]*)</div>', dom)
    assert "all live device memory" in boxes and "site_1" in " ".join(boxes)
    shots = Path(os.environ.get("SPYRESHIM_SCREENSHOT_DIR", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    shot = shots / "trace-timeline.png"
    chromium(tmp_path, "--screenshot=%s" % shot, "--window-size=1280,800",
             "--virtual-time-budget=3000", out.as_uri())
    (w, h), n = png_size(shot)
    assert (w, h) == (1280, 800) and n > 10000


def test_peak_flame_graph(synth):
    text = tracepeak.peak_html(synth)
    p = parse(text)
    assert p.boxes and any("site_" in b["label"] for b in p.boxes)
    assert "peak of all devices" in text


def test_memory_viz_snapshot_is_what_the_page_reads(tmp_path, synth):
    out = tmp_path / "s.pickle"
    memoryviz.write(synth, str(out))
    raw = out.read_bytes()
    ops = {op.name for op, _arg, _pos in pickletools.genops(raw)}
    assert ops <= VIZ_OPCODES, ops - VIZ_OPCODES
    assert raw[:2] == b"\x80\x04"          # PROTO 4: unpickle() takes 2..4
    snap = pickle.loads(raw)
    assert set(snap) >= {"segments", "device_traces"}
    traces = snap["device_traces"]
    assert isinstance(traces, list) and len(traces) == 1
    seen = {}
    for e in traces[0]:
        assert e["action"] in ("alloc", "free_requested", "free_completed", "oom")
        assert isinstance(e["addr"], int) and isinstance(e["size"], int)
        assert "stream" in e and isinstance(e["frames"], list)
        for f in e["frames"]:
            assert set(f) == {"filename", "line", "name"}
        # process_alloc_data pairs alloc and free_completed by addr.
        if e["action"] == "alloc":
            assert e["addr"] not in seen
            seen[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            assert seen.pop(e["addr"]) == e["size"]
    nallocs = sum(1 for k in synth.kind if k == tr.ALLOC)
    assert sum(1 for e in traces[0] if e["action"] == "alloc") == nallocs
    # annotate_snapshot: blocks tile their segment from its address;
    # MemoryView finds every block of the trace inside some segment.
    segs = sorted(snap["segments"], key=lambda s: s["address"])
    live = 0
    for s in segs:
        assert s["device"] == 0 and set(s) >= {"address", "total_size", "stream", "blocks"}
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
        for b in s["blocks"]:
            assert b["state"] in ("active_allocated", "inactive")
            assert set(b) >= {"size", "requested_size", "state", "frames"}
            live += b["size"] if b["state"] == "active_allocated" else 0
    assert live == sum(v for v in seen.values())
    for e in traces[0]:
        if e["action"] == "alloc":
            assert any(s["address"] <= e["addr"] and e["addr"] + e["size"] <= s["address"] +
                       s["total_size"] for s in segs)
