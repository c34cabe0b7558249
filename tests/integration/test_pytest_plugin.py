"""The pytest plugin (spyreshim.pytest_plugin) and the Python API under it,
each run in a child process: pytest in pytest, with and without the shim
preloaded (through `spyreshim run`).

The device is simdev: `simdev.Tensor(n)` allocates n bytes of device memory
and frees them when the object dies.
"""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPT = REPO / "scripts" / "spyreshim"
PKG = REPO
sys.path.insert(0, str(HERE))
import pythons  # noqa: E402

# Debian's interpreter: the one with pytest installed.
PYTEST_PYTHON = "/usr/bin/python3"

INNER = textwrap.dedent('''\
    import gc
    import pytest
    import simdev

    kept = []

    def test_clean():
        t = simdev.Tensor(1 << 20)
        t.fill(7)
        del t

    def test_leaky():
        kept.append(simdev.Tensor(3 << 20))      # LEAK

    def test_leaky_without_the_gil():
        # The GIL released around the allocation, as PyTorch's bindings do.
        kept.append(simdev.Tensor(2 << 20, release_gil=True))   # NOGIL LEAK

    def test_cycle_is_collected():
        t = simdev.Tensor(2 << 20)
        t.me = t                                  # only gc.collect() frees it
        del t

    def test_fails_by_itself():
        kept.append(simdev.Tensor(1 << 20))
        assert False, "own failure"

    @pytest.mark.limit_leaks("4MB")
    def test_marked_under_limit():
        kept.append(simdev.Tensor(1 << 20))

    @pytest.mark.limit_leaks("512KiB")
    def test_marked_over_limit():
        kept.append(simdev.Tensor(1 << 20))

    def test_frees_older_memory():
        # Freeing what earlier tests kept is not a leak of this test.
        kept.clear()
        gc.collect()
    ''')
LEAK_LINE = 1 + INNER.splitlines().index(
    [ln for ln in INNER.splitlines() if "# LEAK" in ln][0])
NOGIL_LINE = 1 + INNER.splitlines().index(
    [ln for ln in INNER.splitlines() if "# NOGIL LEAK" in ln][0])



@pytest.fixture(scope="module")
def shim():
    """(pythons, interpreter, simdev module dir): Debian's python3.11."""
    interp = pythons.get("cpython3.11-static").require()
    if os.path.realpath(interp.exe) != os.path.realpath(PYTEST_PYTHON):
        pythons.need("/usr/bin/python3", "%s is not Debian's python3 (which has pytest)" % interp.exe)
    return pythons, interp, pythons.build_module(interp)


def need_lib(pythons):
    assert pythons.shim_lib().exists(), "%s is not built" % pythons.shim_lib()
    return str(pythons.shim_lib())


def inner_pytest(shim, tmp_path, *pytest_args, preload=True, cli_args=("--leak-check", "--exitcode", "0")):
    pythons, interp, moddir = shim
    (tmp_path / "test_inner.py").write_text(INNER)
    argv = [PYTEST_PYTHON, "-m", "pytest", "-p", "spyreshim.pytest_plugin", "-p", "no:cacheprovider",
            "-rA", "-o", "console_output_style=classic", "test_inner.py"] + list(pytest_args)
    env = pythons.module_env(interp, simdev_memory="1G")
    if preload:
        env["SPYRESHIM_LIB"] = need_lib(pythons)
        argv = [str(SCRIPT), "run"] + list(cli_args) + ["--"] + argv
    else:
        env["PYTHONPATH"] = env.get("PYTHONPATH", "") + os.pathsep + str(PKG)
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=pythons.HANG_S)
    outcomes = dict((name, word) for word, name in
                    re.findall(r"^(PASSED|FAILED|ERROR) test_inner\.py::(\w+)", r.stdout, re.M))
    return r, outcomes


def test_without_the_shim_it_says_so_once_and_checks_nothing(shim, tmp_path):
    r, outcomes = inner_pytest(shim, tmp_path, "--spyreshim-leaks", preload=False)
    assert r.stdout.count("libspyreshim is not preloaded") == 1, r.stdout
    assert outcomes["test_leaky"] == "PASSED"
    assert outcomes["test_marked_over_limit"] == "PASSED"
    assert outcomes["test_fails_by_itself"] == "FAILED"
    assert r.returncode == 1, r.stdout + r.stderr


