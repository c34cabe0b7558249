"""`spyreshim report --pprof` (issue 24, item 7): the profile is read back
with a protobuf wire-format reader written here (profile.proto's fields,
github.com/google/pprof/proto/profile.proto), checked against the trace's
own live set at the peak and at --at, stacks innermost first in call
order; and with `go tool pprof -top` where Go is installed."""
import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pythons

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CLI = REPO / "scripts" / "spyreshim"
sys.path.insert(0, str(REPO))
from spyreshim.reading import trace as tr  # noqa: E402


def varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def fields(b):
    """[(field, wire, value)] of one message: ints for varints, bytes for
    length-delimited fields; any other wire type is an error here."""
    out, i = [], 0
    while i < len(b):
        key, i = varint(b, i)
        f, w = key >> 3, key & 7
        if w == 0:
            v, i = varint(b, i)
        elif w == 2:
            n, i = varint(b, i)
            v = b[i:i + n]
            assert len(v) == n, "truncated field %d" % f
            i += n
        else:
            raise AssertionError("wire type %d in field %d" % (w, f))
        out.append((f, w, v))
    return out


def packed(b):
    out, i = [], 0
    while i < len(b):
        v, i = varint(b, i)
        out.append(v)
    return out


def read_profile(path):
    p = fields(gzip.decompress(Path(path).read_bytes()))
    strings = [v.decode() for f, _w, v in p if f == 6]
    assert strings[0] == ""

    def one(msg, field, default=0):
        got = [v for f, _w, v in fields(msg) if f == field]
        return got[0] if got else default
    types = [(strings[one(m, 1)], strings[one(m, 2)]) for f, _w, m in p if f == 1]
    funcs = {one(m, 1): (strings[one(m, 2)], strings[one(m, 4)]) for f, _w, m in p if f == 5}
    locs = {}
    for f, _w, m in p:
        if f == 4:
            lines = [v for ff, _ww, v in fields(m) if ff == 4]
            assert len(lines) == 1
            locs[one(m, 1)] = (funcs[one(lines[0], 1)], one(lines[0], 2))
    samples = []
    for f, _w, m in p:
        if f == 2:
            ids = [x for ff, _ww, v in fields(m) if ff == 1 for x in packed(v)]
            vals = [x for ff, _ww, v in fields(m) if ff == 2 for x in packed(v)]
            labels = [(strings[one(v, 1)], strings[one(v, 2)]) for ff, _ww, v in fields(m)
                      if ff == 3]
            samples.append(([locs[i] for i in ids], vals, labels))
    default = [v for f, _w, v in p if f == 14]
    return types, samples, strings[default[0]] if default else None


@pytest.fixture(scope="module")
def demo(tmp_path_factory, builddir):
    tmp = tmp_path_factory.mktemp("pprof")
    trace = tmp / "demo.trace"
    env = dict(os.environ, LD_PRELOAD=str(pythons.shim_lib()), SIMDEV_MEMORY="256M",
               SPYRESHIM_TRACE=str(trace), PYTHONPATH=str(builddir / "tests" / "simdev"))
    r = pythons.run([sys.executable, REPO / "scripts" / "demo_train.py"], env=env)
    assert r.returncode == 0, r.stderr
    return tmp, trace, tr.load(str(trace))


