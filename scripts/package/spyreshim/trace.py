"""Reading a trace file (SPYRESHIM_TRACE; the layout is docs/trace-format.md,
written by shim/trace/tracefile.c) and replaying it: live memory at any
event, the peak, per-site totals.

Owns the parsing and the replay only; the views are tracepeak.py (peak
flame graph and stats text), timeline.py (the HTML timeline) and
memoryviz.py (PyTorch's memory_viz snapshot). Stdlib only. A trace cut by
a crash ends with an incomplete chunk: it is dropped and `truncated` says so.
"""

import itertools
import operator
import os
import struct
from array import array

from . import report as rpt
from . import tracecodec

MAGIC = b"SPYTRACE"
CHUNK_MAGIC = 0x4B4E4843
HEADER = struct.Struct("<8sIIQQ")
CHUNK = struct.Struct("<IIIIQQ")
META = struct.Struct("<II")

ALLOC, FREE, OOM, PRESSURE_BEGIN, PRESSURE_END, GC = 1, 2, 3, 4, 5, 6
SEGMENT_ALLOC, SEGMENT_FREE = 7, 8   # a region reserved / released (views: memoryviz.py)
KIND_NAMES = {ALLOC: "alloc", FREE: "free", OOM: "oom", PRESSURE_BEGIN: "pressure",
              PRESSURE_END: "pressure end", GC: "collection", SEGMENT_ALLOC: "segment alloc",
              SEGMENT_FREE: "segment free", 9: "pool trim"}
MARKERS = (OOM, PRESSURE_BEGIN, PRESSURE_END, GC)
DEVICE_NONE = 0xFF
MAX_DEVICES = 0xFF      # an event names its device in one byte; 0xFF is "none"
SIZE_MASK = (1 << 48) - 1

(T_SITE, T_NSTACK, T_DEVICE, T_MAPS, T_SYMBOL, T_PYSTACK, T_PYMARKS) = range(1, 8)


def is_trace(path):
    try:
        with open(path, "rb") as f:
            return f.read(8) == MAGIC
    except OSError:
        return False


class _Bad(Exception):
    """A record that does not follow the format: what is wrong with it."""


def _cstrings(b, n):
    out = []
    pos = 0
    for _ in range(n):
        end = b.find(b"\0", pos)
        if end < 0:
            raise _Bad("a string without its terminating NUL")
        # surrogateescape: a path's non-UTF-8 bytes stay bytes (os.fsencode
        # gives them back); escape.terminal shows them as \xNN.
        out.append(b[pos:end].decode("utf-8", "surrogateescape"))
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
        self.symbol_flags = {}  # address -> TRACE_SYMBOL_* bits (callorder.py reads them)
        self.pymarks = {}    # Python stack id -> (SHIM_PYSTACK_* flags, [entry per frame])
        self.devices = {}    # index -> runtime name
        self.maps = []       # (start, end, offset, path) of executable mappings
        self.foreign_frees = 0   # frees of blocks allocated before fork() (not counted)
        self.foreign_bytes = 0
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


def _need(p, n, what):
    if len(p) < n:
        raise _Bad("%s: %d bytes, needs %d" % (what, len(p), n))


def _parse_meta(t, b, base, path):
    """The metadata records of one chunk; base is their offset in the file."""
    pos = 0
    n = len(b)
    while pos + 8 <= n:
        tag, ln = META.unpack_from(b, pos)
        at = base + pos
        pos += 8
        if pos + ln > n:
            raise rpt.ReportError("%s: offset %d: metadata record (tag %d) of %d bytes runs past "
                                  "its chunk" % (path, at, tag, ln))
        p = b[pos:pos + ln]
        pos += (ln + 7) & ~7
        try:
            _parse_record(t, tag, p)
        except _Bad as e:
            raise rpt.ReportError("%s: offset %d: %s record: %s" % (
                path, at, _TAG_NAMES.get(tag, "tag %d" % tag), e))
        except (struct.error, ValueError, IndexError) as e:
            raise rpt.ReportError("%s: offset %d: %s record: malformed (%s)" % (
                path, at, _TAG_NAMES.get(tag, "tag %d" % tag), e))


