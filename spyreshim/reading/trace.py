"""Reading a trace file (SPYRESHIM_TRACE; the layout is docs/trace-format.md,
written by shim/trace/tracefile.c) and replaying it: live memory at any
event, the peak, per-site totals.

Streams: `stream(path)` reads the metadata (sites, stacks, names, devices:
a first pass over the chunk headers and metadata records that seeks over
the event bodies), and `Trace.batches()` then delivers the events in
sequence order, in batches of columns, decoding one chunk at a time and
merging the chunks of several threads by their seq_base (only the chunks
that overlap the merge's frontier are in memory). Memory is proportional to
the live set, the sites and the largest chunk, never to the number of events.
`load(path)` keeps every event in columns (tests and small files).

Owns the parsing and the replay only; the views are tracepeak.py (peak
flame graph and stats text), timeline.py (the HTML timeline),
memoryviz.py (PyTorch's memory_viz snapshot), gcview.py, pprof.py and
diff.py; each makes one or two passes of batches(). Stdlib only, with a
vectorized path when numpy is importable (the merge's sort, the foreign
frees, the running sums: `np` below; SPYRESHIM_NO_NUMPY=1 turns it off);
both paths give the same events and figures. A trace cut by a crash ends
with an incomplete chunk: it is dropped and `truncated` says so.
"""

import bisect
import builtins
import itertools
import operator
import os
import struct
from array import array

from . import elfsyms
from . import report as rpt
from . import tracecodec

# numpy when importable (Debian's python3-numpy; scripts/deps.sh), else None:
# every user checks `trace.np` at the start of a pass, so that a test can
# set it to None and compare both paths in one process.
np = None
if not os.environ.get("SPYRESHIM_NO_NUMPY"):
    try:
        import numpy as np
    except ImportError:
        np = None

MAGIC = b"SPYTRACE"
CHUNK_MAGIC = 0x4B4E4843
HEADER = struct.Struct("<8sIIQQ")
CHUNK = struct.Struct("<IIIIQQ")
META = struct.Struct("<II")

ALLOC, FREE, OOM, PRESSURE_BEGIN, PRESSURE_END, GC = 1, 2, 3, 4, 5, 6
SEGMENT_ALLOC, SEGMENT_FREE = 7, 8   # a region reserved / released (views: memoryviz.py)
SHUTDOWN = 10    # the interpreter began to shut down (report --diff's last moment: diff.py)
KIND_NAMES = {ALLOC: "alloc", FREE: "free", OOM: "oom", PRESSURE_BEGIN: "pressure",
              PRESSURE_END: "pressure end", GC: "collection", SEGMENT_ALLOC: "segment alloc",
              SEGMENT_FREE: "segment free", 9: "pool trim", SHUTDOWN: "shutdown"}
MARKERS = (OOM, PRESSURE_BEGIN, PRESSURE_END, GC)
DEVICE_NONE = 0xFF
MAX_DEVICES = 0xFF      # an event names its device in one byte; 0xFF is "none"
SIZE_MASK = (1 << 48) - 1

(T_SITE, T_NSTACK, T_DEVICE, T_MAPS, T_SYMBOL, T_PYSTACK, T_PYMARKS, T_STATE, T_PROCESS,
 T_CAPACITY) = range(1, 11)
