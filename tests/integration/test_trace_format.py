"""Trace format version 2 (docs/trace-format.md, shim/trace/tracecodec.c,
spyreshim/reading/tracecodec.py): the same events read back
identically from versions 1 and 2; a traced program writes version 2 (each
chunk naming its thread, compressed, uncompressed when zlib cannot be
loaded) that gives the peak of its statistics; a version 1 file still
reads; a realistic synthetic trace takes at most 12 bytes an event; every
malformed version 2 chunk is one line naming the file and the offset, exit
status 2, and a cut last chunk is dropped as `truncated`."""
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(HERE))
import pythons  # noqa: E402
import trace_synth  # noqa: E402
from spyreshim.reading import trace as tr, tracecodec  # noqa: E402

SCRIPT = REPO / "scripts" / "spyreshim"
COLUMNS = trace_synth.COLUMNS


def records(path):
    """(offset, ChunkHead, body) of every whole chunk record, and the
    header's version."""
    data = Path(path).read_bytes()
    version = struct.unpack_from("<I", data, 8)[0]
    out, pos = [], 32
    while pos + 32 <= len(data):
        h = tracecodec.chunk_header(version, data[pos:pos + 32])
        end = pos + 32 + h.body_bytes + h.meta_bytes
        if not h.magic_ok or end > len(data):
            break
        out.append((pos, h, data[pos + 32:pos + 32 + h.body_bytes]))
        pos = end
    return version, out


def same_columns(a, b):
    for c in COLUMNS:
        assert getattr(a, c) == getattr(b, c), c


def report(*args):
    return subprocess.run([sys.executable, str(SCRIPT), "report"] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=pythons.HANG_S)


def test_the_same_events_in_version_1_and_2_read_back_identically(tmp_path):
    chunks = list(trace_synth.events(60000, threads=4, sites=48, seed=3))
    meta = trace_synth.metadata(48)
    paths = {}
    for name, version, level in (("v1", 1, 1), ("v2", 2, 1), ("v2raw", 2, None)):
        paths[name] = tmp_path / (name + ".trace")
        trace_synth.write_events(paths[name], chunks, meta, version=version, level=level)
    t1, t2, t3 = (tr.load(str(paths[n])) for n in ("v1", "v2", "v2raw"))
    assert len(t1) == sum(len(c["seq"]) for _t, c in chunks) == 60000
    assert not (t1.truncated or t2.truncated or t3.truncated)
    same_columns(t1, t2)
    same_columns(t1, t3)
    assert list(t2.seq) == list(range(1, 60001))
    p1, p2 = tr.peaks(t1), tr.peaks(t2)
    assert (p1.bytes, p1.index, p1.per_device) == (p2.bytes, p2.index, p2.per_device)
    assert p1.bytes > 0
    assert t1.sites == t2.sites and t1.devices == t2.devices == {0: "simdev"}
    # Chunk by chunk, before any merging: each version 2 chunk decodes to
    # exactly the columns written, with its thread's number; compressed,
    # and not (flags 0) in the file written uncompressed.
    for name, flags in (("v2", tracecodec.FLAG_ZLIB), ("v2raw", 0)):
        version, recs = records(paths[name])
        assert version == 2 and len(recs) == len(chunks)
        for (thread, cols), (_off, h, body) in zip(chunks, recs):
            assert (h.thread, h.flags, h.nevents) == (thread, flags, len(cols["seq"]))
            got = dict(zip(COLUMNS, tracecodec.decode_chunk(2, h, body)))
            for c in COLUMNS:
                assert got[c] == cols[c], (name, c)
    # The text views agree to the byte.
    for view in ([], ["--view", "stats"]):
        outs = [report(*view, paths[n]) for n in ("v1", "v2")]
        assert [r.returncode for r in outs] == [0, 0], outs[0].stderr + outs[1].stderr
        assert outs[0].stdout.replace(str(paths["v1"]), "X") == \
            outs[1].stdout.replace(str(paths["v2"]), "X")


def test_a_version_1_file_still_reads(tmp_path):
    # Written by the old layout (trace_synth --version 1, the reader's
    # fixture), and the same events in version 2.
    old, new = tmp_path / "old.trace", tmp_path / "new.trace"
    for path, version in ((old, 1), (new, 2)):
        r = subprocess.run([sys.executable, str(REPO / "bench" / "trace_synth.py"), "--version",
                            str(version), "--threads", "3", str(path), "30000"],
                           capture_output=True, text=True, timeout=pythons.HANG_S)
        assert r.returncode == 0, r.stderr
    assert old.read_bytes()[8:12] == struct.pack("<I", 1)
    assert new.read_bytes()[8:12] == struct.pack("<I", 2)
    # Version 1: 32 bytes an event.
    assert old.stat().st_size >= 32 * 30000
    a, b = tr.load(str(old)), tr.load(str(new))
    assert len(a) == 30000
    same_columns(a, b)
    r = report("--view", "stats", old)
    assert r.returncode == 0, r.stderr
    assert "allocations" in r.stdout.lower()


