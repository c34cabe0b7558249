"""The shim on real PyTorch (Debian's 1.13 and PyPI's 2.x, torchrun.VERSIONS)
through the simdev device (tests/torch/simdev_torch): the garbage-collection rescue in
forward (main thread) and in backward (PyTorch's autograd thread for the
device), the final out-of-memory report naming PyTorch's linear.py and the
user's script in call order, the pytest plugin catching a cached nn.Linear
output, a trace turned into PyTorch's memory_viz snapshot with torch frames,
and a leak report whose native frames are C++ functions, demangled.

Each case in a child process, OMP_NUM_THREADS=1."""
import json
import pickle
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torchrun  # noqa: E402


@pytest.fixture(scope="module", autouse=True, params=torchrun.VERSIONS)
def torch_here(request, builddir, shim_lib):
    return torchrun.require(request.param)


# Collections are seen through gc.callbacks: which phase of the step ran
# (forward, backward) and on which thread, when each collection started.
PHASES = textwrap.dedent("""\
    import gc, json, sys, threading
    import torch
    import simdev_torch
    dev = simdev_torch.device
    phase = ["setup"]
    collections = []
    def on_gc(stage, info):
        if stage == "start":
            collections.append((phase[0], threading.get_ident() == threading.main_thread().ident))
    gc.callbacks.append(on_gc)
    gc.disable()

    def cycle(**tensors):
        # a dict that refers to itself, holding the step's tensors
        d = dict(tensors)
        d["self"] = d

    def done(steps):
        print(json.dumps({"steps": steps, "collections": collections}))
    """)

FORWARD = PHASES + textwrap.dedent("""\
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512)).to(dev)
    x = torch.randn(256, 512).to(dev)
    for step in range(60):
        phase[0] = "forward"
        with torch.no_grad():
            out = model(x)                       # 2 x 512 KiB of activations
        phase[0] = "loop"
        cycle(out=out)
        del out
    done(step + 1)
    """)

BACKWARD = PHASES + textwrap.dedent("""\
    model = torch.nn.Linear(1024, 1024).to(dev)  # 4 MiB of weight
    grad_threads = set()
    model.weight.register_hook(lambda g: grad_threads.add(threading.get_ident()))
    x = torch.randn(1, 1024).to(dev)
    for step in range(12):
        phase[0] = "forward"
        loss = model(x).sum()                    # a few KiB
        phase[0] = "backward"
        loss.backward()                          # 4 MiB of weight gradient, on the autograd thread
        phase[0] = "loop"
        cycle(grad=model.weight.grad)
        model.weight.grad = None
        del loss
    print("gradient on the main thread:", threading.main_thread().ident in grad_threads)
    done(step + 1)
    """)


def run_phases(source, preload):
    r = torchrun.run(source, preload=preload, simdev_memory="16M", SPYRESHIM_LOG="warn")
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    return r, (json.loads(last) if last.startswith("{") else None)


def test_rescue_in_forward_on_the_main_thread():
    r, got = run_phases(FORWARD, preload=False)
    assert r.returncode != 0 and "OutOfMemoryError" in r.stderr, r
    assert "simdev: out of memory" in r.stderr
    r, got = run_phases(FORWARD, preload=True)
    assert r.returncode == 0, r
    assert got["steps"] == 60
    # Every collection was the shim's, during a forward pass. PyTorch's
    # bindings release the GIL around an operator, so the allocating thread
    # does not hold it: the shim's own thread collects while it waits.
    assert got["collections"], got
    assert set(map(tuple, got["collections"])) == {("forward", False)}, got


def test_rescue_in_backward_on_the_autograd_thread():
    r, got = run_phases(BACKWARD, preload=False)
    assert r.returncode != 0 and "OutOfMemoryError" in r.stderr, r
    assert "loss.backward()" in r.stderr, r.stderr
    r, got = run_phases(BACKWARD, preload=True)
    assert r.returncode == 0, r
    assert got["steps"] == 12
    # The gradient is computed by PyTorch's worker thread for the device,
    # which does not hold the GIL: the shim's own thread collects, while
    # the main thread waits in backward().
    assert "gradient on the main thread: False" in r.stdout, r.stdout
    assert got["collections"], got
    assert set(map(tuple, got["collections"])) == {("backward", False)}, got