STATE_RECORDING, STATE_ENDED, STATE_SIGNALLED = 1, 2, 3
# The process record's keys whose values are numbers (the others: text).
PROCESS_NUMBERS = ("rank", "local_rank", "world_size", "restart")


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
    """A trace's header and metadata (sites, stacks, names, devices) and
    its chunk index; its events, in allocator order (by sequence number),
    come from batches() as parallel arrays: seq, addr, size, kind, dev,
    time (ns since start), site. After load() the same arrays hold every
    event (t.kind, t.size, ...)."""

    def __init__(self):
        self.path = None
        self.pid = None
        self.start_realtime_ns = 0
        self.truncated = False
        # Whether the file reached its process's exit: None when it does
        # not say (written before state records existed), False when it
        # stopped before (killed, _exit, exec, a failed write).
        self.ended = None
        # The signal whose default action ended the process (SIGTERM: the
        # shim flushed first), else None.
        self.signal = None
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
        # The launcher's identity (rank, local_rank, world_size, restart:
        # int; run_id, host: str), what the process record holds.
        self.process = {}
        self.capacity = {}   # device index -> bytes the program may have there
        self.maps = []       # (start, end, offset, path) of executable mappings
        self.foreign_frees = 0   # frees of blocks allocated before fork() (not counted)
        self.foreign_bytes = 0
        self._frames = {}
        self.version = 1
        # The chunk index of the first pass: file offset, seq_base and event
        # count of each chunk (20 bytes a chunk of up to 8192 events).
        self._offsets = array("Q")
        self._bases = array("Q")
        self._counts = array("I")
        self.raw_events = 0      # events the chunks hold, foreign frees included
        self._loaded = False     # load(): the columns below hold every event
        self._count = None       # events after a whole pass (foreign frees dropped)

    def __len__(self):
        if self._loaded:
            return len(self.kind)
        if self._count is None:
            for _b in self.batches():
                pass
        return self._count

    def batches(self, size=None):
        """The events in sequence order, foreign frees dropped: Batch
        objects of columns. A pass over the file (or over load()'s columns);
        each pass counts the foreign frees again."""
        if self._loaded:
            return _memory_batches(self, size or BATCH)
        return _file_batches(self)

    # ------------------------------------------------------------ frames

    def _module(self, a):
        for start, end, off, path in self.maps:
            if start <= a < end:
                return path, a - start + off
        return None, None

    def native_frame(self, a):
        """Report frame of return address `a`: the process's own names (its
        symbol record), else, for a frame it did not name, the function of
        the object's symbol tables (.symtab, .dynsym) that holds it, read
        from the file the module map names (elfsyms.py)."""
        s = self.symbols.get(a)
        path, off = self._module(a)
        if s:
            fn, file, line, obj = s
            if not fn:
                fn = elfsyms.function_at(path, off)
            return {"kind": "native", "function": fn or None, "file": file or None,
                    "line": line or None, "object": obj or None, "address": "0x%x" % a,
                    "offset": "0x%x" % off if obj and off is not None else None}
        return {"kind": "native", "function": elfsyms.function_at(path, off), "file": None,
                "line": None, "object": path, "address": "0x%x" % a,
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
        """One line naming a site: its innermost frame in the user's own code
        (report.label_of; the views use callorder.label, which also
        knows the call order)."""
        return rpt.label_of(self.frames(site)) or "[no stack recorded]"

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
              T_PYMARKS: "python stack marks", T_STATE: "state", T_PROCESS: "process",
              T_CAPACITY: "device capacity"}


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
    elif tag == T_CAPACITY:
        _need(p, 16, "record")
        idx, _, cap = struct.unpack_from("<IIQ", p)
        if idx >= MAX_DEVICES:
            raise _Bad("device index %d out of range (0 to %d)" % (idx, MAX_DEVICES - 1))
        t.capacity[idx] = cap
    elif tag == T_PROCESS:
        words, _ = _cstrings(p, p.count(b"\0") & ~1)
        out = {}
        for key, value in zip(words[::2], words[1::2]):
            if key in PROCESS_NUMBERS:
                if not (value.isascii() and value.isdigit()) or len(value) > 20:
                    raise _Bad("%s %r is not a number" % (key, value[:40]))
                value = int(value)
            out[key] = value
        t.process = out
    elif tag == T_PYMARKS:
        _need(p, 8, "record")
        sid, flags = struct.unpack_from("<II", p)
        t.pymarks[sid] = (flags, [bool(c) for c in p[8:]])
    elif tag == T_STATE:
        _need(p, 4, "record")
        (state,) = struct.unpack_from("<I", p)
        if state == STATE_RECORDING:
            t.ended = False
        elif state == STATE_ENDED:
            t.ended = True
        elif state == STATE_SIGNALLED:
            _need(p, 8, "record")
            t.ended = False
            t.signal = struct.unpack_from("<I", p, 4)[0]
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


# ------------------------------------------------------------------ codec

# Per-chunk decoding of every version the reader knows (tracecodec.py):
# chunk_header(version, b) -> ChunkHead, decode_chunk(version, head, body)
# -> the columns seq, addr, size, kind, dev, time, site; ChunkError.
_codec = tracecodec

# A chunk holds one thread's buffer (8192 events, tracebuf.c) or a flush's
# part of it; more than this is a crafted file, refused in one line rather
# than decoded into columns of its size.
MAX_CHUNK_EVENTS = 1 << 20
BATCH = 1 << 16          # events per batch of an in-memory trace


def load(path):
    """Reads a whole trace into columns (t.kind, t.size, ...: tests and
    small files; the views stream with stream()); raises
    report.ReportError (one line naming the file and the offset or field)
    when it is not one or is malformed."""
    t = stream(path)
    cols = [array("Q"), array("Q"), array("Q"), array("B"), array("B"), array("Q"), array("I")]
    for b in t.batches():
        for c, part in zip(cols, (b.seq, b.addr, b.size, b.kind, b.dev, b.time, b.site)):
            c.extend(part)
    t.seq, t.addr, t.size, t.kind, t.dev, t.time, t.site = cols
    t._loaded = True
    return t


def stream(path):
    """The trace's header and metadata (first pass: chunk headers and
    metadata records, event bodies skipped); its events come from
    t.batches(). Raises report.ReportError as load() does."""
    try:
        f = builtins.open(path, "rb")
    except OSError as e:
        raise rpt.ReportError("cannot read %s: %s" % (path, e.strerror or e))
    with f:
        try:
            return _scan(f, path)
        except OSError as e:
            raise rpt.ReportError("cannot read %s: %s" % (path, e.strerror or e))


def _head(f, path, pos, n, t):
    """The chunk header at pos as a ChunkHead, or None at the cut end."""
    ch = f.read(_codec.CHUNK_BYTES)
    if len(ch) < _codec.CHUNK_BYTES:
        return None
    try:
        head = _codec.chunk_header(t.version, ch)
    except _codec.ChunkError as e:
        raise rpt.ReportError("%s: offset %d: chunk: %s" % (path, pos, e))
    if not head.magic_ok or pos + _codec.CHUNK_BYTES + head.body_bytes + head.meta_bytes > n:
        return None
    return head


