"""Memory categories (spyreshim/reading/categories.py): a real trace of a training
loop (tests/torch_examples/train.py's VAE with Adam, PyTorch 1.13 and 2.x
on the simdev device, `spyreshim run --trace`) classed by its stacks into
PyTorch's categories, and by lifetimes (a forward's blocks live as the
backward begins are activations, the rest temporaries; the engine's that
outlive their backward gradients, the rest autograd detail: a synthetic
trace of the phases too); `report --view stats` and the peak view break the
peak down by them; `report --memory-timeline OUT.json.gz` writes PyTorch's
raw memory timeline, which Holistic Trace Analysis' MemoryAnalysis
(PyPI HolisticTraceAnalysis, scripts/hta_venv.sh's venv) reads and draws;
its figures equal ours. `--categories rules.toml`: the user's rules first.
Run with -s for the breakdown (the closing note's figures)."""
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pythons  # noqa: E402
import torchrun  # noqa: E402

sys.path.insert(0, str(pythons.REPO))
from spyreshim.reading import categories, trace as tr  # noqa: E402
from spyreshim.reading.units import format_size  # noqa: E402

REPO = pythons.REPO
TRAIN = REPO / "tests" / "torch_examples" / "train.py"
STEPS = 3
BATCH = 32
# train.py's VAE: Linear(784, 400), (400, 20) twice, (20, 400), (400, 784),
# float32 weights and biases.
LAYERS = [(784, 400), (400, 20), (400, 20), (20, 400), (400, 784)]
PARAMS = sorted([i * o * 4 for i, o in LAYERS] + [o * 4 for _i, o in LAYERS])
# A batch: 32 images of 1x28x28 float32 and their 32 int64 labels.
INPUTS = sorted([BATCH * 784 * 4, BATCH * 8])
# What a VAE step's forward saves for backward (PyTorch's saved tensors):
# relu's results h and relu(dec1(z)) (relu's backward, dec's addmm), mu
# and logvar (returned: the KL term's pow and exp read them), randn_like's
# eps and exp(logvar / 2) (mul's and exp's backward), z (dec1's addmm),
# sigmoid's result and the clamped reconstruction (sigmoid's and the
# BCE's backward): all live as the backward begins.
SAVED = sorted([BATCH * 400 * 4] * 2 + [BATCH * 20 * 4] * 5 + [BATCH * 784 * 4] * 2)
# What it frees before backward: the three linear layers' outputs that
# relu and sigmoid replace (enc, dec1, dec2), logvar / 2 and eps * std.
FORWARD_TEMPORARIES = sorted([BATCH * 400 * 4] * 2 + [BATCH * 20 * 4] * 2 + [BATCH * 784 * 4])
# The raw export's category numbers (torch.profiler._memory_profiler's
# _CATEGORY_TO_INDEX, HTA's _CATEGORY_TO_INDEX).
IDX = {"PARAMETER": 0, "OPTIMIZER_STATE": 1, "INPUT": 2, "TEMPORARY": 3, "ACTIVATION": 4,
       "GRADIENT": 5, "AUTOGRAD_DETAIL": 6, "unknown": 7}


def cli(*args, cwd):
    return torchrun.run(argv=[str(torchrun.SCRIPT), *map(str, args)], cwd=cwd)


@pytest.fixture(scope="module", params=torchrun.VERSIONS)
def traced(request, tmp_path_factory, builddir, shim_lib):
    """The VAE's trace, its raw timeline and the stats view, on PyTorch
    1.13 (Debian's: the optimizer's state made in its step) and 2.x (in
    its _init_group)."""
    torchrun.require(request.param)
    d = tmp_path_factory.mktemp("categories")
    trace = d / "vae.trace"
    r = torchrun.run(argv=[str(torchrun.SCRIPT), "run", "--trace", str(trace), "--",
                           torchrun.PYTHON, str(TRAIN), "vae", "--device", "simdev",
                           "--steps", str(STEPS), "--batch", str(BATCH),
                           "--import", "simdev_torch"], cwd=d)
    assert r.returncode == 0, r
    assert f"train: completed {STEPS} steps" in r.stdout, r
    out = d / "vae.json.gz"
    e = cli("report", "--memory-timeline", out, trace, cwd=d)
    assert e.returncode == 0, e
    assert re.search(r"wrote .*vae\.json\.gz: \d+ memory events", e.stderr), e
    stats = cli("report", "--view", "stats", trace, cwd=d)
    assert stats.returncode == 0, stats
    return {"version": request.param, "dir": d, "trace": trace, "timeline": out,
            "stats": stats.stdout, "events": json.loads(gzip.open(out, "rt").read())}


