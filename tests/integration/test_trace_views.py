"""The views of a trace: the timeline page (well-formed, self-contained,
exact peak, markers; rendered and clicked in headless Chromium), the peak
flame graph, and the memory_viz export checked against what PyTorch's
page reads (torch/utils/viz/MemoryViz.js: annotate_snapshot,
process_alloc_data, MemoryView, and its own unpickle()).

Set SPYRESHIM_SCREENSHOT_DIR to keep the screenshot for a look."""
import json
import math
import os
import pickle
import pickletools
import random
import re
import struct
import subprocess
import sys
from array import array
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(HERE))
import trace_synth  # noqa: E402
from spyreshim.exports import memoryviz  # noqa: E402
from spyreshim.views import timeline, tracepeak
from spyreshim.reading import trace as tr
from test_html_report import Page, chromium, png_size  # noqa: E402
import pythons  # noqa: E402

# The opcodes MemoryViz.js's unpickle() handles (its switch statement).
VIZ_OPCODES = {"PROTO", "APPEND", "APPENDS", "LIST", "TUPLE", "NEWFALSE", "NEWTRUE", "NONE",
               "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME",
               "LONG1", "LONG_BINGET", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "SETITEMS",
               "SETITEM", "DICT", "SHORT_BINUNICODE", "BINUNICODE", "STOP", "EMPTY_TUPLE",
               "TUPLE1", "TUPLE2", "TUPLE3", "BINFLOAT"}


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "s.trace"
    trace_synth.write(str(path), 60000, sites=4)
    return tr.load(str(path))


def parse(text):
    p = Page()
    p.feed(text)
    p.close()
    assert not p.errors and not p.stack, (p.errors, p.stack)
    return p


def _rec(tag, body):
    body += b"\0" * (-len(body) % 8)
    return struct.pack("<II", tag, len(body)) + body


# One site whose native stack has two named frames, innermost first.
INNER, OUTER = 0x401000, 0x402000


def write_two_devices(path, events):
    """A trace of `events` [(kind, dev, addr, size)] (docs/trace-format.md),
    all at site 1: native stack [inner_fn, outer_fn], devices 0 and 1."""
    meta = _rec(1, struct.pack("<IIII", 1, 1, 0, 0))
    meta += _rec(2, struct.pack("<IIQQ", 1, 2, INNER, OUTER))
    for i, name in enumerate((b"simdev", b"cuda:0")):
        meta += _rec(3, struct.pack("<II", i, 0) + name + b"\0")
    for a, fn, line in ((INNER, b"inner_fn", 11), (OUTER, b"outer_fn", 22)):
        meta += _rec(5, struct.pack("<QiI", a, line, 0) + fn + b"\0prog.c\0/bin/prog\0")
    ev = b"".join(struct.pack("<QQQII", addr, size | (kind << 48) | (dev << 56), (i + 1) * 1000,
                              i + 1, 1) for i, (kind, dev, addr, size) in enumerate(events))
    with open(path, "wb") as f:
        f.write(struct.pack("<8sIIQQ", b"SPYTRACE", 1, 4242, 0, 0))
        f.write(struct.pack("<IIIIQQ", 0x4B4E4843, len(events), len(meta), 0, 1, 0))
        f.write(ev + meta)
    return tr.load(str(path))


A, F = tr.ALLOC, tr.FREE
TWO_DEVICES = [(A, 0, 0x1000, 100), (A, 1, 0x1000, 200), (A, 0, 0x2000, 50),
               (F, 0, 0x2000, 50), (A, 1, 0x2000, 100),
               (F, 1, 0x1000, 200), (F, 1, 0x2000, 100), (F, 0, 0x1000, 100)]


def test_the_peak_view_holds_the_allocation_that_made_the_peak(tmp_path):
    t = write_two_devices(tmp_path / "two.trace", TWO_DEVICES)
    p = tr.peaks(t)
    assert (p.bytes, p.index) == (400, 4)
    assert p.per_device == {0: (150, 2), 1: (300, 4)}
    # All devices: event 4 made the peak and is in it.
    live = tr.live_at(t, p.index)
    assert sum(sz for sz, _s, _i in live.values()) == p.bytes
    assert (1, 0x2000) in live
    # Each device at its own peak, the allocation that made it included.
    for d, (b, i) in p.per_device.items():
        live = tr.live_at(t, i, device=d)
        assert sum(sz for sz, _s, _i in live.values()) == b, (d, live)
        assert (d, TWO_DEVICES[i][2]) in live
    text = tracepeak.peak_text(t)
    # Titles give the moment's time (event i at (i + 1) us), not its number.
    assert "after event" not in text
    assert "== peak of all devices: 400 B at 0.000005 s ==" in text
    assert "SUMMARY: spyreshim: 400 B live in 3 allocation(s)." in text
    assert "== peak of simdev: 150 B at 0.000003 s ==" in text
    assert "SUMMARY: spyreshim: 150 B live in 2 allocation(s)." in text
    assert "== peak of cuda:0: 300 B at 0.000005 s ==" in text