def test_every_test_is_checked_with_the_option(shim, tmp_path):
    r, outcomes = inner_pytest(shim, tmp_path, "--spyreshim-leaks")
    out = r.stdout
    assert "spyreshim: " in out and "device-memory leak checks on every test (limit 0 B)" in out
    assert outcomes == {
        "test_clean": "PASSED",
        "test_leaky": "FAILED",
        "test_leaky_without_the_gil": "FAILED",
        "test_cycle_is_collected": "PASSED",
        "test_fails_by_itself": "FAILED",       # its own failure, not a leak report
        "test_marked_under_limit": "PASSED",
        "test_marked_over_limit": "FAILED",
        "test_frees_older_memory": "PASSED",
    }, out
    assert ("spyreshim: test_inner.py::test_leaky left 3145728 B (3.0 MiB) of device memory "
            "in 1 allocation after garbage collection (limit 0 B)") in out
    assert ("spyreshim: test_inner.py::test_marked_over_limit left 1048576 B (1.0 MiB) of device "
            "memory in 1 allocation after garbage collection (limit per location 524288 B (512.0 KiB))") in out
    assert "own failure" in out
    assert "test_fails_by_itself left" not in out
    # The stacks of the leak: the extension's constructor below it.
    section = leak_section(out, "test_leaky")
    assert re.search(r"#\d+ 0x[0-9a-f]+ in Tensor_new \S*simdevmodule\.c:\d+ \(/", section), section
    assert r.returncode == 1


def leak_section(out, test):
    section = out[out.index("%s left" % test):]
    return section[:section.index("\n_____")]


def test_the_failure_shows_the_python_line(shim, tmp_path):
    r, outcomes = inner_pytest(shim, tmp_path, "--spyreshim-leaks")
    for test, line in (("test_leaky", LEAK_LINE), ("test_leaky_without_the_gil", NOGIL_LINE)):
        assert outcomes[test] == "FAILED"
        section = leak_section(r.stdout, test)
        frames = re.findall(r"^\s+#\d+ (.*)$", section, re.M)
        # Innermost first, as every report: the extension's constructor,
        # then up to the test's own frame (what is outside it is pytest).
        assert "in Tensor_new " in frames[0], section
        assert frames[-1] == "in %s %s:%d [python]" % (test, tmp_path / "test_inner.py", line), \
            section


def test_only_marked_tests_are_checked_without_the_option(shim, tmp_path):
    r, outcomes = inner_pytest(shim, tmp_path)
    assert "leak checks on tests marked limit_leaks" in r.stdout
    assert outcomes["test_leaky"] == "PASSED"
    assert outcomes["test_marked_under_limit"] == "PASSED"
    assert outcomes["test_marked_over_limit"] == "FAILED"
    assert "test_marked_over_limit left 1048576 B (1.0 MiB)" in r.stdout


def test_a_limit_for_every_test(shim, tmp_path):
    r, outcomes = inner_pytest(shim, tmp_path, "--spyreshim-leaks", "--spyreshim-leak-limit", "3MiB")
    assert outcomes["test_leaky"] == "PASSED"          # exactly 3 MiB: not above
    assert outcomes["test_marked_over_limit"] == "FAILED"  # the marker wins


def test_bad_limits_are_usage_errors(shim, tmp_path):
    r, _ = inner_pytest(shim, tmp_path, "--spyreshim-leaks", "--spyreshim-leak-limit", "lots")
    assert r.returncode == 4, r.stdout + r.stderr      # pytest's usage error
    assert "--spyreshim-leak-limit: invalid size 'lots'" in r.stderr
    (tmp_path / "test_bad_marker.py").write_text(
        "import pytest\n@pytest.mark.limit_leaks('many')\ndef test_x():\n    pass\n")
    r, outcomes = inner_pytest(shim, tmp_path, "test_bad_marker.py")
    assert r.returncode == 4, r.stdout + r.stderr
    assert "test_bad_marker.py::test_x: @pytest.mark.limit_leaks: invalid size 'many'" in r.stderr
    assert outcomes == {}


# ----------------------------------------------------------- the Python API

