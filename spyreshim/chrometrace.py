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

from . import callorder
from . import trace as tr

SAMPLE_NS = 1_000_000     # 1 ms


def _rank_pid(row):
    """The process id the file shows: the rank where there is one."""
    return row.rank if row.rank is not None else row.pid


def _events(row, t0, out):
    t = tr.stream(row.trace)
    pid = _rank_pid(row)
    base = (t.start_realtime_ns - t0) if t0 is not None else 0
    out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                "args": {"name": row.label()}})
    out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                "args": {"sort_index": pid}})
    used, reserved = {}, {}
    bucket, top = {}, {}          # dev -> current sample interval, its largest in-use

    def us(ns):
        return (base + ns) / 1000.0

    def sample(dv, when):
        out.append({"ph": "C", "name": "device %s" % t.device_name(dv), "pid": pid, "tid": 0,
                    "ts": us(when), "args": {"in use": top.get(dv, used.get(dv, 0)),
                                             "reserved": reserved.get(dv, 0)}})

    for b in t.batches():
        for k, sz, dv, tm, addr, site in zip(b.kind, b.size, b.dev, b.time, b.addr, b.site):
            if k in (tr.ALLOC, tr.FREE, tr.SEGMENT_ALLOC, tr.SEGMENT_FREE):
                if dv in tr.PASSTHROUGH_DEVICES:
                    continue
                slot = tm // SAMPLE_NS
                if dv in bucket and bucket[dv] != slot:
                    sample(dv, bucket[dv] * SAMPLE_NS)
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
                out.append({"ph": "i", "s": "p", "name": "collection", "pid": pid, "tid": 0,
                            "ts": us(tm), "args": {"freed bytes": sz, "duration ns": addr}})
            elif k == tr.PRESSURE_BEGIN:
                out.append({"ph": "i", "s": "p", "name": "pressure", "pid": pid, "tid": 0,
                            "ts": us(tm), "args": {"request bytes": sz}})
            elif k == tr.OOM:
                args = {"request bytes": sz, "runtime free bytes": addr}
                if site:
                    args["site"] = callorder.label(t, site)
                out.append({"ph": "i", "s": "p", "name": "out of memory", "pid": pid, "tid": 0,
                            "ts": us(tm), "args": args})
    for dv, slot in bucket.items():
        sample(dv, slot * SAMPLE_NS)


def write(rows, path):
    """Writes the rows' traces (rows without one are left out) to path,
    through a temporary file; returns the number of events written."""
    traced = [r for r in rows if r.trace]
    starts = [r.start_ns for r in traced if r.start_ns]
    t0 = min(starts) if starts else None
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
