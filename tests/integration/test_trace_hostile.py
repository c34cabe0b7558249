"""Traces and reports against what users and attackers feed them (issue 26):
one writer per trace file (`%%p` is literal; a second process on the same
path writes a file of its own and says so), bounded memory on a hostile device index,
one line and exit status 2 for every bad input (a seeded fuzz of a fixed
count), names that cannot forge terminal output or break a page's script,
non-UTF-8 paths that round-trip, fork-aware views."""
import json
import os
import random
import re
import resource
import struct
import subprocess
import sys
import time
from array import array
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(HERE))
import pythons  # noqa: E402
import trace_synth  # noqa: E402
from spyreshim.reading import escape, trace as tr  # noqa: E402
from test_html_report import chromium  # noqa: E402

SCRIPT = REPO / "scripts" / "spyreshim"


def shim_env(builddir, **extra):
    env = dict(os.environ, LD_PRELOAD=str(pythons.shim_lib()), SIMDEV_MEMORY="64M",
               PYTHONPATH=str(builddir / "tests" / "simdev"))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def report(*args, limit_as=None):
    def cap():
        if limit_as:
            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))
    return subprocess.run([sys.executable, str(SCRIPT), "report"] + [str(a) for a in args],
                          capture_output=True, text=True, errors="replace", timeout=pythons.HANG_S,
                          preexec_fn=cap)


# ------------------------------------------------------------ one writer

def allocs(t):
    return sorted(t.size[i] for i in range(len(t)) if t.kind[i] == tr.ALLOC)


def test_escaped_percent_p_forked_children_never_reopen_the_parents_file(tmp_path, builddir):
    # x%%p.trace is the literal file x%p.trace; the children (no %p) record
    # nothing; the parent's file keeps every event of the parent.
    prog = ("import os, time, simdev\n"
            "keep = [simdev.Tensor(1 << 20)]\n"
            "for n in range(3):\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        b = simdev.Tensor(3 << 20); del b\n"
            "        time.sleep(0.3)\n"          # past a flush: a writer would open the file
            "        os._exit(0)\n"
            "    os.waitpid(pid, 0)\n"
            "    keep.append(simdev.Tensor((n + 2) << 20))\n")
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                       timeout=pythons.HANG_S,
                       env=shim_env(builddir, SPYRESHIM_TRACE=tmp_path / "x%%p.trace",
                                    SPYRESHIM_TRACE_FLUSH_MS=10))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x%p.trace"]
    t = tr.load(str(tmp_path / "x%p.trace"))
    assert not t.truncated
    assert allocs(t) == [1 << 20, 2 << 20, 3 << 20, 4 << 20]


