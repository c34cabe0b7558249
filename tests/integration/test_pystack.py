"""Python stacks of allocating threads (python_gc/pystack.c, pyframes.c).

Two layers, on every interpreter of the matrix:
- pystack by itself, through tests/pystack/hook.c loaded with ctypes:
  ctypes.PyDLL calls keep the GIL, ctypes.CDLL calls release it around
  the call (as PyTorch's bindings and simdev.Tensor(n, release_gil=True)
  do), so both capture paths run on a real interpreter. The frame layout
  is also compared with offsets compiled from the interpreter's headers.
- end to end: a script leaks a simdev tensor through a reference leak,
  under LD_PRELOAD=libspyreshim.so with SPYRESHIM_LEAK_CHECK=1, and the
  JSON report names its file:line and function, native frames below.
"""
import json
import os
import subprocess
import textwrap

import pytest

import pythons

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE_SRC = os.path.join(HERE, "..", "pystack", "probe_offsets.c")


@pytest.fixture(scope="session")
def hook(builddir):
    lib = builddir / "tests" / "libpystackhook.so"
    if not lib.exists():
        pytest.fail(f"{lib} is missing: ninja -C {builddir}")
    return lib


# Loaded first by every hook script: `gil` and `nogil` call the same
# library with and without the GIL; frames(id) -> [(function, file, line)].
PRELUDE = r'''
import ctypes, gc, os, sys, threading
HOOK = os.environ["PYSTACK_HOOK"]
gil = ctypes.PyDLL(HOOK) if hasattr(ctypes, "PyDLL") else ctypes.CDLL(HOOK)  # PyPy: no PyDLL
nogil = ctypes.CDLL(HOOK)
for _l in (gil, nogil):
    _l.pystack_test_capture.restype = ctypes.c_uint
    _l.pystack_test_capture.argtypes = [ctypes.c_uint]
    _l.pystack_test_frames.restype = ctypes.c_size_t
    _l.pystack_test_frames.argtypes = [ctypes.c_uint, ctypes.c_char_p, ctypes.c_size_t]
F = os.path.abspath(__file__)
QUAL = sys.version_info >= (3, 11)

def frames(sid):
    buf = ctypes.create_string_buffer(1 << 20)
    n = gil.pystack_test_frames(sid, buf, len(buf))
    out = []
    for line in buf.value.decode().splitlines():
        fn, fi, li = line.split("\t")
        out.append((fn, fi, int(li)))
    assert len(out) == min(n, 256), (n, out)
    return out

def here():
    return sys._getframe(1).f_lineno

def make(name, body="return lib.pystack_test_capture(8)"):
    """A fresh function (and code object) named `name`."""
    ns = {}
    src = f"def {name}(lib):\n    {body}\n"
    exec(compile(src, f"/virtual/{name}.py", "exec"), ns)
    return ns[name]
'''


def run_hook(interp, hook, source):
    res = pythons.run_python(interp, PRELUDE + textwrap.dedent(source), preload=False,
                             simdev=False, env={"PYSTACK_HOOK": hook})
    res.check()
    return res


def cpython(interp):
    if interp.kind != "cpython":
        pythons.need("cpython", f"{interp.name}: Python stacks are CPython only (PyPy: native stacks)")
    return interp


def test_layout_matches_the_interpreters_headers(interpreter, hook, tmp_path):
    cpython(interpreter)
    if not interpreter.include or not os.path.exists(os.path.join(interpreter.include, "Python.h")):
        pythons.need(interpreter.name, f"{interpreter.name}: no headers at {interpreter.include!r}")
    exe = tmp_path / "probe"
    cc = os.environ.get("CC", "cc")
    build = subprocess.run([cc, "-std=gnu11", *pythons.include_args(interpreter), PROBE_SRC,
                            "-o", str(exe)], capture_output=True, text=True, timeout=pythons.HANG_S)
    assert build.returncode == 0, build.stderr
    want = dict(line.split() for line in subprocess.check_output([str(exe)], text=True).splitlines())
    res = run_hook(interpreter, hook, """
        for published in (1, 0):
            buf = ctypes.create_string_buffer(4096)
            rc = gil.pystack_test_layout(published, buf, len(buf))
            print("=== published" if published else "=== table")
            print(buf.value.decode())
            if sys.version_info >= (3, 13) and not published:
                # No table from 3.13 on: the interpreter's own offsets only.
                assert rc == -1 and "_Py_DebugOffsets only" in buf.value.decode(), buf.value
            else:
                assert rc == 0, buf.value
    """)
    _, published, table = res.stdout.split("=== ")
    if tuple(interpreter.version[:2]) >= (3, 13):
        assert "source _Py_DebugOffsets" in published, published
    for text in (published, table) if tuple(interpreter.version[:2]) < (3, 13) else (published,):
        lines = text.strip().splitlines()[1:]
        got = dict(line.split(None, 1) for line in lines)
        got.pop("source")
        assert got == want, f"{text.splitlines()[0]}: ours {got}\nheaders {want}"


