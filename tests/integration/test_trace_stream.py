"""The streaming trace reader (issue 26 item 2, issue 24 item 8): events in
sequence order however the chunks of several threads interleave in the file,
the metadata before the events, and every view and export of `spyreshim
report` in memory that does not grow with the number of events (peak RSS
of each, on synthetic traces of 98k and 508k events: the old reader held
38 bytes an event, memory_viz's export about 700)."""
import pickle
import re
import struct
import subprocess
import sys
from array import array
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
from spyreshim.exports import memoryviz  # noqa: E402
from spyreshim.views import timeline
from spyreshim.reading import trace as tr

sys.path.insert(0, str(HERE))
import pythons  # noqa: E402

EV = struct.Struct("<QQQII")


def rec(tag, body):
    body += b"\0" * (-len(body) % 8)
    return struct.pack("<II", tag, len(body)) + body


def meta(nsites=4):
    m = rec(3, struct.pack("<II", 0, 0) + b"simdev\0")
    for s in range(1, nsites + 1):
        m += rec(1, struct.pack("<IIII", s, s, 0, 0))
        m += rec(2, struct.pack("<IIQ", s, 1, 0x400000 + s * 16))
        m += rec(5, struct.pack("<QiI", 0x400000 + s * 16, s, 0) + b"site_%d\0f.c\0/bin/x\0" % s)
    return m


def chunk(events, base, meta_bytes=b""):
    """events [(seq, kind, dev, addr, size, site)] of one thread."""
    body = b"".join(EV.pack(a, sz | (k << 48) | (d << 56), seq * 1000, seq & 0xFFFFFFFF, st)
                    for seq, k, d, a, sz, st in events)
    return struct.pack("<IIIIQQ", 0x4B4E4843, len(events), len(meta_bytes), 0, base, 0) + \
        body + meta_bytes


def header():
    return struct.pack("<8sIIQQ", b"SPYTRACE", 1, 4242, 0, 0)