def test_two_processes_on_one_path_the_second_writes_its_own_file_and_says_so(tmp_path,
                                                                            builddir):
    path = tmp_path / "same.trace"
    ready = tmp_path / "ready"
    first = ("import os, sys, time, simdev\n"
             "a = simdev.Tensor(5 << 20)\n"
             "while not os.path.exists(sys.argv[1]) or os.path.getsize(sys.argv[1]) < 32:\n"
             "    time.sleep(0.01)\n"
             "open(sys.argv[2], 'w').close()\n"
             "while not os.path.exists(sys.argv[2] + '.go'): time.sleep(0.01)\n"
             "b = simdev.Tensor(6 << 20)\n")
    second = ("import os, simdev\nprint(os.getpid())\n"
              "c = simdev.Tensor(7 << 20)\nd = simdev.Tensor(9 << 20)\n")
    env = shim_env(builddir, SPYRESHIM_TRACE=path, SPYRESHIM_TRACE_FLUSH_MS=10)
    a = subprocess.Popen([sys.executable, "-c", first, str(path), str(ready)], env=env,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + pythons.HANG_S
        while not ready.exists():
            assert a.poll() is None and time.monotonic() < deadline, "the first process stopped"
            time.sleep(0.02)
        b = subprocess.run([sys.executable, "-c", second], env=env, capture_output=True,
                           text=True, timeout=pythons.HANG_S)
        assert b.returncode == 0, b.stderr
        b_pid = int(b.stdout)
        said = [ln for ln in b.stderr.splitlines() if "SPYRESHIM_TRACE" in ln]
        assert len(said) == 1 and "being written by another process" in said[0], b.stderr
        assert said[0].endswith("writes %s" % (tmp_path / "same.2.trace")), said
        Path(str(ready) + ".go").touch()
        assert a.wait(timeout=pythons.HANG_S) == 0, a.stderr.read()
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
        a.stderr.close()
    t = tr.load(str(path))
    assert not t.truncated and t.pid == a.pid
    assert allocs(t) == [5 << 20, 6 << 20]
    t2 = tr.load(str(tmp_path / "same.2.trace"))
    assert not t2.truncated and t2.pid == b_pid
    assert allocs(t2) == [7 << 20, 9 << 20]


def test_a_fifo_or_a_long_trace_path_says_why(tmp_path, builddir):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for where, why in ((fifo, "not a regular file"), ("/dev/null", "not a regular file"),
                       (str(tmp_path / ("a" * 5000)), "longer than")):
        r = subprocess.run([sys.executable, "-c", "import simdev; a = simdev.Tensor(4096)"],
                           env=shim_env(builddir, SPYRESHIM_TRACE=where), capture_output=True,
                           text=True, timeout=pythons.HANG_S)
        assert r.returncode == 0
        said = [ln for ln in r.stderr.splitlines() if "SPYRESHIM_TRACE" in ln]
        assert len(said) == 1 and why in said[0], r.stderr


def test_run_trace_defaults_to_a_file_per_process(tmp_path, builddir):
    env = dict(os.environ, SIMDEV_MEMORY="64M", SPYRESHIM_LIB=str(pythons.shim_lib()))
    r = subprocess.run([sys.executable, str(SCRIPT), "run", "--trace", "--",
                        builddir / "tests" / "simdev_ops", "a:1M"],
                       env=env, capture_output=True, text=True, cwd=tmp_path,
                       timeout=pythons.HANG_S)
    assert r.returncode == 0, r.stderr
    files = list(tmp_path.glob("spyreshim-*.trace"))
    assert len(files) == 1 and re.fullmatch(r"spyreshim-\d+\.trace", files[0].name)
    # The process says which file it wrote, %p expanded, in one line at exit.
    n = len(tr.load(str(files[0])))
    assert r.stderr.splitlines() == ["spyreshim: trace written to %s (%d events)" % (files[0], n)], \
        r.stderr


def test_run_trace_names_the_file_a_taken_path_became(tmp_path, builddir):
    """The path is being written by another process (it holds the file's
    lock): this one writes same.2.trace, and its line at exit names that."""
    import fcntl
    env = dict(os.environ, SIMDEV_MEMORY="64M", SPYRESHIM_LIB=str(pythons.shim_lib()))
    with open(tmp_path / "same.trace", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = subprocess.run([sys.executable, str(SCRIPT), "run", "--trace", "same.trace", "--",
                            builddir / "tests" / "simdev_ops", "a:1M"],
                           env=env, capture_output=True, text=True, cwd=tmp_path,
                           timeout=pythons.HANG_S)
    assert r.returncode == 0, r.stderr
    written = tmp_path / "same.2.trace"
    lines = r.stderr.splitlines()
    assert lines[-1] == "spyreshim: trace written to %s (%d events)" % (
        written, len(tr.load(str(written)))), r.stderr
    assert len(lines) == 2 and "being written by another process" in lines[0], r.stderr
    # Set by the environment alone, the trace is written without the line.
    bare = dict(env, LD_PRELOAD=str(pythons.shim_lib()), SPYRESHIM_TRACE=str(tmp_path / "e.trace"))
    r = subprocess.run([builddir / "tests" / "simdev_ops", "a:1M"], env=bare,
                       capture_output=True, text=True, timeout=pythons.HANG_S)
    assert r.returncode == 0 and r.stderr == "" and (tmp_path / "e.trace").is_file(), r


# ------------------------------------------------------- crafted traces

def rec(tag, body):
    body += b"\0" * (-len(body) % 8)
    return struct.pack("<II", tag, len(body)) + body


def write_trace(path, events, names=("inner_fn", "outer_fn"), device=0, pid=4242, version=1,
                level=1):
    """events [(kind, dev, addr, size)] at site 1, whose native stack has one
    frame per name (innermost first); in format version 1, or 2 (columns
    compressed at zlib `level`, or not with None: bench/trace_synth.py)."""
    addrs = [0x401000 + 0x100 * i for i in range(len(names))]
    meta = rec(1, struct.pack("<IIII", 1, 1, 0, 0))
    meta += rec(2, struct.pack("<II", 1, len(addrs)) + struct.pack("<%dQ" % len(addrs), *addrs))
    meta += rec(3, struct.pack("<II", device, 0) + b"simdev\0")
    for a, fn in zip(addrs, names):
        fn = fn.encode("utf-8", "surrogateescape") if isinstance(fn, str) else fn
        meta += rec(5, struct.pack("<QiI", a, 7, 0) + fn + b"\0prog.c\0/bin/prog\0")
    ev = b"".join(struct.pack("<QQQII", addr, size | (kind << 48) | (dev << 56), (i + 1) * 1000,
                              i + 1, 1) for i, (kind, dev, addr, size) in enumerate(events))
    if version == 2:
        cols = {c: array(trace_synth.TYPECODES[c]) for c in trace_synth.COLUMNS}
        for i, (kind, dev, addr, size) in enumerate(events):
            for c, v in zip(("seq", "addr", "size", "kind", "dev", "time", "site"),
                            (i + 1, addr, size, kind, dev, (i + 1) * 1000, 1)):
                cols[c].append(v)
        data = trace_synth.header(2, pid) + trace_synth.chunk_record(2, cols, 1, meta, level)
        Path(path).write_bytes(data)
        return data
    data = struct.pack("<8sIIQQ", b"SPYTRACE", 1, pid, 0, 0)
    data += struct.pack("<IIIIQQ", 0x4B4E4843, len(events), len(meta), 0, 1, 0) + ev + meta
    Path(path).write_bytes(data)
    return data


A, F = tr.ALLOC, tr.FREE
EVENTS = [(A, 0, 0x1000, 100), (A, 0, 0x2000, 50), (F, 0, 0x2000, 50), (A, 0, 0x3000, 70),
          (F, 0, 0x1000, 100)]


def one_line_error(r, path):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert str(path) in lines[0]
    return lines[0]


def test_hostile_device_index_is_one_line_in_bounded_memory(tmp_path):
    path = tmp_path / "hostile.trace"
    write_trace(path, EVENTS, device=1728053248)
    # 1 GiB of address space: the old reader built one list per index
    # (5.7 GB after 120 s); one line naming the offset and the field now.
    r = report("--memory-viz", tmp_path / "out.pickle", path, limit_as=1 << 30)
    line = one_line_error(r, path)
    assert "offset" in line and "device index 1728053248" in line
    assert not (tmp_path / "out.pickle").exists()


def test_a_free_of_the_parents_block_is_the_freeing_process_s(tmp_path):
    # The child's file: it frees a 1 MiB block the parent allocated before
    # fork(), then holds 2 MiB of its own. Its peak is 2 MiB (was 1 MiB),
    # and the timeline draws (was a KeyError).
    path = tmp_path / "child.trace"
    write_trace(path, [(F, 0, 0x9000, 1 << 20), (A, 0, 0x1000, 1 << 20),
                       (A, 0, 0x200000, 1 << 20)])
    t = tr.load(str(path))
    assert t.foreign_frees == 1 and t.foreign_bytes == 1 << 20
    assert tr.peaks(t).bytes == 2 << 20
    r = report("--view", "stats", path)
    assert r.returncode == 0, r.stderr
    assert "2.0 MiB" in r.stdout
    r = report("--view", "timeline", "--html", tmp_path / "t.html", path)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------ fuzz

# One byte appended to the progress file (argv[4]) per case done: the test
# tells a hung case (no byte in HANG_S) from a slow run, which is no failure.
FUZZ_DRIVER = r"""
import io, json, os, random, sys, traceback
sys.path.insert(0, sys.argv[1])
from spyreshim.cli import main as cli
seeds, out = json.load(open(sys.argv[2])), sys.argv[3]
progress = open(sys.argv[4], "ab", buffering=0)
bad = []
statuses = {}
for path, argv in seeds:
    err = io.StringIO()
    old_err, old_out = sys.stderr, sys.stdout
    sys.stderr, sys.stdout = err, io.StringIO()
    try:
        rc = cli.main(["report"] + argv + [path])
    except SystemExit as e:
        rc = e.code
    except BaseException:
        rc = "raised"
        text = traceback.format_exc()[-800:]
    finally:
        sys.stderr, sys.stdout = old_err, old_out
        progress.write(b".")
    statuses[str(rc)] = statuses.get(str(rc), 0) + 1
    text = err.getvalue() if rc != "raised" else text
    if rc not in (0, 2) or "Traceback" in text or (rc == 2 and len(text.strip().splitlines()) != 1):
        bad.append([path, argv, str(rc), text[-800:]])
json.dump({"bad": bad, "statuses": statuses}, open(out, "w"))
"""

TRACE_CASES = 2400   # 800 of each base: version 1, version 2 compressed and not
REPORT_CASES = 1500


def mutate(rnd, data):
    b = bytearray(data)
    what = rnd.randrange(5)
    if what == 0:                        # truncate
        return bytes(b[:rnd.randrange(len(b))])
    if what == 1:                        # flip bytes
        for _ in range(rnd.randint(1, 8)):
            b[rnd.randrange(len(b))] = rnd.randrange(256)
    elif what == 2:                      # a huge or hostile 32-bit field
        at = rnd.randrange(len(b) - 4) & ~3
        b[at:at + 4] = struct.pack("<I", rnd.choice((0xFFFFFFFF, 0x80000000, 1728053248,
                                                     rnd.randrange(1 << 32))))
    elif what == 3:                      # duplicate a slice
        i, j = sorted(rnd.randrange(len(b)) for _ in range(2))
        b[j:j] = b[i:j]
    else:                                # insert random bytes
        at = rnd.randrange(len(b))
        b[at:at] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 40)))
    return bytes(b)