def _scan(f, path):
    n = os.fstat(f.fileno()).st_size
    head = f.read(HEADER.size)
    if len(head) < HEADER.size or head[:8] != MAGIC:
        raise rpt.ReportError("%s: not a spyreshim trace" % path)
    magic, version, pid, real, mono = HEADER.unpack_from(head, 0)
    if version not in _codec.VERSIONS:
        raise rpt.ReportError("%s: trace version %d is not understood (%s)" % (
            path, version, " or ".join(str(v) for v in _codec.VERSIONS)))
    t = Trace()
    t.path, t.pid, t.start_realtime_ns, t.file_bytes, t.version = path, pid, real, n, version
    pos = HEADER.size
    # A chunk whose sizes run past the end of the file is the incomplete
    # last one of a crash, never an allocation of its size.
    while pos + _codec.CHUNK_BYTES <= n:
        h = _head(f, path, pos, n, t)
        if h is None:
            t.truncated = True
            break
        if h.nevents > MAX_CHUNK_EVENTS:
            raise rpt.ReportError("%s: offset %d: chunk of %d events (a chunk holds at most %d)"
                                  % (path, pos, h.nevents, MAX_CHUNK_EVENTS))
        body_at = pos + _codec.CHUNK_BYTES
        if h.nevents:
            t._offsets.append(pos)
            t._bases.append(h.seq_base)
            t._counts.append(h.nevents)
            t.raw_events += h.nevents
        if h.meta_bytes:
            f.seek(body_at + h.body_bytes)
            meta = f.read(h.meta_bytes)
            if len(meta) < h.meta_bytes:
                t.truncated = True
                break
            _parse_meta(t, meta, body_at + h.body_bytes, path)
        else:
            f.seek(body_at + h.body_bytes)
        t.chunks += 1
        pos = body_at + h.body_bytes + h.meta_bytes
    if pos < n and not t.truncated:
        t.truncated = True
    return t


_TYPECODES = "QQQBBQI"
_NAMES = ("seq", "addr", "size", "kind", "dev", "time", "site")


def _dtypes():
    return (np.uint64, np.uint64, np.uint64, np.uint8, np.uint8, np.uint64, np.uint32)


class Batch(object):
    """Consecutive events in sequence order: columns of equal length, and
    `start`, the index (0-based, in the whole trace) of the first. The
    columns are arrays (b.seq, ...); the numpy path builds a batch from
    numpy columns and makes each array on first use; nd() gives the
    columns as numpy arrays (views of the arrays, no copy)."""
    __slots__ = ("start", "_a", "_nd")

    def __init__(self, start, cols, nd=None):
        self.start = start
        self._a = list(cols) if cols is not None else [None] * 7
        self._nd = nd

    def _col(self, i):
        a = self._a[i]
        if a is None:
            a = self._a[i] = array(_TYPECODES[i], self._nd[i].tobytes())
        return a

    seq = property(lambda self: self._col(0))
    addr = property(lambda self: self._col(1))
    size = property(lambda self: self._col(2))
    kind = property(lambda self: self._col(3))
    dev = property(lambda self: self._col(4))
    time = property(lambda self: self._col(5))
    site = property(lambda self: self._col(6))

    def nd(self):
        if self._nd is None:
            self._nd = tuple(np.frombuffer(a, dtype=dt) for a, dt in zip(self._a, _dtypes()))
        return self._nd

    def __len__(self):
        if self._nd is not None:
            return len(self._nd[3])
        return len(self._a[3])


def _memory_batches(t, size):
    cols = (t.seq, t.addr, t.size, t.kind, t.dev, t.time, t.site)
    n = len(t.kind)
    for lo in range(0, n, size):
        yield Batch(lo, [c[lo:lo + size] for c in cols])


def _file_batches(t):
    """One pass over the file: each chunk decoded when the merge reaches its
    seq_base (every event of a chunk has seq >= its base); the events below
    the next chunk's base are final and go out, sorted when several chunks
    hold some. A chunk is read again from its offset, header and body."""
    path = t.path
    try:
        f = builtins.open(path, "rb")
    except OSError as e:
        raise rpt.ReportError("cannot read %s: %s" % (path, e.strerror or e))
    with f:
        try:
            for b in _merge(t, f):
                yield b
        except OSError as e:
            raise rpt.ReportError("cannot read %s: %s" % (path, e.strerror or e))


