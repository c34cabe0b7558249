"""Reading a trace file (SPYRESHIM_TRACE; the layout is docs/trace-format.md,
written by shim/trace/tracefile.c) and replaying it: live memory at any
event, the peak, per-site totals.

Owns the parsing and the replay only; the views are tracepeak.py (peak
flame graph and stats text), timeline.py (the HTML timeline) and
memoryviz.py (PyTorch's memory_viz snapshot). Stdlib only. A trace cut by
a crash ends with an incomplete chunk: it is dropped and `truncated` says so.
"""

import operator
import struct
from array import array

from . import report as rpt

MAGIC = b"SPYTRACE"
CHUNK_MAGIC = 0x4B4E4843
HEADER = struct.Struct("<8sIIQQ")
CHUNK = struct.Struct("<IIIIQQ")
META = struct.Struct("<II")

ALLOC, FREE, OOM, PRESSURE_BEGIN, PRESSURE_END, GC = 1, 2, 3, 4, 5, 6
KIND_NAMES = {ALLOC: "alloc", FREE: "free", OOM: "oom", PRESSURE_BEGIN: "pressure",
              PRESSURE_END: "pressure end", GC: "collection"}
MARKERS = (OOM, PRESSURE_BEGIN, PRESSURE_END, GC)
DEVICE_NONE = 0xFF
SIZE_MASK = (1 << 48) - 1

(T_SITE, T_NSTACK, T_DEVICE, T_MAPS, T_SYMBOL, T_PYSTACK) = range(1, 7)


def is_trace(path):
    try:
        with open(path, "rb") as f:
            return f.read(8) == MAGIC
    except OSError:
        return False


def _cstrings(b, n):
    out = []
    pos = 0
    for _ in range(n):
        end = b.index(b"\0", pos)
        out.append(b[pos:end].decode("utf-8", "replace"))
        pos = end + 1
    return out, pos


class Trace(object):
    """Events in allocator order (by sequence number), as parallel arrays:
    kind, dev, size, addr, time (ns since start), site; and the metadata."""

    def __init__(self):
        self.path = None
        self.pid = None
        self.start_realtime_ns = 0
        self.truncated = False
        self.chunks = 0
        self.file_bytes = 0
        self.kind = array("B")
        self.dev = array("B")
        self.size = array("Q")
        self.addr = array("Q")
        self.time = array("Q")
        self.site = array("I")
        self.seq = array("Q")
        self.sites = {}      # site -> (native stack id, python stack id)
        self.nstacks = {}    # id -> [return addresses], innermost first
        self.pystacks = {}   # id -> [(function, file, line)], innermost first
        self.symbols = {}    # address -> (function, file, line, object)
        self.devices = {}    # index -> runtime name
        self.maps = []       # (start, end, offset, path) of executable mappings
        self._frames = {}

    def __len__(self):
        return len(self.kind)

    # ------------------------------------------------------------ frames

    def _module(self, a):
        for start, end, off, path in self.maps:
            if start <= a < end:
                return path, a - start + off
        return None, None

    def native_frame(self, a):
        s = self.symbols.get(a)
        if s:
            fn, file, line, obj = s
            base = None
            if obj:
                base = self._module(a)[1]
            return {"kind": "native", "function": fn or None, "file": file or None,
                    "line": line or None, "object": obj or None, "address": "0x%x" % a,
                    "offset": "0x%x" % base if base is not None else None}
        obj, off = self._module(a)
        return {"kind": "native", "function": None, "file": None, "line": None,
                "object": obj, "address": "0x%x" % a,
                "offset": "0x%x" % off if off is not None else None}

    def frames(self, site):
        """The site's frames as report frames: Python frames first (innermost
        first), then native ones (innermost first), as the leak reports."""
        got = self._frames.get(site)
        if got is not None:
            return got
        ns, ps = self.sites.get(site, (0, 0))
        out = []
        for fn, file, line in self.pystacks.get(ps, ()):
            out.append({"kind": "python", "function": fn or None, "file": file or None,
                        "line": line or None, "object": None, "address": None, "offset": None})
        if ps and ps not in self.pystacks:
            out.append({"kind": "python", "function": "<python stack %d: not resolved>" % ps,
                        "file": None, "line": None, "object": None, "address": None,
                        "offset": None})
        for a in self.nstacks.get(ns, ()):
            out.append(self.native_frame(a))
        self._frames[site] = out
        return out

    def site_label(self, site):
        """One line naming a site: its innermost frame that has a name."""
        fr = self.frames(site)
        if not fr:
            return "[no stack recorded]"
        for f in fr:
            if f["function"]:
                return rpt.frame_label(f)
        return rpt.frame_label(fr[0])

    def device_name(self, d):
        return self.devices.get(d, "device %d" % d)


