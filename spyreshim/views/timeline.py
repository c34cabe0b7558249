"""The timeline view of a trace: one self-contained HTML page with live
device bytes over time, stacked by allocation site (the top sites, the rest
as "other"), markers for pressure events, collections and out-of-memory,
and a time cursor: clicking the chart shows what was live then as a flame
graph.

Owns this page only (reads trace.py's stream in one pass; each batch by
_batch_np with numpy, else _batch: the same data). Usable for 10
million events and more, in memory that does not grow with them: the chart
has BUCKETS columns; each shows the state at the moment its interval was
highest (so saw-teeth keep their tips), and the bucket holding the peak
shows the exact peak. The click view is the live set by site at that same
moment. Markers are one SVG path per kind (a stroke per distinct
position), not an element each. The SVG is drawn here, complete without the script; the
script adds the cursor and the flame graph. Every string from the trace
goes through html.escape or json.dumps (program-controlled text).
"""

import bisect
import collections
import heapq
import html
import itertools
import json
import operator
from array import array

from ..reading import callorder
from ..reading import report as rpt
from ..reading import trace as tr
from ..reading import units

BUCKETS = 800
TOP_SITES = 8
SNAPSHOT_SITES = 80     # sites listed per click snapshot; the rest summed
W, H, PAD_L, PAD_B = 1200, 360, 70, 24
COLOURS = ["#4e79a7", "#f28e2c", "#e15759", "#76b7b2", "#59a14f", "#edc949",
           "#af7aa1", "#ff9da7", "#9c755f", "#bab0ab"]
OTHER = "#cccccc"
MARK_COLOURS = {tr.PRESSURE_BEGIN: "#e15759", tr.GC: "#59a14f", tr.OOM: "#000000"}
MARK_NAMES = {tr.PRESSURE_BEGIN: "pressure event", tr.GC: "collection", tr.OOM: "out of memory"}
MARK_PLURAL = {tr.PRESSURE_BEGIN: "pressure events", tr.GC: "collections",
               tr.OOM: "out-of-memory events"}


def _esc(s):
    return html.escape(str(s), quote=True)


_IS_MARK = bytes(1 if k in MARK_NAMES else 0 for k in range(256))
_IS_MARK_NP = tr.np.frombuffer(_IS_MARK, dtype=tr.np.uint8).astype(bool) if tr.np else None
MARK_TICKS = 1 << 14    # marker positions kept per kind (a fraction of a pixel)


def _site_add(site_live, site, d):
    """Adds each event's delta d to its site's live bytes, in C loops: the
    (site, delta) pairs counted (sizes repeat, so the distinct pairs are
    few)."""
    for (s, dv), c in collections.Counter(zip(site, d)).items():
        if dv:
            v = site_live.get(s, 0) + dv * c
            if v:
                site_live[s] = v
            else:
                site_live.pop(s, None)


_BYTES = operator.itemgetter(1)


def _by_bytes(kv):
    return kv[1], -kv[0]


def _keep(site_live):
    """What a snapshot needs of site_live now: a copy while the sites are
    few (most snapshots are replaced by a higher one later: _snap runs at
    the end on those that stay), else the snapshot itself (bounded)."""
    if len(site_live) <= 4 * SNAPSHOT_SITES:
        return dict(site_live)
    return _snap(site_live)


def _snap(site_live):
    """The live set by site, largest first (equal bytes: the lower site
    first, whatever order the sites were added in): SNAPSHOT_SITES of them
    and the rest summed as site -1."""
    if len(site_live) <= 4 * SNAPSHOT_SITES:
        # Two C sorts: by site, then (stable) by bytes, largest first.
        items = sorted(site_live.items())
        items.sort(key=_BYTES, reverse=True)
    else:
        items = heapq.nlargest(SNAPSHOT_SITES + 1, site_live.items(), key=_by_bytes)
    if len(items) <= SNAPSHOT_SITES:
        return list(map(list, items))
    snap = list(map(list, items[:SNAPSHOT_SITES]))
    shown = sum(v for _s, v in snap)
    snap.append([-1, sum(site_live.values()) - shown])
    return snap