def _read_chunk(t, f, pos):
    f.seek(pos)
    raw = f.read(_codec.CHUNK_BYTES)
    try:
        head = _codec.chunk_header(t.version, raw) if len(raw) == _codec.CHUNK_BYTES else None
    except _codec.ChunkError as e:
        raise rpt.ReportError("%s: offset %d: chunk: %s" % (t.path, pos, e))
    body = f.read(head.body_bytes) if head is not None else b""
    if head is None or len(body) < head.body_bytes:
        raise rpt.ReportError("%s: offset %d: chunk cut short (the file changed while it was "
                              "read)" % (t.path, pos))
    try:
        cols = _codec.decode_chunk(t.version, head, body)
    except _codec.ChunkError as e:
        raise rpt.ReportError("%s: offset %d: chunk: %s" % (t.path, pos, e))
    except (struct.error, ValueError, IndexError) as e:
        raise rpt.ReportError("%s: offset %d: chunk: malformed (%s)" % (t.path, pos, e))
    del body
    seq = cols[0]
    if len(seq) != head.nevents:
        raise rpt.ReportError("%s: offset %d: chunk: %d events decoded, the header says %d"
                              % (t.path, pos, len(seq), head.nevents))
    cols = list(cols)
    # A thread appends in its own order, which is not always sequence order
    # (an allocation takes its number under the allocator's lock and is
    # appended after it: the frees of a collection it set off, appended
    # first, can carry higher numbers). Sorted here, checked in C.
    if np is not None:
        nd = [np.frombuffer(c, dtype=dt) for c, dt in zip(cols, _dtypes())]
        if len(seq) > 1 and (nd[0][1:] < nd[0][:-1]).any():
            order = np.argsort(nd[0], kind="stable")
            nd = [c[order] for c in nd]
        return [nd, 0, None]
    if len(seq) > 1:
        ordered = array(seq.typecode, sorted(seq))
        if ordered != seq:
            cols = _sort_rows(cols)
    return [cols, 0, None]


def _sort_rows(cols):
    """The columns' rows sorted by the first column (seq): the order of
    the rows (timsort merges the threads' sorted runs), then each column
    gathered by one itemgetter (C loops; half the time of sorting rows as
    tuples)."""
    seq = cols[0]
    order = sorted(range(len(seq)), key=seq.__getitem__)
    if len(order) == 1:
        return cols
    pick = operator.itemgetter(*order)
    return [array(c.typecode, pick(c)) for c in cols]


_INF = 1 << 64
_PENDING = 1 << 15       # events the merge gathers before it sorts and emits


def _merge(t, f):
    if np is not None:
        for b in _merge_np(t, f):
            yield b
        return
    order = sorted(range(len(t._bases)), key=t._bases.__getitem__)
    bases = [t._bases[i] for i in order]
    offsets = [t._offsets[i] for i in order]
    del order
    nch = len(bases)
    active = []          # [columns, first event not emitted, largest seq]
    nxt = 0
    start = 0
    foreign = _Foreign()
    while nxt < nch or active:
        # Activate the next chunks: always while the next one starts at or
        # below the smallest event not emitted (else nothing could go out),
        # and while fewer than _PENDING events wait (fewer, larger batches).
        pending = sum(len(c[0]) - p for c, p, _top in active)
        head = min(c[0][p] for c, p, _top in active) if active else _INF
        while nxt < nch and (bases[nxt] <= head or pending < _PENDING):
            ch = _read_chunk(t, f, offsets[nxt])
            nxt += 1
            seq = ch[0][0]
            if len(seq):
                active.append(ch)
                pending += len(seq)
                head = min(head, seq[0])
        bound = bases[nxt] if nxt < nch else _INF
        parts = []
        for a in active:
            cols, p, top = a
            if top is None:
                top = a[2] = max(cols[0])
            q = len(cols[0]) if top < bound else bisect.bisect_left(cols[0], bound, p)
            if q > p:
                parts.append([c[p:q] if (p or q < len(c)) else c for c in cols])
                a[1] = q
        active = [a for a in active if a[1] < len(a[0][0])]
        if not parts:
            continue
        if len(parts) == 1:
            out = parts[0]
        else:
            out = [array(c.typecode) for c in parts[0]]
            for part in parts:
                for c, x in zip(out, part):
                    c.extend(x)
            out = _sort_rows(out)
        del parts
        out = foreign.drop(out)
        if out is None:
            continue
        b = Batch(start, out)
        start += len(b)
        _name_devices(t, b.dev)
        yield b
    t._count = start
    t.foreign_frees, t.foreign_bytes = foreign.count, foreign.bytes


def _name_devices(t, dev):
    """A device index is below 255 by its byte; one without its device
    record is shown as "device N" (a kind this reader does not know is kept
    and skipped by the views: the version rules)."""
    d0 = dev[0]
    if dev.count(d0) == len(dev):
        if d0 != DEVICE_NONE and d0 not in t.devices:
            t.devices[d0] = "device %d" % d0
        return
    for d in set(dev):
        if d != DEVICE_NONE and d not in t.devices:
            t.devices[d] = "device %d" % d




def _order(seq):
    """The order that sorts seq (numpy; its values distinct): when they are
    consecutive numbers, as the shim numbers its events, each one's place
    is its value less the smallest (one scatter); else a stable argsort."""
    n = len(seq)
    lo = int(seq.min())
    if int(seq.max()) - lo == n - 1:
        at = (seq - np.uint64(lo)).astype(np.intp)
        o = np.full(n, -1, dtype=np.intp)
        o[at] = np.arange(n, dtype=np.intp)
        if not (o < 0).any():       # n distinct places: a permutation
            return o
    return np.argsort(seq, kind="stable")


