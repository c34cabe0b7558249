"""The files and descriptors the shim uses are its own: never the program's,
never lost, never clobbered (issue 47). Each case runs tests/programs/
own_files.c (or the command line) without and with the shim and compares
what the program printed, its exit status and the files it wrote; then
looks at what the shim recorded."""
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))
import pythons  # noqa: E402
from spyreshim.reading import report as rpt, trace as tr  # noqa: E402

SCRIPT = REPO / "scripts" / "spyreshim"


def program(builddir):
    return builddir / "tests" / "own_files"


def nofile_1024():
    # The soft limit many systems start programs with: the shim's high
    # descriptors are then below 1024, where a close-fds loop reaches them.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))


def run_both(builddir, ops, tmp_path, shim_env, cwd_name="run"):
    """The program with `ops` in a directory of its own, bare and under the
    shim: (bare, shimmed, bare dir, shimmed dir)."""
    out = []
    for name, extra in (("bare", {}), ("shim", shim_env)):
        d = tmp_path / name / cwd_name
        d.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, SIMDEV_MEMORY="64M")
        if extra:
            env.update(LD_PRELOAD=str(pythons.shim_lib()), **{k: str(v) for k, v in extra.items()})
        r = subprocess.run([str(program(builddir))] + ops, env=env, cwd=d, capture_output=True,
                           text=True, timeout=pythons.HANG_S, preexec_fn=nofile_1024)
        out.append((r, d))
    (bare, bd), (shim, sd) = out
    return bare, shim, bd, sd


def allocs(t):
    return sum(1 for i in range(len(t)) if t.kind[i] == tr.ALLOC)


def files_of(d):
    return {p.name: p.read_bytes() for p in d.iterdir() if not p.name.endswith(".trace")}


# ------------------------------------------------- the program's descriptors

def test_a_program_that_closes_its_descriptors_keeps_its_files_and_the_trace_every_event(
        tmp_path, builddir):
    # 100 allocations flushed, then the program closes 3..1023 (the trace's
    # descriptor with them) and opens its own file 1000 times (every number
    # up to 1002, the trace's old one among them), writes one line, makes
    # 200 more buffers, waits past a flush. Its file holds its line alone
    # (it got the trace's chunks), the descriptor numbers it got are those
    # of the bare run, and the trace has all 300 allocations (it had 100).
    ops = ["open:first.txt", "a:100:4096", "sleep:200", "closefds", "open:mine.txt:1000",
           "write:the program's line", "a:200:4096", "sleep:200", "close"]
    bare, shim, bd, sd = run_both(builddir, ops, tmp_path,
                                  {"SPYRESHIM_TRACE": tmp_path / "shim" / "t.trace",
                                   "SPYRESHIM_TRACE_FLUSH_MS": 20})
    assert bare.returncode == 0, bare.stdout
    assert (shim.returncode, shim.stdout) == (0, bare.stdout), shim.stderr
    assert "opened fd 3..1002" in bare.stdout
    assert files_of(sd) == files_of(bd) == {"first.txt": b"",
                                            "mine.txt": b"the program's line\n"}
    assert shim.stderr == "", shim.stderr
    t = tr.load(str(tmp_path / "shim" / "t.trace"))
    assert not t.truncated and allocs(t) == 300 and t.ended


def test_a_trace_the_program_closed_and_moved_stops_with_one_line(tmp_path, builddir):
    # The program closes the trace's descriptor and moves the file away:
    # the path names no trace of ours, so recording stops, said in one
    # line; the moved file reads whole up to its last flush.
    trace = tmp_path / "shim" / "t.trace"
    ops = ["a:100:4096", "sleep:200", "closefds", "mv:%s:%s" % (trace, tmp_path / "moved"),
           "a:5:4096", "sleep:200"]
    bare, shim, bd, sd = run_both(builddir, ops, tmp_path,
                                  {"SPYRESHIM_TRACE": trace, "SPYRESHIM_TRACE_FLUSH_MS": 20})
    assert bare.returncode == 1 and "rename failed" in bare.stdout   # bare: no trace to move
    assert shim.returncode == 0 and shim.stdout.endswith("moved\nallocated 5, 105 kept\n")
    said = shim.stderr.splitlines()
    assert len(said) == 1 and "closed the trace's descriptor" in said[0], shim.stderr
    assert "recording stops" in said[0]
    t = tr.load(str(tmp_path / "moved"))
    assert allocs(t) == 100 and not t.truncated and t.ended is False   # it says it stopped


