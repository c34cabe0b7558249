"""Export of a trace to the snapshot PyTorch's memory_viz page reads
(https://pytorch.org/memory_viz; its reader is torch/utils/viz/MemoryViz.js,
the Python side torch/cuda/_memory_viz.py). Our own writer; docs/trace-format.md
lists the fields.

What the page reads, and what we write:
- snapshot.segments[]: device, address, total_size, stream, blocks[]
  (annotate_snapshot gives each block addr = segment address + the sizes of
  the blocks before it, so blocks tile their segment); a block has size,
  requested_size, state ('active_allocated' is drawn, 'inactive' is a gap),
  frames[] of {filename, line, name} (format_frames, frameFilter) and the
  same frames in history[0] (with addr and real_size: the older layout,
  which some versions of the page read instead). A segment is each region
  the shim holds at the end of the page (the trace's segment events); for
  a trace written before they existed, each run of addresses that blocks
  covered.
- snapshot.device_traces[device][]: action ('alloc', 'free_requested',
  'free_completed', 'segment_alloc', 'segment_free', 'oom';
  process_alloc_data pairs alloc with free_completed and segment_alloc
  with segment_free by addr; MemoryView replays them backwards from the
  segments), addr, size, stream, frames (innermost first, in call order:
  callorder.py), time_us (microseconds on the Unix epoch), and for 'oom'
  device_free (the runtime's free bytes then) with the failing request's
  frames.
- A page is the events [first, last] (--from/--to); the segments and
  blocks are the state after the last.
- The page's own unpickler (unpickle() in MemoryViz.js) knows protocols 2
  to 4 and a fixed set of opcodes; protocol 4 with dicts, lists, str, int,
  bool and None stays inside it (tests/integration/test_trace_views.py
  checks every opcode of a written file against that set).
"""

import pickle

from . import callorder
from . import report as rpt
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


def parse_bound(text):
    """--from/--to: "12.5s" (seconds since the trace began) or "N" (event
    number, 1-based as the views print them)."""
    v = text.strip()
    try:
        if v.endswith("s"):
            sec = float(v[:-1])
            if not sec >= 0:
                raise ValueError
            return ("s", sec)
        n = int(v)
        if n < 1:
            raise ValueError
        return ("n", n)
    except ValueError:
        raise rpt.ReportError("%r is not a time in seconds (\"2.5s\") or an event number "
                              "(1, 2, ...)" % text)


def event_range(t, first=None, last=None):
    """[lo, hi) event indices of the page from --from/--to bounds."""
    n = len(t)
    lo, hi = 0, n
    if first is not None:
        kind, v = first
        if kind == "n":
            lo = min(n, v - 1)
        else:
            ns = int(v * 1e9)
            lo = next((i for i in range(n) if t.time[i] >= ns), n)
    if last is not None:
        kind, v = last
        if kind == "n":
            hi = min(n, v)
        else:
            ns = int(v * 1e9)
            hi = next((i for i in range(n) if t.time[i] > ns), n)
    if hi < lo:
        raise rpt.ReportError("--to is before --from")
    return lo, hi


def _block(size, frames, addr, state="active_allocated"):
    return {"size": size, "requested_size": size, "state": state, "frames": frames,
            "history": [{"addr": addr, "real_size": size, "frames": frames}]}


def _gap(size):
    return {"size": size, "requested_size": size, "state": "inactive", "frames": []}


def _tile(t, d, lo, hi, blocks_sorted, j, cache):
    """Blocks of segment [lo, hi) from blocks_sorted[j:], gaps between."""
    blocks = []
    at = lo
    while j < len(blocks_sorted) and blocks_sorted[j][0] < hi:
        a, (s, st) = blocks_sorted[j]
        if a > at:
            blocks.append(_gap(a - at))
        blocks.append(_block(s, _frames(t, st, cache), a))
        at = a + s
        j += 1
    if at < hi:
        blocks.append(_gap(hi - at))
    used = sum(b["size"] for b in blocks if b["state"] != "inactive")
    seg = {"device": d, "address": lo, "total_size": hi - lo, "stream": 0,
           "segment_type": "large", "allocated_size": used, "active_size": used,
           "requested_size": used, "blocks": blocks, "frames": []}
    return seg, j