API = textwrap.dedent('''\
    import json, os, sys
    import spyreshim, simdev

    print("available", spyreshim.available())
    if not spyreshim.available():
        # Never loaded behind the program's back.
        print("mapped", any("libspyreshim" in l for l in open("/proc/self/maps")))
        try:
            spyreshim.mark()
        except spyreshim.Unavailable as e:
            print("unavailable:", e)
        sys.exit(0)

    s0 = spyreshim.stats()
    m = spyreshim.mark()
    keep = simdev.Tensor(1 << 20)
    gone = simdev.Tensor(1 << 16)
    del gone
    spyreshim.collect()       # PyPy frees on collection only
    s1 = spyreshim.stats()
    print("allocs", s1["allocs"] - s0["allocs"], "used", s1["used_bytes"] - s0["used_bytes"])

    snap = spyreshim.snapshot(since=m)
    print("since", snap.count, snap.bytes, [a.size for a in snap.allocations],
          snap.allocations[0].seq > m, snap.allocations[0].runtime)
    everything = spyreshim.snapshot()
    print("all>=since", everything.count >= snap.count)

    path = sys.argv[1]
    snap.write_json(path)
    rep = json.load(open(path))
    print("json", rep["format"], rep["reason"], rep["groups"][0]["bytes"], oct(os.stat(path).st_mode & 0o777))
    print("text", "api.py" in snap.text())
    sys.stdout.flush()
    snap.print()
    snap.close()

    def make():
        return simdev.Tensor(1 << 18)

    with spyreshim.track() as t:
        a = make()
        b = make()
        b.me = b          # a cycle: track() collects it
        del b
    print("track", t.count, t.bytes)
    del a
    with spyreshim.track() as t2:
        pass
    print("track-empty", t2.count, t2.bytes)
    ''')


def run_api(pythons, interp, tmp_path, preload):
    pythons.build_module(interp)
    (tmp_path / "api.py").write_text(API)
    env = pythons.module_env(interp, simdev_memory="1G")
    argv = [interp.exe, str(tmp_path / "api.py"), str(tmp_path / "snap.json")]
    if preload:
        env["SPYRESHIM_LIB"] = need_lib(pythons)
        argv = [str(SCRIPT), "run", "--leak-check", "--exitcode", "0", "--"] + argv
    else:
        env["PYTHONPATH"] = env.get("PYTHONPATH", "") + os.pathsep + str(PKG)
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=pythons.HANG_S)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_api_without_the_shim(shim, tmp_path):
    out = run_api(shim[0], shim[1], tmp_path, preload=False).stdout
    assert "available False" in out
    assert "mapped False" in out
    assert "unavailable: libspyreshim is not preloaded" in out


def test_api_with_the_shim(interpreter, tmp_path):
    """On every interpreter of pythons.NAMES (absent ones skip)."""
    r = run_api(pythons, interpreter, tmp_path, preload=True)
    lines = dict(ln.split(" ", 1) for ln in r.stdout.splitlines() if " " in ln)
    assert lines["available"] == "True"
    assert lines["allocs"] == "2 used %d" % (1 << 20)
    assert lines["since"] == "1 %d [%d] True simdev" % (1 << 20, 1 << 20)
    assert lines["all>=since"] == "True"
    assert lines["json"] == "spyreshim-report snapshot %d 0o600" % (1 << 20)
    assert lines["track"] == "1 %d" % (1 << 18)
    assert lines["track-empty"] == "0 0"
    assert "1048576" in r.stderr      # snap.print() on stderr
    if interpreter.kind == "cpython" :
        # Resolved Python frames, through write_json, with the GIL held.
        assert lines["text"] == "True", r.stderr


def test_failure_stacks_stop_at_the_test_function():
    """What is outside the test function is pytest; what is below the first
    native frames is the interpreter."""
    sys.path.insert(0, str(PKG))
    from spyreshim import pytest_plugin

    def py(fn, file):
        return {"kind": "python", "function": fn, "file": file, "line": 1,
                "object": None, "address": None, "offset": None}

    def nat(fn):
        return {"kind": "native", "function": fn, "file": None, "line": None,
                "object": "/x.so", "address": "0x1", "offset": "0x1"}
    # Innermost first: the extension, the test's helper, the test, pytest.
    frames = ([nat("n0"), nat("n1"), py("helper", "/t/test_a.py"), py("test_a", "/t/test_a.py"),
               nat("n2"), py("pytest_pyfunc_call", "/p/python.py"), py("_multicall", "/p/callers.py")] +
              [nat("n%d" % i) for i in range(3, 10)])
    kept, hidden = pytest_plugin._trim(frames, "/t/test_a.py")
    assert [f["function"] for f in kept] == ["n0", "n1", "helper", "test_a"]
    assert hidden == len(frames) - 4
    # Not found (a fixture's file): every Python frame, the innermost native ones.
    kept, hidden = pytest_plugin._trim(frames, "/t/other.py")
    assert len([f for f in kept if f["kind"] == "python"]) == 4
    assert [f["function"] for f in kept if f["kind"] == "native"] == [
        "n%d" % i for i in range(pytest_plugin.NATIVE_SHOWN)]


