"""Many ranks, one answer (issue 49): which worker of a launch wrote each
file. Output paths take %r, %l, %R and %h besides %p; a ranked process's
template without %r gets the rank in its name; the trace's process record
and the report's fields say rank, local rank, world size, restart, run id
and host. The program sees what it sees bare: its output is compared."""
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from html import escape as html_escape
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPT = REPO / "scripts" / "spyreshim"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from spyreshim.reading import trace as tr  # noqa: E402
import pythons  # noqa: E402

LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                 "SLURM_PROCID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                 "SLURM_LOCALID", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS",
                 "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID")

# Leaks one tensor (so that the report is written) and prints what it sees
# of the launcher's variables: the same with the shim as without.
WORKER = textwrap.dedent("""\
    import ctypes
    import os
    import simdev

    t = simdev.Tensor(1 << 20)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))
    print(sorted((k, v) for k, v in os.environ.items()
                 if "RANK" in k or "TORCHELASTIC" in k or k == "WORLD_SIZE"))
    """)


@pytest.fixture(scope="module")
def shim():
    assert pythons.shim_lib().exists(), "%s is not built" % pythons.shim_lib()
    interp = pythons.get("cpython3.11-static").require()
    pythons.build_module(interp)
    return interp


def _env(interp, launch):
    env = pythons.module_env(interp, env={"SPYRESHIM_LIB": str(pythons.shim_lib())},
                             simdev_memory="1G")
    for k in LAUNCHER_VARS:
        env.pop(k, None)
    env.update(launch)
    return env


def _run(interp, tmp_path, launch, *options):
    (tmp_path / "worker.py").write_text(WORKER)
    env = _env(interp, launch)
    bare = subprocess.run([interp.exe, "worker.py"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=pythons.HANG_S)
    r = subprocess.run([str(SCRIPT), "run", "--exitcode", "0"] + [str(o) for o in options] +
                       ["--", interp.exe, "worker.py"],
                       capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=pythons.HANG_S)
    assert r.returncode == 0 and bare.returncode == 0, (r, bare)
    assert r.stdout == bare.stdout, (r.stdout, bare.stdout)
    return r


TORCHRUN = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
            "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_RUN_ID": "job-7"}


def test_tokens_name_the_rank_and_the_records_say_it(shim, tmp_path):
    r = _run(shim, tmp_path, TORCHRUN, "--trace", "t-%r-%l-%R-%h.trace",
             "--report", "r-%r.%R.json")
    host = socket.gethostname()
    names = sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".trace", ".json"))
    assert names == ["r-3.2.json", "t-3-1-2-%s.trace" % host], (names, r.stderr)
    rep = json.loads((tmp_path / "r-3.2.json").read_text())
    assert {k: rep.get(k) for k in ("rank", "local_rank", "world_size", "restart", "run_id",
                                    "host")} == {"rank": 3, "local_rank": 1, "world_size": 4,
                                                 "restart": 2, "run_id": "job-7", "host": host}
    t = tr.stream(tmp_path / ("t-3-1-2-%s.trace" % host))
    assert t.process == {"rank": 3, "local_rank": 1, "world_size": 4, "restart": 2,
                         "run_id": "job-7", "host": host}


def test_a_name_without_the_rank_gets_it(shim, tmp_path):
    """No two ranks, no two restarts, one file: `.rank<N>` (and after a
    restart `.restart<N>`) before the first dot of the file's name."""
    (tmp_path / "sub.d").mkdir()
    _run(shim, tmp_path, TORCHRUN, "--trace", "out.trace", "--report", "sub.d/rep.json")
    assert (tmp_path / "out.rank3.restart2.trace").is_file(), list(tmp_path.iterdir())
    assert not (tmp_path / "out.trace").exists()
    # The dot of a folder is not the file's; the report's .oom companion
    # would be rep.rank3.restart2.json.oom.
    assert [p.name for p in (tmp_path / "sub.d").iterdir()] == ["rep.rank3.restart2.json"]


def test_mpi_and_slurm_ranks_and_the_first_restart(shim, tmp_path):
    (tmp_path / "d").mkdir()
    _run(shim, tmp_path, {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                          "SLURM_PROCID": "9", "TORCHELASTIC_RESTART_COUNT": "0"},
         "--trace", "d/%l-t.trace", "--report", "d/rep")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["0-t.rank5.trace",
                                                                 "rep.rank5"]
    rep = json.loads((tmp_path / "d" / "rep.rank5").read_text())
    assert rep["rank"] == 5 and rep["local_rank"] == 0 and "world_size" not in rep