def created(events, cat):
    return sorted(n for _t, a, n, c in events if a == 2 and c == IDX[cat])


def test_raw_timeline_is_pytorchs_format(traced):
    ev = traced["events"]
    assert ev and all(len(e) == 4 and all(type(x) is int for x in e) for e in ev)
    # CREATE (2) with +bytes, DESTROY (4) with -bytes, on the Unix epoch in ns
    assert {a for _t, a, _n, _c in ev} <= {2, 4}
    assert all((n > 0) == (a == 2) for _t, a, n, _c in ev)
    assert [t for t, *_ in ev] == sorted(t for t, *_ in ev)
    assert 1.5e18 < ev[0][0] < 4e18
    # every DESTROY names the category its block was created with
    live = {}
    for _t, a, n, c in ev:
        if a == 2:
            live.setdefault((n, c), 0)
            live[(n, c)] += 1
        else:
            assert live.get((-n, c)), (n, c)
            live[(-n, c)] -= 1


def test_blocks_are_classed_by_their_stacks(traced):
    ev = traced["events"]
    # Module.to() moved each parameter once; Adam's _init_group made two
    # state tensors per parameter (its step counters stay on the CPU).
    assert created(ev, "PARAMETER") == PARAMS
    assert created(ev, "OPTIMIZER_STATE") == sorted(PARAMS * 2)
    # each step's data.to(device), target.to(device)
    assert created(ev, "INPUT") == sorted(INPUTS * STEPS)
    # the autograd engine's blocks that outlive their backward: the .grad
    # of each parameter. PyTorch 2.x's zero_grad() sets them to None, so
    # each step's backward makes them anew; 1.13's zeroes them, and from
    # the second step on AccumulateGrad adds each new gradient into the
    # old .grad and frees it within the backward.
    assert created(ev, "GRADIENT") == sorted(PARAMS * (STEPS if traced["version"] == "2" else 1))
    # the rest of the engine's blocks: the intermediate gradients, each
    # backward's initial gradient (backward()'s ones, 4 bytes), ...
    detail = created(ev, "AUTOGRAD_DETAIL")
    assert detail.count(4) >= STEPS and BATCH * 784 * 4 in detail, detail
    if traced["version"] != "2":
        for p in PARAMS:
            assert detail.count(p) >= STEPS - 1, (p, detail)
    # a module's forward: what it saves for backward is an ACTIVATION,
    # what it frees before backward a TEMPORARY, beside the loss's terms
    # (outside any module), torch.sigmoid(data) and Adam's update's
    assert created(ev, "ACTIVATION") == sorted(SAVED * STEPS)
    temps = created(ev, "TEMPORARY")
    for n in set(FORWARD_TEMPORARIES):
        assert temps.count(n) >= FORWARD_TEMPORARIES.count(n) * STEPS, (n, temps)
    assert not created(ev, "unknown")


def test_activations_are_what_backward_finds_live(traced):
    """The phases from the export alone: a step begins with its batch
    (INPUT), its backward with its first engine block (GRADIENT or
    AUTOGRAD_DETAIL). Every ACTIVATION is made before its step's
    backward and dies after it began; as each backward begins, the live
    ACTIVATION bytes are what the forward saved for it."""
    ev = traced["events"]
    steps, bwd, act, at_start = 0, True, 0, []
    for _t, a, n, c in ev:
        if a == 2 and c == IDX["INPUT"] and bwd:
            steps, bwd = steps + 1, False
        elif a == 2 and c in (IDX["GRADIENT"], IDX["AUTOGRAD_DETAIL"]) and not bwd:
            bwd = True
            at_start.append(act)
        if c == IDX["ACTIVATION"]:
            act += n
            assert bwd == (a == 4), "an activation made in a backward or freed before it"
    assert steps == STEPS
    assert at_start == [sum(SAVED)] * STEPS
    assert act == 0