MEMRAY = textwrap.dedent('''\
    import threading
    import pytest
    import simdev

    kept = []

    def keep(n):
        kept.append(simdev.Tensor(n))

    @pytest.mark.limit_leaks(location_limit="1 MB")
    def test_keyword_limit_keeps_64k():
        keep(64 << 10)

    @pytest.mark.limit_leaks("1 MB")
    def test_one_location_at_the_limit():
        keep(1 << 20)

    @pytest.mark.limit_leaks("1 MB")
    def test_two_locations_under_it_each():
        keep(600 << 10)
        kept.append(simdev.Tensor(600 << 10))

    @pytest.mark.limit_leaks("1 KB", filter_fn=lambda stack: not any(
        f.function == "keep" for f in stack.frames))
    def test_filter_fn_drops_a_known_cache():
        keep(1 << 20)

    @pytest.mark.limit_leaks("1 KB", filter_fn=lambda stack: stack.frames[0].function != "Tensor_new")
    def test_filter_fn_sees_the_innermost_frame_first():
        keep(1 << 20)

    def other_thread():
        kept.append(simdev.Tensor(1 << 20))

    @pytest.mark.limit_leaks("1 KB", current_thread_only=True)
    def test_current_thread_only_ignores_other_threads():
        t = threading.Thread(target=other_thread)
        t.start(); t.join()

    @pytest.mark.limit_leaks("1 KB")
    def test_all_threads_by_default():
        t = threading.Thread(target=other_thread)
        t.start(); t.join()

    @pytest.mark.limit_leaks("1 KB")
    def test_suppressed():
        kept.append(simdev.Tensor(1 << 20))     # SUPPRESSED
    ''')


def test_limit_leaks_takes_pytest_memrays_signature(shim, tmp_path):
    pythons, interp, moddir = shim
    (tmp_path / "test_memray.py").write_text(MEMRAY)
    supp = tmp_path / "supp.txt"
    supp.write_text("leak:^test_suppressed$\n")
    argv = [str(SCRIPT), "run", "--leak-check", "--exitcode", "0", "--suppressions", str(supp),
            "--", PYTEST_PYTHON, "-m", "pytest", "-p", "spyreshim.pytest_plugin",
            "-p", "no:cacheprovider", "-rA", "test_memray.py"]
    env = pythons.module_env(interp, simdev_memory="1G")
    env["SPYRESHIM_LIB"] = need_lib(pythons)
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=pythons.HANG_S)
    outcomes = dict((name, word) for word, name in
                    re.findall(r"^(PASSED|FAILED|ERROR) test_memray\.py::(\w+)", r.stdout, re.M))
    assert outcomes == {
        "test_keyword_limit_keeps_64k": "PASSED",          # "1 MB" is 1 MiB, not 0
        "test_one_location_at_the_limit": "FAILED",         # at least the limit, as memray
        "test_two_locations_under_it_each": "PASSED",       # per location, not the sum
        "test_filter_fn_drops_a_known_cache": "PASSED",
        "test_filter_fn_sees_the_innermost_frame_first": "PASSED",
        "test_current_thread_only_ignores_other_threads": "PASSED",
        "test_all_threads_by_default": "FAILED",
        "test_suppressed": "PASSED",                        # --suppressions applies
    }, r.stdout + r.stderr
    assert "(limit per location 1048576 B (1.0 MiB))" in r.stdout, r.stdout
    # Without the suppressions file the same test fails.
    supp.write_text("")
    r = subprocess.run(argv + ["-k", "test_suppressed"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=pythons.HANG_S)
    assert "FAILED test_memray.py::test_suppressed" in r.stdout, r.stdout


def test_limit_leaks_misuse_is_a_usage_error(shim, tmp_path):
    pythons, interp, moddir = shim
    for marker in ("limit_leaks('1 MB', warmups=2)", "limit_leaks()", "limit_leaks('1 MB', '2 MB')",
                   "limit_leaks('1 MB', filter_fn=3)"):
        (tmp_path / "test_bad.py").write_text(
            "import pytest\n@pytest.mark.%s\ndef test_x():\n    pass\n" % marker)
        argv = [str(SCRIPT), "run", "--", PYTEST_PYTHON, "-m", "pytest", "-p",
                "spyreshim.pytest_plugin", "-p", "no:cacheprovider", "test_bad.py"]
        env = pythons.module_env(interp, simdev_memory="1G")
        env["SPYRESHIM_LIB"] = need_lib(pythons)
        r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path,
                           timeout=pythons.HANG_S)
        assert r.returncode == 4 and "@pytest.mark.limit_leaks" in r.stderr, (marker, r.stderr)