def test_no_launcher_no_change(shim, tmp_path):
    """Outside a launch the names are as before, and %r, %l, %R expand to
    nothing; the records hold the host alone."""
    _run(shim, tmp_path, {"RANK": "not-a-number"}, "--trace", "a%r%l%R.trace",
         "--report", "rep-%p.json")
    names = [p.name for p in tmp_path.iterdir() if p.suffix in (".trace", ".json")]
    assert "a.trace" in names and len(names) == 2, names
    t = tr.stream(tmp_path / "a.trace")
    assert t.process == {"host": socket.gethostname()}
    rep = json.loads(next(tmp_path.glob("rep-*.json")).read_text())
    assert "rank" not in rep and rep["host"] == socket.gethostname()


# Training-like steps that leave their tensors in reference cycles with the
# collector off: only the shim's collection frees them. "hang" stops after
# the steps, so that the test can kill it mid-run.
CYCLES = textwrap.dedent("""\
    import gc
    import sys
    import time
    import simdev

    gc.disable()

    def step():
        d = {"t": simdev.Tensor(2 << 20)}
        d["self"] = d

    for _ in range(40):
        step()
    if sys.argv[1:] == ["spike"]:
        simdev.Tensor(16 << 20)          # freed at once: a peak between two samples
    print("steps done", flush=True)
    if sys.argv[1:] == ["hang"]:
        time.sleep(600)
    """)


def _rank(interp, tmp_path, rank, memory, *args, hang=False):
    env = _env(interp, {"RANK": str(rank), "WORLD_SIZE": "3", "LOCAL_RANK": str(rank),
                        "TORCHELASTIC_RUN_ID": "cycles"})
    env["SIMDEV_MEMORY"] = memory
    env["SPYRESHIM_TRACE_FLUSH_MS"] = "50"
    argv = [str(SCRIPT), "run", "--trace", str(tmp_path / "t" / "w.trace"), "--",
            interp.exe, "cycles.py", *args]
    if hang:
        return subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    return subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=pythons.HANG_S)


def _check_trace_event_format(doc):
    """The JSON Object Format of the Trace Event Format (Google's "Trace
    Event Format" document): what this export uses of it, checked field by
    field. Returns the events."""
    assert set(doc) <= {"traceEvents", "displayTimeUnit", "otherData"}, set(doc)
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    for e in events:
        assert isinstance(e["name"], str) and isinstance(e["pid"], int), e
        assert isinstance(e["tid"], int), e
        ph = e["ph"]
        assert ph in ("M", "C", "i"), e
        if ph == "M":
            assert e["name"] in ("process_name", "process_sort_index"), e
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if ph == "C":        # counters: every arg a number, one series each
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
        else:
            assert e["s"] in ("g", "p", "t"), e
    return events


