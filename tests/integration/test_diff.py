"""`spyreshim report --diff` (issue 24, item 5): a program takes a snapshot,
leaks at one site while another site allocates and frees, takes a second
snapshot; the diff of the two snapshots, and of the same two moments of its
trace (--at), shows only the leak, with its bytes and count, in text, JSON
and the flame graph page."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pythons

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CLI = ROOT / "scripts" / "spyreshim"

SCRIPT = '''import sys
sys.path.append(sys.argv[3])
import simdev, spyreshim
kept = []
def steady():
    kept.append(simdev.Tensor(1000))
def churn():
    t = simdev.Tensor(777)
    del t
def leaky():
    kept.append(simdev.Tensor(4096))
for _ in range(3):
    steady()
spyreshim.snapshot().write_json(sys.argv[1])
for _ in range(5):
    leaky()
    churn()
spyreshim.snapshot().write_json(sys.argv[2])
'''


def cli(*args):
    return subprocess.run([sys.executable, CLI, "report"] + [str(a) for a in args],
                          capture_output=True, text=True)


def test_diff_of_two_snapshots_and_of_a_trace_shows_only_the_leak(builddir, tmp_path):
    interp = pythons.get("cpython3.11-static").require()
    script = tmp_path / "leak.py"
    script.write_text(SCRIPT)
    a, b, trace = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "r.trace"
    r = pythons.run_python(interp, path=script, args=[str(a), str(b), str(ROOT)],
                           env={"SPYRESHIM_LEAK_CHECK": "1", "SPYRESHIM_TRACE": str(trace)})
    assert r.returncode == 0, r.describe()
    p = cli("--diff", a, b)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("Grew by") == 1, p.stdout
    assert "Grew by 20480 B (20.0 KiB) in 5 allocation(s)" in p.stdout
    lines = p.stdout.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith("Grew by"))
    assert "Tensor_new" in lines[i + 1] and "in leaky " in lines[i + 2], lines[i:i + 4]
    assert "steady" not in p.stdout and "churn" not in p.stdout
    assert "SUMMARY: spyreshim: 20480 B (20.0 KiB) grew in 5 allocation(s) at 1 site(s)." in p.stdout
    # Reversed: nothing grew from B to A.
    p = cli("--diff", b, a)
    assert "Grew by" not in p.stdout and "0 B grew" in p.stdout
    # The same two moments of the trace (after the third steady
    # allocation, after the last churn's free): exact by block.
    sys.path.insert(0, str(ROOT))
    from spyreshim.reading import trace as tr
    t = tr.load(str(trace))
    ev = [(t.kind[i], t.size[i]) for i in range(len(t))]
    at1 = [i for i, e in enumerate(ev) if e == (tr.ALLOC, 1000)][2] + 1
    at2 = [i for i, e in enumerate(ev) if e == (tr.FREE, 777)][-1] + 1
    from_trace = cli("--diff", "--at", at1, "--at", at2, trace)
    assert from_trace.returncode == 0, from_trace.stderr
    out = from_trace.stdout
    assert "Grew by 20480 B (20.0 KiB) in 5 allocation(s)" in out, out
    assert out.count("Grew by") == 1 and "steady" not in out and "churn" not in out, out
    js, page = tmp_path / "d.json", tmp_path / "d.html"
    p = cli("--diff", a, b, "--json", js, "--html", page)
    assert p.returncode == 0, p.stderr
    d = json.loads(js.read_text())
    assert d["format"] == "spyreshim-diff" and d["grown_bytes"] == 20480
    assert [(g["bytes"], g["count"]) for g in d["groups"]] == [(20480, 5)]
    assert d["groups"][0]["frames"][0]["function"] == "Tensor_new"
    html = page.read_text()
    assert "growth from" in html and "leaky" in html and "steady" not in html
    # Usage errors: one line each.
    for bad in (["--diff", a], ["--diff", "--at", "1", trace], ["--at", "1", trace]):
        p = cli(*bad)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, (bad, p.stderr)


GARBAGE = '''import gc, simdev
gc.disable()
kept = []
class Node:
    def __init__(self):
        self.me = self
        self.t = simdev.Tensor(8 << 20)      # garbage: a cycle the shim's collection frees
def garbage():
    Node()
def leaky():
    kept.append(simdev.Tensor(1 << 20))      # the real growth
for _ in range(20):
    garbage()
    leaky()
'''


@pytest.fixture(scope="module")
def garbage_trace(tmp_path_factory):
    """A program whose reference cycles fill a 64 MiB device between the
    shim's collections, while one site keeps 1 MiB a round."""
    interp = pythons.get("cpython3.11-static").require()
    tmp = tmp_path_factory.mktemp("garbage")
    script, trace = tmp / "garbage.py", tmp / "g.trace"
    script.write_text(GARBAGE)
    bare = pythons.run_python(interp, path=script, preload=False, simdev_memory="64M")
    assert bare.returncode != 0, "without the shim the cycles fill the device: " + bare.describe()
    r = pythons.run_python(interp, path=script, simdev_memory="64M",
                           env={"SPYRESHIM_TRACE": str(trace)})
    assert r.returncode == 0, r.describe()
    sys.path.insert(0, str(ROOT))
    from spyreshim.reading import trace as tr
    return trace, tr.load(str(trace)), tr