def snapshot(t, first=None, last=None):
    """The snapshot as a dict of lists, ready to pickle: the events from
    `first` to `last` (parse_bound's values; None = the trace's ends)."""
    lo, hi = event_range(t, first, last)
    devices = sorted(set(t.devices) | set(d for d in t.dev if d != tr.DEVICE_NONE))
    ndev = (max(devices) + 1) if devices else 1
    traces = [[] for _ in range(ndev)]
    cache = {}
    live = {}
    regions = {}  # (dev, addr) -> size of the regions held
    spans = {}    # dev -> [(lo, hi)] of every block (traces without segment events)
    has_segments = False
    base_us = t.start_realtime_ns // 1000
    kind, dev, addr, size, site, time = t.kind, t.dev, t.addr, t.size, t.site, t.time
    for i in range(hi):
        k = kind[i]
        d = dev[i]
        on_page = i >= lo and d < ndev
        if k == tr.ALLOC or k == tr.FREE:
            a, s = addr[i], size[i]
            if k == tr.ALLOC:
                live[(d, a)] = (s, site[i])
                spans.setdefault(d, []).append((a, a + s))
            else:
                live.pop((d, a), None)
            if not on_page:
                continue
            fr = _frames(t, site[i], cache)
            us = base_us + time[i] // 1000
            if k == tr.ALLOC:
                traces[d].append({"action": "alloc", "addr": a, "size": s, "stream": 0,
                                  "frames": fr, "time_us": us})
            else:
                traces[d].append({"action": "free_requested", "addr": a, "size": s,
                                  "stream": 0, "frames": fr, "time_us": us})
                traces[d].append({"action": "free_completed", "addr": a, "size": s,
                                  "stream": 0, "frames": fr, "time_us": us})
        elif k == tr.SEGMENT_ALLOC or k == tr.SEGMENT_FREE:
            has_segments = True
            a, s = addr[i], size[i]
            if k == tr.SEGMENT_ALLOC:
                regions[(d, a)] = s
            else:
                regions.pop((d, a), None)
            if on_page:
                traces[d].append({"action": "segment_alloc" if k == tr.SEGMENT_ALLOC
                                  else "segment_free", "addr": a, "size": s, "stream": 0,
                                  "frames": [], "time_us": base_us + time[i] // 1000})
        elif k == tr.OOM and on_page:
            traces[d].append({"action": "oom", "addr": 0, "size": size[i], "stream": 0,
                              "frames": _frames(t, site[i], cache),
                              "time_us": base_us + time[i] // 1000, "device_free": addr[i]})
    segments = []
    for d in range(ndev):
        ends = sorted((a, v) for (dd, a), v in live.items() if dd == d)
        if has_segments:
            runs = sorted([a, a + s] for (dd, a), s in regions.items() if dd == d)
        else:
            runs = []
            for b_lo, b_hi in sorted(spans.get(d, ())):
                if runs and b_lo <= runs[-1][1]:
                    runs[-1][1] = max(runs[-1][1], b_hi)
                else:
                    runs.append([b_lo, b_hi])
        # A live block outside every region held (a region the trace
        # started after) still needs a segment for the page to draw it.
        extra = []
        r = 0
        for a, (s, _st) in ends:
            while r < len(runs) and runs[r][1] <= a:
                r += 1
            if r < len(runs) and runs[r][0] <= a and a + s <= runs[r][1]:
                continue
            if extra and a <= extra[-1][1]:
                extra[-1][1] = max(extra[-1][1], a + s)
            else:
                extra.append([a, a + s])
        j = 0
        for s_lo, s_hi in sorted(runs + extra):
            while j < len(ends) and ends[j][0] < s_lo:
                j += 1
            seg, j = _tile(t, d, s_lo, s_hi, ends, j, cache)
            segments.append(seg)
    return {"segments": segments, "device_traces": traces}


def write(t, path, first=None, last=None):
    snap = snapshot(t, first, last)
    with open(path, "wb") as f:
        pickle.dump(snap, f, protocol=PROTOCOL)
    return snap