PEAKS = textwrap.dedent('''\
    import pytest
    import simdev

    held = [simdev.Tensor(8 << 20)]              # in use before every test

    @pytest.mark.limit_memory("4 MB")
    def test_peak_of_3mb_freed_at_once():
        t = simdev.Tensor(3 << 20)
        del t

    @pytest.mark.limit_memory("4 MB")
    def test_peak_of_5mb_freed_at_once():
        t = simdev.Tensor(5 << 20)
        del t

    @pytest.mark.limit_memory(limit="4 MB")
    def test_two_of_2mb_at_once():
        a = simdev.Tensor(2 << 20)
        b = simdev.Tensor(2 << 20)
        del a, b

    @pytest.mark.limit_memory("4 MB")
    def test_two_of_2mb_one_after_the_other():
        a = simdev.Tensor(2 << 20)
        del a
        b = simdev.Tensor(2 << 20)
        del b
    ''')


def test_limit_memory_is_the_device_peak_of_the_test(shim, tmp_path):
    pythons, interp, moddir = shim
    (tmp_path / "test_peaks.py").write_text(PEAKS)
    argv = [str(SCRIPT), "run", "--", PYTEST_PYTHON, "-m", "pytest", "-p",
            "spyreshim.pytest_plugin", "-p", "no:cacheprovider", "-rA", "test_peaks.py"]
    env = pythons.module_env(interp, simdev_memory="1G")
    env["SPYRESHIM_LIB"] = need_lib(pythons)
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=pythons.HANG_S)
    outcomes = dict((name, word) for word, name in
                    re.findall(r"^(PASSED|FAILED|ERROR) test_peaks\.py::(\w+)", r.stdout, re.M))
    assert outcomes == {
        "test_peak_of_3mb_freed_at_once": "PASSED",       # nothing kept, 3 MiB at its peak
        "test_peak_of_5mb_freed_at_once": "FAILED",
        "test_two_of_2mb_at_once": "FAILED",               # 4 MiB at once: at the limit
        "test_two_of_2mb_one_after_the_other": "PASSED",
    }, r.stdout + r.stderr
    assert ("spyreshim: test_peaks.py::test_peak_of_5mb_freed_at_once used a device peak of "
            "5242880 B (5.0 MiB) above the 8388608 B (8.0 MiB) in use at its start (limit "
            "4194304 B (4.0 MiB))") in r.stdout, r.stdout
    (tmp_path / "test_bad.py").write_text(
        "import pytest\n@pytest.mark.limit_memory('1 MB', thread_only=True)\n"
        "def test_x():\n    pass\n")
    r = subprocess.run(argv[:-1] + ["test_bad.py"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=pythons.HANG_S)
    assert r.returncode == 4 and "@pytest.mark.limit_memory" in r.stderr, r.stderr


THREADS = textwrap.dedent('''\
    import threading
    import pytest
    import simdev

    held = [simdev.Tensor(8 << 20)]    # allocated by this thread before any test

    def with_a_busy_neighbour(mine):
        # Another thread holds 16 MiB while this one allocates `mine`.
        started, done = threading.Event(), threading.Event()
        def neighbour():
            big = simdev.Tensor(16 << 20)
            started.set()
            done.wait()
            del big
        t = threading.Thread(target=neighbour)
        t.start()
        started.wait()
        a = simdev.Tensor(mine)
        del a
        done.set()
        t.join()

    @pytest.mark.limit_memory("4 MB", current_thread_only=True)
    def test_own_thread_only():
        with_a_busy_neighbour(1 << 20)

    @pytest.mark.limit_memory("4 MB")
    def test_every_thread_by_default():
        with_a_busy_neighbour(1 << 20)

    @pytest.mark.limit_memory("4 MB", current_thread_only=True)
    def test_own_thread_over_its_limit():
        with_a_busy_neighbour(5 << 20)

    @pytest.mark.limit_memory("4 MB", current_thread_only=True)
    def test_freed_by_another_thread():
        # 3 MiB of this thread's, freed by another thread, then 3 MiB
        # again: a peak of 3 MiB, not 6.
        kept = [simdev.Tensor(3 << 20)]
        t = threading.Thread(target=kept.clear)
        t.start()
        t.join()
        b = simdev.Tensor(3 << 20)
        del b

    @pytest.mark.limit_memory("4 MB", current_thread_only=True)
    def test_frees_what_was_allocated_before():
        # What the thread allocated before it was counted is not counted
        # at its free either: the 3 MiB after it are the peak.
        held.clear()
        b = simdev.Tensor(3 << 20)
        del b

    @pytest.mark.limit_leaks("1 KB", current_thread_only=True)
    def test_leaks_of_another_thread_only():
        t = threading.Thread(target=lambda: held.append(simdev.Tensor(1 << 20)))
        t.start()
        t.join()

    @pytest.mark.limit_leaks("1 KB", current_thread_only=True)
    def test_leaks_of_its_own_thread():
        t = threading.Thread(target=lambda: held.append(simdev.Tensor(1 << 20)))
        t.start()
        t.join()
        held.append(simdev.Tensor(2 << 20))
    ''')


@pytest.mark.parametrize("stacks", [True, False], ids=["stacks", "no-stacks"])
def test_current_thread_only_counts_the_tests_thread(shim, tmp_path, stacks):
    """limit_memory's and limit_leaks' current_thread_only, by the thread
    that allocated each block: with stacks recorded (--leak-check) or not."""
    pythons, interp, moddir = shim
    (tmp_path / "test_threads.py").write_text(THREADS)
    argv = [str(SCRIPT), "run"] + (["--leak-check"] if stacks else []) + [
        "--exitcode", "0", "--", PYTEST_PYTHON, "-m", "pytest", "-p", "spyreshim.pytest_plugin",
        "-p", "no:cacheprovider", "-rA", "test_threads.py"]
    env = pythons.module_env(interp, simdev_memory="1G")
    env["SPYRESHIM_LIB"] = need_lib(pythons)
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=pythons.HANG_S)
    outcomes = dict((name, word) for word, name in
                    re.findall(r"^(PASSED|FAILED|ERROR) test_threads\.py::(\w+)", r.stdout, re.M))
    assert outcomes == {
        "test_own_thread_only": "PASSED",              # 1 MiB of its own, 16 of the other's
        "test_every_thread_by_default": "FAILED",      # 17 MiB at once
        "test_own_thread_over_its_limit": "FAILED",
        "test_freed_by_another_thread": "PASSED",
        "test_frees_what_was_allocated_before": "PASSED",
        "test_leaks_of_another_thread_only": "PASSED",
        "test_leaks_of_its_own_thread": "FAILED",
    }, r.stdout + r.stderr
    assert ("spyreshim: test_threads.py::test_own_thread_over_its_limit used a device peak of "
            "5242880 B (5.0 MiB) above the 0 B in use at its start by its thread (limit "
            "4194304 B (4.0 MiB))") in r.stdout, r.stdout
    # Its own 2 MiB, not the other thread's 1 MiB.
    assert ("spyreshim: test_threads.py::test_leaks_of_its_own_thread left 2097152 B "
            "(2.0 MiB) of device memory in 1 allocation after garbage collection") in r.stdout, \
        r.stdout


