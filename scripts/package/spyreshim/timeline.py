"""The timeline view of a trace: one self-contained HTML page with live
device bytes over time, stacked by allocation site (the top sites, the rest
as "other"), markers for pressure events, collections and out-of-memory,
and a time cursor: clicking the chart shows what was live then as a flame
graph.

Owns this page only (reads trace.py's replay). Usable for 10 million
events: the chart has BUCKETS columns; each shows the state at the moment
its interval was highest (so saw-teeth keep their tips), and the bucket
holding the peak shows the exact peak. The click view is the live set at
that same moment. The SVG is drawn here, complete without the script; the
script adds the cursor and the flame graph. Every string from the trace
goes through html.escape or json.dumps (program-controlled text).
"""

import html
import json

from . import callorder
from . import report as rpt
from . import trace as tr

BUCKETS = 800
TOP_SITES = 8
SNAPSHOT_SITES = 80     # sites listed per click snapshot; the rest summed
W, H, PAD_L, PAD_B = 1200, 360, 70, 24
COLOURS = ["#4e79a7", "#f28e2c", "#e15759", "#76b7b2", "#59a14f", "#edc949",
           "#af7aa1", "#ff9da7", "#9c755f", "#bab0ab"]
OTHER = "#cccccc"
MARK_COLOURS = {tr.PRESSURE_BEGIN: "#e15759", tr.GC: "#59a14f", tr.OOM: "#000000"}
MARK_NAMES = {tr.PRESSURE_BEGIN: "pressure event", tr.GC: "collection", tr.OOM: "out of memory"}


def _esc(s):
    return html.escape(str(s), quote=True)


