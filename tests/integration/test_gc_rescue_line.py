"""A run that needed collections says so, once, at the default log level:
how many, how long, how many bytes, and where the cycles were made (the
top site when leak checking recorded stacks, the trace's `--view gc` when
one is kept, how to get either otherwise). A run that needed none prints
nothing of the kind (its stderr is the bare program's)."""
import re
import sys

import gc_support
import pythons

CYCLES = """
import gc, simdev
gc.disable()
for i in range(40):
    t = simdev.Tensor(1 << 20)     # CYCLE LINE: 1 MiB of a 16 MiB device
    t.me = t
    del t
print("completed")
"""
LINE = r"^spyreshim: (\d+) collection\(s\) of Python's reference cycles freed device memory " \
       r"for this run \(([\d.]+) ms, (\d+) B(?: \([\d.]+ [KMGTPE]iB\))?\); (.*)$"


def cpython():
    interp = next((i for i in pythons.interpreters() if i.available and i.kind == "cpython"
                   and not i.free_threaded), None)
    if interp is None:
        pythons.need("/usr/bin/python3", "no CPython of the matrix is usable")
    return interp


def rescue_lines(res):
    return re.findall(LINE, res.stderr, re.M)


def test_a_rescued_run_says_so_in_one_line(builddir, shim_lib, tmp_path):
    interp = cpython()
    bare, _ = gc_support.run(interp, CYCLES, tmp_path, memory="16M", preload=False)
    assert bare.returncode != 0, bare.describe()          # the cycles fill the device
    res, stats = gc_support.run(interp, CYCLES, tmp_path, memory="16M")
    res.check()
    lines = rescue_lines(res)
    assert len(lines) == 1, res.describe()
    n, _, freed, where = lines[0]
    assert int(n) == stats["gc_collections"] > 0 and int(freed) == stats["gc_recovered_bytes"]
    assert where == "where the cycles were made: run with --trace, then spyreshim report --view gc"

    res, _ = gc_support.run(interp, CYCLES, tmp_path, memory="16M",
                            env={"SPYRESHIM_LEAK_CHECK": "1"})
    res.check()
    (_, _, _, where), = rescue_lines(res)
    cycle_line = next(i for i, ln in enumerate(CYCLES.splitlines(), 1) if "CYCLE LINE" in ln)
    assert re.match(rf"the cycles' top site: .*:{cycle_line} in <module> \(\d+ B \([\d.]+ MiB\) freed", where), where

    trace = tmp_path / "t.trace"
    res, _ = gc_support.run(interp, CYCLES, tmp_path, memory="16M",
                            env={"SPYRESHIM_TRACE": str(trace)})
    res.check()
    (_, _, _, where), = rescue_lines(res)
    assert where == f"where the cycles were made: spyreshim report --view gc {trace}"


def test_the_summary_at_exit_says_recovered_once(builddir, shim_lib, tmp_path):
    """SPYRESHIM_LOG=info's last line: what pressure events recovered, said
    once, the collections' share in brackets; sizes as every line reads them."""
    interp = cpython()
    res, stats = gc_support.run(interp, CYCLES, tmp_path, memory="16M",
                                env={"SPYRESHIM_LOG": "info"})
    res.check()
    line, = [ln for ln in res.stderr.splitlines() if " pressure events recovered " in ln]
    assert line.count("recovered") == 1, line
    sys.path.insert(0, str(pythons.REPO))
    from spyreshim.reading.units import format_size
    assert " pressure events recovered %s in " % format_size(
        stats["callback_recovered_bytes"]) in line, line
    assert "timeouts: %s of it)" % format_size(stats["gc_recovered_bytes"]) in line, line
    assert "peak %s in use" % format_size(stats["peak_used_bytes"]) in line, line


def test_a_run_without_collections_prints_no_such_line(builddir, shim_lib, tmp_path):
    interp = cpython()
    res, stats = gc_support.run(interp, CYCLES, tmp_path, memory="256M")
    res.check()
    assert stats["gc_collections"] == 0 and not rescue_lines(res), res.describe()