def test_the_program_s_descriptor_numbers_are_its_own_under_control(tmp_path, builddir):
    # The control thread waits for clients in poll(), not in a blocking
    # accept(), which held the lowest free number for its next connection:
    # the program's first file was number 4 (3 bare). Its socket sits high.
    ops = ["a:5:4096", "open:f.txt", "write:x", "a:5:4096", "close"]
    bare, shim, bd, sd = run_both(builddir, ops, tmp_path, {"SPYRESHIM_CONTROL": 1})
    assert "opened fd 3..3" in bare.stdout
    assert (shim.returncode, shim.stdout) == (bare.returncode, bare.stdout), shim.stderr
    assert files_of(sd) == files_of(bd)


def snapshot_until_answered(pid, cwd):
    """`spyreshim snapshot PID` until it is answered (the control thread
    makes its socket again within a second of the program closing it)."""
    deadline = time.monotonic() + pythons.HANG_S
    while True:
        r = subprocess.run([sys.executable, str(SCRIPT), "snapshot", str(pid)], cwd=cwd,
                           capture_output=True, text=True, timeout=pythons.HANG_S)
        if r.returncode == 0 or time.monotonic() > deadline:
            return r
        time.sleep(0.2)


def serve_clients(builddir, tmp_path, name, control):
    """The server: closes 3..1023, listens on its own socket, serves two
    clients; under `spyreshim run --control` a snapshot is taken before
    the clients come. Its output, exit status and the answers."""
    d = tmp_path / name
    d.mkdir()
    sock = d / "server.sock"
    cmd = [str(program(builddir)), "a:3:4096", "closefds", "listen:" + str(sock), "serve:2"]
    env = dict(os.environ, SIMDEV_MEMORY="64M", SPYRESHIM_LIB=str(pythons.shim_lib()))
    if control:
        cmd = [sys.executable, str(SCRIPT), "run", "--control", "--"] + cmd
    p = subprocess.Popen(cmd, env=env, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=nofile_1024)
    answers = []
    try:
        lines = [p.stdout.readline() for _ in range(3)]
        assert lines[-1].startswith("listening on fd"), (lines, p.poll())
        if control:
            r = snapshot_until_answered(p.pid, d)   # `run` execs the program: its pid
            assert r.returncode == 0, r.stderr
            assert "3 live allocations" in r.stderr, r.stderr
        for k in range(2):
            c = socket.socket(socket.AF_UNIX)
            c.settimeout(60)
            c.connect(str(sock))
            c.sendall(b"client %d\n" % k)
            answers.append(c.recv(100))
            c.close()
        out, err = p.communicate(timeout=pythons.HANG_S)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return p.returncode, "".join(lines) + out, answers, err


def test_a_server_that_closes_its_descriptors_gets_every_client_under_control(tmp_path,
                                                                                builddir):
    # It listens on the number the control socket had; after a snapshot the
    # control thread accepted its clients ("error: permission denied") and
    # the server waited for ever. Now it serves both, as bare.
    bare = serve_clients(builddir, tmp_path, "bare", control=False)
    shim = serve_clients(builddir, tmp_path, "shim", control=True)
    assert bare[:3] == (0, "allocated 3, 3 kept\nclosed 3..1023\nlistening on fd 3\n"
                           "served client 0\nserved client 1\n",
                        [b"echo client 0\n", b"echo client 1\n"]), bare
    assert shim[:3] == bare[:3], shim


# ---------------------------------------------------------------- exec