def test_the_demo_fails_without_the_shim_and_completes_with_it(tmp_path):
    """scripts/demo_torch.py, what scripts/demo.sh runs, on its 8 MiB device."""
    args = ["--steps", "80", "--every", "20", "--losses", tmp_path / "losses.json"]
    r = torchrun.run(path=torchrun.DEMO, args=args, simdev_memory="8M")
    assert r.returncode == 1, r
    m = re.search(r"^step (\d+): out of device memory: simdev: out of memory", r.stdout, re.M)
    assert m and 10 < int(m.group(1)) < 80, r.stdout
    assert not (tmp_path / "losses.json").exists()
    r = torchrun.run(path=torchrun.DEMO, args=args, simdev_memory="8M", preload=True)
    assert r.returncode == 0, r
    assert "demo_torch: completed 80 steps" in r.stdout
    s = re.search(r"^spyreshim: (\d+) pressure events, (\d+) collections .* (\d+) failed allocations",
                  r.stdout, re.M)
    assert s and int(s.group(1)) >= 1 and int(s.group(2)) >= 1 and s.group(3) == "0", r.stdout
    shim_losses = json.loads((tmp_path / "losses.json").read_text())
    r = torchrun.run(path=torchrun.DEMO, args=args + ["--device", "cpu"])
    assert r.returncode == 0, r
    assert json.loads((tmp_path / "losses.json").read_text()) == shim_losses


OOM = textwrap.dedent("""\
    import torch, simdev_torch
    layer = torch.nn.Linear(512, 512).to(simdev_torch.device)
    outputs = []

    def run_layer(x):
        return layer(x)                          # RUN LINE

    def main():
        x = torch.randn(256, 512).to(simdev_torch.device)
        try:
            for _ in range(100):
                outputs.append(run_layer(x))     # MAIN LINE: every output stays live
        except torch.cuda.OutOfMemoryError as e:
            print("OOM:", str(e).splitlines()[0])

    main()
    """)


def line_of(source, mark):
    return 1 + [i for i, ln in enumerate(source.splitlines()) if mark in ln][0]


def test_final_oom_report_names_linear_py_and_the_script_in_call_order(tmp_path):
    script = tmp_path / "oom_user.py"
    script.write_text(OOM)
    r = torchrun.run(path=script, preload=True, simdev_memory="16M", cwd=tmp_path,
                     SPYRESHIM_LEAK_CHECK="1", SPYRESHIM_EXITCODE="0")
    assert r.returncode == 0 and r.stdout.startswith("OOM: simdev: out of memory"), r
    err = r.stderr
    assert "spyreshim: out of simdev memory: a request of 524288 B (512.0 KiB) failed" in err, err
    group = err[err.index("Live: "):]
    group = group[:group.index("\n\n")]
    frames = re.findall(r"^    #\d+ (.*)$", group, re.M)
    # The largest holder: the layer's outputs. Innermost first: the device's
    # allocator, PyTorch's C++ linear (demangled), linear.py's forward, the
    # script's functions from the innermost out.
    assert "SimdevAllocator::allocate(unsigned long)" in frames[0], frames
    idx = {}
    for key, pat in [("cpp", r" at::native::linear\(at::Tensor const&"),
                     ("linear.py", r"in Linear\.forward \S+/torch/nn/modules/linear\.py:\d+ \[python\]"),
                     ("run_layer", r"in run_layer %s:%d \[python\]" % (re.escape(str(script)),
                                                                   line_of(OOM, "RUN LINE"))),
                     ("main", r"in main %s:%d \[python\]" % (re.escape(str(script)),
                                                         line_of(OOM, "MAIN LINE"))),
                     ("module", r"in <module> %s:\d+ \[python\]" % re.escape(str(script)))]:
        hits = [i for i, f in enumerate(frames) if re.search(pat, f)]
        assert hits, (key, frames)
        idx[key] = hits[0]
    assert idx["cpp"] < idx["linear.py"] < idx["run_layer"] < idx["main"] < idx["module"], frames
    assert "_ZN" not in group


