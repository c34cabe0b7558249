"""Memory categories (spyreshim/reading/categories.py): a real trace of a training
loop (tests/torch_examples/train.py's VAE with Adam, PyTorch 1.13 and 2.x
on the simdev device, `spyreshim run --trace`) classed by its stacks into
PyTorch's categories; `report --view stats` and the peak view break the
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
    return {"dir": d, "trace": trace, "timeline": out, "stats": stats.stdout,
            "events": json.loads(gzip.open(out, "rt").read())}


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
    # the autograd engine: each step's .grad of each parameter (set to None
    # by zero_grad) among the backward's buffers
    grads = created(ev, "GRADIENT")
    for p in PARAMS:
        assert grads.count(p) >= STEPS, (p, grads)
    # forward's outputs: the encoder's 32x400 and the decoder's 32x784 among them
    acts = created(ev, "ACTIVATION")
    assert BATCH * 400 * 4 in acts and BATCH * 784 * 4 in acts, acts
    # the rest: torch.sigmoid(data), the loss's terms, Adam's update temporaries
    assert len(created(ev, "TEMPORARY")) >= STEPS
    assert not created(ev, "unknown") and not created(ev, "AUTOGRAD_DETAIL")


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
    # the batches train.py draws: AUTOGRAD_DETAIL instead of INPUT
    rules.write_text('rules = [\n  ["^ImageData\\\\.draw ", "autograd detail"],\n]\n')
    out = tmp_path / "t.raw.json.gz"
    r = cli("report", "--categories", rules, "--memory-timeline", out, traced["trace"],
            cwd=tmp_path)
    assert r.returncode == 0, r
    ev = json.loads(gzip.open(out, "rt").read())
    assert created(ev, "AUTOGRAD_DETAIL") == sorted(INPUTS * STEPS)
    assert not created(ev, "INPUT")
    assert created(ev, "PARAMETER") == PARAMS
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