def mutate_report(rnd, obj):
    """A leak report with one value replaced by something hostile."""
    hostile = [10 ** 400, -1, 2 ** 64, "\ud800", "\udcff", None, [], {}, 1.5e308, "x" * 5000,
               "\x1b[2J", True, "", 0]
    o = json.loads(json.dumps(obj))
    targets = [(o, k) for k in list(o)]
    for g in o["groups"]:
        targets += [(g, k) for k in list(g)]
        for f in g["frames"]:
            targets += [(f, k) for k in list(f)]
    for _ in range(rnd.randint(1, 3)):
        d, k = rnd.choice(targets)
        d[k] = rnd.choice(hostile)
    text = json.dumps(o)
    if rnd.random() < 0.3:
        text = text[:rnd.randrange(len(text))]
    raw = text.encode("utf-8", "surrogatepass")
    if rnd.random() < 0.2:
        raw = raw.replace(b"prog", b"pr\xffog")
    return raw


BASE_REPORT = {
    "format": "spyreshim-report", "version": 1, "pid": 42, "exe": "/bin/prog",
    "reason": "exit", "live_bytes": 100, "live_allocations": 1,
    "suppressed_bytes": 0, "suppressed_allocations": 0,
    "groups": [{"bytes": 100, "count": 1, "runtime": "simdev", "suppressed": False,
                "frames": [{"kind": "python", "function": "f", "file": "/x/prog.py", "line": 3},
                           {"kind": "native", "function": "g", "file": "prog.c", "line": 9,
                            "object": "/bin/prog", "address": "0x1", "offset": "0x2"}]}],
}


