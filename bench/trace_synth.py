"""Writes a synthetic trace (docs/trace-format.md) of N events, in format
version 2 (the default) or 1, for the readers' time, memory and the file's
bytes per event at 1M and 10M events (bench/trace_read_memory.sh,
bench/trace_size.sh) and for the tests (tests/integration/test_trace_views.py,
test_trace_hostile.py, test_trace_format.py).

    python3 bench/trace_synth.py [--version 1|2] [--threads T] [--sites S] [--rank R]
                                 OUT.trace N

With --rank R (for the cross-rank report's cost, docs/cli.md): pid 4242 +
R, a process record (rank R of a world of R + 1 at least, run id "synth")
and a capacity record of 8 GiB for device 0; the seed is R + 1 unless given.

What it models, so that its bytes per event say something about real
traces: T threads (4) interleaving on one device, each running steps of a
training loop: a ramp of allocations (a forward pass) then their frees,
mostly in reverse order (the backward pass), over a few long-lived blocks
(weights); S allocation sites (48), a few of them hot (Zipf-like), each
with the size of its tensor (from a small set, one site in eight of
varying size); addresses from one allocator shared by the threads (blocks
reused last-freed-first per size, else cut from 256 MiB regions, 512-byte
aligned); times a few microseconds apart (1.0 to 6 us, ns resolution, per
thread); sequence numbers in time order across the threads; every 40,000
events a pressure event whose collection frees a third of one thread's
blocks (the saw-tooth and the markers of the timeline). Chunks are each
thread's 8192 events, as the shim's buffers hold, written as they fill.
"""
import heapq
import random
import struct
import sys
import zlib
from array import array

CHUNK_EVENTS = 8192
REGION = 256 << 20
REGION_BASE = 0x7F3A00000000
SIZES = (512, 2048, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 3 << 20, 786432, 12288, 8192)
ALLOC, FREE, PRESSURE_BEGIN, PRESSURE_END, GC = 1, 2, 4, 5, 6
COLUMNS = ("seq", "addr", "size", "kind", "dev", "time", "site")
TYPECODES = dict(zip(COLUMNS, "QQQBBQI"))
# Version 2's columns in the body's order, with their widths (tracefmt.h).
V2_COLUMNS = (("kind", 1), ("dev", 1), ("site", 4), ("size", 8), ("seq", 8), ("time", 8),
              ("addr", 8))
CHUNK_MAGIC = 0x4B4E4843
FLAG_ZLIB = 1


def _rec(tag, body):
    body += b"\0" * (-len(body) % 8)
    return struct.pack("<II", tag, len(body)) + body


def metadata(sites):
    """Site s: a native stack of one frame 0x400000 + 16 s, named site_s;
    device 0 is simdev."""
    meta = b""
    for s in range(1, sites + 1):
        meta += _rec(1, struct.pack("<IIII", s, s, 0, 0))
        meta += _rec(2, struct.pack("<IIQ", s, 1, 0x400000 + s * 16))
        meta += _rec(5, struct.pack("<QiI", 0x400000 + s * 16, 10 * s, 0) +
                     b"site_%d\0file.c\0/bin/synth\0" % s)
    meta += _rec(3, struct.pack("<II", 0, 0) + b"simdev\0")
    return meta


def encode_v1(cols):
    """32-byte events (addr, size|kind|dev, time, seq_lo, site) and the
    chunk's seq_base."""
    n = len(cols["seq"])
    out = bytearray(32 * n)
    for name, at, width in (("addr", 0, 8), ("time", 16, 8), ("size", 8, 6), ("seq", 24, 4),
                            ("site", 28, 4)):
        raw = _le(cols[name])
        w = cols[name].itemsize
        for b in range(width):
            out[at + b::32] = raw[b::w]
    out[14::32] = _le(cols["kind"])
    out[15::32] = _le(cols["dev"])
    return bytes(out), 0, min(cols["seq"]) if n else 0