def test_memory_viz_frames_are_innermost_first(tmp_path):
    # PyTorch's snapshot lists a block's frames innermost first (the
    # allocating function, then its callers), as the leak reports do.
    t = write_two_devices(tmp_path / "two.trace", TWO_DEVICES)
    snap = memoryviz.snapshot(t)
    allocs = [e for tr_ in snap["device_traces"] for e in tr_ if e["action"] == "alloc"]
    assert len(allocs) == 4
    for e in allocs:
        assert [f["name"] for f in e["frames"]] == ["inner_fn", "outer_fn"], e["frames"]
        assert [f["line"] for f in e["frames"]] == [11, 22]
    assert [f["function"] for f in t.frames(1)] == ["inner_fn", "outer_fn"]


def test_timeline_page_is_self_contained_with_the_exact_peak(synth):
    text = timeline.page(synth, buckets=300)
    p = parse(text)
    assert not re.search(r"(src|href)=\"https?:", text)
    peak = tr.peaks(synth)
    assert "peak %s at" % tracepeak.rpt.format_size(peak.bytes) in text
    layers = [a for tag, a in p.tags if tag == "polygon" and a.get("class") == "layer"]
    assert len(layers) == 5                      # 4 sites + other
    # Markers: one path per kind (issue 24 item 8), a stroke per distinct
    # position, the count in its title; no element per marker.
    ngc = sum(1 for k in synth.kind if k == tr.GC)
    assert ngc > 0
    assert not [a for tag, a in p.tags if tag == "line" and "mark" in a.get("class", "")]
    gcs = [a for tag, a in p.tags if tag == "path" and a.get("class") == "mark gc"]
    assert len(gcs) == 1 and int(gcs[0]["data-count"]) == ngc
    strokes = re.findall(r"M([0-9.]+) 10V", gcs[0]["d"])
    assert 0 < len(strokes) <= ngc
    # Each stroke at a collection's time (to the rendering's 0.1 px).
    x0, pw = timeline.PAD_L, timeline.W - timeline.PAD_L - 10
    span = max(synth.time) + 1
    want = {round(x0 + pw * synth.time[i] / span, 1) for i in range(len(synth))
            if synth.kind[i] == tr.GC}
    for x in map(float, strokes):
        assert min(abs(x - v) for v in want) <= 0.2, x
    assert "%d collections" % ngc in text
    data = json.loads(re.search(r'id="data">(.*?)</script>', text, re.S).group(1))
    assert len(data["snaps"]) == 300
    # The peak column's snapshot is the exact peak.
    assert sum(v for _s, v in data["snaps"][data["peak_bucket"]]) == peak.bytes


def many_sites(path, nsites):
    """One allocation at each of `nsites` sites, in a shuffled site order,
    of sizes with many ties (a whole page apart: no two totals collide by
    chance); nothing freed, so the last event is the peak. Returns the
    trace and its live bytes by site."""
    rnd = random.Random(nsites)
    order = list(range(1, nsites + 1))
    rnd.shuffle(order)
    live = {s: 4096 * ((s * 37) % 50 + 1) for s in order}
    rows = [(i + 1, 0x100000 * (i + 1), live[s], tr.ALLOC, 0, (i + 1) * 1000, s)
            for i, s in enumerate(order)]
    cols = {c: array(trace_synth.TYPECODES[c], [r[k] for r in rows])
            for k, c in enumerate(trace_synth.COLUMNS)}
    trace_synth.write_events(str(path), [(0, cols)], trace_synth.metadata(nsites))
    return tr.load(str(path)), live


