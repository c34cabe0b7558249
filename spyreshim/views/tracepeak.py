"""Two views of a trace (trace.py): what was live at the peak (text, and
HTML through the leak reports' flame graph, flamegraph.page), and summary
statistics in the shape of `memray stats`. Owns these views only; stacks
are in call order (callorder.py); each peak is broken down by category
(categories.py). Both stream (trace.batches()): the peak takes two passes
(where the peaks are, then the live sets there), the statistics two (the
second: the live set at the peak, for its categories; three when the
trace has markers: their intervals need the trace's duration), and one
more for the categories' lifetimes when stacks hold a module's forward or
the autograd engine (categories.Lifetimes); memory is the live set, the
sites and a bit an event."""

import collections
import itertools

from ..reading import callorder
from ..reading import categories as cats
from . import flamegraph
from ..reading import report as rpt
from ..reading import trace as tr


def peak_reports(t, classifier=None):
    """[(title, report)]: all devices together, then each device; with a
    categories.Classifier, [(title, report, {category: bytes})]."""
    p = tr.peaks(t)
    wants = [(p.index, None)]
    per = sorted(p.per_device.items()) if len(p.per_device) > 1 else []
    wants += [(i, d) for d, (_b, i) in per]
    lives = tr.live_sets(t, wants)
    out = []
    # Titles give the moment's time, not its event number.
    tm = tr.times_at(t, [i for i, _d in wants])
    out.append(("peak of all devices: %s at %s" % (rpt.format_size(p.bytes),
                                                    tr.seconds(tm.get(p.index, 0))),
                callorder.live_report(t, lives[0], "peak")))
    for (d, (b, i)), live in zip(per, lives[1:]):
        out.append(("peak of %s: %s at %s" % (t.device_name(d), rpt.format_size(b),
                                              tr.seconds(tm[i])),
                    callorder.live_report(t, live, "peak")))
    if classifier is not None:
        out = [o + (cats.breakdown(classifier, live, served=(j == 0)),)
               for j, (o, live) in enumerate(zip(out, lives))]
    return p, out


def peak_text(t, top=0, rules=(), native_frames="folded"):
    """Each peak's live blocks by stack, after its breakdown by category
    (categories.py; `rules`: the user's, before the built-in ones)."""
    p, reports = peak_reports(t, cats.Classifier(t, rules))
    lines = []
    for title, r, by in reports:
        lines.append("== %s ==" % title)
        if by:
            lines.append("By category:")
            lines.extend(cats.breakdown_lines(by))
            lines.append("")
        lines.append(rpt.text(rpt.merge([r]), top=top, native_frames=native_frames).rstrip("\n"))
        lines.append("")
    return "\n".join(lines) + "\n"


def peak_html(t, top=0, rules=(), native_frames="folded"):
    """The flame graph page of the overall peak (per-device peaks follow
    as their own pages only in text; one device is the usual case); its
    title ends with the peak's categories."""
    p, reports = peak_reports(t, cats.Classifier(t, rules))
    title, r, by = reports[0]
    if by:
        title += " (%s)" % ", ".join("%s %s" % (c or "unknown", rpt.format_size(by[c]))
                                     for c in cats.ORDER if by.get(c))
    return flamegraph.page(rpt.merge([r]), title="spyreshim: device memory at the " + title, top=top,
                           native_frames=native_frames)


_MARKS = (tr.PRESSURE_BEGIN, tr.GC, tr.OOM)
_IS_MARK = bytes(1 if k in _MARKS else 0 for k in range(256))
_IS_ALLOC = bytes(1 if k == tr.ALLOC else 0 for k in range(256))
if tr.np is not None:
    _IS_MARK_NP = tr.np.frombuffer(_IS_MARK, dtype=tr.np.uint8).astype(bool)
    _POW2 = tr.np.array([1 << k for k in range(64)], dtype=tr.np.uint64)


class _Stats(object):
    """What the statistics need, gathered batch by batch."""

    def __init__(self):
        self.nalloc = self.nfree = self.total = 0
        self.smin = self.smax = None
        self.hist = collections.Counter()       # bit length of a size -> count
        self.by_count = collections.Counter()   # site -> allocations
        self.by_bytes = {}                      # site -> bytes allocated
        self.site_live, self.site_peak = {}, {}
        self.tmax = 0
        self.nevents = 0
        self.marks = [0, 0, 0, 0]               # pressure, collections, freed, OOMs


