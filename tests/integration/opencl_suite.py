"""PyOpenCL's own test suite, the judge of the shim's OpenCL layer: its
test files from the source distribution of the PyOpenCL that is installed
(Debian's python3-pyopencl ships none), fetched once from PyPI into the
cache and checked against PyPI's sha256, then run by /usr/bin/python3 with
and without the shim, each test's outcome read from pytest's JUnit XML.

    python3 tests/integration/opencl_suite.py [--with-shim LIB] FILE...

prints one line per test (`outcome id`) and the totals; the tests
(test_opencl.py) call the functions.
"""
import hashlib
import html
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

# The files the test command runs; SPYRESHIM_OPENCL_SUITE=all runs every
# test_*.py of the distribution.
DEFAULT_FILES = ("test_wrapper.py", "test_enqueue_copy.py", "test_array.py",
                 "test_algorithm.py", "test_clmath.py", "test_clrandom.py",
                 "test_arrays_in_structs.py")


class SuiteUnavailable(Exception):
    """The suite cannot be had here (no PyOpenCL, no network): the reason."""


def cache_dir():
    base = os.environ.get("SPYRESHIM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "spyreshim")
    return Path(base) / "pyopencl"


def installed_version(python="/usr/bin/python3"):
    r = subprocess.run([python, "-c", "import pyopencl; print(pyopencl.VERSION_TEXT)"],
                       capture_output=True, text=True, timeout=120)
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
    if os.environ.get("SPYRESHIM_OPENCL_SUITE") == "all":
        return sorted(p.name for p in tests.glob("test_*.py"))
    return [f for f in DEFAULT_FILES if (tests / f).exists()]


def outcomes(xml_path):
    """{test id: outcome} from pytest's JUnit XML: passed, failed, error,
    skipped or xfailed."""
    got = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        tid = f"{case.get('classname')}::{case.get('name')}"
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


def run(tests, names, workdir, env, timeout=1500):
    """Runs the files `names` of `tests` (copied into workdir: the suite
    writes next to itself) with env; returns (outcomes, the pytest run)."""
    work = Path(workdir)
    if not (work / names[0]).exists():
        shutil.copytree(tests, work, dirs_exist_ok=True)
    xml = work / "result.xml"
    xml.unlink(missing_ok=True)
    r = subprocess.run(["/usr/bin/python3", "-m", "pytest", "-p", "no:cacheprovider", "-q",
                        "-o", "junit_family=xunit1", f"--junitxml={xml}", *names],
                       cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    if not xml.exists():
        return {}, r
    return outcomes(xml), r


GOOD = ("passed", "xfailed", "skipped")


def worse(without, with_shim):
    """The tests that did better without the shim: (id, without, with)."""
    bad = []
    for tid, was in sorted(without.items()):
        now = with_shim.get(tid, "missing")
        if was == "passed" and now != "passed":
            bad.append((tid, was, now))
        elif was in GOOD and now not in GOOD:
            bad.append((tid, was, now))
    return bad


def totals(got):
    t = {}
    for v in got.values():
        t[v] = t.get(v, 0) + 1
    return t


def main():
    import argparse
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--with-shim", metavar="LIB")
    p.add_argument("--workdir", default="/tmp/spyreshim-pyopencl-suite")
    p.add_argument("files", nargs="*")
    a = p.parse_args()
    tests = suite_dir()
    env = dict(os.environ)
    if a.with_shim:
        env["LD_PRELOAD"] = a.with_shim
    got, r = run(tests, a.files or files(tests), a.workdir, env)
    for tid, o in sorted(got.items()):
        print(o, tid)
    print(totals(got), "pytest exit", r.returncode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
