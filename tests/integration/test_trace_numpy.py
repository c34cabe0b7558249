"""The trace reader's two paths give the same answers: the vectorized one
(numpy, when importable) and the pure-Python one (pypy3, pyenv's
interpreters, SPYRESHIM_NO_NUMPY=1). Each view runs on the same trace both
ways, in one process (trace.np set to None) and through the command line
with the variable set, and the text, the timeline's data and page, the
pprof profile and the memory_viz pickle must be equal.

The traces: the synthetic training loop of bench/trace_synth.py (4
threads interleaving, markers) and a messy one written here: several
devices (one of them a pass-through pseudo-device), frees of blocks never
allocated (a forked child's) and double frees, markers of no device,
times that step back between threads, small chunks interleaving."""
import gzip
import io
import os
import random
import subprocess
import sys
from array import array
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import trace_synth  # noqa: E402
from spyreshim.reading import categories, trace as tr  # noqa: E402
from spyreshim.views import gcview, timeline, tracepeak  # noqa: E402
from spyreshim.exports import memoryviz, pprof  # noqa: E402

sys.path.insert(0, str(HERE))
import pythons  # noqa: E402

NUMPY = tr.np


@pytest.fixture(autouse=True)
def numpy_here():
    if NUMPY is None:
        reason = ("numpy is not importable in %s (Debian's python3-numpy: scripts/deps.sh), "
                  "or SPYRESHIM_NO_NUMPY is set: there is one path only" % sys.executable)
        pythons.need("numpy-off" if os.environ.get("SPYRESHIM_NO_NUMPY") else "numpy", reason)
    yield
    tr.np = NUMPY


def messy(path, n, seed, threads=3, devs=(0, 1, 0xfc), per_chunk=700):
    r = random.Random(seed)
    live = {d: [] for d in devs}
    evs = {th: [] for th in range(threads)}
    now = 0
    for seq in range(1, n + 1):
        th = r.randrange(threads)
        now += r.randrange(0, 3000)
        d = r.choice(devs)
        x = r.random()
        if x < 0.45 or not live[d]:
            # Addresses from a few, so that allocations reuse them (and an
            # allocation of a live address happens: a double free follows).
            a = r.choice((0x1000, 0x2000, 0x3000)) * r.randrange(1, 60)
            k, sz, site = tr.ALLOC, r.choice((512, 4096, 1 << 20, 3 << 20)), r.randrange(1, 9)
            live[d].append((a, sz, site))
        elif x < 0.85:
            a, sz, site = live[d].pop(r.randrange(len(live[d])))
            k = tr.FREE
        elif x < 0.93:      # a block this file never saw allocated
            k, a, sz, site = tr.FREE, r.randrange(1, 200) * 0x1000, 777, r.randrange(1, 9)
        else:
            k, a, sz, site = r.choice(tr.MARKERS), 0, r.randrange(0, 1 << 22), 0
            d = tr.DEVICE_NONE
        # Thread 1's clock runs up to 2 us behind: times step back.
        evs[th].append((seq, a, sz, k, d, now + r.randrange(0, 2000) * (th == 1), site))
    chunks = []
    for th, e in evs.items():
        for lo in range(0, len(e), per_chunk):
            part = e[lo:lo + per_chunk]
            cols = {c: array(trace_synth.TYPECODES[c], [row[i] for row in part])
                    for i, c in enumerate(trace_synth.COLUMNS)}
            chunks.append((part[0][0], th, cols))
    chunks.sort(key=lambda c: c[0])
    trace_synth.write_events(str(path), [(th, cols) for _b, th, cols in chunks],
                             trace_synth.metadata(8))
    return path


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("numpy")
    synth = d / "synth.trace"
    trace_synth.write(str(synth), 120000, sites=6)
    return {"synth": synth, "messy": messy(d / "messy.trace", 60000, 7),
            "messy2": messy(d / "messy2.trace", 30000, 11, threads=5, devs=(2,), per_chunk=97)}


