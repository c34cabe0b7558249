"""`spyreshim report --html OUT.html` over several ranks: one self-contained
page (no script, no network), the cross-rank summary (ranks.text: the
first out-of-memory rank's stacks first, then the table) and every
rank's device memory on one time axis, the launch's wall clock: a lane per
rank with its bytes in use (solid) and reserved (dashed) per device, its
capacity (a line), collections (grey ticks) and out-of-memory failures
(red). The curves are chrometrace.walk's samples, so the page and the
Trace Event Format export show the same figures."""

from ..exports import chrometrace
from . import ranks as rk
from ..reading import report as rpt
from ..reading import units

WIDTH, LANE, PAD, LEFT = 1000, 120, 14, 130


def _esc(s):
    return (str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def page(rows, top=0, native_frames="folded"):
    t0 = chrometrace.launch_start(rows)
    lanes = []
    tmax = 1
    for r in rows:
        if not r.trace:
            continue
        series, marks = {}, []
        for w in chrometrace.walk(r, t0):
            if w[0] == "counter":
                series.setdefault(w[1], []).append(w[2:])
                tmax = max(tmax, w[2])
            else:
                marks.append(w[1:3])
                tmax = max(tmax, w[2])
        lanes.append((r, series, marks))
    # Each lane to its own scale, its capacity or its highest curve: a rank
    # of 16 MiB beside one of 80 GiB is read, not a flat line.
    scales = [max([1, r.capacity or 0] + [max(v[1], v[2]) for pts in s.values() for v in pts])
              for r, s, _m in lanes]
    plot = WIDTH - LEFT - PAD
    height = PAD + len(lanes) * (LANE + PAD) + 30

    def x(ns):
        return LEFT + plot * ns / tmax

    def y(i, v):
        return PAD + i * (LANE + PAD) + LANE * (1 - v / scales[i])

    svg = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="11">' % (WIDTH, height)]
    for i, (r, series, marks) in enumerate(lanes):
        top = PAD + i * (LANE + PAD)
        svg.append('<rect x="%d" y="%d" width="%d" height="%d" fill="#f7f7f7"/>' % (
            LEFT, top, plot, LANE))
        svg.append('<text x="4" y="%d">%s</text>' % (top + 14, _esc(r.label())))
        svg.append('<text x="4" y="%d" fill="#555">peak %s</text>' % (
            top + 28, _esc(rpt.format_size(r.peak or 0))))
        if r.capacity:
            svg.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#c00" '
                       'stroke-dasharray="2,3"><title>capacity %s</title></line>' % (
                           LEFT, LEFT + plot, y(i, r.capacity), y(i, r.capacity),
                           _esc(rpt.format_size(r.capacity))))
            svg.append('<text x="4" y="%d" fill="#555">of %s</text>' % (
                top + 42, _esc(rpt.format_size(r.capacity))))
        for dev, pts in sorted(series.items()):
            used = " ".join("%.1f,%.1f" % (x(ns), y(i, u)) for ns, u, _res in pts)
            res = " ".join("%.1f,%.1f" % (x(ns), y(i, v)) for ns, _u, v in pts)
            svg.append('<polyline fill="none" stroke="#36c" points="%s"><title>%s: in use'
                       '</title></polyline>' % (used, _esc(dev)))
            svg.append('<polyline fill="none" stroke="#36c" stroke-dasharray="4,2" '
                       'opacity="0.6" points="%s"><title>%s: reserved</title></polyline>' % (
                           res, _esc(dev)))
        for name, ns in marks:
            color = "#c00" if name == "out of memory" else "#999"
            svg.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="%s"><title>%s at '
                       '%.3f s</title></line>' % (x(ns), x(ns), top + LANE - 8, top + LANE,
                                                  color, _esc(name), ns / 1e9))
    axis = PAD + len(lanes) * (LANE + PAD) + 12
    for sec, label in units.time_ticks(tmax / 1e9):     # round ticks (units.py)
        svg.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (
            x(sec * 1e9), axis, _esc(label)))
    svg.append("</svg>")
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>spyreshim: device "
            "memory per rank</title></head><body style=\"font-family:sans-serif\">"
            "<h1 style=\"font-size:16px\">Device memory per rank, on the launch's clock</h1>"
            "<pre>%s</pre>%s<p style=\"color:#555\">Solid: bytes in use; dashed: reserved; "
            "red dashed: capacity (each lane to its own scale, up to its capacity); ticks: collections (grey), out-of-memory (red). One "
            "sample a millisecond at most, each the largest in-use value of its "
            "millisecond.</p></body></html>\n" % (_esc(rk.text(rows, top, native_frames)),
                                                  "\n".join(svg)))
