"""`spyreshim report --diff`: what was allocated between two moments and is
still live at the second, grouped by allocation site (growth only).

Two moments are: two leak reports or snapshots (spyreshim.snapshot(),
spyreshim_snapshot_write_json) in the report format, or two points of one
trace (`--at T1 --at T2`; without them, the start and the moment the
interpreter began to shut down, trace kind 10). From a trace the answer is
exact: the blocks live at T2 that were allocated after T1, and those of
them a later collection of the shim freed (garbage waiting for it, not
growth) are listed apart. From two reports it is by site:
a site whose live bytes grew between A and B, by the growth (stacks are
matched as `report.merge` matches them, so two processes of one program
compare). Owns this view only: text (group_text's layout), JSON, the
flame graph page (flamegraph.page) and the moments' titles, in times. Frames of a trace are in call order
(callorder.py).
"""

import itertools
import json

from ..reading import callorder
from ..reading import report as rpt
from ..reading import trace as tr

JSON_FORMAT = "spyreshim-diff"


def _key(g):
    return (g["runtime"], tuple(rpt.frame_key(f) for f in g["frames"]))


def _shape(groups, name, pid=None):
    gl = sorted(groups, key=lambda g: (-g["bytes"], -g["count"]))
    b = sum(g["bytes"] for g in gl)
    c = sum(g["count"] for g in gl)
    return {"name": name, "pid": pid, "exe": None, "reason": "diff", "groups": gl,
            "live_bytes": b, "live_allocations": c, "reported_bytes": b,
            "reported_allocations": c, "suppressed_bytes": 0, "suppressed_allocations": 0}


def of_reports(a, b):
    """Growth from report a to report b (report.parse's shape), by site."""
    before = {}
    for g in a["groups"]:
        if g["suppressed"]:
            continue
        k = _key(g)
        s = before.setdefault(k, [0, 0])
        s[0] += g["bytes"]
        s[1] += g["count"]
    after = {}
    for g in b["groups"]:
        if g["suppressed"]:
            continue
        k = _key(g)
        m = after.get(k)
        if m is None:
            m = after[k] = {"bytes": 0, "count": 0, "runtime": g["runtime"],
                            "suppressed": False, "frames": g["frames"],
                            "order": g.get("order"), "unspliced": g.get("unspliced")}
        m["bytes"] += g["bytes"]
        m["count"] += g["count"]
    out = []
    for k, m in after.items():
        ob, oc = before.get(k, (0, 0))
        if m["bytes"] > ob:
            m["bytes"] -= ob
            m["count"] = max(0, m["count"] - oc)
            out.append(m)
    return _shape(out, "%s -> %s" % (a["name"], b["name"]), b["pid"])


def default_moments(t):
    """`--diff TRACE` without --at: the first moment (before the first
    event: nothing live) and the last before the interpreter began to shut
    down (its shutdown marker, kind 10), else the last event. Returns
    (i1, i2, words for the second)."""
    for b in t.batches():
        kb = b.kind.tobytes()
        j = kb.find(bytes([tr.SHUTDOWN]))
        if j >= 0:
            return -1, b.start + j - 1, "the interpreter's shutdown"
    return -1, len(t) - 1, "the end of the trace"


_WATCH = bytes(1 if k in (tr.FREE, tr.PRESSURE_BEGIN, tr.PRESSURE_END, tr.GC) else 0
               for k in range(256))


def _later_collected(t, live, i2):
    """The keys of `live` (what was live just after event i2) that a later
    collection freed: their free falls in a pressure event's window before
    one of its collections' markers (as gcview.py attributes frees), the
    first free of the block after i2."""
    left = set(live)
    collected = set()
    window, pending = False, []
    for b in t.batches():
        end = b.start + len(b)
        if end <= i2 + 1:
            continue
        kind, dev, addr = b.kind, b.dev, b.addr
        lo = max(0, i2 + 1 - b.start)
        kb = kind.tobytes()
        for j in itertools.compress(range(lo, len(kind)), kb[lo:].translate(_WATCH)):
            k = kind[j]
            if k == tr.FREE:
                key = (dev[j], addr[j])
                if key in left:
                    left.discard(key)
                    if window:
                        pending.append(key)
            elif k == tr.PRESSURE_BEGIN:
                window, pending = True, []
            elif k == tr.PRESSURE_END:
                window, pending = False, []
            elif window:              # a collection's marker
                collected.update(pending)
                pending = []
        if not left and not window:
            break
    return collected


