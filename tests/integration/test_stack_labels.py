"""The user's own line first (issue 48 items 1-3): a trace's views fold each
run of a library's frames (the frameworks', site-packages', the C runtime's,
the interpreter's) into one frame named after the library unless
`--native-frames=all`; a site is labelled by its first frame in the user's
code, and sites listed together that would read the same get the frame
where their stacks parted; a frame the process did not name is named by the
reader from the object's symbol tables (.dynsym of a stripped object
included) through the trace's module map.

The PyTorch case is a real 200-step training loop on the simdev device
(tests/torch/simdev_torch) under PyTorch 2.x, recorded with `spyreshim run
--trace`."""
import re
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
from spyreshim.reading import frames  # noqa: E402

sys.path.insert(0, str(HERE))
import pythons  # noqa: E402
import torchrun  # noqa: E402

LOOP = textwrap.dedent("""\
    import torch
    import simdev_torch

    dev = simdev_torch.device
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(64, 256)
    target = torch.randint(0, 10, (64,))


    def step(i):
        opt.zero_grad()
        x = data.to(dev)
        y = target.to(dev)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss


    for i in range(200):
        step(i)
    print("done")
    """)
TO_LINE = 15        # x = data.to(dev)
assert LOOP.splitlines()[TO_LINE - 1].strip() == "x = data.to(dev)"
FOLDED = re.compile(r"^\s+#\d+ \[[^]]+\]$")
LIBTORCH = re.compile(r"\[libtorch_cpu\.so(?: \+\d+ more)?: \d+ frames\]")


def _report(trace, *args, cwd):
    r = torchrun.run(argv=[str(torchrun.SCRIPT), "report", *args, str(trace)], cwd=cwd)
    assert r.returncode == 0, r.describe()
    return r.stdout


@pytest.fixture(scope="module")
def loop_trace(builddir, tmp_path_factory):
    torchrun.require("2")
    tmp = tmp_path_factory.mktemp("loop")
    (tmp / "torch_loop.py").write_text(LOOP)
    trace = tmp / "loop.trace"
    r = torchrun.run(argv=[str(torchrun.SCRIPT), "run", "--trace", str(trace), "--",
                           torchrun.PYTHON, str(tmp / "torch_loop.py")], cwd=tmp)
    assert r.returncode == 0 and "done" in r.stdout, r.describe()
    return trace, tmp


BACKWARD_LINE = 18   # loss.backward()
assert LOOP.splitlines()[BACKWARD_LINE - 1].strip() == "loss.backward()"


def test_torch_loop_autograd_thread_is_labelled_by_backward(loop_trace):
    """With the PyTorch preset, what the autograd engine allocates on its
    device thread (no Python frame there) names the backward() call; each
    such site is told apart by its backward function. Without it they are
    the allocator's, "on another thread" nowhere."""
    trace, tmp = loop_trace
    plain = _report(trace, "--view", "stats", "--top", "8", cwd=tmp)
    assert "on another thread" not in plain
    ptrace = tmp / "preset.trace"
    r = torchrun.run(argv=[str(torchrun.SCRIPT), "run", "--preset", "torch", "--trace", str(ptrace),
                           "--", torchrun.PYTHON, str(tmp / "torch_loop.py")], cwd=tmp)
    assert r.returncode == 0 and "done" in r.stdout, r.describe()
    stats = _report(ptrace, "--view", "stats", "--top", "8", cwd=tmp)
    bw = re.findall(r"^\t- (step \(torch_loop\.py:%d\), on another thread via (\S+)): " % BACKWARD_LINE,
                    stats, re.M)
    assert len(bw) >= 2 and any("Backward" in via or "backward" in via for _l, via in bw), stats
    peak = _report(ptrace, cwd=tmp)
    assert max(map(len, peak.splitlines())) <= 120
    groups = [g for g in peak.split("\nLive: ")[1:] if "started its work" in g]
    assert groups, peak
    for g in groups:
        fl = [ln for ln in g.splitlines() if re.match(r"^\s+#\d+ ", ln)]
        assert FOLDED.match(fl[0]) and "in step %s:%d [python]" % (
            tmp / "torch_loop.py", BACKWARD_LINE) in fl[1], g