INCREASE = textwrap.dedent('''\
    from pathlib import Path
    import pytest
    import simdev

    def mib(name):
        return int(Path(name).read_text()) << 20

    @pytest.mark.limit_memory("64 MB")
    def test_grows():
        t = simdev.Tensor(mib("grows"))
        del t

    @pytest.mark.limit_memory("64 MB")
    def test_shrinks():
        t = simdev.Tensor(mib("shrinks"))
        del t

    @pytest.mark.limit_memory("1 MB")
    def test_over_its_limit():
        t = simdev.Tensor(2 << 20)
        del t
    ''')


def increase_run(shim, tmp_path, python, test_file, sizes, *args):
    """One pytest run of `test_file` under the shim, with pytest's cache
    (in tmp_path), the sizes in MiB written where the tests read them."""
    pythons, interp, moddir = shim
    for name, n in sizes.items():
        (tmp_path / name).write_text(str(n))
    argv = [str(SCRIPT), "run", "--", python, "-m", "pytest", "-p", "spyreshim.pytest_plugin",
            "-rA", "-o", "console_output_style=classic", test_file] + list(args)
    env = pythons.module_env(interp, simdev_memory="1G")
    env["SPYRESHIM_LIB"] = need_lib(pythons)
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=pythons.HANG_S)
    stem = test_file[:-3]
    # pytest-memray names its failures MEMORY PROBLEMS in the summary.
    outcomes = dict((name, "FAILED" if word == "MEMORY PROBLEMS" else word) for word, name in
                    re.findall(r"^(PASSED|FAILED|ERROR|MEMORY PROBLEMS) %s\.py::(\w+)" % stem,
                               r.stdout, re.M))
    return r, outcomes


