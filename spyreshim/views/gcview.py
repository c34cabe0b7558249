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
only (text); streams trace.py's batches (one pass; memory is a pressure
event's window and the sites).
"""

import itertools
import tempfile

from ..reading import callorder
from ..reading import report as rpt
from ..reading import trace as tr


def collections(t):
    """[{index, time_ns, duration_ns, freed, attributed, count, sites:
    {(dev, site): [bytes, count]}}] in order."""
    return list(each(t))


_PRESSURE = bytes(1 if k in (tr.PRESSURE_BEGIN, tr.PRESSURE_END) else 0 for k in range(256))


def each(t):
    """The collections one by one, as collections() lists them, streaming
    (a pass of trace.batches(); memory is one pressure event's window)."""
    window = None
    for b in t.batches():
        kind = b.kind
        kb = kind.tobytes()
        if window is None and not kb.translate(_PRESSURE).count(1):
            # No window open and none opens here: only collections matter.
            if kb.count(tr.GC):
                for i in itertools.compress(range(len(kind)), kb.translate(_IS_GC)):
                    yield _one(b, i, None)
            continue
        size, site, dev = b.size, b.site, b.dev
        for i, k in enumerate(kind):
            if k == tr.PRESSURE_BEGIN:
                window = {}
            elif k == tr.PRESSURE_END:
                window = None
            elif k == tr.FREE and window is not None:
                s = window.setdefault((dev[i], site[i]), [0, 0])
                s[0] += size[i]
                s[1] += 1
            elif k == tr.GC:
                yield _one(b, i, window)
                window = {} if window is not None else None


_IS_GC = bytes(1 if k == tr.GC else 0 for k in range(256))


def _one(b, i, window):
    sites = window or {}
    return {"index": b.start + i, "time_ns": b.time[i], "duration_ns": b.addr[i],
            "freed": b.size[i], "attributed": sum(v[0] for v in sites.values()),
            "count": sum(v[1] for v in sites.values()), "sites": sites}


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
    out = []
    write(t, out.append, top)
    return "".join(out)


def write(t, w, top=10, native_frames="folded"):
    """The view, line by line to w, in one pass: each collection's lines go
    to a spool file while the totals that head the view are summed (memory
    is the sites, not the collections)."""
    n = freed = got = 0
    tot = {}
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="surrogateescape") as spool:
        for c in each(t):
            n += 1
            freed += c["freed"]
            got += min(c["attributed"], c["freed"])
            for key, (bb, k) in c["sites"].items():
                s = tot.setdefault(key, [0, 0, 0])
                s[0] += bb
                s[1] += k
                s[2] += 1
            spool.write("\n")
            spool.write("#%d at %.3f s (%.1f ms): freed %s in %d block(s), %.1f%% attributed, "
                        "%d site(s)\n" % (n, c["time_ns"] / 1e9, c["duration_ns"] / 1e6,
                                          rpt.format_size(c["freed"]), c["count"],
                                          _pct(c["attributed"], c["freed"]), len(c["sites"])))
            items = sorted(c["sites"].items(), key=lambda kv: -kv[1][0])
            for (d, s), (b, k) in items[:top]:
                spool.write("    %24s in %5d block(s)  %s\n" % (rpt.format_size(b), k,
                                                                callorder.label(t, s)))
            if len(items) > top:
                rest = items[top:]
                spool.write("    %24s in %5d block(s)  (%d more sites)\n" % (
                    rpt.format_size(sum(v[0] for _k, v in rest)), sum(v[1] for _k, v in rest),
                    len(rest)))
        w("Collections in %s: %d\n" % (t.path, n))
        w("Freed by collections: %s, attributed to allocation sites: %s (%.1f%%)\n" % (
            rpt.format_size(freed), rpt.format_size(got), _pct(got, freed)))
        spool.seek(0)
        while True:
            part = spool.read(1 << 16)
            if not part:
                break
            w(part)
    if tot:
        w("\n")
        w("The cycles that held device memory (sites whose blocks collections freed):\n")
        for (d, s), (b, k, nc) in sorted(tot.items(), key=lambda kv: -kv[1][0])[:top]:
            w("    %24s in %6d block(s) over %d collection(s)  %s\n" % (
                rpt.format_size(b), k, nc, callorder.label(t, s)))
            for f in callorder.shown(t, s, native_frames)[:6]:
                w("        %s\n" % rpt.frame_label(f))