def test_torch_loop_peak_names_the_users_line_first(loop_trace):
    trace, tmp = loop_trace
    out = _report(trace, cwd=tmp)
    lines = out.splitlines()
    assert max(map(len, lines)) <= 120, max(lines, key=len)
    # Every group: before its first frame in torch_loop.py only folded
    # library frames; the .to() site is the user's line right after one
    # folded run that holds libtorch_cpu.so's dispatcher frames.
    groups = out.split("\nLive: ")[1:]
    assert groups, out
    seen_to = False
    for g in groups:
        fl = [ln for ln in g.splitlines() if re.match(r"^\s+#\d+ ", ln)]
        user = [i for i, ln in enumerate(fl) if "torch_loop.py:" in ln]
        if not user:
            continue        # the autograd thread's: no Python frame
        assert all(FOLDED.match(ln) for ln in fl[:user[0]]), g
        if "torch_loop.py:%d " % TO_LINE in fl[user[0]]:
            seen_to = True
            assert user[0] == 1 and LIBTORCH.search(fl[0]), g
            assert re.match(r"^\s+#1 in step \S+/torch_loop\.py:%d \[python\]$" % TO_LINE,
                            fl[1]), g
    assert seen_to, out
    assert "at::_ops::_to_copy" not in out and "SimdevAllocator" not in out


def test_torch_loop_native_frames_all_shows_them(loop_trace):
    trace, tmp = loop_trace
    out = _report(trace, "--native-frames", "all", cwd=tmp)
    assert not re.search(r"#\d+ \[", out), out[:2000]
    assert "at::_ops::_to_copy::redispatch(" in out
    assert torchrun.ALLOCATE in out
    assert "in step %s:%d [python]" % (tmp / "torch_loop.py", TO_LINE) in out


def test_torch_loop_flame_graph_folds_the_dispatcher(loop_trace):
    trace, tmp = loop_trace
    for how, want in (([], True), (["--native-frames=all"], False)):
        page = tmp / "peak.html"
        _report(trace, "--html", str(page), *how, cwd=tmp)
        text = page.read_text()
        assert bool(LIBTORCH.search(text)) == want, how
        assert ("_to_copy::redispatch" in text) != want, how


def test_torch_loop_stats_labels_differ_between_sites(loop_trace):
    trace, tmp = loop_trace
    out = _report(trace, "--view", "stats", "--top", "8", cwd=tmp)
    for head in ("by peak live bytes", "by number of allocations"):
        part = out.split(head)[1].split("\nTop ")[0].split("\nPressure")[0]
        labels = [m.group(1) for m in re.finditer(r"^\t- (.*): \d", part, re.M)]
        assert len(labels) == 8, part
        assert len(set(labels)) == len(labels), part       # each site reads its own
    assert "\t- step (torch_loop.py:%d): " % TO_LINE in out
    # The forward's sites on one line are told apart by the call inside torch.
    assert re.search(r"step \(torch_loop\.py:17\) via Linear\.forward \(linear\.py:\d+\)", out), out
    assert "SimdevAllocator::allocate(unsigned long): " not in out
    # The timeline's legend: one entry per site, none twice.
    page = tmp / "timeline.html"
    _report(trace, "--view", "timeline", "--html", str(page), cwd=tmp)
    text = page.read_text()
    legend = text[text.index('<div id="legend">'):]
    legend = legend[:legend.index("</div>")]
    names = re.findall(r"</i>([^<]*)</span>", legend)
    sites = names[:names.index("other sites")]
    assert len(sites) >= 4 and len(set(sites)) == len(sites), names


def test_library_of_a_frame():
    def native(obj, fn="f"):
        return {"kind": "native", "function": fn, "file": None, "line": None, "object": obj}

    def py(file):
        return {"kind": "python", "function": "f", "file": file, "line": 1, "object": None}
    sp = "/v/lib/python3.11/site-packages/"
    assert frames.library(native(sp + "torch/lib/libtorch_cpu.so")) == "libtorch_cpu.so"
    assert frames.library(native("/usr/lib/python3/dist-packages/pyopencl/"
                                 "_cl.cpython-311-x86_64-linux-gnu.so")) == "pyopencl"
    assert frames.library(native("/lib/x86_64-linux-gnu/libc.so.6")) == "libc.so.6"
    assert frames.library(native("/usr/lib/x86_64-linux-gnu/libpocl.so.2")) == "libpocl.so.2"
    assert frames.library(native("/usr/bin/python3.11")) == "python3.11"
    assert frames.library(native("/home/u/hashcat")) is None
    assert frames.library(py(sp + "torch/nn/modules/linear.py")) == "torch"
    assert frames.library(py("/usr/lib/python3.11/threading.py")) == "python"
    assert frames.library(py("<frozen importlib._bootstrap>")) == "python"
    assert frames.library(py("/home/u/train.py")) is None
    # A run of library frames is one frame, named after the one with most.
    fr = [native(sp + "torch/lib/libtorch_cpu.so")] * 3 + [native("/x/libc10.so")] + \
         [py("/home/u/train.py")] + [native("/usr/bin/python3.11")]
    out = frames.fold(fr)
    assert [f["function"] for f in out] == ["[libtorch_cpu.so +1 more: 4 frames]", "f",
                                            "[python3.11]"]


