"""CPU time to decode every chunk's events of a trace (tracecodec.py's
decode_chunk, versions 1 and 2), apart from what the views do with them:
the reader's share of `spyreshim report` that the format decides.

    python3 bench/trace_decode.py TRACE [TRACE...]
"""
import os
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from spyreshim.reading import tracecodec  # noqa: E402


def decode(path):
    with open(path, "rb") as f:
        version = struct.unpack_from("<I", f.read(32), 8)[0]
        pos, n = 32, 0
        t0 = time.process_time()
        while True:
            raw = f.read(32)
            if len(raw) < 32:
                break
            h = tracecodec.chunk_header(version, raw)
            if not h.magic_ok:
                break
            body = f.read(h.body_bytes)
            if len(body) < h.body_bytes:
                break
            if h.nevents:
                tracecodec.decode_chunk(version, h, body)
                n += h.nevents
            f.seek(h.meta_bytes, 1)
            pos += 32 + h.body_bytes + h.meta_bytes
        return version, n, time.process_time() - t0, os.path.getsize(path)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        v, n, s, size = decode(p)
        print("%s: version %d, %d events, %.2f bytes an event, decoded in %.2f s of CPU "
              "(%.0f ns an event)" % (p, v, n, size / max(n, 1), s, s * 1e9 / max(n, 1)))