_TAG_NAMES = {T_SITE: "site", T_NSTACK: "native stack", T_DEVICE: "device", T_MAPS: "maps",
              T_SYMBOL: "symbol", T_PYSTACK: "python stack",
              T_PYMARKS: "python stack marks"}


def _parse_record(t, tag, p):
    if tag == T_SITE:
        _need(p, 16, "record")
        site, ns, ps, _ = struct.unpack_from("<IIII", p)
        t.sites[site] = (ns, ps)
    elif tag == T_NSTACK:
        _need(p, 8, "record")
        sid, nf = struct.unpack_from("<II", p)
        _need(p, 8 + 8 * nf, "%d frames" % nf)
        t.nstacks[sid] = list(struct.unpack_from("<%dQ" % nf, p, 8))
    elif tag == T_DEVICE:
        _need(p, 8, "record")
        idx, _ = struct.unpack_from("<II", p)
        if idx >= MAX_DEVICES:
            raise _Bad("device index %d out of range (0 to %d)" % (idx, MAX_DEVICES - 1))
        t.devices[idx] = p[8:].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    elif tag == T_MAPS:
        maps = []
        for line in p.decode("utf-8", "surrogateescape").splitlines():
            parts = line.split(None, 5)
            if len(parts) < 6:
                continue
            try:
                lo, hi = parts[0].split("-")
                maps.append((int(lo, 16), int(hi, 16), int(parts[2], 16), parts[5]))
            except ValueError:
                raise _Bad("line %r is not a mapping" % line[:80])
        t.maps = maps
    elif tag == T_SYMBOL:
        _need(p, 16, "record")
        a, line, flags = struct.unpack_from("<QiI", p)
        (fn, file, obj), _ = _cstrings(p[16:], 3)
        t.symbols[a] = (fn, file, line, obj)
        if flags:
            t.symbol_flags[a] = flags
    elif tag == T_PYMARKS:
        _need(p, 8, "record")
        sid, flags = struct.unpack_from("<II", p)
        t.pymarks[sid] = (flags, [bool(c) for c in p[8:]])
    elif tag == T_PYSTACK:
        _need(p, 8, "record")
        sid, nf = struct.unpack_from("<II", p)
        body = p[8:]
        _need(body, 6 * nf, "%d frames" % nf)   # a line and two NULs each at least
        q = 0
        frames = []
        for _ in range(nf):
            _need(body[q:], 4, "frame")
            (line,) = struct.unpack_from("<i", body, q)
            (fn, file), used = _cstrings(body[q + 4:], 2)
            q += 4 + used
            frames.append((fn, file, line))
        t.pystacks[sid] = frames


