"""One chunk record of a trace file, version 1 or 2, decoded into columns
(the layout is docs/trace-format.md; the writer is shim/trace/tracefile.c
and tracecodec.c). trace.py reads the file and calls `chunk_header` then
`decode_chunk` for each chunk record.

Owns the chunk header and the events' encodings, nothing else: no file, no
metadata records, no order across chunks. Stdlib only, and every step runs
at C speed (strided slice assignment, bytes.count, zlib, array.frombytes),
never a Python loop per event: a reader of 10M events spends its time in
the views, not here. Raises ChunkError (a message without the file and
offset: the caller adds them) for a chunk that does not follow the format.
"""

import collections
import struct
import sys
import zlib
from array import array

VERSIONS = (1, 2)
CHUNK_BYTES = 32
CHUNK_MAGIC = 0x4B4E4843                # "CHNK"
CHUNK = struct.Struct("<IIIIQII")       # magic, nevents, meta, body, seq_base, thread, flags
EVENT_V1_BYTES = 32

FLAG_ZLIB = 1                           # version 2: the body is one zlib stream
FLAGS_KNOWN = FLAG_ZLIB
V2_MAX_EVENTS = 65536                   # in one chunk (the writer's hold 8192)
# Version 2's columns, in the body's order: name, width in bytes, typecode
# of the column returned.
V2_COLUMNS = (("kind", 1, "B"), ("dev", 1, "B"), ("site", 4, "I"), ("size", 8, "Q"),
              ("seq", 8, "Q"), ("time", 8, "Q"), ("addr", 8, "Q"))
V2_TABLE_BYTES = sum(1 + w for _, w, _ in V2_COLUMNS)   # 45
V2_PLANES = sum(w for _, w, _ in V2_COLUMNS)            # 38

_BIG = sys.byteorder == "big"
for _tc, _w in (("B", 1), ("I", 4), ("Q", 8)):
    if array(_tc).itemsize != _w:    # array's widths are the platform's C types
        raise ImportError("array(%r) is not %d bytes here" % (_tc, _w))

ChunkHead = collections.namedtuple(
    "ChunkHead", "magic_ok nevents body_bytes meta_bytes seq_base thread flags")


class ChunkError(ValueError):
    """A chunk record that does not follow the format: what is wrong."""


def chunk_header(version, b):
    """The 32 bytes of a chunk record's header. body_bytes is the length of
    the encoded events that follow it (version 1: 32 per event), so that a
    record is CHUNK_BYTES + body_bytes + meta_bytes long in every version;
    magic_ok false (or a record running past the end of the file) is the
    cut last chunk of a crash, for the caller to decide."""
    magic, nev, meta, body, base, thread, flags = CHUNK.unpack_from(b, 0)
    if version == 1:
        # Version 1 wrote zeros after meta_bytes and seq_base; the events
        # are 32 bytes each.
        return ChunkHead(magic == CHUNK_MAGIC, nev, nev * EVENT_V1_BYTES, meta, base, 0, 0)
    if magic == CHUNK_MAGIC:
        if flags & ~FLAGS_KNOWN:
            raise ChunkError("flags 0x%x not understood (known: 0x%x)" % (flags, FLAGS_KNOWN))
        if nev > V2_MAX_EVENTS:
            raise ChunkError("%d events, more than a chunk holds (%d)" % (nev, V2_MAX_EVENTS))
        if not nev and body:
            raise ChunkError("no events but %d bytes of them" % body)
    return ChunkHead(magic == CHUNK_MAGIC, nev, body, meta, base, thread, flags)


def decode_chunk(version, head, body):
    """The chunk's events as columns (arrays): seq Q, addr Q, size Q,
    kind B, dev B, time Q, site I, in the order the thread recorded them
    (sequence order within the chunk). body is exactly head.body_bytes."""
    if len(body) != head.body_bytes:
        raise ChunkError("%d bytes of events, the header says %d" % (len(body), head.body_bytes))
    if not head.nevents:
        return tuple(array(tc) for tc in "QQQBBQI")
    if version == 1:
        return _decode_v1(body, head.nevents, head.seq_base)
    return _decode_v2(body, head.nevents, head.flags)


