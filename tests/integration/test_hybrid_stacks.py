"""Hybrid stacks: Python frames spliced into the native stack where the
interpreter ran them, the interpreter's own frames folded (issue 12).

On every CPython of the matrix (shared, static, debug, free-threaded), a
script leaks device memory from Python -> extension, from Python ->
extension -> Python callback -> extension, with the GIL held and released,
and from a thread C created; each report is checked frame by frame,
innermost first, as the text report shows it (interpreter frames folded)
and as the JSON keeps it (every frame, evaluation-loop frames next to the
Python frames they ran)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pythons

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "scripts" / "spyreshim"
sys.path.insert(0, str(ROOT))
from spyreshim.reading import report as rpt  # noqa: E402

SCRIPT = '''import ctypes, sys, simdev; kept = []
def keep(t):  # an extension's reference leak; PyPy's ctypes has no pythonapi: held until exit there
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(t)) if hasattr(ctypes, "pythonapi") else kept.append(t)
def mlp(release):
    keep(simdev.Tensor(1000 + release, release_gil=release))
def layer(release):
    mlp(release)
def model(release):
    layer(release)
def cb(n, release):
    keep(simdev.Tensor(n, release_gil=release))
def outer(release):
    simdev.call(cb, 2000 + release, release)
for release in (False, True):
    model(release)
    outer(release)
if "--c-thread" in sys.argv:
    simdev.leak_in_c_thread(3000)
'''

CPYTHONS = [n for n in pythons.NAMES if not n.startswith("pypy")]


def run_script(interp, tmp_path, env=None, args=("--c-thread",)):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    report = tmp_path / "r.json"
    e = {"SPYRESHIM_LEAK_CHECK": "held", "SPYRESHIM_REPORT": str(report), "SPYRESHIM_EXITCODE": "7"}
    e.update(env or {})
    r = pythons.run_python(interp, path=script, args=list(args), env=e)
    assert r.returncode == 7, r.describe()
    return script, report, r


def by_size(report):
    return {g["bytes"]: g for g in rpt.load(str(report))["groups"]}


def key_frames(frames, script):
    """Everything but the interpreter's own native frames, as comparable
    tuples: ("py", function, line) for the script's frames, ("c", function)
    for native ones."""
    out = []
    for f in frames:
        if f["kind"] == "python":
            assert f["file"] == str(script), f
            out.append(("py", f["function"], f["line"]))
        elif not f["interpreter"]:
            out.append(("c", f["function"]))
    return out


MODEL = [("c", "Tensor_new"), ("py", "mlp", 5), ("py", "layer", 7), ("py", "model", 9),
         ("py", "<module>", 15)]
CALLBACK = [("c", "Tensor_new"), ("py", "cb", 11), ("c", "call"), ("py", "outer", 13),
            ("py", "<module>", 16)]


def check_hybrid(g, script, expected):
    assert g["order"] == "hybrid", g
    shown = rpt.visible_frames(g)
    assert key_frames(shown, script) == expected
    # The default view keeps nothing of the interpreter's own object, by
    # address (named or not): the extension frame is followed directly by
    # the innermost Python frame, and nothing native is below the outermost.
    assert not [f for f in shown if f["kind"] == "native" and f["interpreter"]], \
        [(x["function"], x["object"]) for x in shown]
    assert shown[0]["kind"] == "native" and shown[1]["kind"] == "python", shown[:2]
    assert shown[-1]["kind"] == "python", "nothing native below <module>"
    # --native-frames=all still shows every frame.
    assert rpt.visible_frames(g, "all") == g["frames"]
    # The JSON keeps every frame: each evaluation-loop frame follows the
    # Python frames it ran, and every Python frame has exactly one.
    frames = g["frames"]
    loops = [i for i, f in enumerate(frames) if f["function"] and
             f["function"].startswith("_PyEval_EvalFrameDefault")]
    assert loops and all(frames[i]["python_frames"] for i in loops), frames
    assert all(frames[i]["interpreter"] and frames[i]["folded"] for i in loops)
    ran = 0
    for i in loops:
        k = frames[i]["python_frames"]
        assert all(f["kind"] == "python" for f in frames[i - k:i])
        ran += k
    assert ran == len([f for f in frames if f["kind"] == "python"])
    start = {"_start", "__libc_start_main", "__libc_start_call_main", "__libc_start_main_impl"}
    assert all(f["function"] in start or (f["function"] is None and "/libc.so" in f["object"])
               for f in frames
               if f["kind"] == "native" and f["folded"] and not f["interpreter"]), \
        "folding hides only the interpreter and, below it, the program's start"


@pytest.mark.parametrize("name", CPYTHONS)
def test_python_frames_sit_where_the_interpreter_ran_them(name, builddir, shim_lib, tmp_path):
    interp = pythons.get(name).require()
    script, report, r = run_script(interp, tmp_path)
    groups = by_size(report)
    assert sorted(groups) == [1000, 1001, 2000, 2001, 3000], r.describe()
    for release in (0, 1):     # GIL held, GIL released around the allocation
        check_hybrid(groups[1000 + release], script, MODEL)
        check_hybrid(groups[2000 + release], script, CALLBACK)
    if interp.version[:2] <= (3, 10):
        # One evaluation-loop call per Python frame.
        for g, frames in ((groups[1000], 4), (groups[2000], 3)):
            loops = [f["python_frames"] for f in g["frames"] if f["python_frames"] is not None]
            assert loops == [1] * frames
    else:
        # One call runs the script's frames down to the entry from C.
        assert [f["python_frames"] for f in groups[1000]["frames"]
                if f["python_frames"] is not None] == [4]
        assert [f["python_frames"] for f in groups[2000]["frames"]
                if f["python_frames"] is not None] == [1, 2]
    # A thread C created never ran Python: native frames only, nothing folded.
    c = groups[3000]
    assert c["order"] == "native"
    assert c["frames"][0]["function"] == "c_thread_main"
    # start_thread is local to the C library: nameless in one without
    # .symtab (the one Debian unstable's 3.14 and 3.15 bring).
    assert c["frames"][1]["function"] == "start_thread" or (
        c["frames"][1]["function"] is None and "/libc.so" in c["frames"][1]["object"]), c["frames"][1]
    assert not any(f["folded"] for f in c["frames"])

    # The shim's own text at exit folds the same way.
    text = r.stderr
    block = text[text.index("Leak of 1000 B"):]
    block = block[:block.index("\n\n")]
    lines = [ln.strip() for ln in block.splitlines()[1:]]
    names = [ln.split(" in ", 1)[1].split(" ")[0] for ln in lines if " in " in ln]
    assert names[0] == "Tensor_new" and names[-4:] == ["mlp", "layer", "model", "<module>"], block
    assert "_PyEval_EvalFrameDefault" not in block
    assert "interpreter frame(s) folded" in block


def test_report_command_folds_and_shows_every_frame_on_request(builddir, shim_lib, tmp_path):
    interp = next((pythons.get(n) for n in CPYTHONS if pythons.get(n).available), None)
    if interp is None:
        pythons.need("/usr/bin/python3", "no CPython of the matrix is usable")
    script, report, _ = run_script(interp, tmp_path)
    folded = subprocess.run([str(CLI), "report", str(report)], capture_output=True, text=True)
    every = subprocess.run([str(CLI), "report", "--native-frames=all", str(report)],
                           capture_output=True, text=True)
    assert folded.returncode == 0 and every.returncode == 0, folded.stderr + every.stderr
    assert "_PyEval_EvalFrameDefault" not in folded.stdout
    assert "--native-frames=all shows them" in folded.stdout
    assert "_PyEval_EvalFrameDefault" in every.stdout
    g = by_size(report)[1000]
    block = every.stdout[every.stdout.index("Leak of 1000 B"):]
    block = block[:block.index("\n\n")]
    assert len([ln for ln in block.splitlines() if ln.strip().startswith("#")]) == len(g["frames"])


def test_a_cut_stack_is_not_spliced_and_says_so(builddir, shim_lib, tmp_path):
    interp = next((pythons.get(n) for n in CPYTHONS if pythons.get(n).available), None)
    if interp is None:
        pythons.need("/usr/bin/python3", "no CPython of the matrix is usable")
    script, report, r = run_script(interp, tmp_path, env={"SPYRESHIM_STACK_DEPTH": "3"})
    g = by_size(report)[1000]
    assert g["order"] == "python-first" and "cut" in g["unspliced"]
    kinds = [f["kind"] for f in g["frames"]]
    assert kinds == sorted(kinds, key=lambda k: k != "python"), "today's order: Python first"
    assert not any(f["folded"] for f in g["frames"]), "nothing folded in a guess"
    assert "unspliced, Python frames first" in r.stderr


def test_suppressions_match_folded_frames(builddir, shim_lib, tmp_path):
    interp = next((pythons.get(n) for n in CPYTHONS if pythons.get(n).available), None)
    if interp is None:
        pythons.need("/usr/bin/python3", "no CPython of the matrix is usable")
    sup = tmp_path / "sup.txt"
    sup.write_text("leak:PyEval_EvalCode\n")
    script, report, _ = run_script(interp, tmp_path, env={"SPYRESHIM_SUPPRESSIONS": str(sup)})
    groups = by_size(report)
    assert all(groups[n]["suppressed"] for n in (1000, 1001, 2000, 2001))
    assert any(f["folded"] and f["function"] == "PyEval_EvalCode" for f in groups[1000]["frames"])
    assert not groups[3000]["suppressed"]


def test_pypy_reports_say_native_stacks_only(builddir, shim_lib, tmp_path):
    interp = pythons.get("pypy3").require()
    script, report, r = run_script(interp, tmp_path, args=())
    data = json.loads(report.read_text())
    assert "PyPy" in data["python_note"] and "native stacks only" in data["python_note"]
    assert all(g["order"] == "native" for g in data["groups"])
    assert "native stacks only" in r.stderr
    text = subprocess.run([str(CLI), "report", str(report)], capture_output=True, text=True).stdout
    assert "native stacks only" in text


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_flame_graph_reads_outermost_at_the_bottom_in_call_order(builddir, shim_lib, tmp_path):
    interp = next((pythons.get(n) for n in CPYTHONS if pythons.get(n).available), None)
    if interp is None:
        pythons.need("/usr/bin/python3", "no CPython of the matrix is usable")
    script, report, _ = run_script(interp, tmp_path)
    page = tmp_path / "flame.html"
    r = subprocess.run([str(CLI), "report", "--html", str(page), str(report)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    html = page.read_text(encoding="utf-8")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_html_report import parse   # the page's own parser
    boxes = parse(html).boxes
    depth = {}
    for b in boxes:
        depth.setdefault(b["attrs"]["data-label"], []).append(int(b["attrs"]["data-d"]))
    one = {k: v[0] for k, v in depth.items() if len(v) == 1}
    # Outermost at the root (depth 1), up to the allocation, in call order.
    chain = ["<module> (script.py:15)", "model (script.py:9)", "layer (script.py:7)",
             "mlp (script.py:5)"]
    assert [one[k] for k in chain] == [1, 2, 3, 4], depth
    assert min(depth["Tensor_new"]) > one["mlp (script.py:5)"]
    cb = ["<module> (script.py:16)", "outer (script.py:13)", "call", "cb (script.py:11)"]
    assert [one[k] for k in cb] == [1, 2, 3, 4], depth
    assert "_PyEval_EvalFrameDefault" not in depth and "_start" not in depth
    if CHROMIUM is None:
        pythons.need("chromium", "chromium is not installed (Debian: apt-get install chromium)")
    profile = tmp_path / "profile"
    shot = tmp_path / "hybrid-flamegraph.png"
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update",
                        "--disable-sync", "--hide-scrollbars", "--user-data-dir=%s" % profile,
                        "--screenshot=%s" % shot, "--window-size=1280,700", page.as_uri()],
                       capture_output=True, timeout=pythons.HANG_S)
    assert r.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    d = os.environ.get("SPYRESHIM_SCREENSHOT_DIR")
    if d:
        os.makedirs(d, exist_ok=True)
        shutil.copy(shot, d)