def _merge_np(t, f):
    """_merge with numpy columns: the same frontier, the parts of several
    chunks joined and put in order by one stable argsort of seq, the
    foreign frees found per batch (_ForeignNp)."""
    order = sorted(range(len(t._bases)), key=t._bases.__getitem__)
    bases = [t._bases[i] for i in order]
    offsets = [t._offsets[i] for i in order]
    del order
    nch = len(bases)
    active = []          # [numpy columns, first event not emitted, largest seq]
    nxt = 0
    start = 0
    foreign = _ForeignNp()
    while nxt < nch or active:
        pending = sum(len(c[0]) - p for c, p, _top in active)
        head = min(int(c[0][p]) for c, p, _top in active) if active else _INF
        while nxt < nch and (bases[nxt] <= head or pending < _PENDING):
            ch = _read_chunk(t, f, offsets[nxt])
            nxt += 1
            seq = ch[0][0]
            if len(seq):
                active.append(ch)
                pending += len(seq)
                head = min(head, int(seq[0]))
        bound = bases[nxt] if nxt < nch else _INF
        parts = []
        for a in active:
            cols, p, top = a
            if top is None:
                top = a[2] = int(cols[0][-1])     # sorted: the last is the largest
            if top < bound:
                q = len(cols[0])
            else:
                q = p + int(np.searchsorted(cols[0][p:], np.uint64(bound), "left"))
            if q > p:
                parts.append([c[p:q] for c in cols])
                a[1] = q
        active = [a for a in active if a[1] < len(a[0][0])]
        if not parts:
            continue
        if len(parts) == 1:
            out = parts[0]
        else:
            out = [np.concatenate([part[i] for part in parts]) for i in range(7)]
            out = [c[o] for o in (_order(out[0]),) for c in out]
        del parts
        out = foreign.drop(out)
        if out is None:
            continue
        b = Batch(start, None, tuple(out))
        start += len(b)
        for d in np.flatnonzero(np.bincount(out[4], minlength=256)).tolist():
            if d != DEVICE_NONE and d not in t.devices:
                t.devices[d] = "device %d" % d
        yield b
    t._count = start
    t.foreign_frees, t.foreign_bytes = foreign.count, foreign.bytes


class _Foreign(object):
    """Fork-aware accounting: a free of a block this trace never saw
    allocated (its parent process allocated it before fork(); this process,
    the child, freed it) is not subtracted from this process's live bytes:
    each process's file accounts what it allocated, and its peaks are its
    own. Such frees are dropped from the stream and counted. Memory: the
    live blocks' keys, one set per device."""

    def __init__(self):
        self.live = {}
        self.count = 0
        self.bytes = 0

    def drop(self, cols):
        seq, addr, size, kind, dev, times, site = cols
        n = len(kind)
        d0 = dev[0]
        if d0 == DEVICE_NONE:
            d0 = next((d for d in dev if d != DEVICE_NONE), DEVICE_NONE)
        one = dev.count(d0) + (dev.count(DEVICE_NONE) if d0 != DEVICE_NONE else 0) == n
        drop = self._loop(addr, kind, dev, d0 if one else None)
        if not drop:
            return cols
        drop.sort()
        self.count += len(drop)
        self.bytes += sum(size[i] for i in drop)
        if len(drop) == n:
            return None
        keep = bytearray(b"\1") * n
        for i in drop:
            keep[i] = 0
        return [array(c.typecode, itertools.compress(c, keep)) for c in cols]

    def _loop(self, addr, kind, dev, d0):
        drop = None
        if d0 is not None:
            live = self.live.get(d0)
            if live is None:
                live = self.live[d0] = set()
            add, remove = live.add, live.remove
            # The index of a foreign free from the kind iterator's position
            # (its __reduce__), so the loop carries no counter: a quarter
            # of its time.
            kit = iter(kind)
            it = zip(kit, addr)
            while True:
                try:
                    for k, a in it:
                        if k == ALLOC:
                            add(a)
                        elif k == FREE:
                            remove(a)
                    return drop
                except KeyError:
                    if drop is None:
                        drop = []
                    drop.append(kit.__reduce__()[2] - 1)
        lives = self.live
        for i, k, d, a in zip(itertools.count(), kind, dev, addr):
            if k == ALLOC:
                live = lives.get(d)
                if live is None:
                    live = lives[d] = set()
                live.add(a)
            elif k == FREE:
                live = lives.get(d)
                if live is not None and a in live:
                    live.remove(a)
                else:
                    if drop is None:
                        drop = []
                    drop.append(i)
        return drop


