"""The exit check in two parts (docs/leaks.md, "What counts as a leak"):
what Python objects still held when the interpreter began to shut down,
after a collection, is "held until exit", reported apart and counted in the
exit status only under --leak-check=held; leaked is only what is live after
finalization and was not held then.

  - a clean PyTorch loop (no cache, no cycles kept) exits 0 under
    --leak-check with the bare program's output, on 1.13 and on 2.x, where
    finalization leaves the model's parameters allocated (5 runs each);
  - a loop that keeps a tensor per step: exit 0 under --leak-check, its
    cache reported as held until exit, first, at the line that appends;
    exit 23 under --leak-check=held;
  - the same with the simdev module and a module-level list (no torch)."""
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pythons  # noqa: E402
import torchrun  # noqa: E402

RUNS = 5

CLEAN = textwrap.dedent("""\
    import torch, simdev_torch
    dev = simdev_torch.device
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 64).to(dev)
    y = torch.randint(0, 10, (32,)).to(dev)
    cache = []
    for step in range(10):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if KEEP:
            cache.append(torch.ones(8192, device=dev) * step)      # KEEP LINE
    print("loss", loss.item())
    """)


def line_of(text, marker):
    return next(i for i, ln in enumerate(text.splitlines(), 1) if marker in ln)


def run_loop(tmp_path, keep, *opts):
    script = tmp_path / "loop.py"
    script.write_text(CLEAN.replace("KEEP", "True" if keep else "False", 1)
                      .replace("if KEEP:", "if True:" if keep else "if False:"))
    report = tmp_path / "r.json"
    if report.exists():
        report.unlink()
    argv = [str(torchrun.SCRIPT), "run", *opts, "--report", str(report), "--",
            torchrun.PYTHON, str(script)]
    r = torchrun.run(argv=argv, cwd=tmp_path, simdev_memory="64M")
    return r, (json.loads(report.read_text()) if report.exists() else None), script


@pytest.mark.parametrize("version", torchrun.VERSIONS)
def test_clean_torch_loop_exits_0_under_the_leak_check(version, builddir, shim_lib, tmp_path):
    torchrun.require(version)
    script = tmp_path / "loop.py"
    script.write_text(CLEAN.replace("if KEEP:", "if False:"))
    bare = torchrun.run(path=script, cwd=tmp_path, simdev_memory="64M")
    assert bare.returncode == 0 and bare.stdout.startswith("loss "), bare
    for _ in range(RUNS):
        r, data, _ = run_loop(tmp_path, False, "--leak-check")
        assert r.returncode == 0, r
        assert r.stdout == bare.stdout, (r.stdout, bare.stdout)
        assert "detected device memory leaks" not in r.stderr, r.stderr
        assert "terminate called" not in r.stderr, r.stderr
        assert data["groups"] == [] and data["live_bytes"] == 0, data["groups"][:1]
        # The model, its gradients and the optimizer's inputs were held.
        assert data["held_until_exit"]["bytes"] > 0


@pytest.mark.parametrize("version", torchrun.VERSIONS)
def test_a_loop_that_keeps_tensors_is_held_until_exit_at_its_line(version, builddir, shim_lib,
                                                                  tmp_path):
    torchrun.require(version)
    r, data, script = run_loop(tmp_path, True, "--leak-check")
    assert r.returncode == 0, r
    assert data["groups"] == [], data["groups"][:1]
    held = data["held_until_exit"]["groups"]
    first = held[0]
    assert first["bytes"] == 10 * 8192 * 4 and first["count"] == 10, held[0]
    python = [f for f in first["frames"] if f["kind"] == "python"]
    assert python[0]["file"] == str(script) and python[0]["line"] == line_of(CLEAN, "KEEP LINE")
    text = r.stderr[r.stderr.index("held by Python until exit"):]
    first_text = text.split("\n\n")[1]
    assert f"loop.py:{line_of(CLEAN, 'KEEP LINE')}" in first_text, first_text
    r, data, _ = run_loop(tmp_path, True, "--leak-check=held")
    assert r.returncode == 23, r
    assert "ERROR: spyreshim: detected device memory leaks, or held by Python until exit" in r.stderr
    assert f"loop.py:{line_of(CLEAN, 'KEEP LINE')}" in r.stderr


CACHE = textwrap.dedent("""\
    import simdev
    cache = []
    for i in range(8):
        cache.append(simdev.Tensor(4096))      # CACHE LINE
    print("ok")
    """)


def test_a_module_level_cache_is_held_until_exit(builddir, shim_lib, tmp_path):
    interp = next((i for i in pythons.interpreters() if i.available and i.kind == "cpython"
                   and not i.free_threaded), None)
    if interp is None:
        pythons.need("/usr/bin/python3", "no CPython of the matrix is usable")
    script = tmp_path / "cache.py"
    script.write_text(CACHE)
    bare = pythons.run_python(interp, path=script, preload=False)
    report = tmp_path / "r.json"
    r = pythons.run_python(interp, path=script,
                           env={"SPYRESHIM_LEAK_CHECK": "1", "SPYRESHIM_REPORT": report})
    assert r.returncode == bare.returncode == 0 and r.stdout == bare.stdout, r.describe()
    data = json.loads(report.read_text())
    assert data["groups"] == [] and data["held_until_exit"]["bytes"] == 8 * 4096, data
    assert re.search(r"Held until exit: 32768 B \(32\.0 KiB\) in 8 allocation\(s\)", r.stderr), r.stderr
    assert f"cache.py:{line_of(CACHE, 'CACHE LINE')}" in r.stderr, r.stderr
    r = pythons.run_python(interp, path=script, env={"SPYRESHIM_LEAK_CHECK": "held"})
    assert r.returncode == 23, r.describe()


def test_run_help_says_what_counts_as_a_leak():
    import subprocess
    r = subprocess.run([str(torchrun.SCRIPT), "run", "--help"], capture_output=True, text=True,
                       timeout=pythons.HANG_S)
    text = " ".join(r.stdout.split())
    assert r.returncode == 0, r.stderr
    assert "What counts as a leak: device memory still allocated at exit" in text, text
    assert "held until exit" in text and "--leak-check=held" in text, text