def test_fail_on_increase_compares_with_the_last_successful_run(shim, tmp_path):
    (tmp_path / "test_increase.py").write_text(INCREASE)
    run = lambda sizes, *args: increase_run(shim, tmp_path, PYTEST_PYTHON, "test_increase.py",
                                            sizes, *args)
    r, outcomes = run({"grows": 2, "shrinks": 4}, "--fail-on-increase")
    assert outcomes == {"test_grows": "PASSED", "test_shrinks": "PASSED",
                        "test_over_its_limit": "FAILED"}, r.stdout + r.stderr
    # Second run: one test's device peak grew, the other's shrank.
    for again in range(2):
        r, outcomes = run({"grows": 4, "shrinks": 2}, "--fail-on-increase")
        assert outcomes == {"test_grows": "FAILED", "test_shrinks": "PASSED",
                            "test_over_its_limit": "FAILED"}, r.stdout + r.stderr
        # Compared with the last successful run's 2 MiB, again in the run
        # after (a failed run keeps the old peak).
        assert ("spyreshim: test_increase.py::test_grows used a device peak of 4194304 B "
                "(4.0 MiB), more than the 2097152 B (2.0 MiB) of its last successful run "
                "(--fail-on-increase)") in r.stdout, r.stdout
        # The limit is still told as before.
        assert ("spyreshim: test_increase.py::test_over_its_limit used a device peak of 2097152 "
                "B (2.0 MiB) above the 0 B in use at its start (limit 1048576 B (1.0 MiB))") \
            in r.stdout, r.stdout
    # Without the option the same growth passes, and becomes the peak to beat.
    r, outcomes = run({"grows": 4, "shrinks": 2})
    assert outcomes["test_grows"] == "PASSED", r.stdout + r.stderr
    r, outcomes = run({"grows": 4, "shrinks": 2}, "--fail-on-increase")
    assert outcomes["test_grows"] == "PASSED", r.stdout + r.stderr
    # pytest's cache holds it under our own key.
    assert list((tmp_path / ".pytest_cache" / "v" / "spyreshim" / "device_peak").iterdir())


MEMRAY_VENV = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / \
    "spyreshim" / "venv-pytest-memray"


def memray_python():
    """A venv of Debian's python3 (its site packages seen) with
    pytest-memray from PyPI, made once and cached."""
    py = MEMRAY_VENV / "bin" / "python"
    probe = [str(py), "-c", "import pytest_memray, memray"]
    if py.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return str(py)
    r = subprocess.run([PYTEST_PYTHON, "-m", "venv", "--clear", "--system-site-packages",
                        str(MEMRAY_VENV)], capture_output=True, text=True, timeout=pythons.HANG_S)
    if r.returncode == 0:
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", "pytest-memray"],
                           capture_output=True, text=True, timeout=pythons.HANG_S)
    if r.returncode != 0 or subprocess.run(probe, capture_output=True).returncode != 0:
        pythons.need("pytest-memray", "pytest-memray could not be installed into %s: %s" % (
            MEMRAY_VENV, r.stderr.strip()[-300:]))
    return str(py)