def test_fuzz_traces_and_reports_one_line_and_status_0_or_2(tmp_path):
    rnd = random.Random(26)
    # Version 1, and version 2 compressed and not (its column table and
    # planes then lie open to the mutations).
    bases = [write_trace(tmp_path / ("base%d.trace" % i), EVENTS * 4, names=("f", "g"),
                         version=v, level=level)
             for i, (v, level) in enumerate(((1, 1), (2, 1), (2, None)))]
    views = [[], ["--view", "stats"], ["--view", "timeline", "--html", str(tmp_path / "o.html")],
             ["--memory-viz", str(tmp_path / "o.pickle")]]
    cases = []
    for i in range(TRACE_CASES):
        p = tmp_path / ("t%d.trace" % i)
        p.write_bytes(mutate(rnd, bases[i % len(bases)]))
        cases.append([str(p), rnd.choice(views)])
    for i in range(REPORT_CASES):
        p = tmp_path / ("r%d.json" % i)
        p.write_bytes(mutate_report(rnd, BASE_REPORT))
        cases.append([str(p), rnd.choice([[], ["--html", str(tmp_path / "r.html")]])])
    out, listing = tmp_path / "fuzz.json", tmp_path / "cases.json"
    listing.write_text(json.dumps(cases))
    progress, err = tmp_path / "progress", tmp_path / "driver.err"
    with open(err, "w") as err_file:
        proc = subprocess.Popen([sys.executable, "-c", FUZZ_DRIVER, str(REPO), str(listing),
                                 str(out), str(progress)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err_file,
                                preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS,
                                                                      (2 << 30, 2 << 30)))
    done, since = 0, time.monotonic()
    while proc.poll() is None:
        time.sleep(0.5)
        now = progress.stat().st_size if progress.exists() else 0
        if now != done:
            done, since = now, time.monotonic()
        elif time.monotonic() - since > pythons.HANG_S:
            proc.kill()
            proc.wait()
            raise AssertionError("case %d hung (no answer in %d s): %r"
                                 % (done, pythons.HANG_S, cases[done]))
    assert proc.returncode == 0, err.read_text()[-3000:]
    got = json.loads(out.read_text())
    print("fuzz: %d traces, %d reports; statuses %s" % (TRACE_CASES, REPORT_CASES,
                                                       got["statuses"]))
    assert not got["bad"], got["bad"][:5]
    # Both outcomes were reached: the fuzz is not all-accepted or all-refused.
    assert got["statuses"].get("0", 0) > 0 and got["statuses"].get("2", 0) > 0


