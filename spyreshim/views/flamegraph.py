"""The HTML report: one self-contained page with a flame graph of live device
memory by stack, and the groups as a table.

Owns the page only; it reads the merged view built by report.merge. The page
needs no network: CSS, script and SVG are inline, and the SVG is complete
without the script (tooltips are SVG <title>s), which only adds click to
zoom and a details line. Every string that comes from a report goes through
html.escape: function and file names are program-controlled text.
"""

import hashlib
import html

from ..reading import report as rpt

WIDTH = 1200          # SVG user units; the page scales it to the window
ROW = 18              # height of one frame
CHAR = 6.6            # average advance of the 11px monospace font
ROOT_LABEL = "all live device memory"
MIN_WIDTH = 0.1       # boxes narrower than this (SVG units at full width) are left out
THIN = 3.0            # boxes narrower than this get no border
TABLE_ROWS = 100      # stacks listed in the table unless --top says otherwise


def _esc(s):
    return html.escape(str(s), quote=True)


class _Node(object):
    __slots__ = ("label", "tip", "kind", "bytes", "count", "pids", "children", "x0", "depth")

    def __init__(self, label, tip, kind):
        self.label, self.tip, self.kind = label, tip, kind
        self.bytes = self.count = 0
        self.pids = []
        self.children = {}
        self.x0 = 0.0
        self.depth = 0


def _frame_tip(f):
    if f["kind"] == "library":
        return "%d frame%s folded, by library: %s (--native-frames=all shows them)" % (
            f["frames"], "" if f["frames"] == 1 else "s", f["library"])
    if f["kind"] == "python":
        where = "%s:%s" % (f["file"] or "<unknown file>", f["line"] or "?")
        return "%s  %s  (python)" % (f["function"] or "<unknown>", where)
    parts = [f["function"] or "??"]
    if f["file"]:
        parts.append("%s:%s" % (f["file"], f["line"]) if f["line"] else f["file"])
    if f["object"]:
        parts.append("%s+%s" % (f["object"], f["offset"] or "?"))
    return "  ".join(parts) + "  (native)"


def build_tree(merged, show_suppressed=False, native_frames="folded"):
    """Each group's frames reversed (outermost at the root), in true call
    order where the shim spliced Python frames into the native stack (the
    interpreter's own frames folded unless native_frames is "all"), merged
    into a tree weighted by bytes."""
    root = _Node(ROOT_LABEL, ROOT_LABEL, "root")
    for g in merged["groups"]:
        if g["suppressed"] and not show_suppressed:
            continue
        path = [(rpt.frame_key(f), rpt.frame_label(f), _frame_tip(f), f["kind"])
                for f in reversed(rpt.visible_frames(g, native_frames))]
        if not path:
            path = [(("none",), "[no stack recorded]", "[no stack recorded]", "none")]
        nodes = [root]
        for key, label, tip, kind in path:
            parent = nodes[-1]
            child = parent.children.get(key)
            if child is None:
                child = parent.children[key] = _Node(label, tip, kind)
            nodes.append(child)
        for n in nodes:
            n.bytes += g["bytes"]
            n.count += g["count"]
            for p in g.get("pids", []):
                if p not in n.pids:
                    n.pids.append(p)
    return root


def _layout(root, min_fraction=0.0):
    """Pre-order list of nodes with x0 (fraction of the root) and depth;
    children largest first, left to right. Boxes narrower than
    min_fraction of the root (and so all above them) are left out, as
    flamegraph.pl's --minwidth: thousands of sub-pixel boxes make a page
    heavy and show nothing. Returns (nodes, how many were left out)."""
    out = []
    omitted = 0
    stack = [(root, 0.0, 0)]
    total = float(root.bytes) or 1.0
    while stack:
        node, x0, depth = stack.pop()
        node.x0, node.depth = x0, depth
        out.append(node)
        kids = sorted(node.children.values(), key=lambda c: (-c.bytes, c.label))
        x = x0
        placed = []
        for c in kids:
            if c.bytes / total >= min_fraction:
                placed.append((c, x, depth + 1))
            else:
                omitted += _size(c)
            x += c.bytes / total
        stack.extend(reversed(placed))
    return out, omitted


