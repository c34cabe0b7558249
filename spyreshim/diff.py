"""`spyreshim report --diff`: what was allocated between two moments and is
still live at the second, grouped by allocation site (growth only).

Two moments are: two leak reports or snapshots (spyreshim.snapshot(),
spyreshim_snapshot_write_json) in the report format, or two points of one
trace (`--at T1 --at T2`). From a trace the answer is exact: the blocks
live at T2 that were allocated after T1. From two reports it is by site:
a site whose live bytes grew between A and B, by the growth (stacks are
matched as `report.merge` matches them, so two processes of one program
compare). Owns this view only: text (group_text's layout), JSON and the
flame graph page (flamegraph.page). Frames of a trace are in call order
(callorder.py).
"""

import json

from . import callorder
from . import report as rpt
from . import trace as tr

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


def at_index(t, text):
    """An --at value as an event index: "2.5s" (the last event at or
    before that time) or an event number (1-based). Streams: a time reads
    the trace up to it; an event number past the end counts the events."""
    v = text.strip()
    try:
        if v.endswith("s"):
            ns = float(v[:-1]) * 1e9
            if not ns >= 0:
                raise ValueError
        else:
            k = int(v)
            if k < 0:
                raise ValueError
    except ValueError:
        raise rpt.ReportError("--at %r: not a time in seconds (\"2.5s\") or an event number" % text)
    if not v.endswith("s"):
        return min(k, len(t)) - 1
    i = -1
    for b in t.batches():
        tm = b.time
        if max(tm) <= ns:
            i = b.start + len(tm) - 1
            continue
        for j, x in enumerate(tm):
            if x > ns:
                return b.start + j - 1
    return i


def of_trace(t, i1, i2):
    """Blocks live just after event i2 that were allocated after event i1."""
    if i2 < i1:
        i1, i2 = i2, i1
    live = {(d, a): v for (d, a), v in tr.live_at(t, i2).items() if v[2] > i1}
    r = callorder.live_report(t, live, "diff",
                              name="%s: events %d -> %d" % (t.path, i1 + 1, i2 + 1))
    return r


def text(r, title):
    out = ["=" * 65, "spyreshim: growth %s" % title,
           "(allocated in between and still live at the second moment, by site)"]
    for g in r["groups"]:
        out.append("")
        out.append(rpt.group_text(g, leaks=False).replace("Live:", "Grew by", 1))
    out.append("")
    out.append("SUMMARY: spyreshim: %s grew in %d allocation(s) at %d site(s)." % (
        rpt.format_size(r["reported_bytes"]), r["reported_allocations"], len(r["groups"])))
    return "\n".join(out) + "\n"


def to_json(r, title):
    def frame(f):
        return {k: f.get(k) for k in ("kind", "function", "file", "line", "object", "address",
                                      "offset", "interpreter", "folded")}
    return json.dumps({
        "format": JSON_FORMAT, "version": 1, "between": title,
        "grown_bytes": r["reported_bytes"], "grown_allocations": r["reported_allocations"],
        "groups": [{"bytes": g["bytes"], "count": g["count"], "runtime": g["runtime"],
                    "frames": [frame(f) for f in g["frames"]]} for g in r["groups"]],
    }, indent=1) + "\n"


def html(r, title):
    from . import flamegraph
    return flamegraph.page(rpt.merge([r]), title="spyreshim: growth " + title)