@pytest.mark.parametrize("mode", ["gil", "nogil"])
def test_stack_names_function_file_and_line(interpreter, hook, mode):
    cpython(interpreter)
    run_hook(interpreter, hook, f"""
        lib = {mode}
        def inner(lib):
            return lib.pystack_test_capture(32), here()
        class Model:
            def forward(self, lib):
                return inner(lib), here()
        def outer(lib):
            return Model().forward(lib), here()
        ((sid, l_inner), l_fwd), l_outer = outer(lib); l_mod = here()
        assert sid != 0
        got = frames(sid)
        want = [("inner", F, l_inner), ("Model.forward" if QUAL else "forward", F, l_fwd),
                ("outer", F, l_outer), ("<module>", F, l_mod)]
        assert got == want, (got, want)
        # Interned: the same stack twice is one id; another line is another.
        ((sid2, _), _), _ = outer(lib); l2 = here()
        assert sid2 != sid and frames(sid2)[3] == ("<module>", F, l2)
        ids = {{outer(lib)[0][0][0] for _ in range(5)}}
        assert len(ids) == 1 and 0 not in ids, ids
    """)


@pytest.mark.parametrize("mode", ["gil", "nogil"])
def test_threads_generators_and_depth(interpreter, hook, mode):
    cpython(interpreter)
    run_hook(interpreter, hook, f"""
        lib = {mode}
        res = {{}}
        def worker():
            res["w"] = (lib.pystack_test_capture(64), here())
        t = threading.Thread(target=worker); t.start(); t.join()
        sid, line = res["w"]
        got = frames(sid)
        assert got[0] == ("worker", F, line), got
        assert any(f[0].endswith("_bootstrap") for f in got), got

        def gen(lib):
            yield lib.pystack_test_capture(32), here()
        def use(lib):
            return next(gen(lib)), here()
        (sid, l_gen), l_use = use(lib)
        assert frames(sid)[:2] == [("gen", F, l_gen), ("use", F, l_use)], frames(sid)

        def rec(n, lib, depth):
            if n == 0:
                return lib.pystack_test_capture(depth), here()
            return rec(n - 1, lib, depth)
        sid, line = rec(50, lib, 20)
        got = frames(sid)
        assert len(got) == 20 and got[0] == ("rec", F, line), got
        assert all(f[0] == "rec" for f in got)
        sid, _ = rec(400, lib, 1000)          # capped at 256 frames
        assert len(frames(sid)) == 256
    """)


def test_concurrent_capture_from_many_threads(interpreter, hook):
    cpython(interpreter)
    run_hook(interpreter, hook, """
        fns = [make(f"worker_{i}") for i in range(8)]
        out = [[] for _ in fns]
        def work(i):
            for k in range(300):
                out[i].append(fns[i](nogil if k % 2 else gil))
        ts = [threading.Thread(target=work, args=(i,)) for i in range(len(fns))]
        for t in ts: t.start()
        for t in ts: t.join()
        for i, ids in enumerate(out):
            assert len(set(ids)) <= 2 and 0 not in ids, (i, set(ids))
            for sid in set(ids):
                assert frames(sid)[0] == (f"worker_{i}", f"/virtual/worker_{i}.py", 2), frames(sid)
    """)