class _ForeignNp(_Foreign):
    """_Foreign with numpy, batch by batch: the live blocks' addresses per
    device as a sorted array. A free is foreign when the event before it
    on its address (in this batch, else the live set before the batch) is
    not an allocation: after an allocation the address is live, after a
    free it is not (a foreign free leaves it not live), whatever came
    before; so one stable sort by address tells every event's predecessor.
    The counts are _Foreign's; `live` holds a sorted array per device."""

    def drop(self, cols):
        seq, addr, size, kind, dev, times, site = cols
        n = len(kind)
        af = np.flatnonzero((kind == ALLOC) | (kind == FREE))
        if not len(af):
            return cols
        # The devices as _Foreign sees them: a batch of one device (and
        # events of none) keeps every block in that device's set.
        d0 = int(dev[0])
        if d0 == DEVICE_NONE:
            other = np.flatnonzero(dev != DEVICE_NONE)
            d0 = int(dev[other[0]]) if len(other) else DEVICE_NONE
        nd0 = int(np.count_nonzero(dev == d0))
        one = nd0 + (int(np.count_nonzero(dev == DEVICE_NONE)) if d0 != DEVICE_NONE else 0) == n
        if one:
            groups = [(d0, af)]
        else:
            da = dev[af]
            groups = [(d, af[da == d]) for d in np.unique(da).tolist()]
        drops = []
        for d, sel in groups:
            got = self._device(d, addr[sel], kind[sel])
            if got is not None:
                drops.append(sel[got])
        if not drops:
            return cols
        drop = np.concatenate(drops) if len(drops) > 1 else drops[0]
        self.count += len(drop)
        self.bytes += sum(size[drop].tolist())
        if len(drop) == n:
            return None
        keep = np.ones(n, dtype=bool)
        keep[drop] = False
        return [c[keep] for c in cols]

    def _device(self, d, a, k):
        """Indices (into a) of the foreign frees among one device's
        allocations and frees a, k (in sequence order); the device's live
        set moved past them."""
        live = self.live.get(d)
        if live is None:
            live = np.zeros(0, dtype=np.uint64)
        o = np.argsort(a, kind="stable")
        sa, sk = a[o], k[o]
        m = len(sa)
        first = np.ones(m, dtype=bool)
        first[1:] = sa[1:] != sa[:-1]
        last = np.ones(m, dtype=bool)
        last[:-1] = first[1:]
        # Each address's first event here: live before it when the set
        # holds the address; every other event: when the one before it on
        # its address is an allocation.
        firsts = np.flatnonzero(first)
        ua = sa[firsts]
        pos = np.searchsorted(live, ua)
        if len(live):
            was = live[np.minimum(pos, len(live) - 1)] == ua
        else:
            was = np.zeros(len(ua), dtype=bool)
        before = np.empty(m, dtype=bool)       # live just before each event
        before[1:] = sk[:-1] == ALLOC
        before[firsts] = was
        bad = (sk == FREE) & ~before
        # The addresses this batch touched leave the set; those whose last
        # event is an allocation go back in.
        gone = pos[was]
        if len(gone):
            keep = np.ones(len(live), dtype=bool)
            keep[gone] = False
            live = live[keep]
        add = sa[last & (sk == ALLOC)]
        if len(add):
            live = np.insert(live, np.searchsorted(live, add), add)
        self.live[d] = live
        if not bad.any():
            return None
        return np.sort(o[bad])


# ------------------------------------------------------------------ replay

# Pseudo-devices of memory the shim passes through and watches (VMM,
# managed, host-pinned: tracefmt.h): their own peaks, never in the overall one.
PASSTHROUGH_DEVICES = (0xf9, 0xfa, 0xfb, 0xfc, 0xfd, 0xfe)


class Peak(object):
    """Where live bytes were highest: overall (all devices together) and
    per device, with the event index at which each was reached."""

    def __init__(self):
        self.bytes = 0
        self.index = -1
        self.per_device = {}   # dev -> (bytes, index)


# Each event's change of live bytes, by kind: +size for an allocation,
# -size for a free, 0 for the rest.
_SIGN = bytes([0, 1, 0xFF] + [0] * 253)     # as signed chars: 0, +1, -1
_NOT_PASSTHROUGH = bytes(0 if d in PASSTHROUGH_DEVICES else 1 for d in range(256))


if np is not None:
    _SIGN_NP = np.frombuffer(_SIGN, dtype=np.int8).astype(np.int64)
    _NOT_PASSTHROUGH_NP = np.frombuffer(_NOT_PASSTHROUGH, dtype=np.uint8).astype(bool)


def deltas_np(np, kind, size, dev):
    """deltas then served, with numpy: int64 of the changes of live bytes
    of a batch's columns, the pass-through pseudo-devices' zeroed."""
    d = size.astype(np.int64)
    d *= _SIGN_NP[kind]
    served = _NOT_PASSTHROUGH_NP[dev]
    if not served.all():
        d *= served
    return d


def deltas(b):
    """array('q') of the batch's changes of live bytes (alloc +size, free
    -size, other kinds 0), every device (a numpy int64 array on the numpy
    path: for served() and PeakTracker.feed)."""
    if np is not None:
        nd = b.nd()
        d = nd[2].astype(np.int64)
        d *= _SIGN_NP[nd[3]]
        return d
    sign = array("b")
    sign.frombytes(b.kind.tobytes().translate(_SIGN))
    return array("q", map(operator.mul, b.size, sign))


