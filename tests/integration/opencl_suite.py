"""PyOpenCL's own test suite, the judge of the shim's OpenCL layer: its
test files from the source distribution of the PyOpenCL that is installed
(Debian's python3-pyopencl ships none), fetched once from PyPI into the
cache and checked against PyPI's sha256, then run by /usr/bin/python3,
each test's outcome read from pytest's JUnit XML.

The outcomes without the shim are recorded in data/opencl_suite_outcomes.json,
keyed to the OpenCL platforms (PoCL's version), PyOpenCL's version, the
suite's sha256 and the files run, so that the test command runs the suite
only under the shim; where the key differs it runs it both ways.

    python3 tests/integration/opencl_suite.py --record
    python3 tests/integration/opencl_suite.py [--with-shim LIB] [FILE...]

--record runs the files (files(): SPYRESHIM_OPENCL_SUITE unset for the
recording the test command uses) without the shim and writes the
recording; otherwise it prints one line per test (`outcome id`) and the
totals. The tests (test_opencl.py) call the functions.
"""
import hashlib
import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

# The files the test command runs (files() below), in two pytest processes
# side by side, each running its files in this order: the outcomes of one
# pytest run of them all. Not pytest-xdist, whose workers take the tests in
# an order that changes from run to run, and outcomes depend on the order:
# test_array.py registers the struct type that test_algorithm.py's
# test_struct_reduce declares, under another name, so that this one fails
# when it comes after the other in a process (PyOpenCL's type registry is
# per process). So the two share one process, and the rest runs in the
# other (13% of the time on a cold kernel cache, 18% on a warm one).
DEFAULT_FILES = (("test_wrapper.py", "test_enqueue_copy.py", "test_array.py",
                  "test_algorithm.py"),
                 ("test_clmath.py", "test_clrandom.py", "test_arrays_in_structs.py"))

# The outcomes without the shim, written by --record (main below).
RECORDING = Path(__file__).resolve().parent / "data" / "opencl_suite_outcomes.json"

# pytest -v writes each test's id as it starts and its outcome as it ends:
# output is the suite's progress, so a run is killed only after this long
# without a byte (a hang), never for its total time. The same bound (as
# pythons.HANG_S) for the short children that ask PyOpenCL its versions.
QUIET_LIMIT = 900


class SuiteUnavailable(Exception):
    """The suite cannot be had here (no PyOpenCL, no network): the reason."""