def _gather(t):
    st = _Stats()
    st.peaks = tr.PeakTracker()
    by_bytes, site_live, site_peak = st.by_bytes, st.site_live, st.site_peak
    for b in t.batches():
        st.peaks.feed(b, tr.deltas(b))
        kind, size, site = b.kind, b.size, b.site
        kb = kind.tobytes()
        st.nfree += kb.count(tr.FREE)
        am = kb.translate(_IS_ALLOC)
        na = am.count(1)
        st.tmax = max(st.tmax, max(b.time))
        st.nevents += len(b)
        if na and tr.np is not None:
            _alloc_stats_np(tr.np, st, b, na)
        elif na:
            asz = list(itertools.compress(size, am))
            st.nalloc += na
            st.total += sum(asz)
            lo, hi = min(asz), max(asz)
            st.smin = lo if st.smin is None else min(st.smin, lo)
            st.smax = hi if st.smax is None else max(st.smax, hi)
            st.hist.update(map(int.bit_length, asz))
            st.by_count.update(itertools.compress(site, am))
        # Per-site bytes allocated and live (its peak): the one loop.
        if tr.np is not None:
            _site_peaks_np(tr.np, b, by_bytes, site_live, site_peak)
            kind = ()
        for k, s, sz in zip(kind, site, size):
            if k == tr.ALLOC:
                by_bytes[s] = by_bytes.get(s, 0) + sz
                v = site_live.get(s, 0) + sz
                site_live[s] = v
                if v > site_peak.get(s, 0):
                    site_peak[s] = v
            elif k == tr.FREE:
                site_live[s] = site_live.get(s, 0) - sz
        if kb.translate(_IS_MARK).count(1):
            for k, sz in _marks_of(b, (b.kind, size)):
                if k in _MARKS:
                    if k == tr.PRESSURE_BEGIN:
                        st.marks[0] += 1
                    elif k == tr.GC:
                        st.marks[1] += 1
                        st.marks[2] += sz
                    else:
                        st.marks[3] += 1
    return st


def _marks_of(b, cols):
    """zip(*cols), the markers' rows only on the numpy path (the loops
    that read them skip the other kinds)."""
    if tr.np is None:
        return zip(*cols)
    at = tr.np.flatnonzero(_IS_MARK_NP[b.nd()[3]])
    return zip(*(tr.np.frombuffer(c, dtype=d)[at].tolist() for c, d in zip(
        cols, [{"B": tr.np.uint8, "Q": tr.np.uint64}[c.typecode] for c in cols])))


def _alloc_stats_np(np, st, b, na):
    """The allocations' count, total, extremes, size histogram (by bit
    length) and count by site, with numpy; a site new to by_count goes in
    at its first allocation, as Counter.update would put it."""
    _seq, _addr, size, kind, _dev, _tm, site = b.nd()
    am = kind == tr.ALLOC
    asz = size[am]
    lo, hi = int(asz.min()), int(asz.max())
    st.nalloc += na
    st.total += int(asz.sum()) if hi * na < 1 << 64 else sum(asz.tolist())
    st.smin = lo if st.smin is None else min(st.smin, lo)
    st.smax = hi if st.smax is None else max(st.smax, hi)
    bits = np.searchsorted(_POW2, asz, "right")     # int.bit_length of each size
    counts = np.bincount(bits, minlength=65)
    st.hist.update({int(k): int(counts[k]) for k in np.flatnonzero(counts)})
    asite = site[am]
    us, first, cnt = np.unique(asite, return_index=True, return_counts=True)
    by_count = st.by_count
    for i in np.argsort(first, kind="stable").tolist():
        s = int(us[i])
        by_count[s] = by_count.get(s, 0) + int(cnt[i])


def _site_peaks_np(np, b, by_bytes, site_live, site_peak):
    """The per-event loop of _gather with numpy: per site (one stable sort
    by site), the running sum of its allocations less its frees from its
    live bytes so far, its highest after an allocation, and the bytes
    allocated; a site new to site_peak goes in where the loop would have
    put it (its first allocation that leaves it above 0), since the
    report lists equal peaks in that order."""
    _seq, _addr, size, kind, _dev, _tm, site = b.nd()
    af = np.flatnonzero((kind == tr.ALLOC) | (kind == tr.FREE))
    if not len(af):
        return
    o = np.argsort(site[af], kind="stable")
    at = af[o]
    ss, isa = site[at], kind[at] == tr.ALLOC
    sz = size[at].astype(np.int64)
    dd = np.where(isa, sz, -sz)
    m = len(at)
    first = np.ones(m, dtype=bool)
    first[1:] = ss[1:] != ss[:-1]
    starts = np.flatnonzero(first)
    lens = np.diff(np.append(starts, m))
    us = ss[starts].tolist()
    init = np.array([site_live.get(s, 0) for s in us], dtype=np.int64)
    cs = np.cumsum(dd)
    base = np.concatenate(([0], cs[starts[1:] - 1])) if len(starts) > 1 else np.zeros(1, np.int64)
    v = cs - np.repeat(base - init, lens)         # each site's live bytes after each event
    low = np.iinfo(np.int64).min
    tops = np.maximum.reduceat(np.where(isa, v, low), starts).tolist()
    allocated = np.add.reduceat(np.where(isa, sz, 0), starts).tolist()
    anyalloc = np.logical_or.reduceat(isa, starts).tolist()
    above = np.minimum.reduceat(np.where(isa & (v > 0), at, len(kind)), starts).tolist()
    final = v[np.append(starts[1:], m) - 1].tolist()
    new = []
    for g, s in enumerate(us):
        site_live[s] = final[g]
        if anyalloc[g]:
            by_bytes[s] = by_bytes.get(s, 0) + allocated[g]
            if tops[g] > site_peak.get(s, 0):
                if s in site_peak:
                    site_peak[s] = tops[g]
                else:
                    new.append((above[g], s, tops[g]))
    for _i, s, top in sorted(new):
        site_peak[s] = top