def test_numpy_and_pure_python_class_lifetimes_alike(traced, tmp_path):
    """Both paths of Lifetimes' pass and the export, streamed, and on the
    loaded trace in batches of 5 events (a backward's state carried from
    batch to batch)."""
    out = {}
    saved, batch = tr.np, tr.BATCH
    try:
        for name, np in (("numpy", saved), ("python", None)):
            if name == "numpy" and np is None:
                pythons.need("numpy", "numpy is not installed (Debian: python3-numpy)")
            tr.np = np
            for how in ("stream", "small batches"):
                tr.BATCH = batch if how == "stream" else 5
                t = (tr.stream if how == "stream" else tr.load)(str(traced["trace"]))
                p = tmp_path / (name + ".json")
                categories.write_timeline(t, str(p), categories.Classifier(t))
                out[name, how] = p.read_bytes()
    finally:
        tr.np, tr.BATCH = saved, batch
    assert len(set(out.values())) == 1, [k for k in out if out[k] != out["python", "stream"]]
    assert json.loads(out["python", "stream"]) == traced["events"]


def ours_at_peak(stats):
    """{category: bytes} of `--view stats`' breakdown, and the peak."""
    peak = int(re.search(r"Peak memory usage \(all devices\):\n\t(\d+) B\b",
                         stats).group(1))
    part = stats.split("Peak memory usage by category (all devices):\n", 1)[1]
    by = {m.group(1): int(m.group(2))
          for m in re.finditer(r"^\t(\w+)\s+(\d+) B(?: \([\d.]+ \w+\))?,\s+[\d.]+%$", part, re.M)}
    return peak, by


def test_stats_and_peak_views_break_the_peak_down(traced):
    peak, by = ours_at_peak(traced["stats"])
    print("\npeak %d bytes by category: %s" % (peak, by))
    assert sum(by.values()) == peak
    # at the peak, the parameters and Adam's state are all live
    assert by["PARAMETER"] == sum(PARAMS)
    assert by["OPTIMIZER_STATE"] == 2 * sum(PARAMS)
    # the peak is in the first step's optimizer.step(): every .grad, and
    # of the activations, those the step still holds: the model's
    # returned reconstruction, mu and logvar
    assert by["GRADIENT"] == sum(PARAMS)
    assert by["ACTIVATION"] == BATCH * 784 * 4 + 2 * BATCH * 20 * 4
    v = cli("report", traced["trace"], cwd=traced["dir"])
    assert v.returncode == 0, v
    head = v.stdout.split("\n\n", 1)[0]
    assert head.startswith("== peak of all devices: "), head
    assert "By category:" in head, head
    assert re.search(r"^\tPARAMETER\s+%d B[ ,]" % sum(PARAMS), head, re.M), head
    page = traced["dir"] / "peak.html"
    h = cli("report", "--html", page, traced["trace"], cwd=traced["dir"])
    assert h.returncode == 0, h
    assert "PARAMETER %s, OPTIMIZER_STATE %s" % (format_size(sum(PARAMS)),
                                                  format_size(2 * sum(PARAMS))) in page.read_text()


@pytest.fixture(scope="module")
def hta_python():
    """Holistic Trace Analysis from PyPI in the project's own venv
    (scripts/hta_venv.sh, under the cache folder), with kaleido."""
    r = subprocess.run([str(REPO / "scripts" / "hta_venv.sh")], capture_output=True,
                       text=True, timeout=pythons.HANG_S)
    if r.returncode != 0:
        pythons.need("hta", "HolisticTraceAnalysis could not be installed from PyPI: "
                     + r.stderr.strip()[-300:])
    return r.stdout.strip().splitlines()[-1]