def encode_v2(cols, level=1):
    """The column table, the planes that vary; compressed when that is
    smaller (as tracecodec.c; level None: never). Returns (body, flags,
    seq_base)."""
    n = len(cols["seq"])
    table = bytearray()
    planes = []
    for name, w in V2_COLUMNS:
        raw = _le(cols[name])
        step = cols[name].itemsize
        mask = 0
        consts = bytearray(w)
        for b in range(w):
            p = raw[b::step] if b < step else bytes(n)
            if p.count(p[:1]) == n:
                consts[b] = p[0]
            else:
                mask |= 1 << b
                planes.append(p)
        table.append(mask)
        table += consts
    body = bytes(table) + b"".join(planes)
    z = zlib.compress(body, level) if level is not None else body
    if len(z) < len(body):
        return z, FLAG_ZLIB, min(cols["seq"])
    return body, 0, min(cols["seq"])


def _le(a):
    if sys.byteorder == "big":
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def chunk_record(version, cols, thread, meta=b"", level=1):
    """One chunk record of the events cols (their thread's number in
    version 2), then the metadata records meta."""
    n = len(cols["seq"])
    if not n:
        body, flags, base = b"", 0, 0
    elif version == 1:
        body, flags, base = encode_v1(cols)
    else:
        body, flags, base = encode_v2(cols, level)
    if version == 1:
        head = struct.pack("<IIIIQQ", CHUNK_MAGIC, n, len(meta), 0, base, 0)
    else:
        head = struct.pack("<IIIIQII", CHUNK_MAGIC, n, len(meta), len(body), base,
                           thread if n else 0, flags)
    return head + body + meta


def header(version, pid=4242, realtime_ns=0):
    return struct.pack("<8sIIQQ", b"SPYTRACE", version, pid, realtime_ns, 0)


def write_events(path, chunks, meta, version=2, pid=4242, level=1):
    """A trace of the given chunks [(thread, {column: array})] in that
    file order, the metadata with the first."""
    with open(path, "wb") as f:
        f.write(header(version, pid))
        for i, (thread, cols) in enumerate(chunks):
            f.write(chunk_record(version, cols, thread, meta if i == 0 else b"", level))
        if not chunks:
            f.write(chunk_record(version, {c: array(TYPECODES[c]) for c in COLUMNS}, 0, meta))