def test_dead_code_object_whose_address_is_reused(interpreter, hook):
    """Captured without the GIL, a frame holds no reference. Its names are
    resolved by a pending call on the main thread; when its code object
    dies before that and a new one takes its address, the old stack must
    not take the newcomer's name, and the newcomer gets a stack of its own.
    All of it runs on a worker while the main thread waits in join(), so
    that the pending call comes late."""
    cpython(interpreter)
    res = run_hook(interpreter, hook, """
        out = {}
        def worker():
            victim = make("victim")
            addr = id(victim.__code__)
            out["old"] = victim(nogil)
            del victim; gc.collect()
            for i in range(5000):
                g = make(f"newcomer{i}")
                if id(g.__code__) == addr:
                    out["new"] = g(nogil)
                    out["name"] = g.__name__
                    out["keep"] = g
                    break
                del g
        t = threading.Thread(target=worker); t.start(); t.join()
        # "victim" where the pending call still found it alive (free-threaded
        # builds free code objects late), never anything else.
        old = out["old"]
        ok = [("<unknown>", "<unknown>", 0), ("victim", "/virtual/victim.py", 2)]
        assert frames(old)[0] in ok, frames(old)
        if "new" not in out:
            print("REUSE-NOT-REACHED", frames(old)[0])
        else:
            name = out["name"]
            assert out["new"] != old
            assert frames(out["new"])[0] == (name, f"/virtual/{name}.py", 2), frames(out["new"])
            print("REUSED", frames(old)[0])

        # On the main thread, the pending call resolves it while it lives.
        early = make("early")
        sid = early(nogil)
        sum(range(1000)); [i for i in range(100)]      # a few checks for pending calls
        del early; gc.collect()
        for i in range(200):
            make(f"filler{i}")
        assert frames(sid)[0] == ("early", "/virtual/early.py", 2), frames(sid)

        # With the GIL, the frame holds a reference: the name stays right.
        kept = make("kept")
        sid = kept(gil)
        del kept; gc.collect()
        for i in range(200):
            make(f"filler{i}")
        assert frames(sid)[0] == ("kept", "/virtual/kept.py", 2), frames(sid)
    """)
    print(res.stdout)


def test_finalization_gate_resolves_and_gives_references_back(interpreter, hook):
    cpython(interpreter)
    run_hook(interpreter, hook, """
        held = make("held")
        rc0 = sys.getrefcount(held.__code__)
        ids = set()
        for i in range(3):
            ids.add(held(gil))
            assert sys.getrefcount(held.__code__) == rc0 + 1   # once per frame, not per capture
        assert len(ids) == 1
        sid = ids.pop()
        free = make("free")
        sid_free = free(nogil)
        assert gil.pystack_test_finalize() == 0          # what python_gc's atexit gate does
        assert sys.getrefcount(held.__code__) == rc0
        assert frames(sid)[0] == ("held", "/virtual/held.py", 2)
        assert frames(sid_free)[0] == ("free", "/virtual/free.py", 2)
        del held, free; gc.collect()
        assert frames(sid)[0] == ("held", "/virtual/held.py", 2)

        # After the gate (atexit handlers, teardown): no reference taken; with
        # the GIL a new frame is resolved at once, without it never.
        late = make("late")
        rc = sys.getrefcount(late.__code__)
        sid = late(gil)
        assert sys.getrefcount(late.__code__) == rc
        assert frames(sid)[0] == ("late", "/virtual/late.py", 2), frames(sid)
        late2 = make("late_nogil")
        assert frames(late2(nogil))[0] == ("<unknown>", "<unknown>", 0)

        # The gate saw finalization end and the interpreter is up again (an
        # embedder's next cycle): a new lifetime, references taken again,
        # and stacks not merged with the old lifetime's.
        gil.pystack_test_next_cycle()
        rc = sys.getrefcount(late.__code__)
        sid2 = late(gil)
        assert sid2 != sid and sys.getrefcount(late.__code__) == rc + 1
        assert frames(sid2)[0] == ("late", "/virtual/late.py", 2)
        assert frames(late2(nogil))[0] == ("late_nogil", "/virtual/late_nogil.py", 2)
        assert gil.pystack_test_finalize() == 0
        assert sys.getrefcount(late.__code__) == rc
    """)


def test_pypy_has_no_python_stacks(hook):
    interp = pythons.get("pypy3").require()
    run_hook(interp, hook, """
        assert gil.pystack_test_capture(32) == 0
        assert nogil.pystack_test_capture(32) == 0
    """)


def debug_offsets_interpreter(interp):
    cpython(interp)
    if tuple(interp.version[:2]) < (3, 13):
        pythons.need("debug-offsets", f"{interp.name}: _Py_DebugOffsets exist from CPython 3.13 on")
    return interp


# The interpreter's own _Py_DebugOffsets (the start of _PyRuntime), copied.
RUNTIME = r'''
import struct
RT = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
REAL = ctypes.string_at(RT, 4096)
'''


