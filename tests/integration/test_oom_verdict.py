"""The out-of-memory verdict (issue 24, item 3): four scenarios on simdev
(tests/integration/oom_scenarios.py), each ending on a request that failed
for good, each with its verdict in the final report's text (one line of at
most 300 characters after the report's headline; the failing thread's one
warning names it too, for the first failure) and in the JSON report's `oom` object, with the figures
that decided it."""
import json
import os
import sys
from pathlib import Path

import pytest

import pythons

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from spyreshim.reading.units import format_size  # noqa: E402
M = 1 << 20


def run(scenario, tmp_path, **env):
    report = tmp_path / "r.json"
    e = dict(os.environ, LD_PRELOAD=str(pythons.shim_lib()), SIMDEV_MEMORY="64M",
             SPYRESHIM_REPORT=str(report))
    e.update(env)
    r = pythons.run([sys.executable, HERE / "oom_scenarios.py", scenario,
                     str(pythons.libsimdev())], env=e)
    assert r.returncode == 0, r.stderr
    oom = json.loads(Path(str(report) + ".oom").read_text())["oom"]
    lines = [ln for ln in r.stderr.splitlines() if "verdict:" in ln]
    assert lines and all(len(ln) <= 300 for ln in lines), lines
    final = lines[-1]   # the exit report's, after its headline
    err = r.stderr.splitlines()
    head = len(err) - 1 - err[::-1].index(final) - 1
    assert "a request of %s failed" % format_size(oom["request"]) in err[head], err[head]
    assert final.startswith("spyreshim: verdict: %s: " % oom["verdict"]), final
    return oom, final, lines


def test_exhausted(builddir, tmp_path):
    oom, line, _ = run("exhausted", tmp_path)
    assert oom["verdict"] == "exhausted"
    assert oom["used"] == oom["reserved"] == 64 * M and oom["device_free"] == 0
    assert oom["largest_hole"] < oom["request"]


def test_fragmentation_with_free_bytes_above_the_request(builddir, tmp_path):
    oom, line, lines = run("fragmentation", tmp_path)
    assert oom["verdict"] == "fragmentation"
    assert oom["request"] == 4 * M and oom["largest_hole"] == 1 * M
    assert oom["free_in_regions"] == 32 * M and oom["free_outside_regions"] == 0
    assert "largest hole is %d bytes" % M in line and "32 MiB" not in line
    # The failing thread's one line was the first failure's (the fill).
    assert lines[0].endswith("if it does not recover (verdict: exhausted)"), lines[0]


def test_limit_while_the_device_had_room(builddir, tmp_path):
    oom, line, _ = run("limit", tmp_path, SPYRESHIM_LIMIT="16M")
    assert oom["verdict"] == "limit" and oom["limit"] == 16 * M
    assert oom["device_free"] >= oom["request"] and oom["reserved"] == 16 * M
    assert "SPYRESHIM_LIMIT=%d" % (16 * M) in line


def test_foreign_memory_holds_the_device(builddir, tmp_path):
    oom, line, _ = run("foreign", tmp_path)
    assert oom["verdict"] == "foreign"
    assert oom["device_free"] == 8 * M and oom["reserved"] == 0
    assert "%d fewer than the shim accounts for" % (56 * M) in line