PLUGIN_INNER = textwrap.dedent("""\
    import torch
    import simdev_torch

    dev = simdev_torch.device
    layer = torch.nn.Linear(256, 256).to(dev)
    cache = []

    def test_uses_the_layer():
        y = layer(torch.ones(4, 256, device=dev))
        assert y.shape == (4, 256)

    def test_caches_the_output():
        with torch.no_grad():
            cache.append(layer(torch.ones(4, 256, device=dev)))     # CACHE LINE
    """)


def test_pytest_plugin_catches_a_cached_linear_output(tmp_path):
    (tmp_path / "test_inner.py").write_text(PLUGIN_INNER)
    argv = [str(torchrun.SCRIPT), "run", "--leak-check", "--exitcode", "0", "--",
            torchrun.PYTHON, "-m", "pytest", "-p", "spyreshim.pytest_plugin",
            "-p", "no:cacheprovider", "-rA", "-o", "console_output_style=classic",
            "--spyreshim-leaks", "test_inner.py"]
    r = torchrun.run(argv=argv, cwd=tmp_path)
    out = r.stdout
    outcomes = dict((name, word) for word, name in
                    re.findall(r"^(PASSED|FAILED|ERROR) test_inner\.py::(\w+)", out, re.M))
    assert outcomes == {"test_uses_the_layer": "PASSED", "test_caches_the_output": "FAILED"}, out
    # The output: 4 x 256 floats, allocated by the layer's forward.
    assert ("spyreshim: test_inner.py::test_caches_the_output left 4096 B (4.0 KiB) of "
            "device memory in 1 allocation after garbage collection") in out, out
    section = out[out.index("test_caches_the_output left"):].split("\n\n")[1]
    frames = re.findall(r"^\s+#\d+ (.*)$", section, re.M)
    # Innermost first, as every report: the C++ below, then PyTorch's
    # Linear.forward, called by the test (the plugin shows the stack up to
    # the test function). Between them, nn.Module's call: _call_impl
    # (1.13), _wrapped_call_impl and _call_impl (2.x).
    test_frame = "in test_caches_the_output %s:%d [python]" % (
        tmp_path / "test_inner.py", line_of(PLUGIN_INNER, "CACHE LINE"))
    assert frames[-1] == test_frame, frames
    forward = next(i for i, f in enumerate(frames) if f.endswith("[python]"))
    assert re.match(r"in Linear\.forward \S+/torch/nn/modules/linear\.py:\d+ \[python\]$",
                    frames[forward]), frames
    assert all("torch/nn/modules/module.py" in f for f in frames[forward + 1:-1]), frames
    assert any(torchrun.ALLOCATE in f for f in frames[:forward]), frames