# More sites than a snapshot lists; 400 also past the copy's bound (a heap
# of the largest then, not a sort of them all).
@pytest.mark.parametrize("nsites", [timeline.SNAPSHOT_SITES + 20, 5 * timeline.SNAPSHOT_SITES])
@pytest.mark.parametrize("path", ["numpy", "pure-python"])
def test_timeline_snapshot_lists_the_largest_sites_in_order_and_sums_the_rest(
        tmp_path, monkeypatch, nsites, path):
    if path == "pure-python":
        monkeypatch.setattr(tr, "np", None)
    elif tr.np is None:
        pythons.need("numpy-off" if os.environ.get("SPYRESHIM_NO_NUMPY") else "numpy",
                     "numpy is not importable here (or SPYRESHIM_NO_NUMPY is set)")
    t, live = many_sites(tmp_path / "sites.trace", nsites)
    # Largest first, equal bytes in site order, whatever order they came in.
    ranked = sorted(live.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ranked[:timeline.SNAPSHOT_SITES]
    rest = sum(v for _s, v in ranked[timeline.SNAPSHOT_SITES:])
    assert rest > 0 and len({v for _s, v in shown}) < len(shown)    # ties among the shown
    want = [[s, v] for s, v in shown] + [[-1, rest]]
    data = timeline.build(t)
    assert data["peak"] == sum(live.values())
    assert data["snaps"][data["peak_bucket"]] == want
    # The page carries that snapshot as it is.
    page = json.loads(re.search(r'id="data">(.*?)</script>', timeline.page(t), re.S).group(1))
    assert page["snaps"][page["peak_bucket"]] == want


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


def test_timeline_axes_have_round_ticks(synth):
    """The bytes axis ticks at multiples of 1, 2 or 5 (times 10, 100) of
    one binary unit, from 0 to the first at or above the highest column;
    the time axis at 1, 2 or 5 times a power of ten: labels read '64 MiB',
    '20 ms', not '48.3 MiB' or '0.173 s'."""
    text = timeline.page(synth, buckets=300)
    ys = re.findall(r'class="ytick"[^>]*/><text[^>]*>([^<]*)</text>', text)
    xs = re.findall(r'class="xtick"[^>]*/><text[^>]*>([^<]*)</text>', text)
    assert len(ys) >= 3 and len(xs) >= 3, (ys, xs)
    unit = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    yv = [0] + [int(v) * unit[u] for v, u in (s.split() for s in ys[1:])]
    assert ys[0] == "0" and all(re.fullmatch(r"\d+ (B|KiB|MiB|GiB)", s) for s in ys[1:]), ys
    step = yv[1]
    assert all(b - a == step for a, b in zip(yv, yv[1:])), ys
    assert int(ys[1].split()[0]) in (1, 2, 5, 10, 20, 50, 100, 200, 500), ys
    assert yv[-1] >= tr.peaks(synth).bytes > yv[-2], (ys, tr.peaks(synth).bytes)
    scale = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}
    assert xs[0] == "0" and all(re.fullmatch(r"\d+ (s|ms|µs|ns)", s) for s in xs[1:]), xs
    xv = [0.0] + [int(v) * scale[u] for v, u in (s.split() for s in xs[1:])]
    xstep = xv[1]
    assert all(abs((b - a) - xstep) < 1e-9 * max(1.0, xstep) for a, b in zip(xv, xv[1:])), xs
    mant = xstep / 10 ** math.floor(math.log10(xstep) + 1e-9)
    assert any(abs(mant - m) < 1e-6 for m in (1, 2, 5)), xs
    assert xv[-1] <= max(synth.time) / 1e9 + 1e-9 < xv[-1] + xstep, (xs, max(synth.time))


def test_every_page_draws_its_flame_graph_the_same_way_up(synth, tmp_path):
    """Flame graphs, not icicles, on every page: the outermost frame at the
    bottom (the leak report's page, the peak's, the timeline's click)."""
    tl = timeline.page(synth, buckets=300)
    peak = tracepeak.peak_html(synth)
    assert "outermost frame at the top" not in tl.lower()
    assert "outermost frame at the bottom" in tl.lower()
    assert "Outermost frame at the bottom" in peak
    # The timeline's graph is drawn by its script: each box's top from the
    # deepest level down, the root's row the lowest.
    assert "e.style.top=((depth-e.dataset.d)*18)+'px'" in tl
    # The leak page's SVG: deeper frames higher (smaller y).
    parse(peak)
    ys = {int(d): float(y) for d, y in re.findall(
        r'data-d="(\d+)"[^>]*>(?:(?!</g>).)*?<rect x="[^"]*" y="([^"]*)"', peak, re.S)}
    assert len(ys) >= 2 and all(ys[d] > ys[d + 1] for d in ys if d + 1 in ys), ys
