"""Writes a synthetic trace (docs/trace-format.md) of N events: a few
allocation sites growing and shrinking in a saw-tooth, with a collection
marker at each drop. For the timeline's render time at 1M and 10M events
(bench/trace_render.sh) and for tests/integration/test_trace_views.py.

    python3 bench/trace_synth.py OUT.trace N
"""
import random
import struct
import sys

CHUNK = 32768


def write(path, n, seed=1):
    rnd = random.Random(seed)
    ev = struct.Struct("<QQQII")
    with open(path, "wb") as f:
        f.write(struct.pack("<8sIIQQ", b"SPYTRACE", 1, 4242, 0, 0))
        live = []            # (addr, size, site)
        addr = 1 << 32
        seq = 0
        meta = b""
        for s in range(1, 5):
            meta += struct.pack("<II", 1, 16) + struct.pack("<IIII", s, s, 0, 0)
            meta += struct.pack("<II", 2, 16) + struct.pack("<IIQ", s, 1, 0x400000 + s * 16)
            name = b"site_%d\0file.c\0/bin/synth\0" % s
            body = struct.pack("<QiI", 0x400000 + s * 16, 10 * s, 0) + name
            meta += struct.pack("<II", 5, len(body)) + body + b"\0" * (-len(body) % 8)
        name = b"simdev\0"
        meta += struct.pack("<II", 3, 8 + len(name)) + struct.pack("<II", 0, 0) + name + \
            b"\0" * (-(8 + len(name)) % 8)
        first = True
        while seq < n:
            buf = bytearray()
            m = min(CHUNK, n - seq)
            base = seq + 1
            for _ in range(m):
                seq += 1
                t = seq * 1000
                if len(live) > 2000 + (seq // 50000) % 3 * 500 and rnd.random() < 0.5:
                    # a collection: free half
                    if rnd.random() < 0.01:
                        buf += ev.pack(0, (6 << 48) | (0xFF << 56), t, seq & 0xFFFFFFFF, 0)
                        continue
                if live and (rnd.random() < 0.45 or len(live) > 4000):
                    a, sz, st = live.pop(rnd.randrange(len(live)))
                    buf += ev.pack(a, sz | (2 << 48), t, seq & 0xFFFFFFFF, st)
                else:
                    sz = rnd.choice((4096, 65536, 1 << 20))
                    st = rnd.randint(1, 4)
                    live.append((addr, sz, st))
                    buf += ev.pack(addr, sz | (1 << 48), t, seq & 0xFFFFFFFF, st)
                    addr += sz
            mb = meta if first else b""
            first = False
            f.write(struct.pack("<IIIIQQ", 0x4B4E4843, m, len(mb), 0, base, 0))
            f.write(buf)
            f.write(mb)


if __name__ == "__main__":
    write(sys.argv[1], int(sys.argv[2]))