def answers(path, tmp):
    """Every view's answer on one trace, with whichever path trace.np says."""
    out = {}
    t = tr.load(str(path))
    out["events"] = (t.seq, t.addr, t.size, t.kind, t.dev, t.time, t.site,
                     t.foreign_frees, t.foreign_bytes, dict(t.devices))
    out["timeline"] = timeline.build(tr.stream(str(path)))
    out["page"] = timeline.page(tr.stream(str(path)))
    out["peak"] = tracepeak.peak_text(tr.stream(str(path)))
    out["stats"] = tracepeak.stats_text(tr.stream(str(path)))
    # The text rounds (a total to 0.1 GiB): its figures, exactly.
    st = tracepeak._gather(tr.stream(str(path)))
    out["stats figures"] = {k: v for k, v in vars(st).items() if k != "peaks"}
    out["gc"] = gcview.text(tr.stream(str(path)))
    p = tr.peaks(tr.stream(str(path)))
    out["peaks"] = (p.bytes, p.index, sorted(p.per_device.items()))
    pb = tmp / "p.pb.gz"
    pprof.write(tr.stream(str(path)), str(pb))
    out["pprof"] = gzip.decompress(pb.read_bytes())
    buf = io.BytesIO()
    memoryviz.stream_write(tr.stream(str(path)), buf)
    out["memory_viz"] = buf.getvalue()
    mt = tmp / "m.json"
    t = tr.stream(str(path))
    categories.write_timeline(t, str(mt), categories.Classifier(t))
    out["memory timeline"] = mt.read_bytes()
    return out


@pytest.mark.parametrize("name", ["synth", "messy", "messy2"])
def test_numpy_and_pure_python_give_the_same_answers(traces, name, tmp_path):
    path = traces[name]
    tr.np = NUMPY
    fast = answers(path, tmp_path)
    tr.np = None
    slow = answers(path, tmp_path)
    tr.np = NUMPY
    for view in fast:
        assert fast[view] == slow[view], view
    # The traces exercise what they are for.
    if name.startswith("messy"):
        assert fast["events"][7] > 1000                # foreign and double frees dropped
        assert len(set(fast["events"][4])) > (1 if name == "messy" else 0)
    t = fast["timeline"]
    assert t["n"] == len(fast["events"][0]) and t["peak"] > 0 and t["marks"][tr.GC][0] > 0


def test_a_batch_of_numpy_columns_gives_arrays(traces):
    tr.np = NUMPY
    b = next(tr.stream(str(traces["messy"])).batches())
    assert isinstance(b._nd[0], NUMPY.ndarray)
    for name, tc in zip(tr._NAMES, tr._TYPECODES):
        col = getattr(b, name)
        assert isinstance(col, array) and col.typecode == tc and len(col) == len(b)
        assert col.tolist() == b.nd()[tr._NAMES.index(name)].tolist()


def test_spyreshim_no_numpy_turns_the_vectorized_path_off(traces, tmp_path):
    def page(env_extra):
        out = tmp_path / ("page%d.html" % len(env_extra))
        env = dict(os.environ, PYTHONPATH=str(REPO), **env_extra)
        env.pop("SPYRESHIM_NO_NUMPY", None) if not env_extra else None
        r = subprocess.run(
            [sys.executable, "-c",
             "import sys; from spyreshim.cli import main as cli; from spyreshim.reading import trace; print(trace.np is None); "
             "sys.exit(cli.main(sys.argv[1:]))",
             "report", "--view", "timeline", "--html", str(out), str(traces["messy"])],
            env=env, capture_output=True, text=True, timeout=pythons.HANG_S)
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines()[0], out.read_bytes()

    off, slow = page({"SPYRESHIM_NO_NUMPY": "1"})
    on, fast = page({})
    assert (off, on) == ("True", "False")
    assert slow == fast


def test_pypy3_without_numpy_writes_the_same_timeline_and_stats(traces, tmp_path):
    # The reader runs on pypy3 (no numpy there): its page and text are the
    # numpy path's, byte for byte (the page's site table in site order,
    # not a set's order, which differs between the interpreters).
    import shutil
    pypy = shutil.which("pypy3")
    if pypy is None:
        pythons.need("pypy3", "pypy3 is not installed (scripts/deps.sh installs it)")
    tr.np = NUMPY
    path = str(traces["messy"])
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from spyreshim.reading import trace\nfrom spyreshim.views import timeline, tracepeak\n"
            "assert trace.np is None\n"
            "open(sys.argv[2], 'w').write(timeline.page(trace.stream(sys.argv[1])))\n"
            "open(sys.argv[3], 'w').write(tracepeak.stats_text(trace.stream(sys.argv[1])))\n"
            % str(REPO))
    page, stats = tmp_path / "p.html", tmp_path / "s.txt"
    r = subprocess.run([pypy, "-c", code, path, str(page), str(stats)],
                       capture_output=True, text=True, timeout=pythons.HANG_S)
    assert r.returncode == 0, r.stderr
    assert page.read_text() == timeline.page(tr.stream(path))
    assert stats.read_text() == tracepeak.stats_text(tr.stream(path))
