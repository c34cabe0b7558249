"""Recording a trace (SPYRESHIM_TRACE; shim/trace/): every event reaches the
file in the allocator's order, so the peak computed from the file is the
shim's own peak_used_bytes; a process killed with SIGKILL leaves a file that
parses up to its last flush; a trace of the demo shows the saw-tooth and
the collections; `spyreshim report` reads it."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))
import pythons  # noqa: E402
from spyreshim.reading import trace as tr  # noqa: E402
from spyreshim.views import tracepeak

SCRIPT = REPO / "scripts" / "spyreshim"


def shim_env(**extra):
    env = dict(os.environ, LD_PRELOAD=str(pythons.shim_lib()))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def test_threads_every_event_in_order_and_the_peak_is_the_shims(tmp_path, builddir):
    trace, stats = tmp_path / "t.trace", tmp_path / "s.json"
    r = pythons.run([builddir / "tests" / "pressure_stress", "4", "3000"],
                    env=shim_env(SIMDEV_MEMORY="48M", SPYRESHIM_TRACE=trace, SPYRESHIM_STATS=stats))
    assert r.returncode == 0, r.stderr
    s = json.loads(stats.read_text())
    t = tr.load(str(trace))
    assert not t.truncated
    kinds = list(t.kind)
    assert kinds.count(tr.ALLOC) == s["allocs"]
    assert kinds.count(tr.FREE) == s["frees"]
    assert kinds.count(tr.PRESSURE_BEGIN) == kinds.count(tr.PRESSURE_END) == s["pressure_events"]
    assert s["pressure_events"] > 0
    # Every event takes one sequence number and is recorded: 1..N, no gap.
    assert list(t.seq) == list(range(1, len(t) + 1))
    p = tr.peaks(t)
    assert p.bytes == s["peak_used_bytes"]
    assert [b for b, _i in p.per_device.values()] == [s["peak_used_bytes"]]
    # Replayed in order, every free matches a live block of its size.
    live = {}
    for i in range(len(t)):
        if t.kind[i] == tr.ALLOC:
            assert (t.dev[i], t.addr[i]) not in live
            live[(t.dev[i], t.addr[i])] = t.size[i]
        elif t.kind[i] == tr.FREE:
            assert live.pop((t.dev[i], t.addr[i])) == t.size[i]
    # Stacks without leak checking: named frames of the test program.
    assert t.devices == {0: "simdev"}
    names = {f["function"] for site in t.sites for f in t.frames(site)}
    assert "work" in names


def run_then_sigkill(prog, trace, builddir, on_disk):
    """Runs `prog` with a trace flushed every 20 ms; once it prints "ready",
    reads the file as it grows until `on_disk(trace)` holds (the writer's
    flushes are the progress waited for: no fixed pause, which a busy
    machine can outlast) and then kills it with SIGKILL. Returns the trace
    loaded after the kill."""
    env = shim_env(SIMDEV_MEMORY="64M", SPYRESHIM_TRACE=trace, SPYRESHIM_TRACE_FLUSH_MS=20,
                   PYTHONPATH=builddir / "tests" / "simdev")
    p = subprocess.Popen([sys.executable, "-c", prog], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + pythons.HANG_S
        while True:
            try:
                if on_disk(tr.load(str(trace))):
                    break
            except (OSError, tr.rpt.ReportError):
                pass        # not written yet, or a chunk half written
            assert time.monotonic() < deadline, "the trace stopped growing (hang bound)"
            time.sleep(0.02)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=pythons.HANG_S)
    finally:
        if p.poll() is None:
            p.kill()
    return tr.load(str(trace))


def _allocs_of(t, size):
    return sum(1 for i in range(len(t)) if t.kind[i] == tr.ALLOC and t.size[i] == size)


def test_sigkill_leaves_a_parsable_file(tmp_path, builddir):
    trace = tmp_path / "k.trace"
    prog = ("import simdev, sys, time\n"
            "keep = [simdev.Tensor(4096) for _ in range(100)]\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    # Killed once the 100 allocations are on disk (a flush happens at most
    # every 20 ms while events wait): they stay readable after the kill.
    t = run_then_sigkill(prog, trace, builddir, lambda t: _allocs_of(t, 4096) >= 100)
    assert _allocs_of(t, 4096) >= 100
    # Killed: no names were written at exit, but stacks and the module map were.
    assert not t.symbols and t.maps and t.nstacks
    assert tr.peaks(t).bytes >= 100 * 4096
    # The report still reads it (frames as object+offset).
    r = subprocess.run([sys.executable, SCRIPT, "report", str(trace)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "live device memory (peak)" in r.stdout


def test_exited_threads_events_reach_the_file_before_a_sigkill(tmp_path, builddir):
    """Each thread appends to a buffer of its own; one that exits hands its
    buffer to the writer (a pthread key destructor), so its events are in
    the file at the next flush although the process is then killed. Each
    thread records more than one buffer (8192 events) and keeps 50 blocks."""
    trace = tmp_path / "x.trace"
    prog = ("import simdev, threading, time\n"
            "keep = []\n"
            "def work():\n"
            "    for _ in range(5000):\n"
            "        simdev.Tensor(1024)\n"
            "    keep.extend(simdev.Tensor(4096) for _ in range(50))\n"
            "ts = [threading.Thread(target=work) for _ in range(4)]\n"
            "[t.start() for t in ts]\n"
            "[t.join() for t in ts]\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    t = run_then_sigkill(prog, trace, builddir,
                         lambda t: _allocs_of(t, 1024) + _allocs_of(t, 4096) >= 4 * 5050)
    assert not t.truncated
    kinds = list(t.kind)
    assert kinds.count(tr.ALLOC) == 4 * 5050 and kinds.count(tr.FREE) == 4 * 5000
    # Merged from four threads' buffers, the sequence numbers are 1..N.
    assert list(t.seq) == list(range(1, len(t) + 1))
    live = {}
    for i in range(len(t)):
        if t.kind[i] == tr.ALLOC:
            live[t.addr[i]] = t.size[i]
        elif t.kind[i] == tr.FREE:
            assert live.pop(t.addr[i]) == t.size[i]
        else:   # the regions the shim reserved (and gave back)
            assert t.kind[i] in (tr.SEGMENT_ALLOC, tr.SEGMENT_FREE), t.kind[i]
    assert sorted(live.values()) == [4096] * 200


def test_fork_child_writes_its_own_trace(tmp_path, builddir):
    prog = ("import os, simdev\n"
            "a = simdev.Tensor(1 << 20)\n"
            "pid = os.fork()\n"
            "b = simdev.Tensor(2 << 20)\n"
            "del b\n"
            "os._exit(0) if pid == 0 else os.waitpid(pid, 0)\n")
    env = shim_env(SIMDEV_MEMORY="64M", SPYRESHIM_TRACE=tmp_path / "f-%p.trace",
                   PYTHONPATH=builddir / "tests" / "simdev")
    r = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True,
                       timeout=pythons.HANG_S)
    assert r.returncode == 0, r.stderr
    files = sorted(tmp_path.glob("f-*.trace"))
    # The child's _exit skips the destructor: its file holds what was
    # flushed (at least the header); the parent's has both of its blocks.
    assert len(files) in (1, 2)
    traces = [tr.load(str(f)) for f in files]
    assert any(sorted(t.size[i] for i in range(len(t)) if t.kind[i] == tr.ALLOC) ==
               [1 << 20, 2 << 20] for t in traces)
    # No file holds another process's events twice: the child dropped the
    # parent's buffer.
    assert all(sorted(t.size[i] for i in range(len(t)) if t.kind[i] == tr.ALLOC).count(1 << 20) <= 1
               for t in traces)


def test_demo_trace_shows_sawtooth_and_collections(tmp_path, builddir):
    trace = tmp_path / "demo.trace"
    env = shim_env(SIMDEV_MEMORY="256M", SPYRESHIM_TRACE=trace,
                   PYTHONPATH=builddir / "tests" / "simdev")
    r = pythons.run([sys.executable, REPO / "scripts" / "demo_train.py"], env=env)
    assert r.returncode == 0, r.stderr
    t = tr.load(str(trace))
    gcs = [i for i in range(len(t)) if t.kind[i] == tr.GC]
    assert len(gcs) >= 2
    # Saw-tooth: live bytes climb to near the device's size before each
    # collection and fall well below it after.
    live, before, after = 0, [], []
    for i in range(len(t)):
        k = t.kind[i]
        if k == tr.ALLOC:
            live += t.size[i]
        elif k == tr.FREE:
            live -= t.size[i]
        elif k == tr.PRESSURE_BEGIN:
            before.append(live)
        elif k == tr.PRESSURE_END:
            after.append(live)
    assert before and all(b >= 192 << 20 for b in before)
    assert all(a <= b // 2 for a, b in zip(after, before))
    # Python stacks come with the trace alone (no leak check).
    assert any("demo_train.py" in (f["file"] or "") for s in t.sites for f in t.frames(s))
    stats = tracepeak.stats_text(t)
    assert "collections: %d" % len(gcs) in stats
    assert "forward (demo_train.py" in stats


def test_run_trace_option_and_report_views(tmp_path, builddir):
    trace = tmp_path / "r.trace"
    env = dict(os.environ, SIMDEV_MEMORY="64M", SPYRESHIM_LIB=str(pythons.shim_lib()))
    r = subprocess.run([sys.executable, SCRIPT, "run", "--trace", str(trace), "--",
                        builddir / "tests" / "simdev_ops", "a:1M", "a:3M", "f", "a:2M"],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert tr.is_trace(str(trace))
    r = subprocess.run([sys.executable, SCRIPT, "report", "--view", "stats", str(trace)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "Total allocations:\n\t3" in r.stdout
    r = subprocess.run([sys.executable, SCRIPT, "report", str(trace)], capture_output=True, text=True)
    assert r.returncode == 0 and "peak of all devices" in r.stdout
    r = subprocess.run([sys.executable, SCRIPT, "report", "--view", "timeline", str(trace)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--html" in r.stderr