def served(b, d):
    """The deltas d with the pass-through pseudo-devices' events zeroed
    (they have their own peaks and stay out of the overall one)."""
    if not isinstance(d, array):
        served = _NOT_PASSTHROUGH_NP[b.nd()[4]]
        return d if served.all() else d * served
    dev = b.dev
    if not any(dev.count(p) for p in PASSTHROUGH_DEVICES):
        return d
    return array("q", map(operator.mul, d, dev.tobytes().translate(_NOT_PASSTHROUGH)))


def devices_of(b):
    """The devices of a batch's events (DEVICE_NONE left out): one C pass
    when there is a single one, the usual case."""
    if np is not None:
        return tuple(x for x in np.flatnonzero(np.bincount(b.nd()[4], minlength=256)).tolist()
                     if x != DEVICE_NONE)
    dev = b.dev
    d0 = dev[0]
    if d0 == DEVICE_NONE:
        d0 = next((d for d in dev if d != DEVICE_NONE), DEVICE_NONE)
        if d0 == DEVICE_NONE:
            return ()
    if dev.count(d0) + (dev.count(DEVICE_NONE)) == len(dev):
        return (d0,)
    return tuple(sorted(set(dev) - {DEVICE_NONE}))


def _only(b, d, dv):
    """The deltas d with every event not on device dv zeroed."""
    if not isinstance(d, array):
        return d * (b.nd()[4] == dv)
    table = bytearray(256)
    table[dv] = 1
    return array("q", map(operator.mul, d, b.dev.tobytes().translate(table)))


def _curve_max(d, initial):
    """(last, max, index of the first max) of the running sum of d from
    initial; index -1 when no partial sum exceeds initial."""
    if not isinstance(d, array):
        cum = np.cumsum(d)
        cum += initial
        i = int(np.argmax(cum))
        m = int(cum[i])
        if m > initial:
            return int(cum[-1]), m, i
        return int(cum[-1]), initial, -1
    cum = array("q", itertools.accumulate(d, initial=initial))
    m = max(cum)
    i = cum.index(m) - 1 if m > initial else -1
    return cum[-1], m, i


class PeakTracker(object):
    """peaks() batch by batch, for a view that makes its own pass."""

    def __init__(self):
        self.p = Peak()
        self.per = {}       # dev -> live bytes now
        self.best = {}      # dev -> (peak bytes, index)
        self.total = 0
        self.p.per_device = self.best

    def feed(self, b, d):
        """Batch b with its deltas d (deltas(b))."""
        p = self.p
        before = self.total
        sd = served(b, d)
        self.total, tm, ti = _curve_max(sd, before)
        if ti >= 0 and tm > p.bytes:
            p.bytes, p.index = tm, b.start + ti
        devs = devices_of(b)
        per, best = self.per, self.best
        for dv in devs:
            if len(devs) == 1 and sd is d and per.get(dv, 0) == before:
                # One device holding all that is live: its curve is the total's.
                per[dv], m, i = self.total, tm, ti
            else:
                dd = d if len(devs) == 1 else _only(b, d, dv)
                per[dv], m, i = _curve_max(dd, per.get(dv, 0))
            if i >= 0 and m > best.get(dv, (0, -1))[0]:
                best[dv] = (m, b.start + i)


def peaks(t):
    """Replays the trace once; live bytes after each event, in allocator
    order. The per-device peak is what the shim's peak_used_bytes counts."""
    pt = PeakTracker()
    for b in t.batches():
        pt.feed(b, deltas(b))
    return pt.p


def live_sets(t, wants):
    """What was live just after each event index of wants [(index,
    device or None)], in one pass: [{(dev, addr): (size, site, index)}]."""
    out = [None] * len(wants)
    order = sorted(range(len(wants)), key=lambda j: wants[j][0])
    lives = {}     # dev -> {addr: (size, site, index)}
    w = 0
    while w < len(order) and wants[order[w]][0] < 0:
        out[order[w]] = {}
        w += 1
    if w < len(order):
        for b in t.batches():
            n, start = len(b), b.start
            lo = 0
            while w < len(order) and wants[order[w]][0] < start + n:
                hi = wants[order[w]][0] - start + 1
                _replay(lives, b, lo, hi)
                lo = hi
                while w < len(order) and wants[order[w]][0] < start + hi:
                    out[order[w]] = _live_dict(lives, wants[order[w]][1])
                    w += 1
            if w == len(order):
                break
            _replay(lives, b, lo, n)
    while w < len(order):      # past the last event: the end
        out[order[w]] = _live_dict(lives, wants[order[w]][1])
        w += 1
    return out


def _live_dict(lives, device):
    out = {}
    for d, live in lives.items():
        if device is None or d == device:
            for a, v in live.items():
                out[(d, a)] = v
    return out