def test_synthetic_debug_offsets_are_refused_with_the_reason(interpreter, hook):
    """A copy of the interpreter's own _Py_DebugOffsets is read like the
    original; with a wrong cookie, an unknown version, another known
    version or a wrong free-threaded flag it is refused, with the reason."""
    debug_offsets_interpreter(interpreter)
    run_hook(interpreter, hook, RUNTIME + textwrap.dedent("""
        gil.pystack_test_layout_at.argtypes = [ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
        def layout(data):
            b = ctypes.create_string_buffer(bytes(data), len(data))
            out = ctypes.create_string_buffer(512)
            rc = gil.pystack_test_layout_at(ctypes.addressof(b), out, len(out))
            return rc, out.value.decode().strip()
        def patched(at, fmt, value):
            d = bytearray(REAL)
            struct.pack_into(fmt, d, at, value)
            return d
        rc, text = layout(REAL)
        assert rc == 0 and "source _Py_DebugOffsets" in text, text
        assert layout(b"xdebugpz" + REAL[8:]) == (-1, "error _Py_DebugOffsets has the wrong cookie (not \\"xdebugpy\\")")
        version, = struct.unpack_from("<Q", REAL, 8)
        minor = sys.version_info[1]
        for unknown in (0x03630000, 0x040D0000, 0x030C0000, version | 1 << 40):
            assert layout(patched(8, "<Q", unknown)) == (-1, "error _Py_DebugOffsets of an unknown version (3.13 to 3.15 are known)"), hex(unknown)
        other = 0x030E0000 if minor != 14 else 0x030D0000
        assert layout(patched(8, "<Q", other)) == (-1, "error _Py_DebugOffsets names another version than the interpreter's")
        ft, = struct.unpack_from("<Q", REAL, 16)
        rc, text = layout(patched(16, "<Q", 1 - ft))
        assert rc == -1 and "disagrees with the running build" in text, text
        rc, text = layout(patched(16, "<Q", 7))
        assert rc == -1 and "disagrees with the running build" in text, text
        # A patch release: the same struct, another micro version.
        rc, text = layout(patched(8, "<Q", (version & ~0xffff) | 0x63f0))
        assert rc == 0, text
    """))


@pytest.mark.parametrize("damage", ["cookie", "version"])
def test_damaged_debug_offsets_give_one_warning_and_native_stacks(interpreter, shim_lib, damage,
                                                                 tmp_path):
    """End to end: the running interpreter's _Py_DebugOffsets damaged
    before the first capture: one warning, the leak still reported, with
    native frames only (and the note saying why)."""
    debug_offsets_interpreter(interpreter)
    script = tmp_path / "leaker.py"
    script.write_text("import ctypes, struct, sys\n" + RUNTIME.replace("import struct\n", "") + f"""
if {damage!r} == "cookie":
    ctypes.memmove(RT, b"xdebugpz", 8)
else:
    ctypes.memmove(RT + 8, struct.pack("<Q", 0x03630000), 8)
""" + LEAKER.replace("step(sys.argv[1] == \"nogil\")", "step(False)\nstep(True)"))
    report = tmp_path / "report.json"
    res = pythons.run_python(interpreter, path=script, simdev_memory="64M",
                             env={"SPYRESHIM_LEAK_CHECK": "held", "SPYRESHIM_REPORT": report,
                                  "SPYRESHIM_EXITCODE": "0"})
    res.check()
    warnings = [l for l in res.stderr.splitlines() if "Python stacks off" in l]
    reason = "wrong cookie" if damage == "cookie" else "unknown version"
    assert len(warnings) == 1 and reason in warnings[0], res.describe()
    data = json.loads(report.read_text())
    groups = [g for g in data["groups"] if g["bytes"] >= 1 << 20]
    assert len(groups) == 2, data          # GIL held, GIL released
    for g in groups:
        assert g["order"] == "native" and not [f for f in g["frames"] if f["kind"] == "python"], g
        assert any(f["function"] == "Tensor_new" for f in g["frames"]), g["frames"]
    assert "not recorded" in (data.get("python_note") or ""), data.get("python_note")


# ---- end to end: leak report of a Python program under the shim ---------

LEAKER = r'''
import ctypes, sys
import simdev

def make_leak(release):
    t = simdev.Tensor(1 << 20, release_gil=release)  # LEAK-LINE
    # A buggy extension's reference leak: the tensor is never freed.
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))
    return t

def step(release):
    make_leak(release)

step(sys.argv[1] == "nogil")
'''


