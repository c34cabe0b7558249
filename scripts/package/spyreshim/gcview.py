"""`spyreshim report --view gc TRACE`: what each collection freed, and where
those blocks were allocated.

A pressure event's collection (trace kind 6, written when it ends, its size
the bytes the shim saw freed meanwhile) is preceded, in sequence order, by
the frees it caused: the finalizers of the cycles it broke free device
blocks, each free carrying its allocation's site. A collection's window
runs from its pressure event's start (kind 4), or the previous collection
of the same event, to its marker; every free in it is attributed to its
site (Python and native frames spliced, callorder.py). "Attributed" is the
share of the marker's bytes the window's frees account for (frees of other
threads that fall in the window count too: the marker counts them as well).

Over the run, "the cycles that held device memory": the sites whose blocks
collections freed, with bytes and counts, largest first. Owns this view
only (text); reads trace.py's arrays.
"""

from . import callorder
from . import report as rpt
from . import trace as tr


def collections(t):
    """[{index, time_ns, duration_ns, freed, attributed, count, sites:
    {(dev, site): [bytes, count]}}] in order."""
    out = []
    kind, size, site, dev, addr, time = t.kind, t.size, t.site, t.dev, t.addr, t.time
    window = None
    for i in range(len(kind)):
        k = kind[i]
        if k == tr.PRESSURE_BEGIN:
            window = {}
        elif k == tr.PRESSURE_END:
            window = None
        elif k == tr.FREE and window is not None:
            s = window.setdefault((dev[i], site[i]), [0, 0])
            s[0] += size[i]
            s[1] += 1
        elif k == tr.GC:
            sites = window or {}
            got = sum(v[0] for v in sites.values())
            out.append({"index": i, "time_ns": time[i], "duration_ns": addr[i],
                        "freed": size[i], "attributed": got,
                        "count": sum(v[1] for v in sites.values()), "sites": sites})
            window = {} if window is not None else None
    return out


def cycles(cols):
    """{(dev, site): [bytes, count, collections]} over every collection."""
    tot = {}
    for c in cols:
        for key, (b, n) in c["sites"].items():
            s = tot.setdefault(key, [0, 0, 0])
            s[0] += b
            s[1] += n
            s[2] += 1
    return tot


def _pct(a, b):
    return 100.0 if b == 0 else 100.0 * min(a, b) / b


def text(t, top=10):
    cols = collections(t)
    w = ["Collections in %s: %d" % (t.path, len(cols))]
    freed = sum(c["freed"] for c in cols)
    got = sum(min(c["attributed"], c["freed"]) for c in cols)
    w.append("Freed by collections: %s, attributed to allocation sites: %s (%.1f%%)" % (
        rpt.format_size(freed), rpt.format_size(got), _pct(got, freed)))
    for j, c in enumerate(cols):
        w.append("")
        w.append("#%d at %.3f s (%.1f ms): freed %s in %d block(s), %.1f%% attributed, "
                 "%d site(s)" % (j + 1, c["time_ns"] / 1e9, c["duration_ns"] / 1e6,
                                 rpt.format_size(c["freed"]), c["count"],
                                 _pct(c["attributed"], c["freed"]), len(c["sites"])))
        items = sorted(c["sites"].items(), key=lambda kv: -kv[1][0])
        for (d, s), (b, n) in items[:top]:
            w.append("    %10s in %5d block(s)  %s" % (rpt.format_size(b), n,
                                                       callorder.label(t, s)))
        if len(items) > top:
            rest = items[top:]
            w.append("    %10s in %5d block(s)  (%d more sites)" % (
                rpt.format_size(sum(v[0] for _k, v in rest)), sum(v[1] for _k, v in rest),
                len(rest)))
    tot = cycles(cols)
    if tot:
        w.append("")
        w.append("The cycles that held device memory (sites whose blocks collections freed):")
        for (d, s), (b, n, nc) in sorted(tot.items(), key=lambda kv: -kv[1][0])[:top]:
            w.append("    %10s in %6d block(s) over %d collection(s)  %s" % (
                rpt.format_size(b), n, nc, callorder.label(t, s)))
            for f in callorder.visible(t, s)[:6]:
                w.append("        %s" % rpt.frame_label(f))
    return "\n".join(w) + "\n"