HTA = r"""
import json, sys
import numpy as np
from hta.memory_analysis import MemoryAnalysis, _CATEGORY_TO_INDEX
m = MemoryAnalysis(sys.argv[1])
times, sizes = m._process_raw_events()
s = np.array(sizes)
i = int(np.argmax(s.sum(axis=1)))
print(json.dumps({"names": list(_CATEGORY_TO_INDEX), "peak": int(s.sum(axis=1)[i]),
                  "at_peak": s[i].tolist(), "max": s.max(axis=0).tolist(), "n": len(times)}))
m.plot_memory_timeline(save_graph=True)
"""


def test_hta_reads_and_draws_the_timeline(traced, hta_python, tmp_path):
    # plotly's PNG writer (kaleido) drives a Chromium
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pythons.need("chromium", "chromium is not installed (Debian: apt-get install chromium)")
    # HTA opens it with gzip whatever its name
    r = pythons.run([hta_python, "-c", HTA, str(traced["timeline"])], cwd=tmp_path,
                    env=dict(os.environ, BROWSER_PATH=chromium))
    assert r.returncode == 0, r
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["names"] == ["Parameter", "Optimizer state", "Input", "Temporary",
                            "Activation", "Gradient", "Autograd", "Unknown"]
    peak, by = ours_at_peak(traced["stats"])
    assert got["peak"] == peak
    assert got["at_peak"] == [by.get(c, 0) for c in IDX], (got, by)
    # each category's own highest: all the parameters, Adam's two states
    # of each, one step's batch
    assert got["max"][IDX["PARAMETER"]] == sum(PARAMS)
    assert got["max"][IDX["OPTIMIZER_STATE"]] == 2 * sum(PARAMS)
    assert got["max"][IDX["INPUT"]] == sum(INPUTS)
    png = tmp_path / "images" / "memory_plot.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print("\nHTA's drawing: %s (%d timestamps)" % (png, got["n"]))


def test_user_rules_come_first(traced, tmp_path):
    rules = tmp_path / "rules.toml"
    # the batches train.py draws: unknown instead of INPUT; the linear
    # layers' outputs: ACTIVATION outright, although forward frees three
    rules.write_text('rules = [\n  ["^ImageData\\\\.draw ", "unknown"],\n'
                     '  ["^Linear\\\\.forward ", "activation"],\n]\n')
    out = tmp_path / "t.raw.json.gz"
    r = cli("report", "--categories", rules, "--memory-timeline", out, traced["trace"],
            cwd=tmp_path)
    assert r.returncode == 0, r
    ev = json.loads(gzip.open(out, "rt").read())
    assert created(ev, "unknown") == sorted(INPUTS * STEPS)
    assert not created(ev, "INPUT")
    assert created(ev, "PARAMETER") == PARAMS
    # enc, mu, logvar, dec1, dec2: Linear's outputs, whenever they die
    linear = [BATCH * 400 * 4, BATCH * 20 * 4, BATCH * 20 * 4, BATCH * 400 * 4, BATCH * 784 * 4]
    # relu's, sigmoid's, the clamp's, randn_like's, exp's: saved
    rest = [BATCH * 400 * 4] * 2 + [BATCH * 784 * 4] * 2 + [BATCH * 20 * 4] * 3
    assert created(ev, "ACTIVATION") == sorted((linear + rest) * STEPS)
    s = cli("report", "--categories", rules, "--view", "stats", traced["trace"], cwd=tmp_path)
    assert s.returncode == 0, s


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """A synthetic trace (bench/trace_synth.py: native sites site_1, ...,
    site_48 with frames 'site_N file.c:LINE /bin/synth'): no PyTorch needed."""
    sys.path.insert(0, str(REPO / "bench"))
    import trace_synth
    p = tmp_path_factory.mktemp("synth") / "s.trace"
    trace_synth.write(str(p), 40000, sites=6)
    return p


def pycli(*args, cwd):
    """The command line in this Python (numpy or not, whatever it has)."""
    return pythons.run([sys.executable, str(torchrun.SCRIPT), *map(str, args)], cwd=cwd)