def test_a_realistic_synthetic_trace_is_at_most_12_bytes_an_event(tmp_path):
    # A size, not a timing: trace_synth's model (four threads interleaving,
    # 48 sites, addresses from one allocator's regions, times a few
    # microseconds apart; its comment says more).
    path = tmp_path / "s.trace"
    n = trace_synth.write(str(path), 200000)
    per = path.stat().st_size / n
    print("synthetic, 200k events: %.2f bytes an event" % per)
    assert per <= 12, per
    # Against version 1's 32 for the same events.
    v1 = tmp_path / "s1.trace"
    trace_synth.write(str(v1), 200000, version=1)
    assert v1.stat().st_size / n >= 32


def shim_env(**extra):
    env = dict(os.environ, LD_PRELOAD=str(pythons.shim_lib()))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def traced_stress(tmp_path, builddir, threads, iterations, **env):
    trace, stats = tmp_path / "p.trace", tmp_path / "p.json"
    r = pythons.run([builddir / "tests" / "pressure_stress", threads, iterations],
                    env=shim_env(SIMDEV_MEMORY="48M", SPYRESHIM_TRACE=trace,
                                 SPYRESHIM_STATS=stats, **env))
    assert r.returncode == 0, r.stderr
    return trace, json.loads(stats.read_text()), r