def _replay_np(lives, b, lo, hi):
    """_replay with numpy: per address, only its last allocation or free
    matters, and where it lands in the dict's order: an address freed in
    the range (or new) and allocated again goes to the end, in the order
    of its first allocation after its last free, as the per-event loop
    leaves it."""
    seq, addr, size, kind, dev, _tm, site = (c[lo:hi] for c in b.nd())
    af = np.flatnonzero((kind == ALLOC) | (kind == FREE))
    if not len(af):
        return
    devs = devices_of(b)
    if len(devs) == 1:
        groups = [(devs[0], af)]
    else:
        da = dev[af]
        groups = [(d, af[da == d]) for d in np.unique(da).tolist()]
    for d, sel in groups:
        live = lives.get(d)
        if live is None:
            live = lives[d] = {}
        a, k = addr[sel], kind[sel]
        o = np.argsort(a, kind="stable")
        sa, sk, si = a[o], k[o], sel[o]
        m = len(sa)
        first = np.ones(m, dtype=bool)
        first[1:] = sa[1:] != sa[:-1]
        starts = np.flatnonzero(first)
        ends = np.append(starts[1:], m) - 1            # each address's last event
        gid = np.cumsum(first) - 1                      # each event's address
        isfree = sk == FREE
        # The last free of each address (-1: none), then the first
        # allocation after it (the group's first allocation when none).
        fpos = np.where(isfree, np.arange(m), -1)
        lastfree = np.maximum.reduceat(fpos, starts)
        after = (~isfree) & (np.arange(m) > lastfree[gid])
        apos = np.where(after, np.arange(m), m)
        firstalloc = np.minimum.reduceat(apos, starts)
        ua = sa[starts].tolist()
        freed = (lastfree >= 0).tolist()
        alive = (sk[ends] == ALLOC).tolist()
        lastev = si[ends]
        vals = list(zip(size[lastev].tolist(), site[lastev].tolist(),
                        (lastev + (b.start + lo)).tolist()))
        reborn = []
        for g, x in enumerate(ua):
            if freed[g]:
                live.pop(x, None)
            if alive[g]:
                if x in live:
                    live[x] = vals[g]
                else:
                    reborn.append(g)
        if reborn:
            at = si[firstalloc[reborn]].tolist()
            for _i, g in sorted(zip(at, reborn)):
                live[ua[g]] = vals[g]


def _replay(lives, b, lo, hi):
    """Events [lo, hi) of batch b into lives (dev -> {addr: (size, site,
    index)})."""
    if hi <= lo:
        return
    if np is not None:
        _replay_np(lives, b, lo, hi)
        return
    kind, addr, size, site = b.kind[lo:hi], b.addr[lo:hi], b.size[lo:hi], b.site[lo:hi]
    devs = devices_of(b)
    idx = itertools.count(b.start + lo)
    if len(devs) == 1:
        live = lives.get(devs[0])
        if live is None:
            live = lives[devs[0]] = {}
        pop = live.pop
        for i, k, a, s, st in zip(idx, kind, addr, size, site):
            if k == ALLOC:
                live[a] = (s, st, i)
            elif k == FREE:
                pop(a, None)
        return
    for i, k, d, a, s, st in zip(idx, kind, b.dev[lo:hi], addr, size, site):
        if k == ALLOC:
            live = lives.get(d)
            if live is None:
                live = lives[d] = {}
            live[a] = (s, st, i)
        elif k == FREE:
            live = lives.get(d)
            if live is not None:
                live.pop(a, None)


def live_at(t, index, device=None):
    """What was live just after event `index`: {(dev, addr): (size, site, index)}."""
    return live_sets(t, [(index, device)])[0]


def times_at(t, indices):
    """{index: ns since the trace began} of the events at those indices
    (an index below 0, before the first event: 0). One pass, stopped at
    the last index wanted."""
    want = sorted(set(i for i in indices if i >= 0))
    out = {i: 0 for i in indices if i < 0}
    w = 0
    if want:
        for b in t.batches():
            n = len(b)
            while w < len(want) and want[w] < b.start + n:
                out[want[w]] = b.time[want[w] - b.start]
                w += 1
            if w == len(want):
                break
    return out


def seconds(ns):
    """A moment of a trace as the views' titles give it: '1.234567 s'."""
    return "%.6f s" % (ns / 1e9)


def at_index(t, text):
    """An --at value as an event index: "2.5s" (the last event at or
    before that time), an event number (1-based; 0 is the start, before
    the first) or "end" (the last event). A moment past the end of the
    trace is refused in one line naming where the trace ends (it would
    read as "nothing grew")."""
    v = text.strip()
    if v == "end":
        return len(t) - 1
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
        raise rpt.ReportError("--at %r: not a time in seconds (\"2.5s\"), an event number "
                              "(0: before the first) or \"end\"" % text)
    if not v.endswith("s"):
        n = len(t)
        if k > n:
            raise rpt.ReportError("--at %s: past the end of %s (it has %d events; \"end\" is "
                                  "the last)" % (text, t.path, n))
        return k - 1
    i, last = -1, None
    for b in t.batches():
        tm = b.time
        if not len(tm):
            continue
        last = max(last or 0, max(tm))
        if max(tm) <= ns:
            i = b.start + len(tm) - 1
            continue
        for j, x in enumerate(tm):
            if x > ns:
                return b.start + j - 1
    if last is None or ns > last:
        raise rpt.ReportError("--at %s: past the end of %s (it ends at %s; \"end\" is its last "
                              "moment)" % (text, t.path, seconds(last or 0)))
    return i