def cache_dir():
    base = os.environ.get("SPYRESHIM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "spyreshim")
    return Path(base) / "pyopencl"


def installed_version(python="/usr/bin/python3"):
    r = subprocess.run([python, "-c", "import pyopencl; print(pyopencl.VERSION_TEXT)"],
                       capture_output=True, text=True, timeout=QUIET_LIMIT)
    if r.returncode != 0:
        raise SuiteUnavailable(f"{python} has no pyopencl (apt-get install python3-pyopencl): "
                               + (r.stderr.strip().splitlines() or ["?"])[-1])
    return r.stdout.strip()


def _fetch_sdist(version, dest):
    """PyPI's sdist of `version` into dest, found in the simple index (PEP
    503: the link's #sha256= is checked); its path."""
    index = "https://pypi.org/simple/pyopencl/"
    name = f"pyopencl-{version}.tar.gz"
    try:
        with urllib.request.urlopen(index, timeout=60) as f:
            page = f.read().decode("utf-8", "replace")
    except OSError as e:
        raise SuiteUnavailable(f"cannot read {index}: {e}") from None
    m = re.search(r'href="([^"#]*/' + re.escape(name) + r')#sha256=([0-9a-f]{64})"', page)
    if not m:
        raise SuiteUnavailable(f"{index} lists no {name}")
    url, want = html.unescape(m.group(1)), m.group(2)
    path = dest / name
    tmp = dest / (name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=300) as f, open(tmp, "wb") as out:
            shutil.copyfileobj(f, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise SuiteUnavailable(f"cannot download {url}: {e}") from None
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    if digest != want:
        tmp.unlink()
        raise SuiteUnavailable(f"{name}: sha256 {digest}, PyPI's index says {want}")
    tmp.rename(path)
    return path


def suite_dir(version=None):
    """The suite's folder (the sdist's test/), fetched and unpacked once."""
    version = version or installed_version()
    dest = cache_dir()
    tests = dest / f"pyopencl-{version}" / "test"
    if (tests / "test_wrapper.py").exists():
        return tests
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob(f"pyopencl-{version}.tar.gz"))
    sdist = found[0] if found else _fetch_sdist(version, dest)
    with tarfile.open(sdist) as tf:
        members = [m for m in tf.getmembers()
                   if m.name.startswith(f"pyopencl-{version}/test/") and (m.isfile() or m.isdir())
                   and ".." not in Path(m.name).parts]
        tf.extractall(dest, members=members)
    if not (tests / "test_wrapper.py").exists():
        raise SuiteUnavailable(f"{sdist} holds no test/test_wrapper.py")
    return tests


def files(tests):
    """The files to run, in groups that run side by side: DEFAULT_FILES, or
    SPYRESHIM_OPENCL_SUITE's (`all`, or names separated by commas) in one."""
    chosen = os.environ.get("SPYRESHIM_OPENCL_SUITE")
    if chosen == "all":
        groups = [sorted(p.name for p in tests.glob("test_*.py"))]
    else:
        groups = [chosen.split(",")] if chosen else DEFAULT_FILES
    return [g for g in ([f for f in group if (tests / f).exists()] for group in groups) if g]


def environment(env=None):
    """What the outcomes depend on besides the suite, asked of PyOpenCL
    itself: its version, each OpenCL platform's name, version (PoCL's
    version is in it) and devices."""
    code = ("import json, pyopencl as cl; print(json.dumps({'pyopencl': cl.VERSION_TEXT, "
            "'platforms': [[p.name, p.version, [d.name for d in p.get_devices()]] "
            "for p in cl.get_platforms()]}))")
    r = subprocess.run(["/usr/bin/python3", "-c", code], env=env, capture_output=True,
                       text=True, timeout=QUIET_LIMIT)
    if r.returncode != 0:
        raise SuiteUnavailable("/usr/bin/python3 finds no pyopencl or no OpenCL platform: "
                               + (r.stderr.strip().splitlines() or ["?"])[-1])
    return json.loads(r.stdout)


def suite_sha256(tests):
    """One sha256 over the suite folder's files, their names and contents."""
    h = hashlib.sha256()
    for f in sorted(p for p in tests.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        data = f.read_bytes()
        h.update(f"{f.relative_to(tests).as_posix()}\0{len(data)}\0".encode() + data)
    return h.hexdigest()


def key(tests, groups, here):
    """What a recording must match to stand for a run without the shim."""
    return {"pyopencl": here["pyopencl"],
            "opencl": [f"{name}: {version}" for name, version, _ in here["platforms"]],
            "suite_sha256": suite_sha256(tests), "files": [list(g) for g in groups]}


def _device_words(here):
    """(words in a test id, the same words without the machine) for each
    device: PoCL names its CPU device after the processor
    ('pthread-skylake-avx512-AMD EPYC'), which a recording must not
    depend on; PyOpenCL's ids spell a device as below (ContextFactory)."""
    return [(f"<pyopencl.Device '{d}' on '{name}'>", f"<pyopencl.Device #{j} on '{name}'>")
            for name, _, devices in here["platforms"] for j, d in enumerate(devices)]


def canonical(tid, here):
    for words, canon in _device_words(here):
        tid = tid.replace(words, canon)
    return tid


def outcomes(xml_path):
    """{node id: outcome} from pytest's JUnit XML (xunit1): passed, failed,
    error, skipped or xfailed."""
    got = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        # classname is the node id's path, dotted: the suite's files lie
        # in its top folder, so the first part is the file.
        module, *classes = case.get("classname").split(".")
        tid = "::".join([module + ".py", *classes, case.get("name")])
        outcome = "passed"
        for child in case:
            if child.tag == "failure":
                outcome = "failed"
            elif child.tag == "error":
                outcome = "error"
            elif child.tag == "skipped":
                outcome = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
        # A test that failed and then errored in teardown counts once, as
        # its worst.
        if got.get(tid) in ("failed", "error"):
            continue
        got[tid] = outcome
    return got


class Run:
    """A run of the suite: outcomes by canonical id, the worst exit status,
    each process's output in a file, seconds, and the silence a process was
    killed after (0: each ended by itself)."""

    def __init__(self, outcomes, returncode, logs, seconds, hung):
        self.outcomes, self.returncode, self.logs = outcomes, returncode, logs
        self.seconds, self.hung = seconds, hung

    def describe(self, chars=4000):
        head = (f"pytest exit {self.returncode} after {self.seconds:.0f} s"
                f"{' (killed: no output for %d s)' % self.hung if self.hung else ''}")
        return "\n".join([head] + [f"{log}:\n{log.read_text(errors='replace')[-chars:]}"
                                   for log in self.logs])


def _pytest(names, work, env, tag, quiet_limit):
    """One pytest process over `names` in work: (outcomes by node id, exit
    status, its output's file, the silence it was killed after or 0)."""
    xml = work / f"result-{tag}.xml"
    xml.unlink(missing_ok=True)
    log = work / f"pytest-{tag}.log"
    argv = ["/usr/bin/python3", "-m", "pytest", "-p", "no:cacheprovider", "-v",
            "-o", "junit_family=xunit1", f"--junitxml={xml}", *names]
    heard = [time.monotonic()]
    with open(log, "wb") as out:
        # Its own session, so that a hang is ended with whatever it started.
        p = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)

        def pump():
            while chunk := p.stdout.read1(1 << 16):
                out.write(chunk)
                heard[0] = time.monotonic()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        hung = 0
        while p.poll() is None:
            if time.monotonic() - heard[0] > quiet_limit:
                hung = quiet_limit
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                break
            time.sleep(1)
        reader.join()
    return (outcomes(xml) if xml.exists() else {}), p.returncode, log, hung


def run(tests, groups, workdir, env, here, quiet_limit=QUIET_LIMIT):
    """Runs each group of files of `tests` in its own pytest process, side
    by side, in a copy in workdir (the suite writes next to itself), with
    env; a process is killed only after quiet_limit seconds without
    output. Returns the Run."""
    work = Path(workdir)
    if not (work / "test_wrapper.py").exists():
        shutil.copytree(tests, work, dirs_exist_ok=True)
    start = time.monotonic()
    done = [None] * len(groups)

    def one(i):
        done[i] = _pytest(groups[i], work, env, i, quiet_limit)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(groups))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = {canonical(t, here): o for d in done for t, o in d[0].items()}
    return Run(got, max((d[1] for d in done), key=abs), [d[2] for d in done],
               time.monotonic() - start, max(d[3] for d in done))