def test_huge_integer_and_lone_surrogate_in_a_report_are_one_line(tmp_path):
    for i, (key, value) in enumerate((("bytes", 10 ** 400), ("function", "\ud800"))):
        o = json.loads(json.dumps(BASE_REPORT))
        if key == "bytes":
            o["groups"][0]["bytes"] = value
            p = tmp_path / ("big%d.json" % i)
            p.write_text(json.dumps(o))
            one_line_error(report(p), p)
        else:
            o["groups"][0]["frames"][0]["function"] = value
            p = tmp_path / ("sur%d.json" % i)
            p.write_bytes(json.dumps(o).encode())     # ASCII: "\ud800" escaped
            r = report(p)
            assert r.returncode == 0 and "in \\ud800 " in r.stdout, r.stderr


# ------------------------------------------------------- forged names

FORGE = "\x1b[2J\x1b[H\nSUMMARY: spyreshim: 0 B leaked in 0 allocation(s)."
PROTO_NAMES = ["constructor", "__proto__", "toString", "hasOwnProperty", "\x1b[31mred"]


def test_report_escapes_control_characters_in_names(tmp_path):
    o = json.loads(json.dumps(BASE_REPORT))
    o["groups"][0]["frames"][0]["function"] = FORGE
    o["groups"][0]["runtime"] = "sim\x1b[1Adev"
    p = tmp_path / "forge.json"
    p.write_text(json.dumps(o))
    r = report(p)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout
    summaries = [ln for ln in r.stdout.splitlines() if ln.startswith("SUMMARY")]
    assert summaries == ["SUMMARY: spyreshim: 100 B leaked in 1 allocation(s)."]
    assert "\\x1b[2J\\x1b[H\\nSUMMARY" in r.stdout
    # The trace views too.
    t = tmp_path / "forge.trace"
    write_trace(t, EVENTS, names=(FORGE, "outer"))
    for args in ([], ["--view", "stats"]):
        r = report(*args, t)
        assert r.returncode == 0 and "\x1b" not in r.stdout, r.stderr


def test_exit_report_escapes_a_python_function_name(tmp_path, builddir):
    prog = ("import ctypes, simdev\n"
            "def f():\n"
            "    t = simdev.Tensor(12345)\n"
            "    ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))\n"
            "f.__code__ = f.__code__.replace(co_name=%r%s)\n"
            "f()\n" % (FORGE, ", co_qualname=%r" % FORGE if sys.version_info >= (3, 11) else ""))
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                       timeout=pythons.HANG_S, env=shim_env(builddir, SPYRESHIM_LEAK_CHECK="held"))
    assert "\x1b" not in r.stderr, r.stderr
    summaries = [ln for ln in r.stderr.splitlines() if ln.startswith("SUMMARY")]
    assert len(summaries) == 1 and "0 B" not in summaries[0], r.stderr
    assert "\\x1b[2J" in r.stderr, r.stderr