@pytest.mark.parametrize("mode", ["gil", "nogil"])
def test_leak_report_shows_python_frames(interpreter, shim_lib, mode, tmp_path):
    cpython(interpreter)
    script = tmp_path / "leaker.py"
    script.write_text(LEAKER)
    report = tmp_path / "r.json"
    res = pythons.run_python(interpreter, path=script, args=[mode],
                             env={"SPYRESHIM_LEAK_CHECK": "held", "SPYRESHIM_REPORT": report,
                                  "SPYRESHIM_EXITCODE": "0"})
    res.check()
    assert report.exists(), f"no report at {report}\n{res.describe()}"
    data = json.loads(report.read_text())
    groups = [g for g in data["groups"] if g["bytes"] >= 1 << 20]
    assert len(groups) == 1, data
    frames = groups[0]["frames"]
    leak_line = LEAKER.splitlines().index(next(l for l in LEAKER.splitlines() if "LEAK-LINE" in l)) + 1
    step_line = LEAKER.splitlines().index("    make_leak(release)") + 1
    module_line = LEAKER.splitlines().index('step(sys.argv[1] == "nogil")') + 1
    py = [f for f in frames if f["kind"] == "python"]
    assert py == [
        {"kind": "python", "function": "make_leak", "file": str(script), "line": leak_line},
        {"kind": "python", "function": "step", "file": str(script), "line": step_line},
        {"kind": "python", "function": "<module>", "file": str(script), "line": module_line},
    ], frames
    # True call order (test_hybrid_stacks.py): the extension's allocation
    # innermost, the Python frames where the interpreter ran them.
    assert groups[0]["order"] == "hybrid", groups[0]
    assert frames[0]["kind"] == "native" and frames[0]["function"] == "Tensor_new", frames


DAEMONS = r'''
import threading, time
import simdev

keep = []
def churn(release):
    while True:
        t = simdev.Tensor(4096, release_gil=release)
        if len(keep) < 64:
            keep.append(t)      # live at exit: reported

for i in range(4):
    threading.Thread(target=churn, args=(i % 2 == 0,), daemon=True).start()
time.sleep(0.2)
# The interpreter finalizes while the daemon threads keep allocating, with
# and without the GIL: their stacks are captured until finalization starts,
# then only native stacks; nothing may crash.
'''


def test_daemon_threads_allocating_through_finalization(interpreter, shim_lib, tmp_path):
    cpython(interpreter)
    report = tmp_path / "r.json"
    # CPython 3.11 and older can crash by themselves here: a daemon thread
    # still waiting for the GIL when finalization destroys it wakes up on
    # freed state (3.12 parks such threads). The shim only makes exit
    # longer, so each extra run is one more chance of CPython's own crash:
    # they run the scenario once, newer interpreters three times.
    runs = 3 if tuple(interpreter.version[:2]) >= (3, 12) else 1
    for _ in range(runs):
        res = pythons.run_python(interpreter, DAEMONS,
                                 env={"SPYRESHIM_LEAK_CHECK": "held", "SPYRESHIM_REPORT": report,
                                      "SPYRESHIM_EXITCODE": "0"})
        res.check()
        data = json.loads(report.read_text())
        names = {f["function"] for g in data["groups"] for f in g["frames"] if f["kind"] == "python"}
        assert "churn" in names, data


def test_embedder_init_fini_cycles_keep_their_own_frames(shim_lib, tmp_path):
    """Python stacks across interpreter lifetimes: each cycle's frames are
    resolved at its own finalization gate (python_gc's), then the next
    cycle starts a new lifetime."""
    interp = pythons.get("cpython3.11-shared").require()
    libdir = os.path.join(os.path.dirname(os.path.dirname(interp.exe)), "lib")
    exe = tmp_path / "embed_cycles"
    cc = os.environ.get("CC", "cc")
    build = subprocess.run([cc, "-std=gnu11", "-I", interp.include,
                            os.path.join(HERE, "..", "pystack", "embed_cycles.c"), "-o", str(exe),
                            "-L", libdir, "-lpython3.11", f"-Wl,-rpath,{libdir}"],
                           capture_output=True, text=True, timeout=pythons.HANG_S)
    assert build.returncode == 0, build.stderr
    report = tmp_path / "r.json"
    env = pythons.module_env(interp, simdev_memory="1G", env={
        "LD_PRELOAD": shim_lib, "SPYRESHIM_LEAK_CHECK": "held", "SPYRESHIM_REPORT": report,
        "SPYRESHIM_EXITCODE": "0"})
    pythons.run([exe, "4"], env=env).check()
    data = json.loads(report.read_text())
    by_size = {g["bytes"]: [f for f in g["frames"] if f["kind"] == "python"] for g in data["groups"]}
    for i in range(4):
        py = by_size.get((i + 1) << 16)
        assert py, (i, data)
        assert py[0]["function"] == f"leak_in_cycle_{i}" and py[0]["line"] == 3, (i, py)