def test_rules_first_match_wins_and_the_export_adds_up(synth, tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text('# site_1 matches both: the first wins\n'
                     'rules = [["^site_1 file\\\\.c:", "PARAMETER"],\n'
                     '         ["^site_[12] ", "gradient"], ["/bin/synth$", "Optimizer-State"]]\n')
    out = tmp_path / "m.json"
    r = pycli("report", "--categories", rules, "--memory-timeline", out, synth, cwd=tmp_path)
    assert r.returncode == 0, r
    ev = json.loads(out.read_text())     # no .gz: plain JSON
    assert {c for *_x, c in ev} == {IDX["PARAMETER"], IDX["GRADIENT"], IDX["OPTIMIZER_STATE"]}
    t = tr.stream(str(synth))
    cl = categories.Classifier(t, categories.load_rules(str(rules)))
    assert [cl.site(s) for s in (1, 2, 3, 6)] == ["PARAMETER", "GRADIENT", "OPTIMIZER_STATE",
                                                  "OPTIMIZER_STATE"]
    assert categories.Classifier(t).site(1) == "TEMPORARY"
    # the live bytes of each category at the overall peak, from the export,
    # equal the stats view's breakdown
    s = pycli("report", "--categories", rules, "--view", "stats", synth, cwd=tmp_path)
    assert s.returncode == 0, s
    peak, by = ours_at_peak(s.stdout)
    run, best, at = [0] * 8, -1, None
    for _t, _a, n, c in ev:
        run[c] += n
        if sum(run) > best:
            best, at = sum(run), list(run)
    assert best == peak
    assert {c: at[i] for c, i in IDX.items() if at[i]} == by
    # without rules: every native stack of the synthetic trace is TEMPORARY
    plain = pycli("report", "--view", "stats", synth, cwd=tmp_path)
    assert ours_at_peak(plain.stdout)[1] == {"TEMPORARY": peak}


@pytest.mark.parametrize("text,error", [
    ('rules = [["(", "PARAMETER"]]', r"rule 1: bad regular expression '\('"),
    ('rules = [["x", "WEIGHTS"]]', r"rule 1: 'WEIGHTS' is not a category \(INPUT, "),
    ('rules = [["x"]]', r'rule 1: not \["REGEX", "CATEGORY"\]'),
    ('rule = []', r"no `rules = "),
    ('rules = [', r"not TOML: "),
])
def test_bad_rules_are_one_line_errors(synth, tmp_path, text, error):
    rules = tmp_path / "rules.toml"
    rules.write_text(text)
    r = pycli("report", "--categories", rules, "--view", "stats", synth, cwd=tmp_path)
    assert r.returncode == 2, r
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert re.search(error, r.stderr), r.stderr
    assert "Traceback" not in r.stderr
    missing = pycli("report", "--categories", tmp_path / "none.toml", synth, cwd=tmp_path)
    assert missing.returncode == 2 and "cannot read" in missing.stderr, missing
    # a leak report is no trace
    rep = pycli("report", "--categories", rules, REPO / "tests/integration/data/leak_single.json",
                cwd=tmp_path)
    assert rep.returncode == 2 and "read a trace" in rep.stderr, rep


# A training step's phases in a synthetic trace (bench/trace_synth.py's
# layout, sites named here): a module's forward, backward()'s initial
# gradient, the autograd engine, anything else.
PHASE_SITES = {1: ("_call_impl", "/t/torch/nn/modules/module.py"),
               2: ("backward", "/t/torch/autograd/__init__.py"),
               3: ("torch::autograd::Engine::evaluate_function", ""),
               4: ("main", "main.c")}
FWD, INIT, ENG, OTHER = 1, 2, 3, 4
# (kind, block, site) in order, with each block's expected category
PHASES = [
    ("A", "x1", FWD), ("A", "x2", FWD), ("F", "x1", FWD),      # freed in forward
    ("A", "g0", INIT), ("A", "e1", ENG), ("A", "e2", ENG),      # backward begins
    ("F", "e1", ENG), ("F", "x2", FWD),
    ("F", "g0", INIT),          # backward() returns: its end
    ("F", "e2", ENG),           # zero_grad(), no allocation between
    ("A", "x3", FWD),
    ("A", "e3", ENG), ("A", "e4", ENG),     # backward(gradient=...): no initial one
    ("F", "e3", ENG),
    ("A", "o1", OTHER),         # its end: the next other allocation
    ("F", "e4", ENG), ("F", "x3", FWD),
    ("A", "x4", FWD),           # no backward follows
]
PHASE_CATS = {"x1": "TEMPORARY", "x2": "ACTIVATION", "g0": "AUTOGRAD_DETAIL",
              "e1": "AUTOGRAD_DETAIL", "e2": "GRADIENT", "x3": "ACTIVATION",
              "e3": "AUTOGRAD_DETAIL", "e4": "GRADIENT", "o1": "TEMPORARY", "x4": "TEMPORARY"}


def phase_trace(path):
    import struct
    from array import array
    sys.path.insert(0, str(REPO / "bench"))
    import trace_synth as ts
    meta = b""
    for s, (fn, file) in PHASE_SITES.items():
        meta += ts._rec(1, struct.pack("<IIII", s, s, 0, 0))
        meta += ts._rec(2, struct.pack("<IIQ", s, 1, 0x400000 + s * 16))
        meta += ts._rec(5, struct.pack("<QiI", 0x400000 + s * 16, 7, 0) +
                        b"%s\0%s\0/bin/synth\0" % (fn.encode(), file.encode()))
    meta += ts._rec(3, struct.pack("<II", 0, 0) + b"simdev\0")
    addr = {b: 0x10000 * (i + 1) for i, b in enumerate(PHASE_CATS)}
    cols = {c: array(ts.TYPECODES[c]) for c in ts.COLUMNS}
    for i, (k, b, s) in enumerate(PHASES):
        for c, v in zip(ts.COLUMNS, (i + 1, addr[b], 4096 * (i + 1), tr.ALLOC if k == "A"
                                     else tr.FREE, 0, 1000 * (i + 1), s)):
            cols[c].append(v)
    # a free carries its allocation's size
    for i, (k, b, _s) in enumerate(PHASES):
        if k == "F":
            cols["size"][i] = next(cols["size"][j] for j, (k2, b2, _x) in enumerate(PHASES)
                                   if k2 == "A" and b2 == b)
    ts.write_events(str(path), [(0, cols)], meta)


def test_lifetimes_find_the_phases_in_any_batching(tmp_path):
    p = tmp_path / "phases.trace"
    phase_trace(p)
    want = []
    for k, b, _s in PHASES:
        want.append((2 if k == "A" else 4, IDX[PHASE_CATS[b]]))
    saved, batch = tr.np, tr.BATCH
    try:
        for np in {saved, None}:
            tr.np = np
            for size in range(1, len(PHASES) + 1):
                tr.BATCH = size
                t = tr.load(str(p))
                rows = [r for b in categories.timeline_rows(t, categories.Classifier(t))
                        for r in b]
                got = [(a, c) for _t, a, _n, c in rows]
                assert got == want, (np is not None, size)
    finally:
        tr.np, tr.BATCH = saved, batch
    # a user's rule names the category outright: the engine's blocks stay
    # AUTOGRAD_DETAIL however long they live, the forward's ACTIVATION
    rules = tmp_path / "rules.toml"
    rules.write_text('rules = [["^torch::autograd::Engine::", "AUTOGRAD_DETAIL"],\n'
                     '         ["^_call_impl ", "ACTIVATION"]]\n')
    t = tr.stream(str(p))
    cl = categories.Classifier(t, categories.load_rules(str(rules)))
    rows = [r for b in categories.timeline_rows(t, cl) for r in b]
    user = {"x1": "ACTIVATION", "x4": "ACTIVATION", "e2": "AUTOGRAD_DETAIL",
            "e4": "AUTOGRAD_DETAIL"}
    assert [(a, c) for _t, a, _n, c in rows] == [
        (2 if k == "A" else 4, IDX[user.get(b, PHASE_CATS[b])]) for k, b, _s in PHASES]