def load(path):
    """Reads a whole trace; raises report.ReportError (one line naming the
    file and the offset or field) when it is not one or is malformed."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise rpt.ReportError("cannot read %s: %s" % (path, e.strerror or e))
    with f:
        try:
            return _load(f, path)
        except OSError as e:
            raise rpt.ReportError("cannot read %s: %s" % (path, e.strerror or e))


def _load(f, path):
    n = os.fstat(f.fileno()).st_size
    head = f.read(HEADER.size)
    if len(head) < HEADER.size or head[:8] != MAGIC:
        raise rpt.ReportError("%s: not a spyreshim trace" % path)
    magic, version, pid, real, mono = HEADER.unpack_from(head, 0)
    if version not in tracecodec.VERSIONS:
        raise rpt.ReportError("%s: trace version %d is not understood (%s)" % (
            path, version, ", ".join(map(str, tracecodec.VERSIONS))))
    t = Trace()
    t.path, t.pid, t.start_realtime_ns, t.file_bytes = path, pid, real, n
    pos = HEADER.size
    # Read chunk by chunk, each chunk's events decoded into the columns at
    # once (no copy of the file, nor of all its events, beside them); a
    # chunk whose sizes run past the end of the file is the incomplete last
    # one of a crash, never an allocation of its size.
    cols = [array("Q"), array("Q"), array("Q"), array("B"), array("B"), array("Q"), array("I")]
    count = 0
    while pos + CHUNK.size <= n:
        ch = f.read(CHUNK.size)
        if len(ch) < CHUNK.size:
            break
        try:
            head = tracecodec.chunk_header(version, ch)
        except tracecodec.ChunkError as e:
            raise rpt.ReportError("%s: offset %d: chunk: %s" % (path, pos, e))
        nev, body_bytes, meta_bytes = head.nevents, head.body_bytes, head.meta_bytes
        end = pos + CHUNK.size + body_bytes + meta_bytes
        if not head.magic_ok or end > n:
            t.truncated = True
            break
        if nev:
            body = f.read(body_bytes)
            if len(body) < body_bytes:
                t.truncated = True
                break
            try:
                part = tracecodec.decode_chunk(version, head, body)
            except tracecodec.ChunkError as e:
                raise rpt.ReportError("%s: offset %d: chunk: %s" % (path, pos, e))
            for c, p in zip(cols, part):
                c.extend(p)
            del body, part
            count += nev
        meta = f.read(meta_bytes)
        if len(meta) < meta_bytes:
            t.truncated = True
            break
        _parse_meta(t, meta, pos + CHUNK.size + body_bytes, path)
        t.chunks += 1
        pos = end
    if pos < n and not t.truncated:
        t.truncated = True
    seq, addr, size, kind, dev, times, site = cols
    del cols
    # One thread's chunk is in order; several threads' chunks interleave.
    sorted_already = count < 2 or all(map(operator.lt, seq, itertools.islice(seq, 1, None)))
    if not sorted_already:
        order = sorted(range(count), key=seq.__getitem__)
        pick = [a.__getitem__ for a in (seq, addr, size, kind, dev, times, site)]
        seq, addr, size, kind, dev, times, site = (
            array(a.typecode, map(g, order))
            for a, g in zip((seq, addr, size, kind, dev, times, site), pick))
    t.seq, t.addr, t.size, t.kind, t.dev, t.time, t.site = seq, addr, size, kind, dev, times, site
    _validate_events(t)
    _drop_foreign_frees(t)
    return t


def _validate_events(t):
    """Every index an event carries, against what the file declares. A kind
    this reader does not know is kept and skipped by the views (the version
    rules: new kinds keep version 1); a device index is below 255 by its
    byte, and one without its record is shown as "device N"."""
    for d in set(t.dev):
        if d != DEVICE_NONE and d not in t.devices:
            t.devices.setdefault(d, "device %d" % d)


def _drop_foreign_frees(t):
    """Fork-aware accounting: a free of a block this trace never saw
    allocated (its parent process allocated it before fork(); this process,
    the child, freed it) is not subtracted from this process's live bytes:
    each process's file accounts what it allocated, and its peaks are its
    own. The frees are counted in t.foreign_frees / t.foreign_bytes. Memory
    proportional to the live set."""
    live = set()
    add, remove = live.add, live.remove
    drop = None
    for i, k, d, a in zip(itertools.count(), t.kind, t.dev, t.addr):
        if k == ALLOC:
            add(d << 64 | a)
        elif k == FREE:
            key = d << 64 | a
            if key in live:
                remove(key)
            else:
                if drop is None:
                    drop = []
                drop.append(i)
    t.foreign_frees = len(drop) if drop else 0
    t.foreign_bytes = sum(t.size[i] for i in drop) if drop else 0
    if not drop:
        return
    keep = bytearray(b"\1") * len(t.kind)
    for i in drop:
        keep[i] = 0
    for name in ("seq", "addr", "size", "kind", "dev", "time", "site"):
        a = getattr(t, name)
        setattr(t, name, array(a.typecode, itertools.compress(a, keep)))


# ------------------------------------------------------------------ replay

# Pseudo-devices of memory the shim passes through and watches (VMM,
# managed, host-pinned: tracefmt.h): their own peaks, never in the overall one.
PASSTHROUGH_DEVICES = (0xfb, 0xfc, 0xfd, 0xfe)


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