def test_profile_at_the_peak_is_the_live_set(demo):
    tmp, trace, t = demo
    out = tmp / "peak.pb.gz"
    p = subprocess.run([sys.executable, CLI, "report", "--pprof", out, trace],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    types, samples, default = read_profile(out)
    assert types == [("inuse_objects", "count"), ("inuse_space", "bytes")]
    assert default == "inuse_space"
    peak = tr.peaks(t)
    live = tr.live_at(t, peak.index)
    assert sum(v[1] for _s, v, _l in samples) == peak.bytes
    assert sum(v[0] for _s, v, _l in samples) == len(live)
    for stack, _v, labels in samples:
        assert labels == [("device", "simdev")]
        names = [fn for (fn, _file), _line in stack]
        assert names[0] == "Tensor_new" and names[-1] == "<module>", names
        assert not [n for n in names if n.startswith("_PyEval")], names
    big = max(samples, key=lambda s: s[1][1])
    (fn, file), line = big[0][1]
    assert fn == "forward" and file.endswith("demo_train.py") and line > 0


def test_profile_at_a_moment(demo):
    tmp, trace, t = demo
    out = tmp / "at.pb.gz"
    at = len(t) // 3
    p = subprocess.run([sys.executable, CLI, "report", "--pprof", out, "--at", str(at), trace],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    _types, samples, _d = read_profile(out)
    live = tr.live_at(t, at - 1)
    assert sum(v[1] for _s, v, _l in samples) == sum(v[0] for v in live.values())
    p = subprocess.run([sys.executable, CLI, "report", "--pprof", out, "--at", "end", trace],
                       capture_output=True, text=True)
    assert p.returncode == 0 and "at the end of the trace" in p.stderr, p.stderr


def test_go_tool_pprof_reads_it(demo):
    go = shutil.which("go")
    if not go:
        pythons.need("go", "Go is not installed (go tool pprof reads the profile where it is)")
    tmp, trace, _t = demo
    out = tmp / "peak.pb.gz"
    subprocess.run([sys.executable, CLI, "report", "--pprof", out, trace], check=True,
                   capture_output=True)
    r = subprocess.run([go, "tool", "pprof", "-top", str(out)], capture_output=True, text=True,
                       timeout=pythons.HANG_S)
    assert r.returncode == 0, r.stderr
    assert "Tensor_new" in r.stdout and "inuse_space" in (r.stdout + r.stderr)
    # Two moments diffed by the tool people use: the peak against the end
    # (nothing live) is the whole peak, all of it Tensor_new's.
    end = tmp / "end.pb.gz"
    subprocess.run([sys.executable, CLI, "report", "--pprof", end, "--at", "end", trace],
                   check=True, capture_output=True)
    r = subprocess.run([go, "tool", "pprof", "-top", "-diff_base", str(end), str(out)],
                       capture_output=True, text=True, timeout=pythons.HANG_S)
    assert r.returncode == 0, r.stderr
    top = [l.split() for l in r.stdout.splitlines() if l.strip().endswith("Tensor_new")]
    assert top and top[0][1] == "100%", r.stdout


def test_profile_of_a_leak_report_is_what_leaked_by_stack(tmp_path):
    """`report --pprof OUT REPORT.json` writes what leaked, by stack (as
    heaptrack's and jeprof's leak profiles), never exit 0 and no file:
    one sample per listed group, suppressed ones left out unless
    --show-suppressed, innermost frame first."""
    sys.path.insert(0, str(REPO))
    from spyreshim.reading import report as rpt
    data = HERE / "data" / "leak_single.json"
    merged = rpt.merge([rpt.load(str(data))])
    out = tmp_path / "leaks.pb.gz"
    p = subprocess.run([sys.executable, CLI, "report", "--pprof", out, data],
                       capture_output=True, text=True)
    assert p.returncode == 0 and out.exists(), p.stderr
    assert p.stdout == "" and "wrote %s: 3145728 B (3.0 MiB) leaked in 2 stacks" % out in p.stderr
    types, samples, default = read_profile(out)
    assert types == [("inuse_objects", "count"), ("inuse_space", "bytes")]
    assert default == "inuse_space"
    listed = [g for g in merged["groups"] if not g["suppressed"]]
    assert sorted(v for _s, v, _l in samples) == sorted([g["count"], g["bytes"]] for g in listed)
    for (stack, _v, labels), g in zip(samples, listed):
        frames = rpt.visible_frames(g)
        assert [fn for (fn, _file), _line in stack] == [
            f["function"] or rpt.frame_label(f) for f in frames], stack
        assert labels == [("device", g["runtime"])]
    p = subprocess.run([sys.executable, CLI, "report", "--pprof", out, "--show-suppressed", data],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    _t, samples, _d = read_profile(out)
    assert sum(v[1] for _s, v, _l in samples) == 3145728 + 4096
    # --fail-on-leaks keeps its meaning with --pprof.
    p = subprocess.run([sys.executable, CLI, "report", "--pprof", out, "--fail-on-leaks", data],
                       capture_output=True, text=True)
    assert p.returncode == 1, p