def _decode_v1(ev, count, base):
    """Version 1: 32-byte events (addr u64, size|kind|dev u64, time u64,
    seq_lo u32, site u32), fields by strided byte slices."""
    words = array("Q")
    words.frombytes(ev)
    if _BIG:
        words.byteswap()
    addr = words[0::4]
    times = words[2::4]
    del words

    def field(offset, width, nbytes):
        out = bytearray(width * count)
        for b in range(nbytes):
            out[b::width] = ev[offset + b::32]
        a = array("Q" if width == 8 else "I")
        a.frombytes(out)
        if _BIG:
            a.byteswap()
        return a

    size = field(8, 8, 6)
    kind = array("B", ev[14::32])
    dev = array("B", ev[15::32])
    site = field(28, 4, 4)
    seq = field(24, 8, 4)   # the low 32 bits; the rest from the chunk's base
    # Events of one chunk lie within 2^31 of its base (tracefile.c).
    blo = base & 0xFFFFFFFF
    bhi = base - blo
    if not (bhi == 0 and min(seq) >= blo):   # else seq = seq_lo: no wrap
        for i in range(count):
            s = seq[i]
            seq[i] = bhi + s if s >= blo else bhi + (1 << 32) + s
    return seq, addr, size, kind, dev, times, site


def _decode_v2(body, count, flags):
    """Version 2: a table (per column: a mask of the byte planes stored,
    then the byte of each plane), then the stored planes, count bytes each;
    the whole a zlib stream when FLAG_ZLIB."""
    most = V2_TABLE_BYTES + V2_PLANES * count
    if flags & FLAG_ZLIB:
        # Inflated up to what count events can hold and no further: a small
        # stream cannot make the reader hold more than its events' columns.
        d = zlib.decompressobj()
        try:
            raw = d.decompress(body, most + 1)
        except zlib.error as e:
            raise ChunkError("bad zlib stream (%s)" % e)
        if len(raw) > most:
            raise ChunkError("the zlib stream holds more than %d events' columns" % count)
        if not d.eof:
            raise ChunkError("the zlib stream ends before its end")
        if d.unused_data:
            raise ChunkError("%d bytes after the zlib stream" % len(d.unused_data))
    else:
        raw = body
    if len(raw) < V2_TABLE_BYTES:
        raise ChunkError("the column table needs %d bytes, the events hold %d"
                         % (V2_TABLE_BYTES, len(raw)))
    stored = 0
    pos = 0
    for name, w, _ in V2_COLUMNS:
        mask = raw[pos]
        if mask >> w:
            raise ChunkError("%s column of %d byte(s): plane mask 0x%02x" % (name, w, mask))
        planes = bin(mask).count("1")
        # Every event has a sequence number of its own: a chunk stores the
        # planes to tell its events apart. That bounds what a few bytes of
        # a hostile file expand to (deflate's own ratio: about 1000).
        if name == "seq" and count > 256 ** planes:
            raise ChunkError("%d events in %d byte plane(s) of sequence numbers: they "
                             "cannot all differ" % (count, planes))
        # Sizes are 48 bits (the recorded event packs kind and device above
        # them): a higher plane would be a crafted size no view could sum.
        if name == "size" and (mask >> 6 or raw[pos + 7] or raw[pos + 8]):
            raise ChunkError("size column: sizes of 2^48 bytes or more")
        stored += planes
        pos += 1 + w
    if len(raw) != V2_TABLE_BYTES + stored * count:
        raise ChunkError("the columns hold %d bytes, %d events of %d stored planes need %d"
                         % (len(raw) - V2_TABLE_BYTES, count, stored, stored * count))
    mv = memoryview(raw)
    cols = {}
    pos = 0
    at = V2_TABLE_BYTES
    for name, w, tc in V2_COLUMNS:
        mask = raw[pos]
        consts = raw[pos + 1:pos + 1 + w]
        pos += 1 + w
        col = array(tc)
        if w == 1:
            if mask:
                col.frombytes(mv[at:at + count])
                at += count
            else:
                col.frombytes(bytes(consts) * count)
            cols[name] = col
            continue
        out = bytearray(w * count)
        for b in range(w):
            if mask >> b & 1:
                out[b::w] = mv[at:at + count]
                at += count
            elif consts[b]:
                out[b::w] = bytes(consts[b:b + 1]) * count
        col.frombytes(out)
        if _BIG:
            col.byteswap()
        cols[name] = col
    return (cols["seq"], cols["addr"], cols["size"], cols["kind"], cols["dev"], cols["time"],
            cols["site"])