def test_an_exec_d_image_writes_its_own_trace_and_leaves_the_first_whole(tmp_path, builddir):
    # 50 buffers, then execv (same pid, so the same %p name): the exec'd
    # image truncated the file (3 allocations left of 53). Now the first
    # image's file keeps its 50 and the exec'd one writes t.PID.2.trace,
    # said in one line.
    ops = ["a:50:4096", "sleep:100", "exec", "a:3:4096", "sleep:100"]
    bare, shim, bd, sd = run_both(builddir, ops, tmp_path,
                                  {"SPYRESHIM_TRACE": tmp_path / "shim" / "t.%p.trace",
                                   "SPYRESHIM_TRACE_FLUSH_MS": 20})
    assert bare.returncode == 0 and bare.stdout == "allocated 50, 50 kept\nallocated 3, 3 kept\n"
    assert (shim.returncode, shim.stdout) == (0, bare.stdout), shim.stderr
    first = list((tmp_path / "shim").glob("t.*.trace"))
    pid = min(int(p.name.split(".")[1]) for p in first)
    assert sorted(p.name for p in first) == ["t.%d.2.trace" % pid, "t.%d.trace" % pid]
    said = shim.stderr.splitlines()
    assert len(said) == 1 and "from before it exec'd" in said[0], shim.stderr
    assert said[0].endswith("writes %s" % (tmp_path / "shim" / ("t.%d.2.trace" % pid)))
    a = tr.load(str(tmp_path / "shim" / ("t.%d.trace" % pid)))
    b = tr.load(str(tmp_path / "shim" / ("t.%d.2.trace" % pid)))
    assert (allocs(a), allocs(b)) == (50, 3)
    assert a.pid == b.pid == pid and not a.truncated and not b.truncated
    assert (a.ended, b.ended) == (False, True)   # the first image never reached an exit


def test_a_trace_of_an_old_process_with_the_same_pid_is_replaced(tmp_path, builddir):
    # A file left by an earlier process that had this pid (containers
    # number their processes alike on every run) began before this process
    # did: it is replaced, as any old trace is, not kept beside a new name.
    # The same header begun now is an earlier image's: kept.
    path = tmp_path / "t.trace"
    for begun, kept in (("1", False), ("time.time_ns()", True)):
        for p in tmp_path.glob("t*.trace"):
            p.unlink()
        launcher = ("import os, struct, sys, time\n"
                    "open(sys.argv[1], 'wb').write(struct.pack('<8sIIQQ', b'SPYTRACE', 2, "
                    "os.getpid(), %s, 0))\n"
                    "os.execv(sys.argv[2], sys.argv[2:])\n" % begun)
        env = dict(os.environ, SIMDEV_MEMORY="64M", LD_PRELOAD=str(pythons.shim_lib()),
                   SPYRESHIM_TRACE=str(path))
        r = subprocess.run([sys.executable, "-c", launcher, str(path), str(program(builddir)),
                            "a:2:4096"], env=env, capture_output=True, text=True, timeout=pythons.HANG_S)
        assert r.returncode == 0, r.stderr
        if kept:
            assert path.stat().st_size == 32 and "from before it exec'd" in r.stderr
            assert allocs(tr.load(str(tmp_path / "t.2.trace"))) == 2
        else:
            assert r.stderr == "" and not (tmp_path / "t.2.trace").exists()
            assert allocs(tr.load(str(path))) == 2


# ---------------------------------------------------------------- chdir

def test_relative_paths_are_resolved_where_the_shim_was_loaded(tmp_path, builddir):
    # SPYRESHIM_TRACE, _REPORT and _STATS relative: the program chdir()s
    # after its first buffers and before the trace's first flush; every
    # file is where the process started (before: in the directory it went
    # to), a `%` in that directory's name being its own (not an escape).
    ops = ["a:10:4096", "chdir:sub", "a:5:4096", "sleep:100"]
    for name in ("bare", "shim"):
        (tmp_path / name / "run%p").mkdir(parents=True)
        (tmp_path / name / "run%p" / "sub").mkdir()
    bare, shim, bd, sd = run_both(builddir, ops, tmp_path,
                                  {"SPYRESHIM_TRACE": "t.trace", "SPYRESHIM_REPORT": "r.json",
                                   "SPYRESHIM_STATS": "s.json", "SPYRESHIM_LEAK_CHECK": 1,
                                   "SPYRESHIM_EXITCODE": 0, "SPYRESHIM_TRACE_FLUSH_MS": 1000},
                                  cwd_name="run%p")
    assert bare.returncode == 0 and bare.stdout.endswith("in sub\nallocated 5, 15 kept\n")
    assert (shim.returncode, shim.stdout) == (0, bare.stdout), shim.stderr
    assert sorted(p.name for p in sd.iterdir()) == ["r.json", "s.json", "sub", "t.trace"]
    assert list((sd / "sub").iterdir()) == []
    assert allocs(tr.load(str(sd / "t.trace"))) == 15
    assert json.loads((sd / "r.json").read_text())["live_allocations"] == 15
    assert json.loads((sd / "s.json").read_text())["allocs"] == 15