BOTH = textwrap.dedent('''\
    from pathlib import Path
    import pytest
    import simdev

    # simdev maps its device into the host on its first call: here, not
    # inside a test, where pytest-memray would count it.
    ready = simdev.Tensor(256)

    def mib(name):
        return int(Path(name).read_text()) << 20

    @pytest.mark.limit_memory("1 GB")
    def test_device_grows():
        host = bytearray(mib("device_grows_host"))
        host[::4096] = b"x" * len(host[::4096])
        t = simdev.Tensor(mib("device_grows_device"))
        del t, host

    @pytest.mark.limit_memory("1 GB")
    def test_host_grows():
        host = bytearray(mib("host_grows_host"))
        host[::4096] = b"x" * len(host[::4096])
        t = simdev.Tensor(mib("host_grows_device"))
        del t, host
    ''')


def test_fail_on_increase_with_pytest_memray_loaded_too(shim, tmp_path):
    """Both plugins loaded (ours by -p first, pytest-memray by its entry
    point after): pytest-memray's --fail-on-increase is the one option, and
    each plugin checks its own memory with it: ours the device peak,
    pytest-memray the host's."""
    py = memray_python()
    (tmp_path / "test_both.py").write_text(BOTH)
    run = lambda sizes, *args: increase_run(shim, tmp_path, py, "test_both.py", sizes, *args)
    first = {"device_grows_host": 32, "device_grows_device": 2,
             "host_grows_host": 4, "host_grows_device": 8}
    second = {"device_grows_host": 4, "device_grows_device": 4,
              "host_grows_host": 32, "host_grows_device": 2}
    r, outcomes = run(first, "--fail-on-increase")
    assert outcomes == {"test_device_grows": "PASSED", "test_host_grows": "PASSED"}, \
        r.stdout + r.stderr
    r, outcomes = run(second, "--fail-on-increase")
    assert outcomes == {"test_device_grows": "FAILED", "test_host_grows": "FAILED"}, \
        r.stdout + r.stderr
    assert ("spyreshim: test_both.py::test_device_grows used a device peak of 4194304 B "
            "(4.0 MiB), more than the 2097152 B (2.0 MiB) of its last successful run "
            "(--fail-on-increase)") in r.stdout, r.stdout
    # pytest-memray's own verdict on the host memory of the other test.
    host_failure = r.stdout[r.stdout.index("test_host_grows"):]
    assert "Test previously used" in host_failure, r.stdout
    assert "spyreshim: test_both.py::test_host_grows" not in r.stdout, r.stdout
    # Without the option, neither fails.
    r, outcomes = run(first)
    assert outcomes == {"test_device_grows": "PASSED", "test_host_grows": "PASSED"}, \
        r.stdout + r.stderr
    # One --fail-on-increase whichever plugin comes first, and ours where
    # pytest-memray is installed but not loaded.
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "conftest.py").write_text('pytest_plugins = ["spyreshim.pytest_plugin"]\n')
    off = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    for args, extra, cwd, whose in [
            (["-p", "spyreshim.pytest_plugin"], {}, tmp_path, "memray"),
            (["-p", "no:memray", "-p", "spyreshim.pytest_plugin"], {}, tmp_path, "ours"),
            (["-p", "spyreshim.pytest_plugin"], off, tmp_path, "ours"),
            (["-p", "pytest_memray.plugin", "-p", "spyreshim.pytest_plugin"], off, tmp_path,
             "memray"),
            (["-p", "spyreshim.pytest_plugin", "-p", "pytest_memray.plugin"], off, tmp_path,
             "memray"),
            ([], {}, conf, "memray"),
            ([], off, conf, "ours")]:
        env = dict(pythons.module_env(shim[1]), PYTHONPATH=str(PKG), **extra)
        r = subprocess.run([py, "-m", "pytest"] + args + ["--help"], capture_output=True,
                           text=True, cwd=cwd, timeout=pythons.HANG_S, env=env)
        help_line = " ".join(r.stdout[r.stdout.find("--fail-on-increase"):].split()[:12])
        assert r.returncode == 0 and r.stdout.count("--fail-on-increase") == 1 and \
            ("device peak" in help_line) == (whose == "ours"), (args, extra, cwd, r.stdout + r.stderr)
