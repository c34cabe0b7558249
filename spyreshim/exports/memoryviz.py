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
- snapshot.spyreshim_devices[device]: the runtime and ordinal of each
  device_traces index ("cuda:0", "opencl:0"); the page ignores the key.
- A page is the events [first, last] (--from/--to); the segments and
  blocks are the state after the last.
- The page's own unpickler (unpickle() in MemoryViz.js) knows protocols 2
  to 4 and a fixed set of opcodes; protocol 4 with dicts, lists, str, int,
  bool and None stays inside it (tests/integration/test_trace_views.py
  checks every opcode of a written file against that set).

Written as it streams (trace.batches(); memory is the live set, the
regions and the sites, never the events): one valid pickle assembled from
pieces. First `spyreshim_frames`, every site's frames once, pickled with
explicit memo indices (BINPUT: protocol 3's opcodes inside the protocol 4
stream); then each batch's events pickled by a fresh Pickler whose memo is
that table's, so an event's frames are a BINGET of its site's list, and the
batch's own memo entries take the indices after it (each batch reuses
them); the batch's list opcodes dropped, its items appended to the device's
list. Device 0's events go straight to the file, the others' to a spool
file each, copied in after it; then the segments, pickled the same way.
"""

import bisect
import io
import os
import pickle
import tempfile

from ..reading import callorder
from ..reading import report as rpt
from ..reading import trace as tr

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


def _page_checks(first, last):
    if first is not None and last is not None and first[0] == last[0] == "n" and last[1] < first[1]:
        raise rpt.ReportError("--to is before --from")


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


FRAMES_KEY = "spyreshim_frames"
DEVICES_KEY = "spyreshim_devices"
_EMPTY = []


class _Out(object):
    """The pickle's pieces: the frames table's memo seeds every later
    Pickler (protocol 3: BINPUT with explicit indices, so the pieces agree
    on them)."""

    def __init__(self, t, cache):
        self.cache = cache
        table = [_EMPTY]
        for site in sorted(t.sites):
            table.append(_frames(t, site, cache))
        buf = io.BytesIO()
        p = pickle.Pickler(buf, 3)
        p.dump(table)
        self.table = buf.getvalue()[2:-1]        # PROTO 3 and STOP off
        self.memo = p.memo.copy()
        self.keep = table

    def piece(self, obj):
        buf = io.BytesIO()
        p = pickle.Pickler(buf, 3)
        p.memo = self.memo.copy()      # the table's entries only, every piece
        p.dump(obj)
        return buf.getvalue()[2:-1]

    def items(self, events):
        """The opcodes that append events to the list on top of the stack."""
        raw = self.piece(events)
        # "]" then BINPUT (q, 1 byte) or LONG_BINPUT (r, 4 bytes): the list.
        skip = 3 if raw[1:2] == b"q" else 6
        assert raw[:1] == b"]" and raw[1:2] in (b"q", b"r"), raw[:8]
        return raw[skip:]


def _short_str(s):
    b = s.encode("utf-8")
    return b"\x8c" + bytes([len(b)]) + b


def _device_lists(ndev):
    return [[] for _ in range(ndev)]


def stream_write(t, f, first=None, last=None, spool_dir=None):
    """Writes the snapshot pickle to the binary file f, streaming. Returns
    (events written, segments)."""
    _page_checks(first, last)
    cache = {}
    out = _Out(t, cache)
    f.write(b"\x80\x04}(")                     # PROTO 4, EMPTY_DICT, MARK
    f.write(_short_str(FRAMES_KEY) + out.table)
    f.write(_short_str("device_traces") + b"]]")  # the list, device 0's list
    spools = {}
    nev = 0
    live = {}       # dev -> {addr: (size, site)}
    regions = {}    # (dev, addr) -> size of the regions held
    runs = {}       # dev -> ([starts], [ends]) of the blocks' address runs (no segment events)
    has_segments = False
    base_us = t.start_realtime_ns // 1000
    lo_i = None if first is None or first[0] == "s" else first[1] - 1
    lo_ns = int(first[1] * 1e9) if first is not None and first[0] == "s" else None
    hi_i = None if last is None or last[0] == "s" else last[1]
    hi_ns = int(last[1] * 1e9) if last is not None and last[0] == "s" else None
    lo = lo_i if lo_i is not None else (0 if lo_ns is None else None)
    hi = None
    for b in t.batches():
        n = len(b)
        m = n
        if hi_i is not None and b.start + n >= hi_i:
            m = max(0, hi_i - b.start)
            hi = hi_i
        tm = b.time
        if hi_ns is not None and max(tm[:m] or [0]) > hi_ns:
            j = next(j for j in range(m) if tm[j] > hi_ns)
            m = j
            hi = b.start + j
        if lo is None and max(tm[:m] or [-1]) >= lo_ns:
            lo = b.start + next(j for j in range(m) if tm[j] >= lo_ns)
        page_from = m if lo is None else max(0, min(m, lo - b.start))
        kind, dev, addr, size, site = b.kind, b.dev, b.addr, b.size, b.site
        pages = {}
        for i in range(m):
            k = kind[i]
            if k not in _ACTIONS:
                continue
            d = dev[i]
            if d == tr.DEVICE_NONE:
                continue
            a, sz = addr[i], size[i]
            if k == tr.ALLOC:
                lv = live.get(d)
                if lv is None:
                    lv = live[d] = {}
                lv[a] = (sz, site[i])
                if not has_segments:
                    _add_run(runs, d, a, a + sz)
            elif k == tr.FREE:
                lv = live.get(d)
                if lv is not None:
                    lv.pop(a, None)
            elif k == tr.SEGMENT_ALLOC:
                if not has_segments:
                    has_segments = True
                    runs.clear()
                regions[(d, a)] = sz
            elif k == tr.SEGMENT_FREE:
                if not has_segments:
                    has_segments = True
                    runs.clear()
                regions.pop((d, a), None)
            if i < page_from:
                continue
            evs = pages.get(d)
            if evs is None:
                evs = pages[d] = []
            us = base_us + tm[i] // 1000
            if k == tr.ALLOC:
                evs.append({"action": "alloc", "addr": a, "size": sz, "stream": 0,
                            "frames": cache.get(site[i], _EMPTY), "time_us": us})
            elif k == tr.FREE:
                fr = cache.get(site[i], _EMPTY)
                evs.append({"action": "free_requested", "addr": a, "size": sz,
                            "stream": 0, "frames": fr, "time_us": us})
                evs.append({"action": "free_completed", "addr": a, "size": sz,
                            "stream": 0, "frames": fr, "time_us": us})
            elif k == tr.OOM:
                evs.append({"action": "oom", "addr": 0, "size": sz, "stream": 0,
                            "frames": cache.get(site[i], _EMPTY), "time_us": us,
                            "device_free": a})
            else:
                evs.append({"action": "segment_alloc" if k == tr.SEGMENT_ALLOC
                            else "segment_free", "addr": a, "size": sz, "stream": 0,
                            "frames": _EMPTY, "time_us": us})
        for d, evs in pages.items():
            nev += len(evs)
            data = out.items(evs)
            if d == 0:
                f.write(data)
            else:
                sp = spools.get(d)
                if sp is None:
                    sp = spools[d] = tempfile.TemporaryFile(dir=spool_dir)
                sp.write(data)
        if hi is not None:
            break
    if (lo is not None and hi is not None and hi < lo) or (
            lo is None and hi is not None and first[0] == last[0] == "s" and last[1] < first[1]):
        raise rpt.ReportError("--to is before --from")
    # The pass-through families' pseudo-devices are named in every trace
    # that watched any memory: a list only for those that had events.
    devices = ({d for d in t.devices if d not in tr.PASSTHROUGH_DEVICES} | set(spools)
               | set(live) | {d for d, _a in regions})
    devices.discard(tr.DEVICE_NONE)
    ndev = (max(devices) + 1) if devices else 1
    f.write(b"a")                                 # device 0's list into the outer one
    for d in range(1, ndev):
        f.write(b"]")
        sp = spools.pop(d, None)
        if sp is not None:
            sp.seek(0)
            while True:
                chunk = sp.read(1 << 20)
                if not chunk:
                    break
                f.write(chunk)
            sp.close()
        f.write(b"a")
    for sp in spools.values():
        sp.close()
    segments = _segments(t, ndev, live, regions, runs, has_segments, cache)
    # Each device_traces index's runtime and ordinal ("cuda:0", "opencl:0"):
    # the viewer shows devices by number only and ignores keys it does not
    # know, as it does spyreshim_frames.
    names = [t.device_name(d) for d in range(ndev)]
    f.write(_short_str(DEVICES_KEY) + out.piece(names))
    f.write(_short_str("segments") + out.piece(segments))
    f.write(b"u.")                                # SETITEMS, STOP
    return nev, len(segments)


_ACTIONS = frozenset((tr.ALLOC, tr.FREE, tr.OOM, tr.SEGMENT_ALLOC, tr.SEGMENT_FREE))


def _add_run(runs, d, lo, hi):
    """The block [lo, hi) into its device's sorted, disjoint address runs
    (touching runs merge), for a trace without segment events."""
    r = runs.get(d)
    if r is None:
        r = runs[d] = ([], [])
    starts, ends = r
    if ends and ends[-1] >= lo and starts[-1] <= hi and (len(ends) < 2 or ends[-2] < lo):
        if lo < starts[-1]:
            starts[-1] = lo
        if hi > ends[-1]:
            ends[-1] = hi
        return
    i = bisect.bisect_left(ends, lo)
    j = bisect.bisect_right(starts, hi)
    if i < j:
        lo = min(lo, starts[i])
        hi = max(hi, ends[j - 1])
        del starts[i:j], ends[i:j]
    starts.insert(i, lo)
    ends.insert(i, hi)


def _segments(t, ndev, live, regions, runs, has_segments, cache):
    segments = []
    for d in range(ndev):
        ends = sorted(live.get(d, {}).items())
        if has_segments:
            rs = sorted([a, a + s] for (dd, a), s in regions.items() if dd == d)
        else:
            r = runs.get(d, ([], []))
            rs = [[a, e] for a, e in zip(r[0], r[1])]
        # A live block outside every region held (a region the trace
        # started after) still needs a segment for the page to draw it.
        extra = []
        r = 0
        for a, (s, _st) in ends:
            while r < len(rs) and rs[r][1] <= a:
                r += 1
            if r < len(rs) and rs[r][0] <= a and a + s <= rs[r][1]:
                continue
            if extra and a <= extra[-1][1]:
                extra[-1][1] = max(extra[-1][1], a + s)
            else:
                extra.append([a, a + s])
        j = 0
        for s_lo, s_hi in sorted(rs + extra):
            while j < len(ends) and ends[j][0] < s_lo:
                j += 1
            seg, j = _tile(t, d, s_lo, s_hi, ends, j, cache)
            segments.append(seg)
    return segments


def snapshot(t, first=None, last=None):
    """The snapshot as a dict of lists (tests; a small trace): what write()
    writes, read back."""
    buf = io.BytesIO()
    stream_write(t, buf, first, last)
    return pickle.loads(buf.getvalue())


def write(t, path, first=None, last=None):
    """Writes the pickle to path (through a temporary file in its folder,
    renamed at the end: a bad trace leaves no half-written file). Returns
    (events, segments)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".spyreshim-", suffix=".pickle", dir=folder)
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)       # as open() would have made it
        with os.fdopen(fd, "wb") as f:
            got = stream_write(t, f, first, last, spool_dir=folder)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return got