STRIPPED_C = r"""
#include <stdlib.h>
__attribute__((noinline, visibility("default"))) void *exported_alloc(unsigned long n)
{ void *p = malloc(n); __asm__ volatile("" ::: "memory"); return p; }
__attribute__((noinline, visibility("hidden"))) void *hidden_alloc(unsigned long n)
{ void *p = malloc(n + 1); __asm__ volatile("" ::: "memory"); return p; }
"""


def _stripped_object(tmp):
    if not shutil.which("gcc") or not shutil.which("strip") or not shutil.which("readelf"):
        pythons.need("g++", "gcc, strip and readelf build the stripped object")
    src = tmp / "obj.c"
    src.write_text(STRIPPED_C)
    so = tmp / "libstripped.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    syms = {}
    for ln in subprocess.run(["readelf", "-sW", str(so)], capture_output=True, text=True,
                             check=True).stdout.splitlines():
        p = ln.split()
        if len(p) >= 8 and p[3] == "FUNC" and p[7] in ("exported_alloc", "hidden_alloc"):
            syms[p[7]] = (int(p[1], 16), int(p[2]))
    subprocess.run(["strip", str(so)], check=True)
    r = subprocess.run(["readelf", "-SW", str(so)], capture_output=True, text=True, check=True)
    assert ".symtab" not in r.stdout and ".dynsym" in r.stdout
    loads = []
    for ln in subprocess.run(["readelf", "-lW", str(so)], capture_output=True, text=True,
                             check=True).stdout.splitlines():
        p = ln.split()
        if p[:1] == ["LOAD"]:
            loads.append((int(p[1], 16), int(p[2], 16), int(p[4], 16)))   # off, vaddr, filesz
    return so, syms, loads


def _rec(tag, body):
    body += b"\0" * (-len(body) % 8)
    return struct.pack("<II", tag, len(body)) + body


def test_unnamed_frame_of_a_stripped_object_gets_its_dynamic_symbol(tmp_path):
    """A trace whose process wrote no names (killed before exit): the
    module map says which file and offset; the reader names the exported
    function from .dynsym and leaves the hidden one unnamed (no symbol
    holds it: naming it after its neighbour would mislabel)."""
    so, syms, loads = _stripped_object(tmp_path)
    base = 0x7F0000000000

    def addr(name):      # a return address inside the function
        vaddr = syms[name][0] + min(4, syms[name][1] - 1)
        off, va, _sz = next(x for x in loads if x[1] <= vaddr < x[1] + x[2])
        return base + vaddr - va + off
    maps = "".join("%x-%x r-xp %08x 00:00 0 %s\n" % (base + off, base + off + ((sz + 4095) & ~4095),
                                                     off, so) for off, _va, sz in loads)
    meta = _rec(3, struct.pack("<II", 0, 0) + b"simdev\0")
    meta += _rec(1, struct.pack("<IIII", 1, 1, 0, 0)) + _rec(1, struct.pack("<IIII", 2, 2, 0, 0))
    meta += _rec(2, struct.pack("<IIQ", 1, 1, addr("exported_alloc")))
    meta += _rec(2, struct.pack("<IIQ", 2, 1, addr("hidden_alloc")))
    meta += _rec(4, maps.encode())
    ev = struct.Struct("<QQQII")
    body = ev.pack(0x1000, 4096 | (1 << 48), 1000, 1, 1) + ev.pack(0x3000, 64 | (1 << 48), 2000, 2, 2)
    data = struct.pack("<8sIIQQ", b"SPYTRACE", 1, 4242, 0, 0)
    data += struct.pack("<IIIIQQ", 0x4B4E4843, 2, len(meta), 0, 1, 0) + body + meta
    trace = tmp_path / "killed.trace"
    trace.write_bytes(data)
    r = subprocess.run([sys.executable, "-m", "spyreshim", "report", "--native-frames", "all",
                        str(trace)], capture_output=True, text=True, cwd=str(REPO))
    assert r.returncode == 0, r.stderr
    assert re.search(r"#0 0x[0-9a-f]+ in exported_alloc \(%s\+0x[0-9a-f]+\)" % re.escape(str(so)),
                     r.stdout), r.stdout
    assert "hidden_alloc" not in r.stdout
    assert re.search(r"#0 0x[0-9a-f]+ \(%s\+0x[0-9a-f]+\)$" % re.escape(str(so)), r.stdout,
                     re.M), r.stdout
    # The stats view labels the site by it too (the user's own object).
    s = subprocess.run([sys.executable, "-m", "spyreshim", "report", "--view", "stats",
                        str(trace)], capture_output=True, text=True, cwd=str(REPO))
    assert "\t- exported_alloc: 4096 B (4.0 KiB)" in s.stdout, s.stdout