def test_diff_lists_garbage_a_later_collection_freed_apart(garbage_trace, tmp_path):
    trace, t, tr = garbage_trace
    kinds = list(t.kind)
    gcs = [i for i, k in enumerate(kinds) if k == tr.GC]
    press = [i for i, k in enumerate(kinds) if k == tr.PRESSURE_BEGIN]
    assert len(gcs) >= 2, kinds
    # From the end of the first collection to just before the next
    # pressure event: the garbage made in between is still live then.
    i1 = gcs[0]
    i2 = next(p for p in press if p > i1) - 1
    live = {k: v for k, v in tr.live_at(t, i2).items() if v[2] > i1}
    leak = [v[0] for v in live.values() if v[0] == 1 << 20]
    junk = [v[0] for v in live.values() if v[0] == 8 << 20]
    assert leak and junk and len(leak) + len(junk) == len(live)
    p = cli("--diff", "--at", i1 + 1, "--at", i2 + 1, trace, "--json", tmp_path / "d.json")
    assert p.returncode == 0, p.stderr
    d = json.loads((tmp_path / "d.json").read_text())
    assert (d["grown_bytes"], d["grown_allocations"]) == (sum(leak), len(leak)), d
    assert (d["collected_bytes"], d["collected_allocations"]) == (sum(junk), len(junk)), d
    assert len(d["collected_groups"]) == 1 and "Node.__init__" in [
        f["function"] for f in d["collected_groups"][0]["frames"] if f["kind"] == "python"]
    out = cli("--diff", "--at", i1 + 1, "--at", i2 + 1, trace).stdout
    # The real growth first and alone under "Grew by"; the garbage after,
    # under its own heading, and counted apart in the summary.
    grew, _, later = out.partition("Garbage a later collection freed")
    assert grew.count("Grew by") == 1 and "in leaky " in grew and "Node" not in grew, out
    from spyreshim.reading.units import format_size
    assert "Grew by %s in %d allocation(s)" % (format_size(sum(leak)), len(leak)) in grew, out
    assert "Collected later: %s in %d allocation(s)" % (format_size(sum(junk)), len(junk)) in later
    assert "in Node.__init__ " in later and "Grew by" not in later, out
    assert ("SUMMARY: spyreshim: %s grew in %d allocation(s) at 1 site(s); %s more in %d "
            "allocation(s) was garbage a later collection freed." % (
                format_size(sum(leak)), len(leak), format_size(sum(junk)), len(junk))) in out, out
    # Titles give times, not event numbers.
    assert re.search(r"^spyreshim: growth in \S+ from \d+\.\d{6} s to \d+\.\d{6} s$", out, re.M), out
    # The flame graph draws the growth only and says what it left out.
    page = tmp_path / "d.html"
    assert cli("--diff", "--at", i1 + 1, "--at", i2 + 1, trace, "--html", page).returncode == 0
    html = page.read_text()
    assert "leaky" in html and "Node.__init__" not in html
    assert "Not drawn: %s in %d allocation(s)" % (format_size(sum(junk)), len(junk)) in html
    # Its pprof profile is the growth's too.
    prof = tmp_path / "d.pb.gz"
    assert cli("--diff", "--at", i1 + 1, "--at", i2 + 1, trace, "--pprof", prof).returncode == 0
    import gzip
    body = gzip.decompress(prof.read_bytes())
    assert b"leaky" in body and b"Node.__init__" not in body


def test_diff_of_a_trace_without_moments_runs_to_the_shutdown(garbage_trace, tmp_path):
    trace, t, tr = garbage_trace
    shut = [i for i, k in enumerate(t.kind) if k == tr.SHUTDOWN]
    assert len(shut) == 1, "one shutdown marker per interpreter lifetime"
    before = tr.live_at(t, shut[0] - 1)
    # The exit's teardown frees what the program held: the end of the
    # trace is not the moment to compare.
    assert sum(v[0] for v in before.values()) > sum(v[0] for v in tr.live_at(t, len(t) - 1).values())
    p = cli("--diff", trace, "--json", tmp_path / "d.json")
    assert p.returncode == 0, p.stderr
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["grown_bytes"] + d["collected_bytes"] == sum(v[0] for v in before.values()), d
    assert d["grown_bytes"] >= 20 << 20        # every round's 1 MiB, kept to the end
    assert d["between"].startswith("in %s from the start to " % trace), d["between"]
    assert d["between"].endswith(" s (the interpreter's shutdown)"), d["between"]
    # --at end is the last event; the same figures as its event number.
    a = cli("--diff", "--at", "1", "--at", "end", trace)
    b = cli("--diff", "--at", "1", "--at", len(t), trace)
    assert a.returncode == 0 and a.stdout == b.stdout, (a.stderr, b.stderr)


@pytest.mark.parametrize("moment", ["9999s", "100000"])
def test_a_moment_past_the_end_of_the_trace_is_one_error(garbage_trace, moment):
    trace, t, _tr = garbage_trace
    p = cli("--diff", "--at", "1", "--at", moment, trace)
    assert p.returncode == 2 and p.stdout == "", p
    line, = p.stderr.splitlines()
    assert "past the end of %s" % trace in line and "grew" not in line, line
    assert ("it ends at " in line) if moment.endswith("s") else ("it has %d events" % len(t) in line)