def test_cross_rank_report(shim, tmp_path):
    (tmp_path / "cycles.py").write_text(CYCLES)
    (tmp_path / "t").mkdir()
    env = _env(shim, {})
    env["SIMDEV_MEMORY"] = "32M"
    bare = subprocess.run([shim.exe, "cycles.py"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=pythons.HANG_S)
    assert bare.returncode != 0 and "steps done" not in bare.stdout, bare
    r0 = _rank(shim, tmp_path, 0, "256M", "spike")
    r1 = _rank(shim, tmp_path, 1, "32M")
    assert r0.returncode == 0 and r1.returncode == 0, (r0, r1)
    assert r0.stdout == r1.stdout == "steps done\n"
    # Rank 2 killed with SIGKILL once its steps are done: its trace is cut.
    p = _rank(shim, tmp_path, 2, "256M", "hang", hang=True)
    try:
        assert p.stdout.readline() == "steps done\n"
        import time
        time.sleep(0.5)      # two flush intervals: the steps' events are in the file
    finally:
        p.kill()
        p.wait()
    names = sorted(f.name for f in (tmp_path / "t").iterdir())
    assert names == ["w.rank0.trace", "w.rank1.trace", "w.rank2.trace"], names

    out = subprocess.run([str(SCRIPT), "report", str(tmp_path / "t")], capture_output=True,
                         text=True, timeout=pythons.HANG_S)
    assert out.returncode == 0, out
    text = out.stdout
    lines = text.splitlines()
    assert lines[0] == "spyreshim: 3 processes, run id cycles, world size 3", text
    head = re.split(r"\s{2,}", lines[1])
    rows = {c[0]: dict(zip(head, c)) for c in (re.split(r"\s{2,}", ln) for ln in lines[2:5])}
    assert sorted(rows) == ["rank 0", "rank 1", "rank 2"], text
    # Rank 0 held every step's tensor (80 MiB, no collection needed) and a
    # spike of 16 MiB; rank 1 collected to stay under 32 MiB.
    assert "highest peak:   rank 0, 100663296 B (96.0 MiB)" in text, text
    assert "least headroom: rank 1," in text and "of 33554432 B (32.0 MiB)" in text, text
    assert "first OOM:      none" in text
    assert rows["rank 0"]["collections (freed)"] == "0 (0 B)", text
    assert not rows["rank 1"]["collections (freed)"].startswith("0 "), text
    assert rows["rank 1"]["headroom"] == "0 B", text
    # The killed rank's trace is read as far as it was flushed: every step.
    assert rows["rank 2"]["peak in use"] == "83886080 B (80.0 MiB)", text

    page = tmp_path / "ranks.html"
    h = subprocess.run([str(SCRIPT), "report", "--html", str(page), str(tmp_path / "t")],
                       capture_output=True, text=True, timeout=pythons.HANG_S)
    assert h.returncode == 0, h
    html = page.read_text()
    assert "least headroom: rank 1, 0 B of 33554432 B (32.0 MiB)" in html     # the summary, on the page
    assert html.count("<polyline") == 6, html                    # in use, reserved: 3 ranks
    # The time axis ticks at round times (1, 2 or 5 times a power of ten).
    ticks = re.findall(r'text-anchor="middle">([^<]*)</text>', html)
    assert ticks[0] == "0" and len(ticks) >= 3, ticks
    assert all(re.fullmatch(r"\d+ (s|ms|µs)", tk) for tk in ticks[1:]), ticks
    assert int(ticks[1].split()[0]) in (1, 2, 5, 10, 20, 50, 100, 200, 500), ticks
    assert [ln for ln in ("rank 0", "rank 1", "rank 2") if ">%s</text>" % ln in html] == [
        "rank 0", "rank 1", "rank 2"]
    assert "<script" not in html

    out = tmp_path / "launch.json"
    c = subprocess.run([str(SCRIPT), "report", "--chrome-trace", str(out), str(tmp_path / "t")],
                       capture_output=True, text=True, timeout=pythons.HANG_S)
    assert c.returncode == 0, c
    events = _check_trace_event_format(json.loads(out.read_text()))
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1", 2: "rank 2"}, names
    used = {p: max(e["args"]["in use"] for e in events if e["ph"] == "C" and e["pid"] == p)
            for p in names}
    assert used == {0: 96 << 20, 1: 32 << 20, 2: 80 << 20}, used     # no peak sampled away
    gcs = [e for e in events if e["name"] == "collection"]
    assert {e["pid"] for e in gcs} == {1}
    assert "%d (" % len(gcs) in rows["rank 1"]["collections (freed)"], (gcs, text)

    d = subprocess.run([str(SCRIPT), "report", "--diff-ranks", "1", "0",
                        *map(str, (tmp_path / "t").iterdir())],
                       capture_output=True, text=True, timeout=pythons.HANG_S)
    assert d.returncode == 0, d
    assert "at rank 0's peak beyond rank 1's" in d.stdout, d.stdout
    assert "Grew by 50331648 B (48.0 MiB) in 24 allocation(s)" in d.stdout, d.stdout
    assert "in step %s:9 [python]" % (tmp_path / "cycles.py") in d.stdout, d.stdout


# A launcher that scrubs its workers' environment (as Ray's and some
# schedulers' do) puts them under the shim with spyreshim.child_env().
LAUNCHER = textwrap.dedent("""\
    import os
    import subprocess
    import sys
    import spyreshim

    ours = spyreshim.child_env(full=False)
    print(sorted(ours))
    print(ours["LD_PRELOAD"].split(":")[0] == spyreshim.library_path())
    scrubbed = {k: v for k, v in os.environ.items()
                if k != "LD_PRELOAD" and not k.startswith("SPYRESHIM_")}
    probe = "import spyreshim; print(spyreshim.available())"
    for env in (scrubbed, spyreshim.child_env(scrubbed)):
        subprocess.run([sys.executable, "-c", probe], env=env, check=True)
    """)


def test_child_env_puts_a_worker_under_the_shim(shim, tmp_path):
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    env = _env(shim, {"LD_PRELOAD": "/lib/x86_64-linux-gnu/libc.so.6"})
    r = subprocess.run([str(SCRIPT), "run", "--stack-depth", "8", "--", shim.exe, "launcher.py"],
                       env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=pythons.HANG_S)
    assert r.returncode == 0, r
    assert r.stdout.splitlines() == [
        "['LD_PRELOAD', 'PYTHONPATH', 'SPYRESHIM_LIB', 'SPYRESHIM_STACK_DEPTH']", "True",
        "False", "True"], r.stdout


HOLD = textwrap.dedent("""\
    import simdev

    held = []

    def hold(n):
        held.append(simdev.Tensor(n))

    try:
        for _ in range(100):
            hold(8 << 20)
    except Exception as e:
        print("OOM", type(e).__name__)
    """)


def _hold(interp, tmp_path, rank, *options):
    env = _env(interp, {"RANK": str(rank), "WORLD_SIZE": "8"})
    r = subprocess.run([str(SCRIPT), "run", "--limit", "64M", "--exitcode", "0", *options, "--",
                        interp.exe, "hold.py"], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=pythons.HANG_S)
    assert r.returncode == 0 and r.stdout.startswith("OOM"), r


def test_first_oom_names_its_rank_verdict_and_site(shim, tmp_path):
    """Ranks that ran out: the one of the earliest (a trace has its time)
    named with the site that asked; one known from its `.oom` report alone
    with the report's verdict; a rank that did not run out beside them."""
    (tmp_path / "hold.py").write_text(HOLD)
    (tmp_path / "cycles.py").write_text(CYCLES)
    (tmp_path / "t").mkdir()
    _hold(shim, tmp_path, 4, "--trace", str(tmp_path / "t" / "w.trace"))
    _hold(shim, tmp_path, 5, "--report", str(tmp_path / "t" / "r.json"))
    assert _rank(shim, tmp_path, 0, "256M").returncode == 0
    files = sorted(f.name for f in (tmp_path / "t").iterdir())
    assert files == ["r.rank5.json", "r.rank5.json.oom", "w.rank0.trace", "w.rank4.trace"], files
    out = subprocess.run([str(SCRIPT), "report", "--ranks", *sorted((tmp_path / "t").iterdir())],
                         capture_output=True, text=True, timeout=pythons.HANG_S)
    assert out.returncode == 0, out
    lines = out.stdout.splitlines()
    table = lines.index("== every process ==") + 1
    rows = {ln.split("  ")[0]: ln for ln in lines[table + 1:table + 4]}
    assert sorted(rows) == ["rank 0", "rank 4", "rank 5"], out.stdout
    assert rows["rank 0"].endswith(" 0     -"), out.stdout
    assert rows["rank 5"].endswith("?, 8388608 B (8.0 MiB) asked, verdict: limit"), out.stdout
    first = lines.index(next(ln for ln in lines if ln.startswith("first OOM:")))
    assert lines[first] == "first OOM:      rank 4", out.stdout
    assert lines[first + 1].strip() == "8388608 B (8.0 MiB) asked at Tensor_new, from hold (hold.py:6)", \
        out.stdout
    # Before the table: rank 4's stacks, as its own out-of-memory report
    # gives them: the request that failed, then what was live then.
    oom = lines[1:table - 1]
    hold = "in hold %s:6 [python]" % (tmp_path / "hold.py")
    module = "in <module> %s:10 [python]" % (tmp_path / "hold.py")
    assert oom[1].startswith("== first out-of-memory: rank 4 (pid "), out.stdout
    assert oom[2] == ("Request of 8388608 B (8.0 MiB) of simdev memory that failed, "
                      "asked from:"), out.stdout
    assert " in Tensor_new " in oom[3] and oom[4:6] == ["    #1 " + hold, "    #2 " + module], \
        out.stdout
    live = oom.index("Live: 67108864 B (64.0 MiB) in 8 allocation(s) of simdev memory, "
                     "allocated from:")
    assert oom[live - 2].endswith("==spyreshim: live device memory at out-of-memory"), out.stdout
    assert " in Tensor_new " in oom[live + 1] and oom[live + 2:live + 4] == [
        "    #1 " + hold, "    #2 " + module], out.stdout
    assert "SUMMARY: spyreshim: 67108864 B (64.0 MiB) live in 8 allocation(s)." in oom, out.stdout
    # The same first in the page.
    page = tmp_path / "ranks.html"
    h = subprocess.run([str(SCRIPT), "report", "--html", page, *sorted((tmp_path / "t").iterdir())],
                       capture_output=True, text=True, timeout=pythons.HANG_S)
    assert h.returncode == 0, h
    html = page.read_text()
    at = html.index("== first out-of-memory: rank 4 (pid ")
    assert at < html.index("== every process ==") < html.index("<svg"), html
    assert html.index("Request of 8388608 B (8.0 MiB)") < html.index(
        "Live: 67108864 B (64.0 MiB)") < html.index("<svg"), html
    assert html.count(html_escape(hold)) == 2 and "<script" not in html, html

    # Rank 5 alone ran out: what was live comes from its `.oom` report
    # (the request's own stack is in a trace only).
    rep = subprocess.run([str(SCRIPT), "report", "--ranks", tmp_path / "t" / "r.rank5.json",
                          tmp_path / "t" / "r.rank5.json.oom", tmp_path / "t" / "w.rank0.trace"],
                         capture_output=True, text=True, timeout=pythons.HANG_S)
    assert rep.returncode == 0, rep
    lines = rep.stdout.splitlines()
    table = lines.index("== every process ==") + 1
    oom = lines[1:table - 1]
    assert oom[1].startswith("== first out-of-memory: rank 5 (pid "), rep.stdout
    assert oom[1].endswith(", 8388608 B (8.0 MiB) asked, verdict: limit =="), rep.stdout
    assert "Live: 67108864 B (64.0 MiB) in 8 allocation(s) of simdev memory, " \
           "allocated from:" in oom, rep.stdout
    assert "    #1 " + hold in oom and "Request of" not in rep.stdout, rep.stdout


def _synth(path, n, rank, records=None):
    sys.path.insert(0, str(REPO / "bench"))
    import trace_synth
    if records is not None:
        orig = trace_synth.rank_records
        trace_synth.rank_records = lambda r, w: records
        try:
            trace_synth.write(str(path), n, seed=rank + 1, rank=rank, world=2)
        finally:
            trace_synth.rank_records = orig
    else:
        trace_synth.write(str(path), n, seed=rank + 1, rank=rank, world=2)


def test_records_of_a_crafted_trace_are_checked(tmp_path):
    """The process and capacity records are read as the format says; one
    that breaks it is one line naming the file and the offset, status 2."""
    import struct
    _synth(tmp_path / "a.trace", 20000, 0)
    _synth(tmp_path / "b.trace", 20000, 1)
    ok = subprocess.run([str(SCRIPT), "report", tmp_path / "a.trace", tmp_path / "b.trace"],
                        capture_output=True, text=True, timeout=pythons.HANG_S)
    assert ok.returncode == 0 and "rank 1   synth  4243" in ok.stdout, ok
    assert "8.0 GiB" in ok.stdout
    words = b"rank\0x1\0host\0h\0"
    bad = struct.pack("<II", 9, len(words)) + words + b"\0" * (-len(words) % 8)
    _synth(tmp_path / "c.trace", 1000, 1, records=bad)
    r = subprocess.run([str(SCRIPT), "report", tmp_path / "a.trace", tmp_path / "c.trace"],
                       capture_output=True, text=True, timeout=pythons.HANG_S)
    assert r.returncode == 2 and r.stdout == "", r
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert "c.trace: offset " in r.stderr and "process record: rank 'x1' is not a number" \
        in r.stderr, r.stderr
    cap = struct.pack("<II", 10, 8) + struct.pack("<II", 300, 0)
    _synth(tmp_path / "d.trace", 1000, 1, records=cap)
    r = subprocess.run([str(SCRIPT), "report", tmp_path / "d.trace", tmp_path / "a.trace"],
                       capture_output=True, text=True, timeout=pythons.HANG_S)
    assert r.returncode == 2 and "device capacity record: " in r.stderr, r


def test_chrome_trace_opens_in_chromiums_reader(tmp_path):
    """Chromium's DevTools trace model (what its Performance panel loads a
    Trace Event Format file with) reads the export: a process per rank."""
    import devtools
    for r in range(3):
        _synth(tmp_path / ("w%d.trace" % r), 30000, r)
    out = tmp_path / "launch.json"
    c = subprocess.run([str(SCRIPT), "report", "--chrome-trace", out, *sorted(
        tmp_path.glob("*.trace"))], capture_output=True, text=True, timeout=pythons.HANG_S)
    assert c.returncode == 0, c
    _check_trace_event_format(json.loads(out.read_text()))
    got = devtools.read(out.read_text())
    assert got["processes"] == {"0": "rank 0", "1": "rank 1", "2": "rank 2"}, got