def _mark_intervals(t, span, n):
    """Second pass, for traces with markers: per interval of span/n, the
    pressure events, collections (bytes freed) and OOMs."""
    buckets = [[0, 0, 0, 0] for _ in range(n)]
    for b in t.batches():
        kind = b.kind
        if not kind.tobytes().translate(_IS_MARK).count(1):
            continue
        for k, tm, sz in _marks_of(b, (kind, b.time, b.size)):
            if k in _MARKS:
                bk = buckets[min(n - 1, tm * n // (span + 1))]
                if k == tr.PRESSURE_BEGIN:
                    bk[0] += 1
                elif k == tr.GC:
                    bk[1] += 1
                    bk[2] += sz
                else:
                    bk[3] += 1
    return buckets


def stats_text(t, top=5, rules=()):
    st = _gather(t)
    p = st.peaks.p
    w = []
    w.append("Trace: %s (pid %s)%s" % (t.path, t.pid, ", truncated (the process did not exit)"
                                       if t.truncated else ""))
    w.append("")
    w.append("Total allocations:\n\t%d" % st.nalloc)
    w.append("Total frees:\n\t%d" % st.nfree)
    w.append("Total memory allocated:\n\t%s" % rpt.format_size(st.total))
    w.append("Peak memory usage (all devices):\n\t%s" % rpt.format_size(p.bytes))
    for d, (b, _i) in sorted(p.per_device.items()):
        w.append("\tpeak of %s: %s" % (t.device_name(d), rpt.format_size(b)))
    if p.index >= 0:
        # What the overall peak held, by category (one more pass: the live
        # set at the peak).
        by = cats.breakdown(cats.Classifier(t, rules), tr.live_sets(t, [(p.index, None)])[0])
        w.append("Peak memory usage by category (all devices):")
        w.extend(cats.breakdown_lines(by))
    if st.nevents:
        w.append("Duration:\n\t%.3f s" % (st.tmax / 1e9))
    w.append("Histogram of allocation size:")
    if st.nalloc:
        w.append("\tmin: %s  max: %s  mean: %s" % (rpt.format_size(st.smin),
                                                    rpt.format_size(st.smax),
                                                    rpt.format_size(st.total // st.nalloc)))
        h = [((1 << (b - 1)) if b else 0, (1 << b) - 1, st.hist[b]) for b in sorted(st.hist)]
        most = max(c for _l, _h, c in h)
        for lo, hi, c in h:
            bar = "*" * max(1, int(40 * c / most))
            w.append("\t%24s - %-24s | %-40s %d" % (rpt.format_size(lo), rpt.format_size(hi), bar, c))
    by_peak = sorted(st.site_peak.items(), key=lambda kv: -kv[1])[:top]
    by_count = sorted(st.by_count.items(), key=lambda kv: -kv[1])[:top]
    names = callorder.labels(t, [s for s, _v in by_peak + by_count])
    w.append("Top %d largest allocating locations (by peak live bytes):" % top)
    for s, v in by_peak:
        w.append("\t- %s: %s" % (names[s], rpt.format_size(v)))
    w.append("Top %d largest allocating locations (by number of allocations):" % top)
    for s, v in by_count:
        w.append("\t- %s: %d (%s in all)" % (names[s], v, rpt.format_size(st.by_bytes[s])))
    npress, ngc, gcfreed, noom = st.marks
    w.append("Pressure events: %d, collections: %d (%s freed), out-of-memory: %d" % (
        npress, ngc, rpt.format_size(gcfreed), noom))
    if (npress or ngc or noom) and st.nevents:
        span = st.tmax or 1
        n = 10
        buckets = _mark_intervals(t, span, n)
        w.append("Over time (%d intervals of %.3f s): pressure events, collections (freed), OOMs" % (
            n, span / n / 1e9))
        for j, (pe, gc, fr, oo) in enumerate(buckets):
            w.append("\t%8.3f s  %6d  %6d (%s)  %d" % (j * span / n / 1e9, pe, gc,
                                                     rpt.format_size(fr), oo))
    return "\n".join(w) + "\n"
