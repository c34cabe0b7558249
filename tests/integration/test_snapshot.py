"""`spyreshim snapshot PID` (issue 24, item 6): a running process under the
shim with SPYRESHIM_CONTROL=1 is asked for its live allocations on its
control socket (shim/leak/control.c); the CLI writes them as a leak report
that `spyreshim report` and `report --diff` read, and the program goes on.
Processes that are not under the shim, not listening, or do not exist get
one line and status 2; bad requests on the socket get one line of error and
the target keeps serving."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pythons

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CLI = ROOT / "scripts" / "spyreshim"

# Allocates known blocks at known sites, says "ready", and sleeps until a
# line arrives on stdin; repeated once per stage. Frees everything at the
# end, so that a clean exit is status 0.
PROGRAM = '''import sys
import simdev
kept = []
def make_block(n):
    kept.append(simdev.Tensor(n))
def other_site():
    kept.append(simdev.Tensor(4096))
def churn():
    t = simdev.Tensor(777)
    del t
def leaky():
    kept.append(simdev.Tensor(8192))
stages = sys.argv[1]
for n in (1000, 2000, 3000):
    make_block(n)
other_site()
print("ready", flush=True)
sys.stdin.readline()
if stages == "2":
    for _ in range(5):
        leaky()
        churn()
    print("ready", flush=True)
    sys.stdin.readline()
make_block(5)
del kept[:]
import gc
gc.collect()   # PyPy frees the tensors only when collected
gc.collect()
print("done", flush=True)
'''


class Target:
    """The program above, running under the shim (or not)."""

    def __init__(self, tmp_path, stages="1", preload=True, control=True, interp=None):
        interp = interp or pythons.get("cpython3.11-static").require()
        script = tmp_path / "target.py"
        script.write_text(PROGRAM)
        env = pythons.module_env(interp, simdev_memory="64M")
        if preload:
            env["LD_PRELOAD"] = str(pythons.shim_lib())
            env["SPYRESHIM_LEAK_CHECK"] = "1"
            if control:
                env["SPYRESHIM_CONTROL"] = "1"
        self.proc = subprocess.Popen([interp.exe, str(script), stages], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                     text=True, cwd=str(tmp_path))
        self.pid = self.proc.pid
        self.wait_ready()

    def wait_ready(self):
        line = self.proc.stdout.readline()
        assert line == "ready\n", (line, self.proc.stderr.read() if self.proc.poll() else "")

    def go_on(self):
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def finish(self):
        self.go_on()
        out, err = self.proc.communicate(timeout=pythons.HANG_S)
        return self.proc.returncode, out, err

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def snapshot(*args, cwd=None):
    return subprocess.run([sys.executable, str(CLI), "snapshot"] + [str(a) for a in args],
                          capture_output=True, text=True, cwd=cwd, timeout=pythons.HANG_S)


def report(*args):
    return subprocess.run([sys.executable, str(CLI), "report"] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=pythons.HANG_S)


def frames(group):
    return [(f["kind"], f["function"]) for f in group["frames"] if not f.get("folded")]


def test_snapshot_of_a_sleeping_process_lists_its_blocks_and_it_goes_on(builddir, tmp_path):
    t = Target(tmp_path)
    try:
        out = tmp_path / "snap.json"
        p = snapshot(t.pid, "-o", out)
        assert p.returncode == 0, p.stderr
        assert p.stderr.count("\n") == 1 and "wrote %s: 4 live allocations" % out in p.stderr
        r = json.loads(out.read_text())
        assert r["format"] == "spyreshim-report" and r["reason"] == "snapshot"
        assert r["pid"] == t.pid
        assert r["live_allocations"] == 4 and r["live_bytes"] == 1000 + 2000 + 3000 + 4096
        groups = sorted((g["bytes"], g["count"], frames(g)) for g in r["groups"])
        assert groups == [
            (4096, 1, [("native", "Tensor_new"), ("python", "other_site"),
                       ("python", "<module>")]),
            (6000, 3, [("native", "Tensor_new"), ("python", "make_block"),
                       ("python", "<module>")]),
        ], groups
        # The default path, in the current directory.
        p = snapshot(t.pid, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        again = json.loads((tmp_path / ("spyreshim-snapshot-%d.json" % t.pid)).read_text())
        assert again["live_allocations"] == 4
        # `spyreshim report` reads it as a snapshot: live memory, not leaks.
        p = report(out)
        assert p.returncode == 0, p.stderr
        assert "live device memory in a snapshot" in p.stdout
        assert "in make_block " in p.stdout and "in other_site " in p.stdout
        rc, stdout, stderr = t.finish()
        assert rc == 0 and stdout == "done\n", stderr
        assert "leak" not in stderr
    finally:
        t.kill()


def test_snapshot_names_python_frames_on_every_interpreter(interpreter, tmp_path):
    """The control thread names the Python frames captured since the last
    resolution by taking the GIL itself (inside python_gc's lifecycle
    gate): on every interpreter, and the program goes on."""
    t = Target(tmp_path, interp=interpreter)
    try:
        out = tmp_path / "snap.json"
        p = snapshot(t.pid, "-o", out)
        assert p.returncode == 0, p.stderr
        r = json.loads(out.read_text())
        assert r["live_allocations"] == 4
        if interpreter.kind == "pypy":
            assert "PyPy" in r["python_note"]
        else:
            names = sorted(set(tuple(f for k, f in frames(g) if k == "python") for g in r["groups"]))
            assert names == [("make_block", "<module>"), ("other_site", "<module>")], names
        rc, stdout, stderr = t.finish()
        assert rc == 0 and stdout == "done\n", stderr
    finally:
        t.kill()


def test_diff_of_two_snapshots_around_a_known_leak_shows_only_it(builddir, tmp_path):
    t = Target(tmp_path, stages="2")
    try:
        a, b = tmp_path / "a.json", tmp_path / "b.json"
        assert snapshot(t.pid, "-o", a).returncode == 0
        t.go_on()
        t.wait_ready()
        p = snapshot(t.pid, "-o", b)
        assert p.returncode == 0, p.stderr
        rc, _out, stderr = t.finish()
        assert rc == 0, stderr
    finally:
        t.kill()
    p = report("--diff", a, b)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("Grew by") == 1, p.stdout
    assert "Grew by 40960 B (40.0 KiB) in 5 allocation(s)" in p.stdout
    assert "in leaky " in p.stdout
    for other in ("make_block", "other_site", "churn"):
        assert other not in p.stdout, p.stdout


def one_line_status_2(p):
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
    assert "Traceback" not in p.stderr
    return p.stderr


def test_a_process_not_under_the_shim_or_not_listening_or_gone(builddir, tmp_path):
    t = Target(tmp_path, preload=False)
    try:
        err = one_line_status_2(snapshot(t.pid))
        assert "process %d is not under the shim" % t.pid in err
        assert t.finish()[0] == 0
    finally:
        t.kill()
    t = Target(tmp_path, control=False)
    try:
        err = one_line_status_2(snapshot(t.pid))
        assert "runs under the shim but is not listening" in err
        assert "SPYRESHIM_CONTROL=1" in err
        assert t.finish()[0] == 0
    finally:
        t.kill()
    # A pid that no longer exists: the process above, reaped.
    err = one_line_status_2(snapshot(t.pid))
    assert "no process %d" % t.pid in err
    assert not list(tmp_path.glob("spyreshim-snapshot-*.json"))


def test_a_process_that_does_not_answer_times_out_and_goes_on(builddir, tmp_path):
    """Stopped (SIGSTOP), the target's kernel still accepts the connection
    but nothing answers: the command says so within its timeout, and the
    target, continued, serves the next request and exits normally."""
    import signal
    t = Target(tmp_path)
    try:
        os.kill(t.pid, signal.SIGSTOP)
        try:
            err = one_line_status_2(snapshot(t.pid, "--timeout", "1", "-o", tmp_path / "x.json"))
        finally:
            os.kill(t.pid, signal.SIGCONT)
        assert "process %d did not answer within 1 s" % t.pid in err
        assert not (tmp_path / "x.json").exists()
        p = snapshot(t.pid, "-o", tmp_path / "y.json")
        assert p.returncode == 0, p.stderr
        rc, out, err = t.finish()
        assert rc == 0 and out == "done\n", err
    finally:
        t.kill()


def test_a_forked_child_does_not_listen_and_the_parent_still_does(builddir, tmp_path):
    interp = pythons.get("cpython3.11-static").require()
    code = """import os, signal, sys, time, simdev