# ------------------------------------------------- two runs, one path

def test_two_runs_given_one_report_path_replace_it_whole_and_say_so(tmp_path, builddir):
    # A starts, B runs to its end and writes same.json, then A ends: its
    # report replaces B's whole (written aside and renamed), and A says in
    # one line that it replaced another process's. B, replacing nothing
    # newer than itself, says nothing.
    env = dict(os.environ, SIMDEV_MEMORY="64M", LD_PRELOAD=str(pythons.shim_lib()),
               SPYRESHIM_LEAK_CHECK="1", SPYRESHIM_EXITCODE="0",
               SPYRESHIM_REPORT=str(tmp_path / "same.json"))
    go = tmp_path / "go"
    a = subprocess.Popen([str(program(builddir)), "a:2:4096", "wait:" + str(go)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert a.stdout.readline() == "allocated 2, 2 kept\n"
        b = subprocess.run([str(program(builddir)), "a:3:4096"], env=env, capture_output=True,
                           text=True, timeout=pythons.HANG_S)
        assert (b.returncode, b.stdout) == (0, "allocated 3, 3 kept\n")
        assert "SPYRESHIM_REPORT" not in b.stderr, b.stderr
        assert json.loads((tmp_path / "same.json").read_text())["live_allocations"] == 3
        go.touch()
        out, err = a.communicate(timeout=pythons.HANG_S)
    finally:
        if a.poll() is None:
            a.kill()
            a.communicate()
    assert (a.returncode, out) == (0, "waited\n")
    said = [ln for ln in err.splitlines() if "SPYRESHIM_REPORT" in ln]
    assert len(said) == 1 and "written by another process since this one started" in said[0], err
    assert "pid %d" % a.pid in said[0]
    assert json.loads((tmp_path / "same.json").read_text())["live_allocations"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["go", "same.json"]


# ------------------------------------------------- a full or read-only disk

def mount_tmpfs(where, opts):
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pythons.need("mount", "cannot mount a tmpfs here (root only): " + r.stderr.strip())


def test_a_full_disk_or_a_read_only_one_is_one_line_and_the_program_runs_on(tmp_path, builddir):
    # 16 KiB of tmpfs holds the first flush's 8192 events, not the 40000:
    # one line saying where the trace ends, the file cut back to its last
    # whole record (read whole, not truncated), the program's output and
    # status those of the bare run. A read-only mount: one line, no trace.
    full, ro = tmp_path / "full", tmp_path / "ro"
    mount_tmpfs(full, "size=16k")
    try:
        mount_tmpfs(ro, "ro")
        try:
            ops = ["a:20000:64", "sleep:100", "a:20000:64"]
            bare, shim, _, _ = run_both(builddir, ops, tmp_path,
                                        {"SPYRESHIM_TRACE": full / "t.trace",
                                         "SPYRESHIM_TRACE_FLUSH_MS": 20})
            assert (shim.returncode, shim.stdout) == (bare.returncode, bare.stdout) == (
                0, "allocated 20000, 20000 kept\nallocated 20000, 40000 kept\n")
            said = shim.stderr.splitlines()
            assert len(said) == 1 and "No space left on device; recording stops" in said[0]
            t = tr.load(str(full / "t.trace"))
            assert not t.truncated and 0 < len(t) < 40000 and t.ended is False
            assert "the trace ends after %d events (%d bytes)" % (
                len(t), (full / "t.trace").stat().st_size) in said[0], said
            bare, shim, _, _ = run_both(builddir, ["a:2:64"], tmp_path,
                                        {"SPYRESHIM_TRACE": ro / "t.trace"}, cwd_name="ro")
            assert (shim.returncode, shim.stdout) == (bare.returncode, bare.stdout)
            assert shim.stderr == ("spyreshim: SPYRESHIM_TRACE: cannot write %s: Read-only file "
                                   "system; no trace recorded\n" % (ro / "t.trace"))
        finally:
            subprocess.run(["umount", str(ro)])
    finally:
        subprocess.run(["umount", str(full)])


# ------------------------------------------------- a process killed

def flushed(path, n):
    """The trace at path holds n allocations and the name of their frame in
    main (it may be half written)."""
    try:
        t = tr.load(str(path))
    except (OSError, rpt.ReportError):
        return False
    return allocs(t) == n and named_main(t)


def named_main(t):
    return any(sym[0] == "main" for sym in t.symbols.values())


def test_the_report_of_a_killed_process_s_trace_says_so_first(tmp_path, builddir):
    # SIGKILL after a flush: the trace reads (what was flushed, with the
    # names of its frames: written with the flush, not at an exit it never
    # reached), and the report's first line says the file ends before its
    # process's exit; the same program run to its end gets no such line.
    env = dict(os.environ, SIMDEV_MEMORY="64M", LD_PRELOAD=str(pythons.shim_lib()),
               SPYRESHIM_TRACE_FLUSH_MS="20")
    killed, ended = tmp_path / "killed.trace", tmp_path / "ended.trace"
    p = subprocess.Popen([str(program(builddir)), "a:5:4096", "wait:" + str(tmp_path / "never")],
                         env=dict(env, SPYRESHIM_TRACE=str(killed)), stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"allocated 5, 5 kept\n"
        deadline = time.monotonic() + pythons.HANG_S
        while not flushed(killed, 5):
            assert time.monotonic() < deadline, "no flush"
            time.sleep(0.02)
    finally:
        p.kill()
        p.communicate()
    assert p.returncode == -signal.SIGKILL
    r = subprocess.run([str(program(builddir)), "a:5:4096"],
                       env=dict(env, SPYRESHIM_TRACE=str(ended)), capture_output=True, timeout=pythons.HANG_S)
    assert r.returncode == 0
    for path, says in ((killed, True), (ended, False)):
        rep = subprocess.run([sys.executable, str(SCRIPT), "report", str(path)],
                             capture_output=True, text=True, timeout=pythons.HANG_S)
        assert rep.returncode == 0, rep.stderr
        first = rep.stderr.splitlines()[:1]
        assert first == (["spyreshim report: %s ends before its process's exit (killed, _exit, "
                          "exec, or recording stopped); reading what was flushed, with the "
                          "names written by its last flush" % path] if says else []), rep.stderr
        assert "20.0 KiB" in rep.stdout
        assert " in main " in rep.stdout, rep.stdout


# ------------------------------------------------- SIGTERM

def signalled(builddir, ops, cwd, env, signals):
    """Runs the program with `ops`; after each "waiting" line it prints,
    sends the next of `signals`. (exit status, output)."""
    p = subprocess.Popen([str(program(builddir))] + ops, env=env, cwd=cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = []
    try:
        todo = list(signals)
        while todo:
            line = p.stdout.readline()
            if not line:
                break
            out.append(line)
            if line == "waiting\n":
                p.send_signal(todo.pop(0))
        rest, err = p.communicate(timeout=pythons.HANG_S)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return p.returncode, "".join(out) + rest, err


def both_signalled(builddir, ops, tmp_path, signals, trace_env=None):
    env = dict(os.environ, SIMDEV_MEMORY="64M")
    trace = tmp_path / "t.trace"
    shim_env = dict(env, LD_PRELOAD=str(pythons.shim_lib()), SPYRESHIM_TRACE=str(trace),
                    **(trace_env or {}))
    bare = signalled(builddir, ops, tmp_path, env, signals)
    shim = signalled(builddir, ops, tmp_path, shim_env, signals)
    return bare, shim, trace


def test_sigterm_s_default_action_ends_the_process_as_bare_and_the_trace_has_every_event(
        tmp_path, builddir):
    # 50 buffers, then SIGTERM (how `timeout`, CI limits, Slurm and
    # Kubernetes end a job) before the first flush (a second away): the
    # process ends by SIGTERM both ways (the parent sees signal 15: 143
    # from a shell), the program sees SIG_DFL, and the trace holds the 50
    # allocations and their names, flushed by the shim's handler, with a
    # state record the report's first line reads.
    ops = ["a:50:4096", "query", "waitsig"]
    bare, shim, trace = both_signalled(builddir, ops, tmp_path, [signal.SIGTERM])
    assert bare[:2] == (-signal.SIGTERM, "allocated 50, 50 kept\nquery: SIGTERM SIG_DFL flags 0 "
                                         "mask 0 restorer none\nwaiting\n"), bare
    assert shim[:2] == bare[:2] and shim[2] == "", shim
    t = tr.load(str(trace))
    assert allocs(t) == 50 and not t.truncated and named_main(t)
    assert (t.ended, t.signal) == (False, signal.SIGTERM)
    rep = subprocess.run([sys.executable, str(SCRIPT), "report", str(trace)],
                         capture_output=True, text=True, timeout=pythons.HANG_S)
    assert rep.returncode == 0, rep.stderr
    assert rep.stderr.splitlines()[0] == (
        "spyreshim report: %s ends where its process was ended by signal 15 (SIGTERM); "
        "reading what was flushed then" % trace), rep.stderr
    assert "200.0 KiB" in rep.stdout and " in main " in rep.stdout, rep.stdout
    # From a shell: 143 both ways.
    codes = []
    for env in (dict(os.environ, SIMDEV_MEMORY="64M"),
                dict(os.environ, SIMDEV_MEMORY="64M", LD_PRELOAD=str(pythons.shim_lib()),
                     SPYRESHIM_TRACE=str(tmp_path / "sh.trace"))):
        r = subprocess.run(["sh", "-c", '"$0" a:1:64 waitsig & sleep 0.3; kill -TERM $!; '
                            'wait $!; echo "status $?"', str(program(builddir))],
                           env=env, capture_output=True, text=True, timeout=pythons.HANG_S)
        codes.append(r.stdout.splitlines()[-1])
    assert codes == ["status 143", "status 143"], codes


def test_a_program_s_own_sigterm_handlers_run_as_bare_and_see_what_they_set(tmp_path,
                                                                           builddir):
    # The program's dispositions, asked for by sigaction and signal(), are
    # its own both ways (handler, flags, mask, restorer): an SA_SIGINFO |
    # SA_RESETHAND handler gets its signal, sees SIG_DFL inside (the reset)
    # and returns; then 50 buffers and a handler that prints and _exit(7)s:
    # output and status (7) those of the bare run, and the 50 allocations
    # (made after the first SIGTERM, ended by _exit with no destructor,
    # within the flush interval) are in the trace: flushed before the
    # program's handler ran.
    ops = ["query", "term:once", "query", "waitsig", "query", "a:50:4096", "term:exit7",
           "query", "term:signal", "query", "waitsig"]
    bare, shim, trace = both_signalled(builddir, ops, tmp_path, [signal.SIGTERM] * 2)
    assert bare[0] == 7 and bare[1].endswith("waiting\nhandler: SIGTERM, exiting 7\n"), bare
    assert "inside: SIGTERM SIG_DFL flags 0x84000004" in bare[1]
    assert shim[:2] == bare[:2] and shim[2] == "", shim
    t = tr.load(str(trace))
    assert allocs(t) == 50 and not t.truncated and named_main(t)
    assert (t.ended, t.signal) == (False, None)   # the handler's _exit: no exit reached


def test_a_program_that_takes_sigterm_by_sigwait_gets_it_as_bare(tmp_path, builddir):
    # SIGTERM blocked and taken by sigwait: no handler runs, the program
    # gets it (as bare), goes on and exits; its trace ends at that exit.
    ops = ["a:5:4096", "sigwait", "a:5:4096", "query"]
    bare, shim, trace = both_signalled(builddir, ops, tmp_path, [signal.SIGTERM])
    assert bare[:2] == (0, "allocated 5, 5 kept\nwaiting\nsigwait got 15\nallocated 5, 10 kept\n"
                           "query: SIGTERM SIG_DFL flags 0 mask 0 restorer none\n"), bare
    assert shim[:2] == bare[:2] and shim[2] == "", shim
    t = tr.load(str(trace))
    assert allocs(t) == 10 and t.ended and t.signal is None


def test_a_fork_child_ended_by_sigterm_ends_as_bare_with_its_own_trace_flushed(tmp_path,
                                                                               builddir):
    # The child inherits the handler and the program's disposition; with
    # %p it records its own file: SIGTERM to the child flushes the child's
    # 20 allocations (before its first flush), and it ends by SIGTERM as
    # bare, its parent seeing signal 15.
    out = {}
    for name in ("bare", "shim"):
        d = tmp_path / name
        d.mkdir()
        env = dict(os.environ, SIMDEV_MEMORY="64M")
        if name == "shim":
            env.update(LD_PRELOAD=str(pythons.shim_lib()), SPYRESHIM_TRACE=str(d / "t.%p.trace"))
        p = subprocess.Popen([str(program(builddir)), "a:3:4096", "fork", "a:20:4096", "query",
                              "waitsig"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        # The parent's "forked PID" and the child's "waiting" come in
        # either order: the child is signalled once both are read.
        lines, child, waiting = [], None, False
        try:
            for line in p.stdout:
                if line.startswith("forked "):
                    child = int(line.split()[1])
                    line = "forked CHILD\n"
                lines.append(line)
                waiting = waiting or line == "waiting\n"
                if child is not None and waiting:
                    os.kill(child, signal.SIGTERM)
                    waiting = False
            _, err = p.communicate(timeout=pythons.HANG_S)
        finally:
            if p.poll() is None:
                for pid in (child, p.pid):   # the child holds the pipes too
                    if pid is not None:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                p.communicate(timeout=pythons.HANG_S)
        out[name] = (p.returncode, "".join(sorted(lines)), err, child)
    assert out["bare"][:2] == (0, "".join(sorted([
        "allocated 3, 3 kept\n", "forked CHILD\n", "allocated 20, 23 kept\n",
        "query: SIGTERM SIG_DFL flags 0 mask 0 restorer none\n", "waiting\n",
        "child ended by signal 15\n"]))), out["bare"]
    assert out["shim"][:3] == out["bare"][:2] + ("",), out["shim"]
    t = tr.load(str(tmp_path / "shim" / ("t.%d.trace" % out["shim"][3])))
    assert allocs(t) == 20 and (t.ended, t.signal) == (False, signal.SIGTERM)


def test_an_exec_d_image_starts_from_sig_dfl_and_sigterm_ends_it_as_bare(tmp_path, builddir):
    # A handler set, then exec: the kernel puts SIG_DFL back for the new
    # image, which sees SIG_DFL both ways; SIGTERM ends it by SIGTERM, its
    # 5 allocations flushed.
    ops = ["term:exit7", "exec", "query", "a:5:4096", "waitsig"]
    bare, shim, trace = both_signalled(builddir, ops, tmp_path, [signal.SIGTERM])
    assert bare[:2] == (-signal.SIGTERM, "set exit7, was SIG_DFL\nquery: SIGTERM SIG_DFL flags 0 "
                        "mask 0 restorer none\nallocated 5, 5 kept\nwaiting\n"), bare
    assert shim[:2] == bare[:2] and shim[2] == "", shim
    t = tr.load(str(trace))
    assert allocs(t) == 5 and t.signal == signal.SIGTERM


def test_sigterm_taken_by_another_thread_ends_the_process_as_bare(tmp_path, builddir):
    # The main thread blocks SIGTERM; a second thread takes it: the
    # shim's handler runs there, flushes, and the default action ends the
    # process (signal 15 both ways) with its 30 allocations in the trace.
    ops = ["a:30:4096", "threadwait"]
    bare, shim, trace = both_signalled(builddir, ops, tmp_path, [signal.SIGTERM])
    assert bare[:2] == (-signal.SIGTERM, "allocated 30, 30 kept\nwaiting\n"), bare
    assert shim[:2] == bare[:2] and shim[2] == "", shim
    t = tr.load(str(trace))
    assert allocs(t) == 30 and t.signal == signal.SIGTERM


# ------------------------------------------------- two runs, one trace path

def test_two_runs_started_together_on_one_trace_path_each_get_a_file(tmp_path, builddir):
    # Both record their first event, then wait for each other; A ends,
    # then B. The path is claimed at the first event: the one that came
    # second writes same.2.trace, said in one line (before, each opened
    # the file at its first flush, here at its exit: B replaced A's whole
    # trace, one file was left).
    env = dict(os.environ, SIMDEV_MEMORY="64M", LD_PRELOAD=str(pythons.shim_lib()),
               SPYRESHIM_TRACE=str(tmp_path / "same.trace"))
    r = lambda n: str(tmp_path / (n + ".ready"))   # noqa: E731
    a = subprocess.Popen([str(program(builddir)), "a:2:4096", "touch:" + r("a"),
                          "wait:" + r("b")], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    b = subprocess.Popen([str(program(builddir)), "a:3:4096", "touch:" + r("b"),
                          "wait:" + r("a"), "wait:" + r("a-ended")], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out_a, err_a = a.communicate(timeout=pythons.HANG_S)
        Path(r("a-ended")).touch()
        out_b, err_b = b.communicate(timeout=pythons.HANG_S)
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert (a.returncode, out_a) == (0, "allocated 2, 2 kept\nwaited\n")
    assert (b.returncode, out_b) == (0, "allocated 3, 3 kept\nwaited\nwaited\n")
    said = (err_a + err_b).splitlines()
    assert len(said) == 1 and "is being written by another process" in said[0], said
    second = a if said[0] in err_a.splitlines() else b
    assert said[0].endswith("this process (pid %d) writes %s" % (
        second.pid, tmp_path / "same.2.trace")), said
    names = sorted(p.name for p in tmp_path.glob("*.trace"))
    assert names == ["same.2.trace", "same.trace"], names
    got = {}
    for name in names:
        t = tr.load(str(tmp_path / name))
        assert t.ended and not t.truncated
        got[t.pid] = (name, allocs(t))
    first = b if second is a else a
    assert got == {first.pid: ("same.trace", 2 if first is a else 3),
                   second.pid: ("same.2.trace", 2 if second is a else 3)}, got


# ------------------------------------------------- Python names of a killed process

PY_KILLED = '''import time, simdev
keep = []
def model():
    keep.append(simdev.Tensor(1000, release_gil=False))
def layer():
    model()
layer()
print("ready", flush=True)
while True:
    time.sleep(0.01)
'''


def test_a_killed_python_program_s_trace_names_its_python_frames(tmp_path, builddir):
    # A Python stack captured with the GIL is resolved by the interpreter's
    # main thread when the writer asks (a pending call), and the next
    # flush writes it: SIGKILL then leaves the trace with its Python frames
    # named (before, names came only at an exit it never reached).
    interp = pythons.get("cpython3.11-shared").require()
    script = tmp_path / "s.py"
    script.write_text(PY_KILLED)
    trace = tmp_path / "py.trace"
    env = pythons.module_env(interp, env=None, simdev_memory="64M", simdev=True)
    env.update(LD_PRELOAD=str(pythons.shim_lib()), SPYRESHIM_TRACE=str(trace),
               SPYRESHIM_TRACE_FLUSH_MS="20")
    p = subprocess.Popen([interp.exe, str(script)], env=env, stdout=subprocess.PIPE, text=True)

    def functions():
        try:
            t = tr.load(str(trace))
        except (OSError, rpt.ReportError):
            return set()
        return {f[0] for frames in t.pystacks.values() for f in frames}

    try:
        assert p.stdout.readline() == "ready\n"
        deadline = time.monotonic() + pythons.HANG_S
        while not {"model", "layer", "<module>"} <= functions():
            assert time.monotonic() < deadline, functions()
            time.sleep(0.02)
    finally:
        p.kill()
        p.communicate()
    t = tr.load(str(trace))
    assert t.ended is False and allocs(t) == 1
