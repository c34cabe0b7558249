"""Writes a trace again in format version 1 or 2, record by record: the same
chunks (events, threads, metadata), only the events' encoding changes. For
the size table of docs/trace-format.md: bytes per event of one recording
in both versions, exactly the same events.

    python3 bench/trace_recode.py --version 1|2 IN.trace OUT.trace

Prints "IN: N events, B bytes (X per event) -> OUT: B' bytes (X' per event)".
A cut last chunk is left out, as a reader drops it.
"""
import argparse
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
from spyreshim.reading import tracecodec  # noqa: E402
import trace_synth  # noqa: E402


def recode(src, dst, version):
    with open(src, "rb") as f:
        data = f.read()
    magic, ver, pid, real, mono = struct.unpack_from("<8sIIQQ", data, 0)
    if magic != b"SPYTRACE" or ver not in tracecodec.VERSIONS:
        raise SystemExit("%s: not a trace of version 1 or 2" % src)
    pos, events = 32, 0
    with open(dst, "wb") as out:
        out.write(struct.pack("<8sIIQQ", magic, version, pid, real, mono))
        while pos + 32 <= len(data):
            h = tracecodec.chunk_header(ver, data[pos:pos + 32])
            end = pos + 32 + h.body_bytes + h.meta_bytes
            if not h.magic_ok or end > len(data):
                break
            body = data[pos + 32:pos + 32 + h.body_bytes]
            meta = data[pos + 32 + h.body_bytes:end]
            cols = dict(zip(trace_synth.COLUMNS, tracecodec.decode_chunk(ver, h, body)))
            out.write(trace_synth.chunk_record(version, cols, h.thread or 1, meta))
            events += h.nevents
            pos = end
    return events, len(data), os.path.getsize(dst)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", type=int, choices=(1, 2), required=True)
    ap.add_argument("src")
    ap.add_argument("dst")
    a = ap.parse_args(argv)
    n, b0, b1 = recode(a.src, a.dst, a.version)
    per = (lambda b: "%.2f" % (b / n) if n else "-")
    print("%s: %d events, %d bytes (%s per event) -> %s: %d bytes (%s per event)"
          % (a.src, n, b0, per(b0), a.dst, b1, per(b1)))


if __name__ == "__main__":
    main(sys.argv[1:])