def check_program_trace(trace, s):
    """The file's chunks, their threads, and the peak of the statistics."""
    version, recs = records(trace)
    assert version == 2
    threads, seqs = {}, []
    for _off, h, body in recs:
        if not h.nevents:
            assert h.thread == 0 and not h.body_bytes
            continue
        assert h.thread >= 1
        seq = tracecodec.decode_chunk(2, h, body)[0]
        assert min(seq) == h.seq_base
        threads.setdefault(h.thread, []).append(seq)
        seqs += seq
    # The main thread and the four workers, each numbered; every event in
    # one chunk, once.
    assert 4 <= len(threads) <= 8 and max(threads) <= 8
    assert sorted(seqs) == list(range(1, len(seqs) + 1))
    # A number names one thread: the chunks of one number (its buffers,
    # one after the other) barely overlap in sequence numbers, where two
    # threads' interleave. (Not always sequence order within one thread:
    # an allocation's number is taken before the frees of the collection it
    # set off are appended.)
    for chunks in threads.values():
        chunks.sort(key=min)
        overlap = sum(sum(1 for x in b if x < max(a)) for a, b in zip(chunks, chunks[1:]))
        events = sum(len(c) for c in chunks)
        assert overlap <= max(50, events // 100), (overlap, events)
    t = tr.load(str(trace))
    assert not t.truncated
    assert list(t.seq) == list(range(1, len(t) + 1))
    assert list(t.kind).count(tr.ALLOC) == s["allocs"]
    assert tr.peaks(t).bytes == s["peak_used_bytes"]
    return recs, t


def test_a_traced_program_writes_version_2_that_gives_its_peak(tmp_path, builddir):
    # Each worker fills several buffers of 8192 events.
    trace, s, _r = traced_stress(tmp_path, builddir, 4, 15000)
    recs, t = check_program_trace(trace, s)
    assert len(t) > 5 * 8192
    assert all(h.flags == tracecodec.FLAG_ZLIB for _o, h, _b in recs if h.nevents > 100)
    per = trace.stat().st_size / len(t)
    print("pressure_stress 4 threads: %d events, %.2f bytes an event" % (len(t), per))
    assert per <= 12, per


def test_without_zlib_the_chunks_are_written_uncompressed(tmp_path, builddir):
    # A libz.so.1 without deflate found first: the shim writes every chunk
    # uncompressed (flags 0), nothing lost.
    fake = tmp_path / "lib"
    fake.mkdir()
    src = tmp_path / "nothing.c"
    src.write_text("int spyreshim_test_not_zlib(void) { return 0; }\n")
    cc = os.environ.get("CC", "cc")
    r = subprocess.run([cc, "-shared", "-fPIC", "-o", str(fake / "libz.so.1"), str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    trace, s, r = traced_stress(tmp_path, builddir, 4, 2000, LD_LIBRARY_PATH=fake,
                                SPYRESHIM_LOG="info")
    assert "no deflateInit2_" in r.stderr, r.stderr[-2000:]
    recs, t = check_program_trace(trace, s)
    assert all(h.flags == 0 for _o, h, _b in recs)


# ------------------------------------------------------- hostile chunks

def small_chunks():
    """Two chunks of one thread: 300 and 200 events."""
    thread, cols = next(iter(trace_synth.events(500, threads=1, sites=4, seed=5)))
    assert len(cols["seq"]) == 500
    a = {c: cols[c][:300] for c in COLUMNS}
    b = {c: cols[c][300:] for c in COLUMNS}
    return a, b


def raw_record(n, body, flags, thread=1, seq_base=1, meta=b""):
    return struct.pack("<IIIIQII", 0x4B4E4843, n, len(meta), len(body), seq_base, thread,
                       flags) + body + meta


def v2_body(cols, level=1):
    body, flags, _base = trace_synth.encode_v2(cols, level)
    return body, flags


def hostile_file(path, first):
    """The header, a hostile first chunk record and a good second one (so
    that the bad one is not the cut last chunk)."""
    a, b = small_chunks()
    data = trace_synth.header(2) + first + trace_synth.chunk_record(2, b, 1,
                                                                    trace_synth.metadata(4))
    Path(path).write_bytes(data)


def uncompressed_body_drop_last_byte(a):
    body, _ = v2_body(a, None)
    return raw_record(300, body[:-1], 0)


def compressed_body_of_wrong_length(a):
    body, _ = v2_body(a, None)
    return raw_record(300, zlib.compress(body[:-300], 1), tracecodec.FLAG_ZLIB)


def bad_zlib(a):
    body, flags = v2_body(a)
    body = bytearray(body)
    for i in range(10, 30):
        body[i] ^= 0x5A
    return raw_record(300, bytes(body), flags)


def trailing_bytes(a):
    body, flags = v2_body(a)
    return raw_record(300, body + b"\0" * 8, flags)


def zlib_cut_short(a):
    body, flags = v2_body(a)
    return raw_record(300, body[:len(body) // 2], flags)


def unknown_flag(a):
    body, flags = v2_body(a)
    return raw_record(300, body, flags | 4)


def too_many_events(a):
    body, flags = v2_body(a)
    return raw_record(70000, body, flags)


def mask_above_width(a):
    body, _ = v2_body(a, None)
    body = bytearray(body)
    body[0] |= 0x02          # the kind column is one byte: plane 1 does not exist
    return raw_record(300, bytes(body) + bytes(300), 0)


def constant_sequence_numbers(a):
    cols = dict(a)
    cols["seq"] = type(a["seq"])("Q", [7] * 300)
    body, _ = v2_body(cols, None)
    return raw_record(300, body, 0)


def size_of_2_to_the_48(a):
    cols = dict(a)
    cols["size"] = type(a["size"])("Q", [1 << 48] + list(a["size"])[1:])
    body, _ = v2_body(cols, None)
    return raw_record(300, body, 0)


def events_with_no_body(a):
    return raw_record(300, b"", 0)


HOSTILE = [
    (uncompressed_body_drop_last_byte, "the columns hold"),
    (compressed_body_of_wrong_length, "the columns hold"),
    (bad_zlib, "bad zlib stream"),
    (trailing_bytes, "after the zlib stream"),
    (zlib_cut_short, "ends before its end"),
    (unknown_flag, "flags 0x5 not understood"),
    (too_many_events, "more than a chunk holds"),
    (mask_above_width, "kind column of 1 byte(s): plane mask 0x0"),
    (constant_sequence_numbers, "cannot all differ"),
    (events_with_no_body, "the column table needs"),
    (size_of_2_to_the_48, "sizes of 2^48 bytes or more"),
]


@pytest.mark.parametrize("make,what", HOSTILE, ids=[f.__name__ for f, _w in HOSTILE])
def test_a_malformed_version_2_chunk_is_one_line_naming_file_and_offset(tmp_path, make, what):
    a, _b = small_chunks()
    path = tmp_path / "bad.trace"
    hostile_file(path, make(a))
    for view in ([], ["--view", "stats"]):
        r = report(*view, path)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert str(path) in lines[0] and "offset 32: chunk: " in lines[0], lines[0]
        assert what in lines[0], lines[0]


def test_a_cut_last_version_2_chunk_is_dropped_as_truncated(tmp_path):
    a, b = small_chunks()
    whole = trace_synth.header(2) + trace_synth.chunk_record(2, a, 1, trace_synth.metadata(4))
    last = trace_synth.chunk_record(2, b, 1)
    for cut in (10, 40, len(last) - 1):   # in its header, its body, its last byte
        path = tmp_path / ("cut%d.trace" % cut)
        path.write_bytes(whole + last[:cut])
        t = tr.load(str(path))
        assert t.truncated and len(t) == 300
        assert list(t.seq) == list(a["seq"])
        r = report(path)
        assert r.returncode == 0, r.stderr
