"""Export of a trace to the snapshot PyTorch's memory_viz page reads
(https://pytorch.org/memory_viz; its reader is torch/utils/viz/MemoryViz.js,
the Python side torch/cuda/_memory_viz.py). Our own writer; docs/trace-format.md
lists the fields.

What the page reads, and what we write:
- snapshot.segments[]: device, address, total_size, stream, blocks[]
  (annotate_snapshot gives each block addr = segment address + the sizes of
  the blocks before it, so blocks tile their segment); a block has size,
  requested_size, state ('active_allocated' is drawn, 'inactive' is a gap)
  and frames[] of {filename, line, name} (format_frames, frameFilter).
  The shim's regions are not in the trace: a segment is each run of
  addresses that blocks ever covered (every block the trace names lies in
  one, which the 'Allocator State History' view needs), holding the blocks
  live at the end of the trace.
- snapshot.device_traces[device][]: action ('alloc', 'free_requested',
  'free_completed', 'oom'; process_alloc_data pairs alloc with
  free_completed by addr), addr, size, stream, frames, time_us, and
  device_free for 'oom' (formatEvent).
- The page's own unpickler (unpickle() in MemoryViz.js) knows protocols 2
  to 4 and a fixed set of opcodes; protocol 4 with dicts, lists, str, int,
  bool and None stays inside it (tests/integration/test_trace_views.py
  checks every opcode of a written file against that set).
"""

import pickle

from . import callorder
from . import trace as tr

PROTOCOL = 4


def _frames(t, site, cache):
    got = cache.get(site)
    if got is None:
        got = []
        for f in callorder.visible(t, site):
            if f["kind"] == "python":
                got.append({"filename": f["file"] or "??", "line": f["line"] or 0,
                            "name": f["function"] or "??"})
            else:
                got.append({"filename": f["file"] or f["object"] or "??", "line": f["line"] or 0,
                            "name": f["function"] or f["address"] or "??"})
        cache[site] = got
    return got


def snapshot(t):
    """The snapshot as a dict of lists, ready to pickle."""
    devices = sorted(set(t.devices) | set(d for d in t.dev if d != tr.DEVICE_NONE))
    ndev = (max(devices) + 1) if devices else 1
    traces = [[] for _ in range(ndev)]
    cache = {}
    live = {}
    spans = {}   # dev -> [(lo, hi)] of every block
    kind, dev, addr, size, site, time = t.kind, t.dev, t.addr, t.size, t.site, t.time
    for i in range(len(kind)):
        k = kind[i]
        if k == tr.ALLOC or k == tr.FREE:
            d = dev[i]
            a, s = addr[i], size[i]
            fr = _frames(t, site[i], cache)
            us = time[i] // 1000
            if k == tr.ALLOC:
                live[(d, a)] = (s, site[i])
                spans.setdefault(d, []).append((a, a + s))
                traces[d].append({"action": "alloc", "addr": a, "size": s, "stream": 0,
                                  "frames": fr, "time_us": us})
            else:
                live.pop((d, a), None)
                traces[d].append({"action": "free_requested", "addr": a, "size": s,
                                  "stream": 0, "frames": fr, "time_us": us})
                traces[d].append({"action": "free_completed", "addr": a, "size": s,
                                  "stream": 0, "frames": fr, "time_us": us})
        elif k == tr.OOM and dev[i] < ndev:
            traces[dev[i]].append({"action": "oom", "addr": 0, "size": size[i], "stream": 0,
                                   "frames": [], "time_us": time[i] // 1000,
                                   "device_free": 0})
    segments = []
    for d in sorted(spans):
        runs = []
        for lo, hi in sorted(spans[d]):
            if runs and lo <= runs[-1][1]:
                if hi > runs[-1][1]:
                    runs[-1][1] = hi
            else:
                runs.append([lo, hi])
        ends = sorted((a, v) for (dd, a), v in live.items() if dd == d)
        j = 0
        for lo, hi in runs:
            blocks = []
            at = lo
            while j < len(ends) and ends[j][0] < hi:
                a, (s, st) = ends[j]
                if a > at:
                    blocks.append({"size": a - at, "requested_size": a - at,
                                   "state": "inactive", "frames": []})
                blocks.append({"size": s, "requested_size": s, "state": "active_allocated",
                               "frames": _frames(t, st, cache)})
                at = a + s
                j += 1
            if at < hi:
                blocks.append({"size": hi - at, "requested_size": hi - at,
                               "state": "inactive", "frames": []})
            segments.append({"device": d, "address": lo, "total_size": hi - lo, "stream": 0,
                             "segment_type": "large", "allocated_size": sum(
                                 b["size"] for b in blocks if b["state"] != "inactive"),
                             "active_size": sum(
                                 b["size"] for b in blocks if b["state"] != "inactive"),
                             "requested_size": sum(
                                 b["size"] for b in blocks if b["state"] != "inactive"),
                             "blocks": blocks, "frames": []})
    return {"segments": segments, "device_traces": traces}


def write(t, path):
    with open(path, "wb") as f:
        pickle.dump(snapshot(t), f, protocol=PROTOCOL)