def test_trace_then_memory_viz_has_torch_frames(tmp_path):
    trace = tmp_path / "run.trace"
    r = torchrun.run(argv=[str(torchrun.SCRIPT), "run", "--trace", str(trace), "--",
                           torchrun.PYTHON, str(torchrun.DEMO), "--steps", "3", "--gc"],
                     cwd=tmp_path)
    assert r.returncode == 0, r
    pk = tmp_path / "run.pickle"
    v = torchrun.run(argv=[str(torchrun.SCRIPT), "report", "--memory-viz", str(pk), str(trace)],
                     cwd=tmp_path)
    assert v.returncode == 0, v
    snap = pickle.loads(pk.read_bytes())
    events = snap["device_traces"][0]
    allocs = [e for e in events if e["action"] == "alloc"]
    assert allocs, events[:5]
    def has(e, pred):
        return any(pred(f) for f in e["frames"])
    in_linear = [e for e in allocs
                 if has(e, lambda f: f["filename"].endswith("torch/nn/modules/linear.py"))]
    assert in_linear, allocs[0]["frames"]
    e = in_linear[0]
    assert has(e, lambda f: f["filename"].endswith("scripts/demo_torch.py")
               and f["name"] == "train_step"), e["frames"]
    assert has(e, lambda f: f["name"].startswith("at::native::linear(")), e["frames"]
    assert has(e, lambda f: f["name"].startswith("(anonymous namespace)::SimdevAllocator::allocate")), \
        e["frames"]
    assert not has(e, lambda f: f["name"].startswith("_Z")), e["frames"]
    # Deep enough: every stack reaches the script's <module> (below it, the
    # interpreter's frames and the program's start are folded, as in the
    # leak report), or the start of the thread that allocated
    # (SPYRESHIM_STACK_DEPTH's default once Python frames are recorded; 32
    # frames cut most of these).
    starts = ("main", "start_thread", "clone3", "__libc_start_call_main")
    cut = [a["frames"] for a in allocs
           if not has(a, lambda f: (f["name"] in starts and not f["filename"].endswith(".py"))
                      or (f["name"] == "<module>" and f["filename"].endswith("demo_torch.py")))]
    assert not cut, cut[0]
    # Backward's allocations come from the autograd engine's thread.
    assert any(has(a, lambda f: f["name"].startswith("torch::autograd::Engine::thread_main"))
               for a in allocs)


LEAK = textwrap.dedent("""\
    import ctypes
    import torch, simdev_torch

    def leak():
        t = torch.zeros(1000, device=simdev_torch.device)            # LEAK LINE
        # a reference leak, as a buggy extension makes: the tensor outlives
        # the interpreter's finalization
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))

    leak()
    """)


def test_leak_report_names_cpp_functions_demangled(tmp_path):
    script = tmp_path / "leak.py"
    script.write_text(LEAK)
    # The leaked reference keeps a Python object: held until exit, which
    # --leak-check=held counts (test_leak_exit.py has the split itself).
    r = torchrun.run(argv=[str(torchrun.SCRIPT), "run", "--leak-check=held", "--report",
                           str(tmp_path / "r.json"), "--", torchrun.PYTHON, str(script)],
                     cwd=tmp_path)
    assert r.returncode == 23, r
    data = json.loads((tmp_path / "r.json").read_text())
    groups = [g for g in data["held_until_exit"]["groups"] if g["bytes"] == 4000]
    assert len(groups) == 1, data["held_until_exit"]["groups"]
    native = [f for f in groups[0]["frames"] if f["kind"] == "native"]
    names = [f["function"] or "" for f in native]
    assert names[0] == torchrun.ALLOCATE, names
    assert native[0]["raw"] == torchrun.ALLOCATE_RAW
    assert any(n.startswith("at::detail::empty_generic(c10::ArrayRef<long>") for n in names), names
    assert not any(n.startswith("_Z") for n in names), names
    # Every demangled name keeps its raw symbol; C names have none.
    for f in native:
        if f["function"] and "::" in f["function"]:
            assert f["raw"].startswith("_Z"), f
        elif f["function"]:
            assert "raw" not in f, f
    python = [f for f in groups[0]["frames"] if f["kind"] == "python"]
    assert python[0]["function"] == "leak" and python[0]["line"] == line_of(LEAK, "LEAK LINE")
    # The text and the page show the same names (every frame: by default
    # the allocator and libtorch's frames are one folded frame, issue 48).
    text = subprocess.run([str(torchrun.SCRIPT), "report", "--native-frames=all",
                           str(tmp_path / "r.json")],
                          capture_output=True, text=True, env=torchrun.env()).stdout
    assert f"in {torchrun.ALLOCATE} " in text, text
    assert torchrun.ALLOCATE_RAW not in text
    h = subprocess.run([str(torchrun.SCRIPT), "report", "--native-frames=all", "--html",
                        str(tmp_path / "r.html"), str(tmp_path / "r.json")],
                       capture_output=True, text=True, env=torchrun.env())
    assert h.returncode == 0, h.stderr
    page = (tmp_path / "r.html").read_text()
    assert torchrun.ALLOCATE.replace("(anonymous namespace)::", "") in page
    assert torchrun.ALLOCATE_RAW not in page