def _size(node):
    n, todo = 0, [node]
    while todo:
        t = todo.pop()
        n += 1
        todo.extend(t.children.values())
    return n


def _colour(node):
    if node.kind == "root":
        return "#b8b8b8"
    if node.kind == "none":
        return "#d0d0d0"
    h = int(hashlib.md5(node.label.encode("utf-8", "replace")).hexdigest()[:6], 16)
    if node.kind == "library":  # folded library frames: grey-blue, no hue of their own
        return "hsl(215,18%%,%d%%)" % (70 + h % 10)
    if node.kind == "python":   # cool: blues and greens
        return "hsl(%d,55%%,%d%%)" % (165 + h % 45, 62 + (h >> 8) % 14)
    return "hsl(%d,80%%,%d%%)" % (h % 45, 58 + (h >> 8) % 14)   # warm: reds to yellows


def _fit(label, width):
    n = int((width - 6) / CHAR)
    if n < 3:
        return ""
    return label if len(label) <= n else label[:n - 1] + "\u2026"


_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:16px 24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px}
.meta{color:#555;margin:0 0 12px}
.empty{font-size:16px;margin:16px 0}
.legend span{display:inline-block;padding:1px 8px;margin-right:8px;border-radius:3px;font-size:12px}
#details{font:12px monospace;min-height:1.5em;margin:6px 0;padding:4px 6px;background:#f4f4f4;border-radius:3px;white-space:pre-wrap}
svg{width:100%;height:auto;display:block;background:#fafafa;border:1px solid #ddd}
svg g.f{cursor:pointer}
svg g.f rect{stroke:#fff;stroke-width:0.6}
svg g.f:hover rect{stroke:#000;stroke-width:1}
svg text{font:11px monospace;fill:#000;pointer-events:none}
table{border-collapse:collapse;margin-top:16px;width:100%}
th,td{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
td.n{text-align:right;white-space:nowrap}
ol.stack{margin:0;padding-left:2.2em;font:12px monospace}
ol.stack li.python{color:#05603a}
button{font:12px system-ui,sans-serif}
"""

# Click a box to zoom to it (its ancestors span the whole width, unrelated
# boxes hide); click the root or "reset zoom" to go back; #zoom=N in the
# address opens zoomed to box N (pre-order index).
_JS = """
(function(){
var W=%(width)d, CH=%(char)s, THIN=%(thin)s;
var svg=document.getElementById('flame');
var boxes=[].slice.call(svg.querySelectorAll('g.f'));
var details=document.getElementById('details');
function fit(label,w){var n=Math.floor((w-6)/CH);if(n<3)return '';
  return label.length<=n?label:label.slice(0,n-1)+'\\u2026';}
function zoom(g){
  var z0=+g.getAttribute('data-x0'), zw=+g.getAttribute('data-w'), zd=+g.getAttribute('data-d');
  boxes.forEach(function(b){
    var x0=+b.getAttribute('data-x0'), w=+b.getAttribute('data-w'), d=+b.getAttribute('data-d');
    var r=b.querySelector('rect'), t=b.querySelector('text'), x, bw;
    var inside = x0>=z0-1e-12 && x0+w<=z0+zw+1e-12;
    if(d>=zd && inside){x=(x0-z0)/zw*W; bw=w/zw*W;}
    else if(d<zd && x0<=z0+1e-12 && x0+w>=z0+zw-1e-12){x=0; bw=W;}
    else {b.style.display='none'; return;}
    b.style.display='';
    r.setAttribute('x',x.toFixed(2)); r.setAttribute('width',Math.max(bw,0.1).toFixed(2));
    r.style.stroke = bw<THIN ? 'none' : '';
    t.setAttribute('x',(x+3).toFixed(2)); t.textContent=fit(b.getAttribute('data-label'),bw);
  });
}
// #zoom=N in the address zooms to box N: links to a view survive reloads.
function go(i){if(boxes[i]){zoom(boxes[i]);
  try{history.replaceState(null,'',i?'#zoom='+i:location.pathname+location.search);}catch(e){}}}
boxes.forEach(function(b,i){
  b.addEventListener('click',function(){go(i);});
  b.addEventListener('mouseenter',function(){details.textContent=b.querySelector('title').textContent;});
});
document.getElementById('reset').addEventListener('click',function(){go(0);});
var m=/^#zoom=(\\d+)$/.exec(location.hash); if(m)go(+m[1]);
})();
"""


def page(merged, title="spyreshim: live device memory", show_suppressed=False, top=0,
         native_frames="folded", note=None, empty=None):
    """The whole page as a string. `note`: one more line under the summary;
    `empty`: what the page says when no stack is shown (the default names
    the reports' moment: no leaks at exit, nothing live otherwise)."""
    root = build_tree(merged, show_suppressed, native_frames)
    nodes, omitted = _layout(root, MIN_WIDTH / WIDTH)
    total = root.bytes
    depth = max(n.depth for n in nodes) + 1
    height = depth * ROW + 2
    reports = merged["reports"]
    pids = [str(p) for p in merged["pids"]]

    out = []
    w = out.append
    w("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n")
    w("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n")
    w("<title>%s</title>\n<style>%s</style>\n</head>\n<body>\n" % (_esc(title), _CSS))
    w("<h1>%s</h1>\n" % _esc(title))
    reasons = sorted(set(rpt.REASONS.get(r["reason"], r["reason"]) for r in reports))
    exes = sorted(set(r["exe"] for r in reports if r["exe"]))
    w("<p class=\"meta\">%s in %s, %s; %s from %s%s%s.</p>\n" % (
        _esc(rpt.format_size(total)),
        _esc(rpt._plural(root.count, "allocation")),
        _esc(" / ".join(reasons)),
        _esc(rpt._plural(len([g for g in merged["groups"]
                               if show_suppressed or not g["suppressed"]]), "stack")),
        _esc(rpt._plural(len(reports), "report")),
        _esc(" (pid%s %s)" % ("" if len(pids) == 1 else "s", ", ".join(pids))) if pids else "",
        _esc("; " + ", ".join(exes)) if exes else ""))
    if omitted:
        w("<p class=\"meta\">%d frame%s narrower than %s px left out of the graph "
          "(the table and the text report have every stack).</p>\n" % (
              omitted, "" if omitted == 1 else "s", MIN_WIDTH))
    notes = sorted(set(r["python_note"] for r in reports if r.get("python_note")))
    if native_frames != "all":
        notes.append("The interpreter's own native frames are folded, and each run of a "
                     "library's frames is one box named after it (spyreshim report "
                     "--native-frames=all shows them).")
    unspliced = len([g for g in merged["groups"] if g.get("order") == "python-first"
                     and (show_suppressed or not g["suppressed"])])
    if unspliced:
        notes.append("%s not spliced (Python frames drawn above the native ones, "
                     "not in call order; the table says why)." % rpt._plural(unspliced, "stack"))
    if note:
        notes.append(note)
    for text in notes:
        w("<p class=\"meta\">%s</p>\n" % _esc(text))
    if merged["suppressed_allocations"] and not show_suppressed:
        w("<p class=\"meta\">Not shown: %s in %s matched by suppressions.</p>\n" % (
            _esc(rpt.format_size(merged["suppressed_bytes"])),
            _esc(rpt._plural(merged["suppressed_allocations"], "allocation"))))
    if not any(show_suppressed or not g["suppressed"] for g in merged["groups"]):
        # An empty page says so in words, not with a bare grey root box.
        if empty is None:
            if all(r["reason"] == "exit" for r in reports):
                empty = "No device memory leaks: nothing allocated was left live at exit."
            else:
                empty = "Nothing was live %s." % " / ".join(reasons)
        w("<p class=\"empty\" id=\"empty\">%s</p>\n</body>\n</html>\n" % _esc(empty))
        return "".join(out)
    w("<p class=\"legend\"><span style=\"background:hsl(195,55%,68%)\">Python frame</span>"
      "<span style=\"background:hsl(20,80%,64%)\">native frame</span>"
      "Outermost frame at the bottom; width is bytes. Hover for sizes, click to zoom. "
      "<button id=\"reset\" type=\"button\">reset zoom</button></p>\n")

    w("<svg id=\"flame\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %d %d\" "
      "role=\"img\" aria-label=\"flame graph of live device memory\">\n" % (WIDTH, height))
    for n in nodes:
        frac = n.bytes / float(total) if total else 1.0
        x = n.x0 * WIDTH
        bw = frac * WIDTH
        y = height - 1 - (n.depth + 1) * ROW
        tip = "%s\n%s, %.1f%% in %s" % (
            n.tip, rpt.format_size(n.bytes), 100.0 * frac,
            rpt._plural(n.count, "allocation"))
        if n.pids and len(reports) > 1:
            tip += "; pid%s %s" % ("" if len(n.pids) == 1 else "s",
                                   ", ".join(str(p) for p in n.pids))
        w("<g class=\"f %s\" data-x0=\"%.9f\" data-w=\"%.9f\" data-d=\"%d\" data-label=\"%s\">"
          "<title>%s</title><rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" rx=\"2\" fill=\"%s\"%s/>"
          "<text x=\"%.2f\" y=\"%d\">%s</text></g>\n" % (
              n.kind, n.x0, frac, n.depth, _esc(n.label), _esc(tip),
              x, y, max(bw, 0.1), ROW - 1, _colour(n),
              # A white border would hide the colour of a box this narrow.
              " style=\"stroke:none\"" if bw < THIN else "",
              x + 3, y + 12, _esc(_fit(n.label, bw))))
    w("</svg>\n<div id=\"details\">Hover over a frame for its size.</div>\n")

    groups = [g for g in merged["groups"] if show_suppressed or not g["suppressed"]]
    limit = top if top and top > 0 else TABLE_ROWS
    shown = groups[:limit]
    w("<h2>Stacks, largest first</h2>\n<table>\n<thead><tr><th>#</th><th>bytes</th>"
      "<th>allocations</th><th>runtime</th>%s<th>stack (innermost first)</th></tr></thead>\n<tbody>\n"
      % ("<th>pids</th>" if len(reports) > 1 else ""))
    for i, g in enumerate(shown):
        w("<tr><td class=\"n\">%d</td><td class=\"n\">%s</td><td class=\"n\">%d</td><td>%s%s</td>" % (
            i + 1, _esc(rpt.format_size(g["bytes"])), g["count"], _esc(g["runtime"]),
            " (suppressed)" if g["suppressed"] else ""))
        if len(reports) > 1:
            w("<td>%s</td>" % _esc(", ".join(str(p) for p in g.get("pids", []))))
        w("<td><ol class=\"stack\" start=\"0\">")
        for f in rpt.visible_frames(g, native_frames):
            w("<li class=\"%s\">%s</li>" % (
                f["kind"], _esc(rpt.frame_text(f, address=len(g.get("pids", ())) <= 1))))
        if not g["frames"]:
            w("<li>[no stack recorded]</li>")
        w("</ol>")
        if g.get("order") == "python-first":
            w("<p class=\"meta\">unspliced, Python frames first: %s</p>" % _esc(g.get("unspliced") or "?"))
        w("</td></tr>\n")
    w("</tbody>\n</table>\n")
    if len(shown) < len(groups):
        rest = len(groups) - len(shown)
        w("<p class=\"meta\">%d more stack%s not shown (--top %d; the text report "
          "lists all).</p>\n" % (rest, "" if rest == 1 else "s", limit))
    w("<script>%s</script>\n</body>\n</html>\n" % (_JS % {"width": WIDTH, "char": repr(CHAR), "thin": repr(THIN)}))
    return "".join(out)
