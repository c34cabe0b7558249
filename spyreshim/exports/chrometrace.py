"""`spyreshim report --chrome-trace OUT.json`: the traces of a launch in the
Trace Event Format (the JSON object form, with "traceEvents"), which
Perfetto's UI and chrome://tracing open: one process per rank (its
process_name metadata event says `rank N`, or `pid N` outside a launch),
a counter track per device with the bytes in use and reserved, instant
events for collections (bytes freed, duration), pressure events (the
request) and out-of-memory failures (the request, the runtime's free bytes,
the allocation site). Times are microseconds on the launch's wall clock:
from the earliest trace's start.

Counters are sampled, not written per event: at most one sample per device
each SAMPLE_NS (the largest in-use value in that interval, so no peak is
lost, and the reserved bytes at its end), and one at every change of
reserved bytes' interval; a file of millions of events stays a few MB."""

import json
import os

from ..reading import callorder
from ..reading import trace as tr

SAMPLE_NS = 1_000_000     # 1 ms


def _rank_pid(row):
    """The process id the file shows: the rank where there is one."""
    return row.rank if row.rank is not None else row.pid


def walk(row, t0):
    """Yields the rank's samples and instants, times in ns on the launch's
    clock (from t0, the earliest trace's start): ("counter", device name,
    ns, bytes in use, bytes reserved) and ("instant", name, ns, args). The
    page of `report --html` over several ranks (rankpage.py) draws the same."""
    t = tr.stream(row.trace)
    base = (t.start_realtime_ns - t0) if t0 is not None else 0
    used, reserved = {}, {}
    bucket, top = {}, {}          # dev -> current sample interval, its largest in-use

    def sample(dv):
        return ("counter", t.device_name(dv), base + bucket[dv] * SAMPLE_NS,
                top.get(dv, used.get(dv, 0)), reserved.get(dv, 0))

    for b in t.batches():
        for k, sz, dv, tm, addr, site in zip(b.kind, b.size, b.dev, b.time, b.addr, b.site):
            if k in (tr.ALLOC, tr.FREE, tr.SEGMENT_ALLOC, tr.SEGMENT_FREE):
                if dv in tr.PASSTHROUGH_DEVICES:
                    continue
                slot = tm // SAMPLE_NS
                if dv in bucket and bucket[dv] != slot:
                    yield sample(dv)
                    top.pop(dv, None)
                bucket[dv] = slot
                if k == tr.ALLOC:
                    used[dv] = used.get(dv, 0) + sz
                elif k == tr.FREE:
                    used[dv] = used.get(dv, 0) - sz
                elif k == tr.SEGMENT_ALLOC:
                    reserved[dv] = reserved.get(dv, 0) + sz
                else:
                    reserved[dv] = reserved.get(dv, 0) - sz
                top[dv] = max(top.get(dv, 0), used.get(dv, 0))
            elif k == tr.GC:
                yield ("instant", "collection", base + tm, {"freed bytes": sz,
                                                            "duration ns": addr})
            elif k == tr.PRESSURE_BEGIN:
                yield ("instant", "pressure", base + tm, {"request bytes": sz})
            elif k == tr.OOM:
                args = {"request bytes": sz, "runtime free bytes": addr}
                if site:
                    args["site"] = callorder.label(t, site)
                yield ("instant", "out of memory", base + tm, args)
    for dv in bucket:
        yield sample(dv)


def launch_start(rows):
    """The launch's clock: the earliest start of the rows' traces (ns)."""
    starts = [r.start_ns for r in rows if r.trace and r.start_ns]
    return min(starts) if starts else None


def _events(row, t0, out):
    pid = _rank_pid(row)
    out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                "args": {"name": row.label()}})
    out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                "args": {"sort_index": pid}})
    for w in walk(row, t0):
        if w[0] == "counter":
            _, dev, ns, in_use, res = w
            out.append({"ph": "C", "name": "device %s" % dev, "pid": pid, "tid": 0,
                        "ts": ns / 1000.0, "args": {"in use": in_use, "reserved": res}})
        else:
            _, name, ns, args = w
            out.append({"ph": "i", "s": "p", "name": name, "pid": pid, "tid": 0,
                        "ts": ns / 1000.0, "args": args})


def write(rows, path):
    """Writes the rows' traces (rows without one are left out) to path,
    through a temporary file; returns the number of events written."""
    traced = [r for r in rows if r.trace]
    t0 = launch_start(rows)
    events = []
    for r in traced:
        _events(r, t0, events)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms",
                   "otherData": {"producer": "spyreshim report --chrome-trace"}}, f,
                  separators=(",", ":"))
    os.replace(tmp, path)
    return len(events)