def _parse_meta(t, b):
    pos = 0
    n = len(b)
    while pos + 8 <= n:
        tag, ln = META.unpack_from(b, pos)
        pos += 8
        p = b[pos:pos + ln]
        pos += (ln + 7) & ~7
        if tag == T_SITE:
            site, ns, ps, _ = struct.unpack_from("<IIII", p)
            t.sites[site] = (ns, ps)
        elif tag == T_NSTACK:
            sid, nf = struct.unpack_from("<II", p)
            t.nstacks[sid] = list(struct.unpack_from("<%dQ" % nf, p, 8))
        elif tag == T_DEVICE:
            idx, _ = struct.unpack_from("<II", p)
            t.devices[idx] = p[8:].split(b"\0", 1)[0].decode("utf-8", "replace")
        elif tag == T_MAPS:
            maps = []
            for line in p.decode("utf-8", "replace").splitlines():
                parts = line.split(None, 5)
                if len(parts) < 6:
                    continue
                lo, hi = parts[0].split("-")
                maps.append((int(lo, 16), int(hi, 16), int(parts[2], 16), parts[5]))
            t.maps = maps
        elif tag == T_SYMBOL:
            a, line, _ = struct.unpack_from("<QiI", p)
            (fn, file, obj), _ = _cstrings(p[16:], 3)
            t.symbols[a] = (fn, file, line, obj)
        elif tag == T_PYSTACK:
            sid, nf = struct.unpack_from("<II", p)
            body = p[8:]
            q = 0
            frames = []
            for _ in range(nf):
                (line,) = struct.unpack_from("<i", body, q)
                (fn, file), used = _cstrings(body[q + 4:], 2)
                q += 4 + used
                frames.append((fn, file, line))
            t.pystacks[sid] = frames