def recorded(want):
    """The recorded outcomes if the recording's key is `want`, else None;
    and a line saying why not."""
    if not RECORDING.exists():
        return None, f"no recording ({RECORDING.name})"
    rec = json.loads(RECORDING.read_text())
    differ = [f"{k} recorded {rec.get(k)!r}, here {v!r}" for k, v in want.items()
              if rec.get(k) != v]
    if differ:
        return None, "; ".join(differ)
    return rec["outcomes"], "recorded"


# passed, then the outcomes that ran nothing wrong, then the rest.
def _rank(outcome):
    return 0 if outcome == "passed" else 1 if outcome in ("xfailed", "skipped") else 2


def worse(before, after):
    """The tests that did worse in `after` (missing is worse):
    (id, before, after)."""
    return [(t, was, after.get(t, "missing")) for t, was in sorted(before.items())
            if _rank(after.get(t, "missing")) > _rank(was)]


def better(before, after):
    """The tests that did better in `after`, or were not in `before`."""
    return [(t, before.get(t, "absent"), now) for t, now in sorted(after.items())
            if t not in before or _rank(now) < _rank(before[t])]


def totals(got):
    t = {}
    for v in got.values():
        t[v] = t.get(v, 0) + 1
    return t


def bare_env():
    return {k: v for k, v in os.environ.items()
            if k != "LD_PRELOAD" and not k.startswith("SPYRESHIM_")}


def record(workdir):
    """Runs the suite without the shim and writes RECORDING."""
    tests = suite_dir()
    env = bare_env()
    here = environment(env)
    groups = files(tests)
    r = run(tests, groups, workdir, env, here)
    if not r.outcomes or r.hung:
        sys.exit(f"opencl_suite: nothing to record: {r.describe()}")
    rec = {"written by": "python3 tests/integration/opencl_suite.py --record",
           **key(tests, groups, here),
           "recorded on": [d for _, _, ds in here["platforms"] for d in ds],
           "totals": totals(r.outcomes), "outcomes": dict(sorted(r.outcomes.items()))}
    RECORDING.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"{RECORDING}: {rec['totals']}, pytest exit {r.returncode}, {r.seconds:.0f} s")


def main():
    import argparse
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--record", action="store_true",
                   help=f"run without the shim and write {RECORDING.name}")
    p.add_argument("--with-shim", metavar="LIB")
    p.add_argument("--workdir", default="/tmp/spyreshim-pyopencl-suite")
    p.add_argument("files", nargs="*")
    a = p.parse_args()
    if a.record:
        return record(a.workdir)
    tests = suite_dir()
    env = dict(os.environ)
    if a.with_shim:
        env["LD_PRELOAD"] = a.with_shim
    here = environment(bare_env())
    r = run(tests, [a.files] if a.files else files(tests), a.workdir, env, here)
    for tid, o in sorted(r.outcomes.items()):
        print(o, tid)
    print(totals(r.outcomes), f"pytest exit {r.returncode}, {r.seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