keep = simdev.Tensor(1000)
pid = os.fork()
if pid == 0:
    while True:
        time.sleep(1)
print(os.getpid(), pid, flush=True)
sys.stdin.readline()
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
"""
    env = pythons.module_env(interp, simdev_memory="64M")
    env.update(LD_PRELOAD=str(pythons.shim_lib()), SPYRESHIM_CONTROL="1",
               SPYRESHIM_LEAK_CHECK="1", SPYRESHIM_EXITCODE="0")
    proc = subprocess.Popen([interp.exe, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        parent, child = (int(x) for x in proc.stdout.readline().split())
        assert parent == proc.pid and child != parent
        err = one_line_status_2(snapshot(child))
        assert "process %d runs under the shim but is not listening" % child in err
        p = snapshot(parent, "-o", tmp_path / "parent.json")
        assert p.returncode == 0, p.stderr
        assert json.loads((tmp_path / "parent.json").read_text())["live_allocations"] == 1
        proc.stdin.write("\n")
        proc.stdin.flush()
        _out, err = proc.communicate(timeout=pythons.HANG_S)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def ask(pid, data, shut=False):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(pythons.HANG_S)
    s.connect("\0spyreshim-control.%d" % pid)
    if data:
        s.sendall(data)
    if shut:
        s.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
    s.close()
    return got


def test_bad_requests_get_one_line_and_the_target_keeps_serving(builddir, tmp_path):
    t = Target(tmp_path)
    try:
        assert ask(t.pid, b"dump everything\n") == b"error: unknown request (expected \"snapshot\")\n"
        assert ask(t.pid, b"x" * 5000).startswith(b"error: expected one request line (\"snapshot\") of at most")
        assert ask(t.pid, b"", shut=True).startswith(b"error: expected one request line")
        assert ask(t.pid, b"\xff\x00\n").startswith(b"error: unknown request")
        if os.geteuid() == 0:
            # Another user is refused, whatever it asks.
            code = ("import socket; s = socket.socket(socket.AF_UNIX); "
                    "s.connect('\\0spyreshim-control.%d'); s.sendall(b'snapshot\\n'); "
                    "print(s.recv(4096).decode(), end='')" % t.pid)
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               user=65534, group=65534, timeout=pythons.HANG_S)
            assert p.stdout == ("error: permission denied: only the process's own user may "
                                "ask\n"), (p.stdout, p.stderr)
        got = ask(t.pid, b"snapshot\n")
        head, _, body = got.partition(b"\n")
        assert head.startswith(b"ok spyreshim-snapshot 1 blocks=4 ")
        assert json.loads(body)["live_allocations"] == 4
        rc, out, err = t.finish()
        assert rc == 0 and out == "done\n", err
    finally:
        t.kill()


def test_collections_section_attributes_what_each_collection_freed(builddir, tmp_path):
    """The demo's reference cycles (scripts/demo_train.py) under leak
    checking: the exit report's "collections" section lists every
    collection the shim ran for a pressure event, and its sites add up to
    at least 99% of the bytes each one freed."""
    rep, stats = tmp_path / "r.json", tmp_path / "s.json"
    env = dict(os.environ, LD_PRELOAD=str(pythons.shim_lib()), SIMDEV_MEMORY="256M",
               SPYRESHIM_LEAK_CHECK="1", SPYRESHIM_REPORT=str(rep), SPYRESHIM_STATS=str(stats),
               PYTHONPATH=str(builddir / "tests" / "simdev"))
    r = pythons.run([sys.executable, ROOT / "scripts" / "demo_train.py"], env=env)
    assert r.returncode == 0, r.stderr
    c = json.loads(rep.read_text())["collections"]
    s = json.loads(stats.read_text())
    assert c["count"] == s["gc_collections"] >= 2 and c["runs_dropped"] == 0
    assert c["freed"] == s["gc_recovered_bytes"] > 0
    assert len(c["runs"]) == c["count"]
    for run in c["runs"]:
        assert run["freed"] > 0
        got = sum(x["bytes"] for x in run["sites"])
        assert got == run["attributed"] and got >= 0.99 * run["freed"], run
        assert sum(x["count"] for x in run["sites"]) == run["blocks"]
    assert c["attributed"] == sum(run["attributed"] for run in c["runs"])
    assert c["attributed"] >= 0.99 * c["freed"]
    # Over the run: the sites, largest first, with what the runs gave them.
    sites = c["sites"]
    assert [x["bytes"] for x in sites] == sorted((x["bytes"] for x in sites), reverse=True)
    for k, site in enumerate(sites):
        assert site["bytes"] == sum(x["bytes"] for run in c["runs"] for x in run["sites"]
                                    if x["site"] == k)
    top = [(f["kind"], f["function"]) for f in sites[0]["frames"] if not f.get("folded")]
    assert top[:2] == [("native", "Tensor_new"), ("python", "forward")], top
    p = report(rep)
    assert p.returncode == 0, p.stderr
    assert ("Collections run under memory pressure: %d;" % c["count"]) in p.stdout
    assert "(100.0%)" in p.stdout
    cyc = p.stdout.split("The cycles that held device memory")[1]
    assert "in Tensor_new " in cyc and "in forward " in cyc


def test_a_bad_collections_section_is_one_line(tmp_path):
    base = {"format": "spyreshim-report", "version": 1, "pid": 1, "reason": "exit",
            "groups": []}
    good = {"count": 1, "freed": 10, "attributed": 10, "blocks": 1, "cost_ns": 5,
            "cost_cpu_ns": 4, "runs_dropped": 0,
            "runs": [{"at_ns": 1, "duration_ns": 2, "cost_ns": 3, "objects": 1, "freed": 10,
                      "attributed": 10, "blocks": 1,
                      "sites": [{"site": 0, "bytes": 10, "count": 1}]}],
            "sites": [{"bytes": 10, "count": 1, "collections": 1, "runtime": "sim\x1bdev",
                       "order": "native",
                       "frames": [{"kind": "native", "function": "f\nake", "object": "/o"}]}]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(dict(base, collections=good)))
    p = report(path)
    assert p.returncode == 0, p.stderr
    assert "Collections run under memory pressure: 1;" in p.stdout
    # Names are escaped: no raw control character reaches the terminal.
    assert "\x1b" not in p.stdout and "f\\nake" in p.stdout
    for bad, field in ((dict(good, sites=[]), "runs[0].sites[0].site"),
                       (dict(good, count=-1), "count"),
                       (dict(good, runs="x"), "\"runs\"")):
        path.write_text(json.dumps(dict(base, collections=bad)))
        err = one_line_status_2(report(path))
        assert "collections" in err and field in err, err
