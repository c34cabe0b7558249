"""Bytes per event of one trace's events under other encodings than
version 2's, and what a running sum per event would cost its reader: the
figures behind docs/trace-format.md's "Why this encoding". Each chunk's
events are encoded again as byte-plane columns with some columns as
deltas from the previous event (wrapping, 64-bit), compressed by zlib at
a level and strategy; the metadata is counted as it is in the file.

    python3 bench/trace_encodings.py TRACE [TRACE...]
"""
import itertools
import os
import sys
import time
import zlib
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
from spyreshim.reading import tracecodec  # noqa: E402
import trace_synth  # noqa: E402

MASK = (1 << 64) - 1
VARIANTS = [  # name, columns as deltas, zlib level, strategy
    ("planes, no zlib", (), None, 0),
    ("planes, zlib 1 (version 2)", (), 1, zlib.Z_DEFAULT_STRATEGY),
    ("planes, zlib 6", (), 6, zlib.Z_DEFAULT_STRATEGY),
    ("planes, zlib 1 Z_RLE", (), 1, zlib.Z_RLE),
    ("time as deltas", ("time",), 1, zlib.Z_DEFAULT_STRATEGY),
    ("time, seq as deltas", ("time", "seq"), 1, zlib.Z_DEFAULT_STRATEGY),
    ("time, seq, addr as deltas", ("time", "seq", "addr"), 1, zlib.Z_DEFAULT_STRATEGY),
    ("time, seq, addr, size as deltas", ("time", "seq", "addr", "size"), 1,
     zlib.Z_DEFAULT_STRATEGY),
]


def chunks(path):
    with open(path, "rb") as f:
        data = f.read()
    version = int.from_bytes(data[8:12], "little")
    pos, meta, out = 32, 0, []
    while pos + 32 <= len(data):
        h = tracecodec.chunk_header(version, data[pos:pos + 32])
        end = pos + 32 + h.body_bytes + h.meta_bytes
        if not h.magic_ok or end > len(data):
            break
        meta += 32 + h.meta_bytes
        if h.nevents:
            body = data[pos + 32:pos + 32 + h.body_bytes]
            out.append(dict(zip(trace_synth.COLUMNS, tracecodec.decode_chunk(version, h, body))))
        pos = end
    return out, meta + 32


def deltas(a):
    d = array("Q", [a[0]])
    d.extend(map(lambda x, y: (x - y) & MASK, a[1:], a[:-1]))
    return d


def main(paths):
    for path in paths:
        cs, meta = chunks(path)
        n = sum(len(c["seq"]) for c in cs)
        print("%s: %d events, %.2f bytes an event of metadata and chunk headers"
              % (path, n, meta / n))
        for name, delta, level, strategy in VARIANTS:
            total = 0
            for c in cs:
                c = {k: deltas(v) if k in delta else v for k, v in c.items()}
                raw, _f, _b = trace_synth.encode_v2(c, None)
                if level is not None:
                    z = zlib.compressobj(level, zlib.DEFLATED, 15, 8, strategy)
                    raw = min(raw, z.compress(raw) + z.flush(), key=len)
                total += len(raw)
            print("  %-34s %6.2f bytes an event" % (name, (total + meta) / n))
        # What decoding a delta column costs: a running sum per event.
        col = array("Q", itertools.chain.from_iterable(c["time"] for c in cs))
        d = deltas(col)
        t0 = time.process_time()
        back = array("Q", map(MASK.__and__, itertools.accumulate(d)))
        dt = time.process_time() - t0
        assert back == col
        t0 = time.process_time()
        for c in cs:
            raw, _f, _b = trace_synth.encode_v2(c, None)
            h = tracecodec.ChunkHead(True, len(c["seq"]), len(raw), 0, 0, 1, 0)
            tracecodec.decode_chunk(2, h, raw)
        dec = time.process_time() - t0
        print("  a running sum of one column (itertools.accumulate): %.0f ns an event; "
              "decoding every column of version 2 (planes, no zlib): %.0f ns an event"
              % (dt * 1e9 / n, dec * 1e9 / n))


if __name__ == "__main__":
    main(sys.argv[1:])