def load(path):
    """Reads a whole trace; raises report.ReportError when it is not one."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise rpt.ReportError("cannot read %s: %s" % (path, e.strerror or e))
    if len(data) < HEADER.size or data[:8] != MAGIC:
        raise rpt.ReportError("%s: not a spyreshim trace" % path)
    magic, version, pid, real, mono = HEADER.unpack_from(data, 0)
    if version != 1:
        raise rpt.ReportError("%s: trace version %d is not understood (1)" % (path, version))
    t = Trace()
    t.path, t.pid, t.start_realtime_ns, t.file_bytes = path, pid, real, len(data)
    pos = HEADER.size
    n = len(data)
    parts = []
    bases = []   # (first event index, event count, seq_base)
    count = 0
    while pos + CHUNK.size <= n:
        cm, nev, meta_bytes, _, base, _ = CHUNK.unpack_from(data, pos)
        end = pos + CHUNK.size + nev * 32 + meta_bytes
        if cm != CHUNK_MAGIC or end > n:
            t.truncated = True
            break
        if nev:
            parts.append(data[pos + CHUNK.size:pos + CHUNK.size + nev * 32])
            bases.append((count, nev, base))
            count += nev
        _parse_meta(t, data[pos + CHUNK.size + nev * 32:end])
        t.chunks += 1
        pos = end
    if pos < n and not t.truncated:
        t.truncated = True
    del data
    ev = b"".join(parts)
    del parts
    # Fields by strided byte slices (C speed; 10 million events in a few
    # seconds): an event is addr u64, size|kind|dev u64, time u64,
    # seq_lo u32, site u32, little-endian like the host (array's order).
    words = array("Q")
    words.frombytes(ev)
    addr = words[0::4]
    times = words[2::4]
    del words

    def field(offset, width, nbytes):
        out = bytearray(width * count)
        for b in range(nbytes):
            out[b::width] = ev[offset + b::32]
        a = array("Q" if width == 8 else "I")
        a.frombytes(out)
        return a

    size = field(8, 8, 6)
    kind = array("B", ev[14::32])
    dev = array("B", ev[15::32])
    site = field(28, 4, 4)
    seq = field(24, 8, 4)   # the low 32 bits; the rest from each chunk's base
    del ev
    for lo, m, base in bases:
        blo = base & 0xFFFFFFFF
        bhi = base - blo
        if bhi == 0 and min(seq[lo:lo + m]) >= blo:
            continue         # seq = seq_lo (fewer than 2^32 events, no wrap)
        for i in range(lo, lo + m):
            s = seq[i]
            seq[i] = bhi + s if s >= blo else bhi + (1 << 32) + s
    # One thread's chunk is in order; several threads' chunks interleave.
    sorted_already = count < 2 or all(map(operator.lt, seq[:-1], seq[1:]))
    if not sorted_already:
        order = sorted(range(count), key=seq.__getitem__)
        pick = [a.__getitem__ for a in (seq, addr, size, kind, dev, times, site)]
        seq, addr, size, kind, dev, times, site = (
            array(a.typecode, map(g, order))
            for a, g in zip((seq, addr, size, kind, dev, times, site), pick))
    t.seq, t.addr, t.size, t.kind, t.dev, t.time, t.site = seq, addr, size, kind, dev, times, site
    return t


# ------------------------------------------------------------------ replay

# Pseudo-devices of memory the shim passes through and watches (managed,
# host-pinned: tracefmt.h): their own peaks, never in the overall one.
PASSTHROUGH_DEVICES = (0xfd, 0xfe)


class Peak(object):
    """Where live bytes were highest: overall (all devices together) and
    per device, with the event index at which each was reached."""

    def __init__(self):
        self.bytes = 0
        self.index = -1
        self.per_device = {}   # dev -> (bytes, index)


def peaks(t):
    """Replays the trace once; live bytes after each event, in allocator
    order. The per-device peak is what the shim's peak_used_bytes counts."""
    p = Peak()
    live = {}
    per = {}
    total = 0
    kind, dev, size = t.kind, t.dev, t.size
    for i in range(len(kind)):
        k = kind[i]
        if k == ALLOC:
            d = dev[i]
            v = per.get(d, 0) + size[i]
            per[d] = v
            if v > live.get(d, (0, -1))[0]:
                live[d] = (v, i)
            if d not in PASSTHROUGH_DEVICES:
                total += size[i]
                if total > p.bytes:
                    p.bytes, p.index = total, i
        elif k == FREE:
            d = dev[i]
            if d not in PASSTHROUGH_DEVICES:
                total -= size[i]
            per[d] = per.get(d, 0) - size[i]
    p.per_device = live
    return p


def live_at(t, index, device=None):
    """What was live just after event `index`: {(dev, addr): (size, site)}."""
    live = {}
    kind, dev, addr, size, site = t.kind, t.dev, t.addr, t.size, t.site
    for i in range(min(index + 1, len(kind))):
        k = kind[i]
        if k == ALLOC:
            if device is None or dev[i] == device:
                live[(dev[i], addr[i])] = (size[i], site[i], i)
        elif k == FREE:
            live.pop((dev[i], addr[i]), None)
    return live


def live_report(t, live, reason, name=None):
    """A report (report.parse's shape) of a live set, grouped by site, so
    that report.text and flamegraph.page draw it as they draw leaks."""
    groups = {}
    for (d, _a), (sz, site, _i) in live.items():
        key = (d, site)
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"bytes": 0, "count": 0, "runtime": t.device_name(d),
                               "suppressed": False, "frames": t.frames(site)}
        g["bytes"] += sz
        g["count"] += 1
    gl = sorted(groups.values(), key=lambda g: (-g["bytes"], -g["count"]))
    return {"name": name or t.path, "pid": t.pid, "exe": None, "reason": reason, "groups": gl,
            "live_bytes": sum(g["bytes"] for g in gl),
            "live_allocations": sum(g["count"] for g in gl),
            "reported_bytes": sum(g["bytes"] for g in gl),
            "reported_allocations": sum(g["count"] for g in gl),
            "suppressed_bytes": 0, "suppressed_allocations": 0}