def events(n, threads=4, sites=48, seed=1):
    """Yields (thread, chunk columns) as the threads' buffers fill: n events
    in all (see the module's comment for what they model)."""
    rnd = random.Random(seed)
    rand, expo = rnd.random, rnd.expovariate
    # Sites: hot ones first (weights 1/k), each with its tensor's size.
    site_size = [0] + [rnd.choice(SIZES) for _ in range(sites)]
    varying = set(range(8, sites + 1, 8))
    cum = []
    total = 0.0
    for k in range(1, sites + 1):
        total += 1.0 / k
        cum.append(total)
    import bisect
    pick = bisect.bisect

    free_lists = {}
    region = [REGION_BASE, REGION_BASE + REGION]   # bump pointer, its end

    def allocate(size):
        fl = free_lists.get(size)
        if fl:
            return fl.pop()
        if region[0] + size > region[1]:
            base = region[1] + (16 << 20)
            region[:] = [base, base + REGION]
        a = region[0]
        region[0] += (size + 511) & ~511
        return a

    bufs = [{c: array(TYPECODES[c]) for c in COLUMNS} for _ in range(threads)]
    live = [[] for _ in range(threads)]
    target = [rnd.randrange(40, 400) for _ in range(threads)]
    growing = [True] * threads
    clock = [(rnd.randrange(1000, 50000), t) for t in range(threads)]
    heapq.heapify(clock)
    seq = 0
    next_gc = 40000

    def emit(t, kind, dev, addr, size, site, now):
        b = bufs[t]
        b["seq"].append(seq)
        b["addr"].append(addr)
        b["size"].append(size)
        b["kind"].append(kind)
        b["dev"].append(dev)
        b["time"].append(now)
        b["site"].append(site)
        if len(b["seq"]) == CHUNK_EVENTS:
            bufs[t] = {c: array(TYPECODES[c]) for c in COLUMNS}
            return b
        return None

    # Weights: a few blocks per thread that live for the whole run.
    while seq < n:
        now, t = clock[0]
        now += int(expo(1 / 2000.0)) + 1000
        heapq.heapreplace(clock, (now, t))
        L = live[t]
        full = None
        if seq >= next_gc and len(L) > 30 and n - seq > len(L) // 3 + 3:
            # A pressure event: its collection frees a third of the blocks.
            next_gc = seq + 40000
            seq += 1
            full = emit(t, PRESSURE_BEGIN, 0xFF, 0, site_size[1], 0, now)
            if full:
                yield t + 1, full
            freed = 0
            for _ in range(len(L) // 3):
                a, sz, st = L.pop(rnd.randrange(len(L)))
                free_lists.setdefault(sz, []).append(a)
                freed += sz
                seq += 1
                now += 700
                full = emit(t, FREE, 0, a, sz, st, now)
                if full:
                    yield t + 1, full
            for kind, addr in ((GC, 150000), (PRESSURE_END, 0)):
                seq += 1
                now += 900
                full = emit(t, kind, 0xFF, addr, freed, 0, now)
                if full:
                    yield t + 1, full
            continue
        if growing[t]:
            if len(L) >= target[t]:
                growing[t] = False
        elif len(L) <= 8:
            growing[t] = True
            target[t] = rnd.randrange(40, 400)
        seq += 1
        if growing[t] or rand() < 0.1:
            st = pick(cum, rand() * total) + 1
            sz = site_size[st]
            if st in varying:
                sz *= rnd.randrange(1, 9)
            a = allocate(sz)
            L.append((a, sz, st))
            full = emit(t, ALLOC, 0, a, sz, st, now)
        else:
            # Mostly the newest block first (the backward pass).
            i = len(L) - 1 - min(int(expo(0.5)), len(L) - 1)
            a, sz, st = L.pop(i)
            free_lists.setdefault(sz, []).append(a)
            full = emit(t, FREE, 0, a, sz, st, now)
        if full:
            yield t + 1, full
    for t, b in enumerate(bufs):
        if len(b["seq"]):
            yield t + 1, b


def rank_records(rank, world):
    """The process record (tag 9) and device 0's capacity (tag 10)."""
    words = b"".join(k + b"\0" + v + b"\0" for k, v in (
        (b"rank", b"%d" % rank), (b"local_rank", b"%d" % rank), (b"world_size", b"%d" % world),
        (b"run_id", b"synth"), (b"host", b"synth")))
    out = b""
    for tag, p in ((9, words), (10, struct.pack("<IIQ", 0, 0, 8 << 30))):
        out += struct.pack("<II", tag, len(p)) + p + b"\0" * (-len(p) % 8)
    return out


def write(path, n, seed=1, version=2, threads=4, sites=48, rank=None, world=1):
    """The synthetic trace of n events (module comment); returns the
    number of events written (n)."""
    meta = metadata(sites)
    pid = 4242
    if rank is not None:
        meta += rank_records(rank, max(world, rank + 1))
        pid += rank
    count = 0
    with open(path, "wb") as f:
        f.write(header(version, pid))
        first = True
        for thread, cols in events(n, threads, sites, seed):
            f.write(chunk_record(version, cols, thread, meta if first else b""))
            first = False
            count += len(cols["seq"])
    return count


def main(argv):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", type=int, choices=(1, 2), default=2)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--sites", type=int, default=48)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("out")
    ap.add_argument("n", type=int)
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else (a.rank + 1 if a.rank is not None else 1)
    write(a.out, a.n, seed, a.version, a.threads, a.sites, a.rank, a.world)


if __name__ == "__main__":
    main(sys.argv[1:])
