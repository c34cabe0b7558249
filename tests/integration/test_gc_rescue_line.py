"""A run that needed collections says so, once, at the default log level:
how many, how long, how many bytes, and where the cycles were made (the
top site when leak checking recorded stacks, the trace's `--view gc` when
one is kept, how to get either otherwise). A run that needed none prints
nothing of the kind (its stderr is the bare program's)."""
import re

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
       r"for this run \(([\d.]+) ms, (\d+) bytes\); (.*)$"


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
    assert re.match(rf"the cycles' top site: .*:{cycle_line} in <module> \(\d+ bytes freed", where), where

    trace = tmp_path / "t.trace"
    res, _ = gc_support.run(interp, CYCLES, tmp_path, memory="16M",
                            env={"SPYRESHIM_TRACE": str(trace)})
    res.check()
    (_, _, _, where), = rescue_lines(res)
    assert where == f"where the cycles were made: spyreshim report --view gc {trace}"


def test_a_run_without_collections_prints_no_such_line(builddir, shim_lib, tmp_path):
    interp = cpython()
    res, stats = gc_support.run(interp, CYCLES, tmp_path, memory="256M")
    res.check()
    assert stats["gc_collections"] == 0 and not rescue_lines(res), res.describe()