class _Chart(object):
    """Live bytes over time in fine intervals of width w (ns), 2 * buckets
    of them, each holding its highest moment: [bytes, event index, time,
    snapshot]. When an event lies past the last interval, w doubles and
    neighbours merge (the higher one stays): one pass, however long the
    trace, and each chart column later gets at least one interval."""

    def __init__(self, buckets):
        self.k = 2 * buckets
        self.w = 1
        self.fine = {}

    def widen(self, tmax):
        while tmax >= self.k * self.w:
            merged = {}
            for q, c in self.fine.items():
                o = merged.get(q >> 1)
                if o is None or c[0] > o[0] or (c[0] == o[0] and c[1] < o[1]):
                    merged[q >> 1] = c
            self.fine = merged
            self.w *= 2


def build(t, buckets=BUCKETS, top=TOP_SITES):
    """The page's data in one pass: live bytes after every event (a running
    sum, in C), each fine interval's highest moment with the live set by
    site there, and the markers' positions."""
    chart = _Chart(buckets)
    site_live = {}
    marks = {k: [0, 0, set()] for k in MARK_NAMES}   # count, bytes, ticks
    st = [0, 0, 0, 1]    # live bytes, events, largest time, marks' tick width
    np = tr.np
    for b in t.batches():
        if np is not None:
            _batch_np(np, b, chart, site_live, marks, st)
        else:
            _batch(b, chart, site_live, marks, st)
    live, n, tmax, wm = st
    for c in chart.fine.values():
        if isinstance(c[3], dict):
            c[3] = _snap(c[3])
    span = tmax + 1
    # Each fine interval into the chart column its start lies in; a column
    # shows its highest; one without events keeps the previous state.
    best = [None] * buckets
    peak = None
    for q, c in chart.fine.items():
        col = min(buckets - 1, q * chart.w * buckets // span)
        o = best[col]
        if o is None or c[0] > o[0] or (c[0] == o[0] and c[1] < o[1]):
            best[col] = c
        if peak is None or c[0] > peak[0] or (c[0] == peak[0] and c[1] < peak[1]):
            peak = c
    if peak is None or peak[0] <= 0:
        peak = [0, -1, 0, []]
    top_v = {}
    for c in best:
        if c is not None:
            for s, v in c[3]:
                if s != -1 and v > top_v.get(s, 0):
                    top_v[s] = v
    top_sites = [s for s, _v in sorted(top_v.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]
    index = {s: j for j, s in enumerate(top_sites)}
    columns, snaps = [], []
    prev_col, prev_snap = [0] * (len(top_sites) + 1), []
    peak_bucket = 0
    for col in range(buckets):
        c = best[col]
        if c is None:
            columns.append((col * span // buckets, prev_col))
            snaps.append(prev_snap)
            continue
        vec = [0] * (len(top_sites) + 1)
        for s, v in c[3]:
            vec[index[s] if s in index else -1] += v
        columns.append((c[2], vec))
        snaps.append(c[3])
        prev_col, prev_snap = vec, c[3]
        if c is peak:
            peak_bucket = col
    return {"n": n, "tmax": tmax, "span": span, "peak": peak[0], "peak_index": peak[1],
            "peak_time": peak[2], "peak_bucket": peak_bucket,
            "top_sites": top_sites, "columns": columns, "snaps": snaps,
            "marks": marks, "mark_tick": wm}


def _batch(b, chart, site_live, marks, st):
    """One batch into the chart, the sites' live bytes and the markers
    (the pure-Python path; st: live bytes, events, largest time, tick)."""
    live, n, tmax, wm = st
    m = len(b)
    n += m
    tm = b.time
    before = tmax    # the largest time before this batch
    bt = max(tm)
    if bt > tmax:
        tmax = bt
    chart.widen(bt)
    d = tr.served(b, tr.deltas(b))
    if not isinstance(d, array):       # numpy's, for a batch _batch_np left
        d = array("q", d.tobytes())
    cum = array("q", itertools.accumulate(d, initial=live))
    live = cum[-1]
    site, fine, w = b.site, chart.fine, chart.w
    # An interval ends at the first event whose time lies past it: the
    # threads' times can step back a little in sequence order, so the
    # intervals follow the running maximum of the times (sorted), from
    # the trace's start (batch boundaries change nothing).
    top = tm if tm[0] >= before and _ordered(tm) else array(
        "Q", itertools.accumulate(tm, max, initial=before))[1:]
    pos = 0          # site_live holds the state before event pos
    lo = 0
    while lo < m:
        q = top[lo] // w
        hi = bisect.bisect_left(top, (q + 1) * w, lo + 1)
        v = max(cum[lo + 1:hi + 1])
        c = fine.get(q)
        if c is None or v > c[0]:
            # array.index takes no bounds before Python 3.10 (pypy3): a slice.
            j = lo + cum[lo + 1:hi + 1].index(v)
            _site_add(site_live, site[pos:j + 1], d[pos:j + 1])
            pos = j + 1
            fine[q] = [v, b.start + j, tm[j], _keep(site_live)]
        lo = hi
    _site_add(site_live, site[pos:], d[pos:])
    kb = b.kind.tobytes()
    if kb.translate(_IS_MARK).count(1):
        while bt >= MARK_TICKS * wm:
            wm *= 2
            for mk in marks.values():
                mk[2] = {x >> 1 for x in mk[2]}
        kind, size = b.kind, b.size
        for i in itertools.compress(range(m), kb.translate(_IS_MARK)):
            mk = marks[kind[i]]
            mk[0] += 1
            mk[1] += size[i]
            mk[2].add(tm[i] // wm)
    st[:] = live, n, tmax, wm


def _add_site_sums(site_live, gseg, gsite, gsum, gi, upto):
    """Adds to site_live the site sums of segment `upto` (None: of every
    segment left), from index gi on; a site whose live bytes reach 0 goes.
    Returns the index after the last one added."""
    ng = len(gseg)
    while gi < ng and (upto is None or gseg[gi] == upto):
        s = gsite[gi]
        val = site_live.get(s, 0) + gsum[gi]
        if val:
            site_live[s] = val
        else:
            site_live.pop(s, None)
        gi += 1
    return gi


def _site_sums(np, d, site, ends):
    """The sum of d per (segment, site), segment g holding the events after
    ends[g-1] up to ends[g] (the last one: the rest), in segment order:
    three lists (segment, site, sum), the sums that are 0 left out (adding
    them changes nothing)."""
    nz = np.flatnonzero(d)
    if not len(nz):
        return [], [], []
    seg = np.searchsorted(np.array(ends, dtype=np.int64), nz, "left")   # i <= ends[g]: g
    ss = site[nz]
    dd = d[nz]
    nsite = int(ss.max()) + 1
    cells = (len(ends) + 1) * nsite
    # One bincount when its float sums are exact (every partial sum an
    # integer below 2^53) and its cells few; else one sort and reduceat.
    big = int(np.abs(dd).max())
    if cells <= 1 << 22 and big * len(dd) < 1 << 53:
        key = seg * nsite + ss
        sums = np.bincount(key, weights=dd, minlength=cells)
        cell = np.flatnonzero(sums)
        return ((cell // nsite).tolist(), (cell % nsite).tolist(),
                sums[cell].astype(np.int64).tolist())
    o = np.lexsort((ss, seg))
    seg, ss, dd = seg[o], ss[o], dd[o]
    key = np.flatnonzero(np.concatenate(([True], (seg[1:] != seg[:-1]) | (ss[1:] != ss[:-1]))))
    sums = np.add.reduceat(dd, key)
    keep = sums != 0
    return seg[key][keep].tolist(), ss[key][keep].tolist(), sums[keep].tolist()


def _ordered(tm):
    """Whether the times never step back (an array)."""
    return all(map(operator.le, tm, itertools.islice(tm, 1, None)))


def _batch_np(np, b, chart, site_live, marks, st):
    """_batch with numpy: the running sum by cumsum, the intervals by the
    running maximum of the times, each interval's highest moment by
    maximum.reduceat and argmax, and the sites' sums between the moments
    that make a snapshot by one sort on (moment, site) and add.reduceat."""
    seq, addr, size, kind, dev, tm, site = b.nd()
    m = len(kind)
    live, n, tmax, wm = st
    n += m
    top = np.maximum.accumulate(tm)
    if m and int(top[0]) < tmax:
        top = np.maximum(top, np.uint64(tmax))
    bt = int(top[-1])
    if bt > tmax:
        tmax = bt
    chart.widen(bt)
    d = tr.deltas_np(np, kind, size, dev)
    cum = np.cumsum(d)
    cum += live                   # cum[i]: live bytes after event i
    live = int(cum[-1])
    fine, w = chart.fine, chart.w
    q = top // np.uint64(w)
    starts = np.flatnonzero(np.concatenate(([True], q[1:] != q[:-1])))
    tops = np.maximum.reduceat(cum, starts)
    # Each interval's first event at its highest: the events equal to
    # their interval's highest, the first of them past each start.
    lens = np.diff(np.append(starts, m))
    at = np.flatnonzero(cum == np.repeat(tops, lens))
    firsts = at[np.searchsorted(at, starts)].tolist()
    moments = []      # (q, v, j): the events j after which a snapshot is taken
    for qq, v, j in zip(q[starts].tolist(), tops.tolist(), firsts):
        c = fine.get(qq)
        if c is None or v > c[0]:
            moments.append((qq, v, j))
            fine[qq] = [v, None, None, None]     # filled below
    # The sites' sums between consecutive moments: segment g holds the
    # events after moment g-1 up to moment g (the last: the rest).
    gseg, gsite, gsum = _site_sums(np, d, site, [j for _q, _v, j in moments])
    gi = 0
    for g, (qq, v, j) in enumerate(moments):
        gi = _add_site_sums(site_live, gseg, gsite, gsum, gi, g)
        fine[qq] = [v, b.start + j, int(tm[j]), _keep(site_live)]
    _add_site_sums(site_live, gseg, gsite, gsum, gi, None)
    mk_at = np.flatnonzero(_IS_MARK_NP[kind])
    if len(mk_at):
        while bt >= MARK_TICKS * wm:
            wm *= 2
            for mk in marks.values():
                mk[2] = {x >> 1 for x in mk[2]}
        for k, sz, x in zip(kind[mk_at].tolist(), size[mk_at].tolist(),
                            (tm[mk_at] // np.uint64(wm)).tolist()):
            mk = marks[k]
            mk[0] += 1
            mk[1] += sz
            mk[2].add(x)
    st[:] = live, n, tmax, wm
    return True


def _site_frames(t, s, native_frames="folded"):
    """Frame labels, outermost first (the flame graph's root side), in call
    order with the interpreter's frames and each run of a library's frames
    folded (callorder.shown) unless native_frames is "all"."""
    if s == -1:
        return ["(smaller sites)"]
    return ([rpt.frame_label(f) for f in reversed(callorder.shown(t, s, native_frames))]
            or ["[no stack recorded]"])


_CSS = """
body{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:18px;margin:0 0 4px}
.meta{color:#555;margin:2px 0}
#chart{width:100%;height:auto;border:1px solid #ddd;cursor:crosshair;display:block}
#legend span{display:inline-block;margin:2px 10px 2px 0}
#legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
#flame{position:relative;margin-top:8px;font:11px monospace}
#flame div.b{position:absolute;height:17px;overflow:hidden;white-space:nowrap;box-sizing:border-box;
 border:1px solid #fff;border-radius:2px;padding:0 3px;background:hsl(20,80%,70%)}
#flame div.b.py{background:hsl(195,55%,72%)}
#at{font-weight:600;margin-top:10px}
"""

_JS = r"""
(function(){
var D=JSON.parse(document.getElementById('data').textContent);
var svg=document.getElementById('chart'), cur=document.getElementById('cursor');
var at=document.getElementById('at'), fl=document.getElementById('flame');
function fmt(n){var u=['B','KiB','MiB','GiB','TiB'],i=0,v=n;while(v>=1024&&i<4){v/=1024;i++;}return i?n+' B ('+v.toFixed(1)+' '+u[i]+')':n+' B';}
function show(b){
  var x=D.x0+(b+0.5)*D.bw; cur.setAttribute('x1',x);cur.setAttribute('x2',x);cur.style.display='';
  var snap=D.snaps[b], total=0; for(var i=0;i<snap.length;i++) total+=snap[i][1];
  at.textContent='Live at '+(D.times[b]/1e9).toFixed(6)+' s: '+fmt(total)+
    (b===D.peak_bucket?' (the peak)':'')+' — outermost frame at the bottom, width is bytes';
  // Children by name in prototype-free maps: a frame named constructor,
  // __proto__ or toString is a name like any other.
  var root={n:'all live device memory',v:0,c:Object.create(null)};
  for(var i=0;i<snap.length;i++){var fr=D.sites[snap[i][0]]||['?'],node=root;node.v+=snap[i][1];
    for(var j=0;j<fr.length;j++){var k=fr[j];node=node.c[k]||(node.c[k]={n:k,v:0,c:Object.create(null)});node.v+=snap[i][1];}}
  fl.innerHTML=''; var depth=0;
  function draw(node,x,w,d){ if(w<0.05) return; depth=Math.max(depth,d);
    var e=document.createElement('div'); e.className='b'+(/\(.*\.py:/.test(node.n)?' py':'');
    e.style.left=x+'%'; e.style.width=w+'%'; e.dataset.d=d;
    e.textContent=node.n; e.title=node.n+'\n'+fmt(node.v); fl.appendChild(e);
    var kids=Object.keys(node.c).map(function(k){return node.c[k];}).sort(function(a,b){return b.v-a.v;});
    var cx=x; for(var i=0;i<kids.length;i++){var cw=root.v?w*kids[i].v/node.v:0; draw(kids[i],cx,cw,d+1); cx+=cw;} }
  if(root.v) draw(root,0,100,0);
  // A flame graph as the other pages draw it: the root at the bottom.
  for(var e=fl.firstChild;e;e=e.nextSibling) e.style.top=((depth-e.dataset.d)*18)+'px';
  fl.style.height=((depth+1)*18+4)+'px';
}
svg.addEventListener('click',function(ev){
  var p=svg.createSVGPoint(); p.x=ev.clientX; p.y=ev.clientY;
  var q=p.matrixTransform(svg.getScreenCTM().inverse());
  var b=Math.floor((q.x-D.x0)/D.bw); if(b<0||b>=D.snaps.length) return; show(b);
});
window.spyreshimShow=show;
show(D.peak_bucket);
})();
"""


def page(t, buckets=BUCKETS, top=TOP_SITES, title="spyreshim: device memory over time",
         native_frames="folded"):
    d = build(t, buckets, top)
    cols = d["columns"]
    yticks = units.size_ticks(max([sum(c) for _t, c in cols] + [d["peak"], 1]))
    ymax = yticks[-1][0] or 1
    x0, pw, ph = PAD_L, W - PAD_L - 10, H - PAD_B - 10
    bw = pw / float(buckets)

    def y(v):
        return 10 + ph - ph * v / float(ymax)

    out = []
    w = out.append
    w("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n")
    w("<title>%s</title>\n<style>%s</style>\n</head>\n<body>\n" % (_esc(title), _CSS))
    w("<h1>%s</h1>\n" % _esc(title))
    npress, ngc, noom = (d["marks"][k][0] for k in (tr.PRESSURE_BEGIN, tr.GC, tr.OOM))
    w("<p class=\"meta\" id=\"summary\">%s: pid %s, %d events over %.3f s; peak %s at %.6f s; "
      "%d pressure events, %d collections, %d out-of-memory%s.</p>\n" % (
          _esc(t.path), _esc(t.pid), d["n"], d["tmax"] / 1e9, _esc(rpt.format_size(d["peak"])),
          d["peak_time"] / 1e9, npress, ngc, noom,
          "; the trace is truncated (the process did not exit)" if t.truncated else ""))
    w("<p class=\"meta\">Each of the %d columns shows the moment its interval was highest. "
      "Click the chart to see what was live then.</p>\n" % buckets)
    w("<svg id=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %d %d\" role=\"img\" "
      "aria-label=\"live device memory over time\">\n" % (W, H))
    # y axis
    # Round ticks: multiples of 1, 2 or 5 of a binary unit up to the first
    # at or above the highest column; times of 1, 2 or 5 times a power of 10.
    for v, label in yticks:
        w("<line class=\"ytick\" x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>"
          "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n" % (
              x0, x0 + pw, y(v), y(v), x0 - 4, y(v) + 4, _esc(label)))
    for s, label in units.time_ticks(d["span"] / 1e9):
        xt = x0 + pw * s * 1e9 / float(d["span"])
        w("<line class=\"xtick\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#999\"/>"
          "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n" % (
              xt, xt, 10 + ph, 14 + ph, xt, H - 6, _esc(label)))
    # stacked areas: one polygon per layer, bottom layer first ("other" on top)
    nl = len(d["top_sites"]) + 1
    names = callorder.labels(t, d["top_sites"])
    base = [0] * buckets
    for layer in list(range(nl - 1)) + [nl - 1]:
        top_pts, bot_pts = [], []
        for b in range(buckets):
            v = cols[b][1][layer]
            xa, xb = x0 + b * bw, x0 + (b + 1) * bw
            top_pts += ["%.1f,%.1f" % (xa, y(base[b] + v)), "%.1f,%.1f" % (xb, y(base[b] + v))]
            bot_pts += ["%.1f,%.1f" % (xa, y(base[b])), "%.1f,%.1f" % (xb, y(base[b]))]
            base[b] += v
        colour = OTHER if layer == nl - 1 else COLOURS[layer % len(COLOURS)]
        name = "other sites" if layer == nl - 1 else names[d["top_sites"][layer]]
        w("<polygon class=\"layer\" data-site=\"%s\" fill=\"%s\" points=\"%s\"><title>%s</title></polygon>\n" % (
            _esc(d["top_sites"][layer] if layer < nl - 1 else "other"), colour,
            " ".join(top_pts + list(reversed(bot_pts))), _esc(name)))
    # markers: one path per kind, a vertical stroke per distinct position
    for k in (tr.PRESSURE_BEGIN, tr.GC, tr.OOM):
        count, nbytes, ticks = d["marks"][k]
        if not count:
            continue
        xs = sorted({round(x0 + pw * (tk + 0.5) * d["mark_tick"] / float(d["span"]), 1)
                     for tk in ticks})
        path = "".join("M%.1f 10V%d" % (x, 10 + ph) for x in xs)
        w("<path class=\"mark %s\" d=\"%s\" stroke=\"%s\" stroke-width=\"1\" "
          "stroke-opacity=\"0.6\" fill=\"none\" data-count=\"%d\"><title>%d %s (%s %s)"
          "</title></path>\n" % (
              {tr.PRESSURE_BEGIN: "pressure", tr.GC: "gc", tr.OOM: "oom"}[k], path,
              MARK_COLOURS[k], count, count, (MARK_NAMES if count == 1 else MARK_PLURAL)[k],
              _esc(rpt.format_size(nbytes)), "freed" if k == tr.GC else "requested"))
    # the exact peak
    px = x0 + pw * d["peak_time"] / float(d["span"])
    w("<circle id=\"peak\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"none\" stroke=\"#000\"><title>peak: %s "
      "at %.6f s</title></circle>\n" % (px, y(d["peak"]), _esc(rpt.format_size(d["peak"])),
                                        d["peak_time"] / 1e9))
    w("<line id=\"cursor\" x1=\"0\" x2=\"0\" y1=\"10\" y2=\"%d\" stroke=\"#000\" stroke-dasharray=\"3,2\" "
      "style=\"display:none\"/>\n</svg>\n" % (10 + ph))
    w("<div id=\"legend\">")
    for j, s in enumerate(d["top_sites"]):
        w("<span><i style=\"background:%s\"></i>%s</span>" % (COLOURS[j % len(COLOURS)],
                                                             _esc(names[s])))
    w("<span><i style=\"background:%s\"></i>other sites</span>" % OTHER)
    for k in (tr.PRESSURE_BEGIN, tr.GC, tr.OOM):
        w("<span><i style=\"background:%s;width:2px\"></i>%s</span>" % (MARK_COLOURS[k], MARK_NAMES[k]))
    w("</div>\n<div id=\"at\"></div>\n<div id=\"flame\"></div>\n")
    used = set()
    for s in d["snaps"]:
        for site, _v in s:
            used.add(site)
    data = {"x0": x0, "bw": bw, "times": [c[0] for c in cols], "snaps": d["snaps"],
            "peak_bucket": d["peak_bucket"],
            "sites": {str(s): _site_frames(t, s, native_frames) for s in sorted(used)}}
    # json.dumps, then every "<" escaped: the data cannot end the script element.
    w("<script type=\"application/json\" id=\"data\">%s</script>\n" %
      json.dumps(data, separators=(",", ":")).replace("<", "\\u003c"))
    w("<script>%s</script>\n</body>\n</html>\n" % _JS)
    return "".join(out)
