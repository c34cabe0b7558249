"""`spyreshim report --diff` (issue 24, item 5): a program takes a snapshot,
leaks at one site while another site allocates and frees, takes a second
snapshot; the diff of the two snapshots, and of the same two moments of its
trace (--at), shows only the leak, with its bytes and count, in text, JSON
and the flame graph page."""
import json
import subprocess
import sys
from pathlib import Path

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
    from spyreshim import trace as tr
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