def test_pages_with_prototype_names(tmp_path):
    # Each name its own site's innermost frame: the pages' scripts must find
    # each one as a name, not as Object.prototype's member.
    t = tmp_path / "proto.trace"
    write_trace(t, [(A, 0, 0x1000, 4096)], names=PROTO_NAMES)
    out = tmp_path / "timeline.html"
    r = report("--view", "timeline", "--html", out, t)
    assert r.returncode == 0, r.stderr
    r = chromium(tmp_path, "--dump-dom", "--virtual-time-budget=3000", out.as_uri())
    boxes = re.findall(r'<div class="b[^"]*"[^>]*>([^<]*)</div>', r.stdout.decode())
    for name in PROTO_NAMES:
        want = escape.terminal(name)
        assert want in boxes, (name, boxes)
    assert "\x1b" not in "".join(boxes)
    for args in (["--html", tmp_path / "peak.html"],):
        r = report(*args, t)
        assert r.returncode == 0, r.stderr
        dom = chromium(tmp_path, "--dump-dom", "--virtual-time-budget=2000",
                       Path(args[1]).as_uri()).stdout.decode()
        for name in PROTO_NAMES:
            assert escape.terminal(name) in dom, name
    o = json.loads(json.dumps(BASE_REPORT))
    o["groups"][0]["frames"] = [{"kind": "native", "function": n} for n in PROTO_NAMES]
    p = tmp_path / "proto.json"
    p.write_text(json.dumps(o))
    r = report("--html", tmp_path / "leaks.html", p)
    assert r.returncode == 0, r.stderr
    dom = chromium(tmp_path, "--dump-dom", "--virtual-time-budget=2000",
                   (tmp_path / "leaks.html").as_uri()).stdout.decode()
    for name in PROTO_NAMES:
        assert escape.terminal(name) in dom, name


# ----------------------------------------------------------- non-UTF-8

def test_non_utf8_path_round_trip(tmp_path, builddir):
    d = os.path.join(os.fsencode(str(tmp_path)), b"dir\xff\xfe")
    os.mkdir(d)
    script = os.path.join(d, b"leaky.py")
    with open(script, "wb") as f:
        f.write(b"import ctypes, simdev\n"
                b"def leak():\n"
                b"    t = simdev.Tensor(4242)\n"
                b"    ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))\n"
                b"leak()\n")
    rep = tmp_path / "leaks.json"
    r = subprocess.run([sys.executable, script], capture_output=True, timeout=pythons.HANG_S,
                       env=shim_env(builddir, SPYRESHIM_LEAK_CHECK="held", SPYRESHIM_REPORT=rep))
    raw = rep.read_bytes()
    raw.decode("utf-8")                          # valid UTF-8 JSON
    data = json.loads(raw)
    files = [f["file"] for g in data["groups"] for f in g["frames"] if f.get("file")]
    assert any(os.fsencode(f) == script for f in files), files     # reversible
    r = report(rep)
    assert r.returncode == 0, r.stderr
    assert "dir\\xff\\xfe/leaky.py" in r.stdout


# ----------------------------------------------------------- memory

PEAK_DRIVER = r"""
import sys
sys.path.insert(0, sys.argv[1])
from spyreshim.cli import main as cli
rc = cli.main(["report", sys.argv[2]])
sys.stdout.flush()
# VmHWM, this process's own peak: ru_maxrss would carry the pytest
# process's high-water mark across exec.
import re
sys.stderr.write("maxrss %s\n" % re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1))
sys.exit(rc)
"""


def test_reading_a_million_events_stays_in_bounded_memory(tmp_path):
    # A peak-RSS check, not a timing: the reader streams (one chunk decoded
    # at a time, memory the live set and the sites), whatever the threads'
    # chunks' interleaving (trace_synth's four threads). 29 MiB measured on
    # 1M events; the chunked reader that kept every event's columns took
    # 66 (134 with four threads), the whole-file reader 102.
    # (test_trace_stream.py checks every view.)
    sys.path.insert(0, str(REPO / "bench"))
    import trace_synth
    path = tmp_path / "1m.trace"
    trace_synth.write(str(path), 1000000)
    r = subprocess.run([sys.executable, "-c", PEAK_DRIVER, str(REPO),
                        str(path)], capture_output=True, text=True, timeout=pythons.HANG_S)
    assert r.returncode == 0, r.stderr
    kib = int(re.search(r"maxrss (\d+)", r.stderr).group(1))
    print("peak RSS reading 1M events (peak view): %d KiB" % kib)
    assert kib < 50 * 1024, kib
