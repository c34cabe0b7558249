"""Two views of a trace (trace.py): what was live at the peak (text, and
HTML through the leak reports' flame graph, flamegraph.page), and summary
statistics in the shape of `memray stats`. Owns these views only; stacks
are in call order (callorder.py)."""

from array import array

from . import callorder
from . import flamegraph
from . import report as rpt
from . import trace as tr


def peak_reports(t):
    """[(title, report)]: all devices together, then each device."""
    p = tr.peaks(t)
    out = []
    out.append(("peak of all devices: %s after event %d" % (rpt.format_size(p.bytes), p.index + 1),
                callorder.live_report(t, tr.live_at(t, p.index), "peak")))
    if len(p.per_device) > 1:
        for d, (b, i) in sorted(p.per_device.items()):
            out.append(("peak of %s: %s after event %d" % (t.device_name(d), rpt.format_size(b), i + 1),
                        callorder.live_report(t, tr.live_at(t, i, device=d), "peak")))
    return p, out


def peak_text(t, top=0):
    p, reports = peak_reports(t)
    lines = []
    for title, r in reports:
        lines.append("== %s ==" % title)
        lines.append(rpt.text(rpt.merge([r]), top=top).rstrip("\n"))
        lines.append("")
    return "\n".join(lines) + "\n"


def peak_html(t, top=0):
    """The flame graph page of the overall peak (per-device peaks follow
    as their own pages only in text; one device is the usual case)."""
    p, reports = peak_reports(t)
    title, r = reports[0]
    return flamegraph.page(rpt.merge([r]), title="spyreshim: device memory at the " + title, top=top)


def _hist(sizes):
    """Power-of-two buckets: (low, high, count)."""
    counts = {}
    for s in sizes:
        b = s.bit_length()
        counts[b] = counts.get(b, 0) + 1
    return [((1 << (b - 1)) if b else 0, (1 << b) - 1, counts[b]) for b in sorted(counts)]


def stats_text(t, top=5):
    kind, size, site, time = t.kind, t.size, t.site, t.time
    # A packed array (8 bytes a size), not lists of indices and sizes (80
    # bytes an allocation: 788 MB of peak RSS on 10M events).
    asizes = array("Q", (size[i] for i in range(len(kind)) if kind[i] == tr.ALLOC))
    total = sum(asizes)
    p = tr.peaks(t)
    by_count, by_bytes = {}, {}
    live_site, site_peak = {}, {}
    for i in range(len(kind)):
        k = kind[i]
        if k == tr.ALLOC:
            s = site[i]
            by_count[s] = by_count.get(s, 0) + 1
            by_bytes[s] = by_bytes.get(s, 0) + size[i]
            v = live_site.get(s, 0) + size[i]
            live_site[s] = v
            if v > site_peak.get(s, 0):
                site_peak[s] = v
        elif k == tr.FREE:
            live_site[site[i]] = live_site.get(site[i], 0) - size[i]
    w = []
    w.append("Trace: %s (pid %s)%s" % (t.path, t.pid, ", truncated (the process did not exit)"
                                       if t.truncated else ""))
    w.append("")
    w.append("Total allocations:\n\t%d" % len(asizes))
    w.append("Total frees:\n\t%d" % sum(1 for k in kind if k == tr.FREE))
    w.append("Total memory allocated:\n\t%s" % rpt.format_size(total))
    w.append("Peak memory usage (all devices):\n\t%s (%d bytes)" % (rpt.format_size(p.bytes), p.bytes))
    for d, (b, _i) in sorted(p.per_device.items()):
        w.append("\tpeak of %s: %s (%d bytes)" % (t.device_name(d), rpt.format_size(b), b))
    if t.time:
        w.append("Duration:\n\t%.3f s" % (max(t.time) / 1e9))
    w.append("Histogram of allocation size:")
    if asizes:
        w.append("\tmin: %s  max: %s  mean: %s" % (rpt.format_size(min(asizes)),
                                                    rpt.format_size(max(asizes)),
                                                    rpt.format_size(total // len(asizes))))
        h = _hist(asizes)
        most = max(c for _l, _h, c in h)
        for lo, hi, c in h:
            bar = "*" * max(1, int(40 * c / most))
            w.append("\t%10s - %-10s | %-40s %d" % (rpt.format_size(lo), rpt.format_size(hi), bar, c))
    w.append("Top %d largest allocating locations (by peak live bytes):" % top)
    for s, v in sorted(site_peak.items(), key=lambda kv: -kv[1])[:top]:
        w.append("\t- %s: %s" % (callorder.label(t, s), rpt.format_size(v)))
    w.append("Top %d largest allocating locations (by number of allocations):" % top)
    for s, v in sorted(by_count.items(), key=lambda kv: -kv[1])[:top]:
        w.append("\t- %s: %d (%s in all)" % (callorder.label(t, s), v, rpt.format_size(by_bytes[s])))
    marks = [(time[i], kind[i], size[i], t.addr[i]) for i in range(len(kind)) if kind[i] in
             (tr.PRESSURE_BEGIN, tr.GC, tr.OOM)]
    npress = sum(1 for m in marks if m[1] == tr.PRESSURE_BEGIN)
    ngc = sum(1 for m in marks if m[1] == tr.GC)
    noom = sum(1 for m in marks if m[1] == tr.OOM)
    w.append("Pressure events: %d, collections: %d (%s freed), out-of-memory: %d" % (
        npress, ngc, rpt.format_size(sum(m[2] for m in marks if m[1] == tr.GC)), noom))
    if marks and t.time:
        span = max(t.time) or 1
        n = 10
        buckets = [[0, 0, 0, 0] for _ in range(n)]
        for tm, k, sz, _a in marks:
            b = buckets[min(n - 1, tm * n // (span + 1))]
            if k == tr.PRESSURE_BEGIN:
                b[0] += 1
            elif k == tr.GC:
                b[1] += 1
                b[2] += sz
            else:
                b[3] += 1
        w.append("Over time (%d intervals of %.3f s): pressure events, collections (freed), OOMs" % (
            n, span / n / 1e9))
        for j, (pe, gc, fr, oo) in enumerate(buckets):
            w.append("\t%8.3f s  %6d  %6d (%s)  %d" % (j * span / n / 1e9, pe, gc,
                                                     rpt.format_size(fr), oo))
    return "\n".join(w) + "\n"