def of_trace(t, i1, i2):
    """Blocks live just after event i2 that were allocated after event i1;
    those a later collection freed (garbage, not growth) apart, under
    "collected"."""
    if i2 < i1:
        i1, i2 = i2, i1
    live = {(d, a): v for (d, a), v in tr.live_at(t, i2).items() if v[2] > i1}
    gone = _later_collected(t, live, i2)
    grew = {k: v for k, v in live.items() if k not in gone}
    r = callorder.live_report(t, grew, "diff")
    r["collected"] = callorder.live_report(t, {k: live[k] for k in gone}, "diff")
    return r


def trace_title(t, path, i1, i2, words=None):
    """The moments in words: times since the trace began, not event numbers."""
    tm = tr.times_at(t, (i1, i2))
    first = "the start" if i1 < 0 else tr.seconds(tm[i1])
    second = tr.seconds(tm[i2]) if i2 >= 0 else "the start"
    if words:
        second += " (%s)" % words
    return "in %s from %s to %s" % (path, first, second)


def text(r, title):
    out = ["=" * 65, "spyreshim: growth %s" % title,
           "(allocated in between and still live at the second moment, by site)"]
    for g in r["groups"]:
        out.append("")
        out.append(rpt.group_text(g, leaks=False).replace("Live:", "Grew by", 1))
    col = r.get("collected")
    if col and col["groups"]:
        out.append("")
        out.append("-" * 65)
        out.append("Garbage a later collection freed (allocated in between and live at the "
                   "second moment, then freed by the shim's collection of reference cycles: "
                   "not a leak):")
        for g in col["groups"]:
            out.append("")
            out.append(rpt.group_text(g, leaks=False).replace("Live:", "Collected later:", 1))
    out.append("")
    tail = ""
    if col and col["groups"]:
        tail = "; %s more in %d allocation(s) was garbage a later collection freed" % (
            rpt.format_size(col["reported_bytes"]), col["reported_allocations"])
    out.append("SUMMARY: spyreshim: %s grew in %d allocation(s) at %d site(s)%s." % (
        rpt.format_size(r["reported_bytes"]), r["reported_allocations"], len(r["groups"]), tail))
    return "\n".join(out) + "\n"


def _frame(f):
    return {k: f.get(k) for k in ("kind", "function", "file", "line", "object", "address",
                                  "offset", "interpreter", "folded")}


def _groups_json(r):
    return [{"bytes": g["bytes"], "count": g["count"], "runtime": g["runtime"],
             "frames": [_frame(f) for f in g["frames"]]} for g in r["groups"]]


def to_json(r, title):
    col = r.get("collected")
    return json.dumps({
        "format": JSON_FORMAT, "version": 1, "between": title,
        "grown_bytes": r["reported_bytes"], "grown_allocations": r["reported_allocations"],
        "groups": _groups_json(r),
        # From a trace: what was live at the second moment and a later
        # collection freed (absent for two reports, which cannot tell).
        "collected_bytes": col["reported_bytes"] if col else None,
        "collected_allocations": col["reported_allocations"] if col else None,
        "collected_groups": _groups_json(col) if col else None,
    }, indent=1) + "\n"


def html(r, title):
    from . import flamegraph
    col = r.get("collected")
    note = None
    if col and col["groups"]:
        note = ("Not drawn: %s in %d allocation(s) live at the second moment was garbage a "
                "later collection freed (the text and JSON list it by site)." % (
                    rpt.format_size(col["reported_bytes"]), col["reported_allocations"]))
    return flamegraph.page(rpt.merge([r]), title="spyreshim: growth " + title, note=note,
                           empty="Nothing grew between the two moments.")