def test_chunks_of_threads_merge_in_sequence_order(tmp_path):
    # Three threads whose chunks overlap in sequence numbers, written out
    # of order (the writer flushes each thread's buffer when it fills), one
    # chunk not in sequence order inside, and the metadata only in the last
    # record (names at exit).
    A, F = tr.ALLOC, tr.FREE
    seqs = {0: list(range(1, 400, 3)), 1: list(range(2, 400, 3)), 2: list(range(3, 400, 3))}
    events = {}
    for th, ss in seqs.items():
        evs = []
        for j, s in enumerate(ss):
            addr = (th << 32) | ((j // 2) << 12)
            evs.append((s, A if j % 2 == 0 else F, 0, addr, 4096 * (th + 1), th + 1))
        events[th] = evs
    # A thread appends in its own order, not always sequence order: two of
    # thread 2's events the other way round (seq_base is still its least).
    events[2][10], events[2][11] = events[2][11], events[2][10]
    data = header()
    pieces = [(1, events[1][:50]), (0, events[0][:70]), (2, events[2]), (0, events[0][70:]),
              (1, events[1][50:])]
    for th, evs in pieces:
        data += chunk(evs, evs[0][0])
    data += chunk([], 0, meta())
    path = tmp_path / "threads.trace"
    path.write_bytes(data)
    t = tr.stream(str(path))
    assert t.sites and t.raw_events == 399 and not t.truncated   # metadata before events
    got = []
    for b in t.batches():
        assert b.start == len(got)
        got += list(zip(b.seq, b.kind, b.addr, b.size, b.site))
    assert [g[0] for g in got] == list(range(1, 400))
    want = sorted((s, k, a, sz, st) for evs in events.values() for s, k, _d, a, sz, st in evs)
    assert got == want
    # The peak replays that order: each thread holds one block at a time.
    assert tr.peaks(t).bytes == max(
        sum(4096 * (th + 1) for th in range(3) if sum(1 for s in seqs[th] if s <= x) % 2)
        for x in range(1, 400))
    loaded = tr.load(str(path))
    assert list(loaded.seq) == list(range(1, 400)) and len(loaded) == len(t) == 399


def test_a_chunk_larger_than_a_thread_buffer_is_one_line(tmp_path):
    path = tmp_path / "big.trace"
    path.write_bytes(header() + struct.pack("<IIIIQQ", 0x4B4E4843, tr.MAX_CHUNK_EVENTS + 1, 0, 0,
                                            1, 0) + b"\0" * 64)
    # The body is not there: the file is cut (truncated), not an error.
    assert tr.stream(str(path)).truncated
    with open(path, "r+b") as f:
        f.truncate(32 + 32 + 32 * (tr.MAX_CHUNK_EVENTS + 1))
    with pytest.raises(tr.rpt.ReportError, match=r"offset 32: chunk of \d+ events"):
        tr.stream(str(path))


# ------------------------------------------------------------ memory

K = 8192


def write_big(path, n):
    """n events (a multiple of K) in chunks of K: each chunk allocates K/2
    - 1 blocks of 4 sites and frees them, with one collection marker; the
    chunks' file order swaps every pair (file order is not sequence order).
    Built from one template chunk (C-speed byte slicing: 1M events in a
    second)."""
    half = K // 2 - 1
    tmpl = bytearray()
    for j in range(half):
        tmpl += EV.pack(0x7f0000000000 + j * 4096, 4096 | (tr.ALLOC << 48), 0, 0, j % 4 + 1)
    for j in range(half):
        tmpl += EV.pack(0x7f0000000000 + j * 4096, 4096 | (tr.FREE << 48), 0, 0, j % 4 + 1)
    tmpl += EV.pack(0, 4096 * half | (tr.GC << 48) | (0xFF << 56), 0, 0, 0)
    tmpl += EV.pack(0, 0 | (tr.PRESSURE_END << 48) | (0xFF << 56), 0, 0, 0)
    assert len(tmpl) == 32 * K
    with open(path, "wb") as f:
        f.write(header())
        f.write(chunk([], 0, meta()))
        order = []
        for c in range(0, n // K, 2):
            order += [c + 1, c] if c + 1 < n // K else [c]
        for c in order:
            base = c * K + 1
            body = bytearray(tmpl)
            tm = array("Q", range(base * 1000, (base + K) * 1000, 1000)).tobytes()
            sq = array("I", range(base, base + K)).tobytes()
            for i in range(8):
                body[16 + i::32] = tm[i::8]
            for i in range(4):
                body[24 + i::32] = sq[i::4]
            f.write(struct.pack("<IIIIQQ", 0x4B4E4843, K, 0, 0, base, 0))
            f.write(body)


DRIVER = r"""
import sys
sys.path.insert(0, sys.argv[1])
from spyreshim.cli import main as cli
rc = cli.main(["report"] + sys.argv[2:])
sys.stdout.flush()
# VmHWM: this process's own peak (ru_maxrss also counts the parent's RSS
# that a vfork()ed child carries to its exec).
hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0]
sys.stderr.write("maxrss %d\n" % int(hwm.split()[1]))
sys.exit(rc)
"""


def views(tmp, n):
    return {"peak": [], "stats": ["--view", "stats"], "peak-html": ["--html", tmp / "p.html"],
            "timeline": ["--view", "timeline", "--html", tmp / "t.html"],
            "gc": ["--view", "gc"], "pprof": ["--pprof", tmp / "p.pb.gz"],
            "diff": ["--diff", "--at", "1", "--at", str(n // 2)],
            "memory-viz": ["--memory-viz", tmp / "m.pickle"],
            "memory-timeline": ["--memory-timeline", tmp / "m.json.gz"]}


def peak_rss(path, args, package=REPO):
    r = subprocess.run([sys.executable, "-c", DRIVER, str(package)] + [str(a) for a in args] +
                       [str(path)], capture_output=True, text=True, timeout=pythons.HANG_S)
    assert r.returncode == 0, r.stderr[-2000:]
    return int(re.search(r"maxrss (\d+)", r.stderr).group(1)), r


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("big")
    out = {}
    for n in (12 * K, 62 * K):    # 98,304 and 507,904 events
        p = tmp / ("%d.trace" % n)
        write_big(p, n)
        out[n] = p
    return tmp, out


def test_every_view_reads_in_memory_that_does_not_grow_with_the_events(big):
    tmp, traces = big
    small, large = sorted(traces)
    rows = {}
    for name in views(tmp, small):
        rss = []
        for n in (small, large):
            kib, r = peak_rss(traces[n], views(tmp, n)[name])
            rss.append(kib)
        rows[name] = rss
        print("peak RSS %-10s %d events: %6d KiB   %d events: %6d KiB" % (
            name, small, rss[0], large, rss[1]))
    for name, (a, b) in rows.items():
        # Five times the events: a few MiB more at most (the whole-file
        # reader grew by 38 bytes an event: 30 MiB here; memory_viz's export
        # by 700: 540 MiB), and under 100 MiB in all.
        assert b - a < 6 * 1024, (name, a, b)
        assert b < 100 * 1024, (name, b)


def test_the_big_traces_views_are_right(big):
    tmp, traces = big
    n = max(traces)
    path = traces[n]
    t = tr.stream(str(path))
    p = tr.peaks(t)
    half = K // 2 - 1
    assert p.bytes == 4096 * half and len(t) == n and t.foreign_frees == 0
    d = timeline.build(t, buckets=100)
    assert d["peak"] == p.bytes and d["n"] == n
    assert sum(v for _s, v in d["snaps"][d["peak_bucket"]]) == p.bytes
    assert d["marks"][tr.GC][0] == n // K
    out = tmp / "m.pickle"
    nev, nseg = memoryviz.write(t, str(out), None, ("n", 3 * K))
    snap = pickle.loads(out.read_bytes())
    ev = snap["device_traces"][0]
    # Three chunks: each allocation once, each free twice (requested, completed).
    assert nev == len(ev) == 3 * 3 * half
    assert [e["action"] for e in ev[:2]] == ["alloc", "alloc"]
    assert [f["name"] for f in ev[0]["frames"]] == ["site_1"]
    assert ev[1]["frames"] is not ev[0]["frames"] and ev[4]["frames"] is ev[0]["frames"]
    assert snap["segments"] and not any(b["state"] == "active_allocated"
                                        for s in snap["segments"] for b in s["blocks"])


def test_a_foreign_free_inside_a_batch_is_dropped_and_its_address_reused(tmp_path):
    # A forked child's file: it frees its parent's block at 0x9000 in the
    # middle of a chunk, then gets that address again for its own block.
    A, F = tr.ALLOC, tr.FREE
    evs = [(1, A, 0, 0x1000, 1 << 20, 1), (2, F, 0, 0x9000, 4 << 20, 2),
           (3, A, 0, 0x9000, 2 << 20, 2), (4, F, 0, 0x1000, 1 << 20, 1),
           (5, F, 0, 0x7000, 1 << 10, 3), (6, F, 0, 0x9000, 2 << 20, 2)]
    path = tmp_path / "child.trace"
    path.write_bytes(header() + chunk(evs, 1, meta()))
    t = tr.stream(str(path))
    kept = [(s, k) for b in t.batches() for s, k in zip(b.seq, b.kind)]
    assert kept == [(1, A), (3, A), (4, F), (6, F)]
    assert (t.foreign_frees, t.foreign_bytes) == (2, (4 << 20) + (1 << 10))
    assert tr.peaks(t).bytes == 3 << 20
    assert tr.live_at(t, 1) == {(0, 0x1000): (1 << 20, 1, 0), (0, 0x9000): (2 << 20, 2, 1)}