def build(t, buckets=BUCKETS, top=TOP_SITES):
    """The page's data: one pass for totals, bucket maxima and per-site
    peaks, a second for the per-site state at each bucket's maximum."""
    kind, size, site, time = t.kind, t.size, t.site, t.time
    n = len(kind)
    tmax = max(time) if n else 0
    span = tmax + 1
    bmax = [-1] * buckets
    bidx = [-1] * buckets
    live = 0
    peak, peak_i = 0, -1
    site_live, site_peak = {}, {}
    marks = []
    for i in range(n):
        k = kind[i]
        if k == tr.ALLOC:
            s = site[i]
            live += size[i]
            v = site_live.get(s, 0) + size[i]
            site_live[s] = v
            if v > site_peak.get(s, 0):
                site_peak[s] = v
            if live > peak:
                peak, peak_i = live, i
        elif k == tr.FREE:
            live -= size[i]
            site_live[site[i]] -= size[i]
        elif k in MARK_NAMES:
            marks.append((time[i], k, size[i]))
            continue
        else:
            continue
        b = time[i] * buckets // span
        if live > bmax[b]:
            bmax[b], bidx[b] = live, i
    top_sites = [s for s, _v in sorted(site_peak.items(), key=lambda kv: -kv[1])[:top]]
    index = {s: j for j, s in enumerate(top_sites)}
    if peak_i >= 0:
        pb = time[peak_i] * buckets // span
        bidx[pb] = peak_i   # the peak is exact even when times tie
    want = sorted((i, b) for b, i in enumerate(bidx) if i >= 0)
    columns = [None] * buckets
    snaps = [None] * buckets
    site_live = {}
    w = 0
    for i in range(n if want else 0):
        k = kind[i]
        if k == tr.ALLOC:
            site_live[site[i]] = site_live.get(site[i], 0) + size[i]
        elif k == tr.FREE:
            v = site_live[site[i]] - size[i]
            if v:
                site_live[site[i]] = v
            else:
                del site_live[site[i]]
        while w < len(want) and want[w][0] == i:
            b = want[w][1]
            col = [0] * (len(top_sites) + 1)
            for s, v in site_live.items():
                col[index[s] if s in index else -1] += v
            columns[b] = (time[i], col)
            items = sorted(site_live.items(), key=lambda kv: -kv[1])
            snap = [[s, v] for s, v in items[:SNAPSHOT_SITES]]
            rest = sum(v for _s, v in items[SNAPSHOT_SITES:])
            if rest:
                snap.append([-1, rest])
            snaps[b] = snap
            w += 1
        if w == len(want):
            break
    # Intervals without events keep the previous state.
    prev_col, prev_snap = [0] * (len(top_sites) + 1), []
    for b in range(buckets):
        if columns[b] is None:
            columns[b] = (b * span // buckets, prev_col)
            snaps[b] = prev_snap
        else:
            prev_col, prev_snap = columns[b][1], snaps[b]
    return {"n": n, "tmax": tmax, "span": span, "peak": peak, "peak_index": peak_i,
            "peak_time": time[peak_i] if peak_i >= 0 else 0,
            "top_sites": top_sites, "columns": columns, "snaps": snaps, "marks": marks}


def _site_frames(t, s):
    """Frame labels, outermost first (the flame graph's root side), in call
    order with the interpreter's frames folded (callorder.py)."""
    if s == -1:
        return ["(smaller sites)"]
    return [rpt.frame_label(f) for f in reversed(callorder.visible(t, s))] or ["[no stack recorded]"]


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
function fmt(n){var u=['B','KiB','MiB','GiB','TiB'],i=0;while(n>=1024&&i<4){n/=1024;i++;}return (i?n.toFixed(1):n)+' '+u[i];}
function show(b){
  var x=D.x0+(b+0.5)*D.bw; cur.setAttribute('x1',x);cur.setAttribute('x2',x);cur.style.display='';
  var snap=D.snaps[b], total=0; for(var i=0;i<snap.length;i++) total+=snap[i][1];
  at.textContent='Live at '+(D.times[b]/1e9).toFixed(6)+' s: '+fmt(total)+
    (b===D.peak_bucket?' (the peak)':'')+' — outermost frame at the top, width is bytes';
  // Children by name in prototype-free maps: a frame named constructor,
  // __proto__ or toString is a name like any other.
  var root={n:'all live device memory',v:0,c:Object.create(null)};
  for(var i=0;i<snap.length;i++){var fr=D.sites[snap[i][0]]||['?'],node=root;node.v+=snap[i][1];
    for(var j=0;j<fr.length;j++){var k=fr[j];node=node.c[k]||(node.c[k]={n:k,v:0,c:Object.create(null)});node.v+=snap[i][1];}}
  fl.innerHTML=''; var depth=0;
  function draw(node,x,w,d){ if(w<0.05) return; depth=Math.max(depth,d);
    var e=document.createElement('div'); e.className='b'+(/\(.*\.py:/.test(node.n)?' py':'');
    e.style.left=x+'%'; e.style.width=w+'%'; e.style.top=(d*18)+'px';
    e.textContent=node.n; e.title=node.n+'\n'+fmt(node.v); fl.appendChild(e);
    var kids=Object.keys(node.c).map(function(k){return node.c[k];}).sort(function(a,b){return b.v-a.v;});
    var cx=x; for(var i=0;i<kids.length;i++){var cw=root.v?w*kids[i].v/node.v:0; draw(kids[i],cx,cw,d+1); cx+=cw;} }
  if(root.v) draw(root,0,100,0);
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


def page(t, buckets=BUCKETS, top=TOP_SITES, title="spyreshim: device memory over time"):
    d = build(t, buckets, top)
    cols = d["columns"]
    ymax = max([sum(c) for _t, c in cols] + [d["peak"], 1])
    x0, pw, ph = PAD_L, W - PAD_L - 10, H - PAD_B - 10
    bw = pw / float(buckets)

    def y(v):
        return 10 + ph - ph * v / float(ymax)

    out = []
    w = out.append
    w("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n")
    w("<title>%s</title>\n<style>%s</style>\n</head>\n<body>\n" % (_esc(title), _CSS))
    w("<h1>%s</h1>\n" % _esc(title))
    npress = sum(1 for m in d["marks"] if m[1] == tr.PRESSURE_BEGIN)
    ngc = sum(1 for m in d["marks"] if m[1] == tr.GC)
    noom = sum(1 for m in d["marks"] if m[1] == tr.OOM)
    w("<p class=\"meta\" id=\"summary\">%s: pid %s, %d events over %.3f s; peak %s (%d bytes) at %.6f s; "
      "%d pressure events, %d collections, %d out-of-memory%s.</p>\n" % (
          _esc(t.path), _esc(t.pid), d["n"], d["tmax"] / 1e9, _esc(rpt.format_size(d["peak"])),
          d["peak"], d["peak_time"] / 1e9, npress, ngc, noom,
          "; the trace is truncated (the process did not exit)" if t.truncated else ""))
    w("<p class=\"meta\">Each of the %d columns shows the moment its interval was highest. "
      "Click the chart to see what was live then.</p>\n" % buckets)
    w("<svg id=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %d %d\" role=\"img\" "
      "aria-label=\"live device memory over time\">\n" % (W, H))
    # y axis
    for j in range(5):
        v = ymax * j / 4.0
        w("<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>"
          "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n" % (
              x0, x0 + pw, y(v), y(v), x0 - 4, y(v) + 4, _esc(rpt.format_size(int(v)))))
    w("<text x=\"%d\" y=\"%d\" font-size=\"11\">0 s</text><text x=\"%d\" y=\"%d\" font-size=\"11\" "
      "text-anchor=\"end\">%.3f s</text>\n" % (x0, H - 6, x0 + pw, H - 6, d["tmax"] / 1e9))
    # stacked areas: one polygon per layer, bottom layer first ("other" on top)
    nl = len(d["top_sites"]) + 1
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
        name = "other sites" if layer == nl - 1 else callorder.label(t, d["top_sites"][layer])
        w("<polygon class=\"layer\" data-site=\"%s\" fill=\"%s\" points=\"%s\"><title>%s</title></polygon>\n" % (
            _esc(d["top_sites"][layer] if layer < nl - 1 else "other"), colour,
            " ".join(top_pts + list(reversed(bot_pts))), _esc(name)))
    # markers
    for tm, k, sz in d["marks"]:
        x = x0 + pw * tm / float(d["span"])
        w("<line class=\"mark %s\" x1=\"%.1f\" x2=\"%.1f\" y1=\"10\" y2=\"%d\" stroke=\"%s\" "
          "stroke-width=\"1\" stroke-opacity=\"0.6\"><title>%s at %.6f s (%s)</title></line>\n" % (
              {tr.PRESSURE_BEGIN: "pressure", tr.GC: "gc", tr.OOM: "oom"}[k], x, x, 10 + ph,
              MARK_COLOURS[k], MARK_NAMES[k], tm / 1e9,
              _esc(rpt.format_size(sz) + (" requested" if k != tr.GC else " freed"))))
    # the exact peak
    px = x0 + pw * d["peak_time"] / float(d["span"])
    w("<circle id=\"peak\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"none\" stroke=\"#000\"><title>peak: %s "
      "(%d bytes) at %.6f s</title></circle>\n" % (px, y(d["peak"]), _esc(rpt.format_size(d["peak"])),
                                                  d["peak"], d["peak_time"] / 1e9))
    w("<line id=\"cursor\" x1=\"0\" x2=\"0\" y1=\"10\" y2=\"%d\" stroke=\"#000\" stroke-dasharray=\"3,2\" "
      "style=\"display:none\"/>\n</svg>\n" % (10 + ph))
    w("<div id=\"legend\">")
    for j, s in enumerate(d["top_sites"]):
        w("<span><i style=\"background:%s\"></i>%s</span>" % (COLOURS[j % len(COLOURS)],
                                                             _esc(callorder.label(t, s))))
    w("<span><i style=\"background:%s\"></i>other sites</span>" % OTHER)
    for k in (tr.PRESSURE_BEGIN, tr.GC, tr.OOM):
        w("<span><i style=\"background:%s;width:2px\"></i>%s</span>" % (MARK_COLOURS[k], MARK_NAMES[k]))
    w("</div>\n<div id=\"at\"></div>\n<div id=\"flame\"></div>\n")
    used = set()
    for s in d["snaps"]:
        for site, _v in s:
            used.add(site)
    data = {"x0": x0, "bw": bw, "times": [c[0] for c in cols], "snaps": d["snaps"],
            "peak_bucket": (d["peak_time"] * buckets // d["span"]) if d["peak_index"] >= 0 else 0,
            "sites": {str(s): _site_frames(t, s) for s in used}}
    # json.dumps, then every "<" escaped: the data cannot end the script element.
    w("<script type=\"application/json\" id=\"data\">%s</script>\n" %
      json.dumps(data, separators=(",", ":")).replace("<", "\\u003c"))
    w("<script>%s</script>\n</body>\n</html>\n" % _JS)
    return "".join(out)