# ------------------------------------------------------ the origin of work

ORIGIN_SCRIPT = '''import sys
sys.path.insert(0, %r)
import simdev, spyreshim
def started():
    with spyreshim.origin():                # ORIGIN LINE: the stack at begin
        simdev.leak_in_c_thread(3000)
started()
simdev.leak_in_c_thread(3001)               # nothing handed off
with spyreshim.origin():
    with spyreshim.origin():                # two at once: neither is named
        simdev.leak_in_c_thread(3002)
simdev.leak_in_c_thread(3003)               # all ended
'''


def test_work_on_a_thread_without_python_names_the_call_that_started_it(builddir, shim_lib,
                                                                        tmp_path):
    """The shape of backward(): a Python call hands work to a thread that
    runs no Python and waits for it. Inside spyreshim.origin() that
    thread's allocation records the caller's stack as its origin: the
    leak report lists the thread's native frames, then the caller's Python
    frames, and says so; the trace's views label the site by the caller's
    line. Two such calls at once, or none, leave native frames only."""
    interp = next((pythons.get(n) for n in ("cpython3.11-shared", "cpython3.12", "cpython3.11-static")
                   if pythons.get(n).available), None)
    if interp is None:
        pythons.need("cpython3.11-shared", "no CPython 3.11/3.12 to run the script")
    script = tmp_path / "script.py"
    script.write_text(ORIGIN_SCRIPT % str(REPO))
    line = next(i for i, ln in enumerate(ORIGIN_SCRIPT.splitlines(), 1) if "ORIGIN LINE" in ln)
    report, trace = tmp_path / "r.json", tmp_path / "r.trace"
    r = pythons.run_python(interp, path=script, env={
        "SPYRESHIM_LEAK_CHECK": "held", "SPYRESHIM_REPORT": str(report),
        "SPYRESHIM_EXITCODE": "7", "SPYRESHIM_TRACE": str(trace)})
    assert r.returncode == 7, r.describe()
    from spyreshim.reading import callorder, report as rpt, trace as tr
    groups = {g["bytes"]: g for g in rpt.load(str(report))["groups"]}
    g = groups[3000]
    assert g["order"] == "origin", g
    kinds = [f["kind"] for f in g["frames"]]
    assert kinds[0] == "native" and kinds[-1] == "python", kinds
    first_py = kinds.index("python")
    assert all(k == "python" for k in kinds[first_py:]), kinds
    assert g["frames"][0]["function"] == "c_thread_main"
    py = [(f["function"], f["line"]) for f in g["frames"][first_py:] if f["file"] == str(script)]
    assert py == [("started", line), ("<module>", line + 2)], g["frames"]
    assert rpt.site_label(g) == "c_thread_main, from started (script.py:%d)" % line
    # 3001, 3002 and 3003: one stack, native only (one group).
    rest = groups[3001 + 3002 + 3003]
    assert rest["order"] == "native" and rest["count"] == 3, rest
    assert not any(f["kind"] == "python" for f in rest["frames"]), rest
    # The shim's own text at exit says what the Python frames are.
    block = r.stderr[r.stderr.index(" 3000 B (2.9 KiB) in 1 allocation(s)"):]
    block = block[:block.index("\n\n")]
    assert "started %s:%d [python]" % (script, line) in block, block
    assert "the Python frames are the call that started its work" in block, block
    # The trace: the same order, and the label.
    t = tr.load(str(trace))
    sites = {sz: site for (sz, site, _i) in tr.live_at(t, len(t) - 1).values()}
    assert callorder.group(t, sites[3000])["order"] == "origin"
    assert callorder.label(t, sites[3000]) == \
        "c_thread_main, from started (script.py:%d), on another thread" % line
    assert callorder.group(t, sites[3002])["order"] == "native"
