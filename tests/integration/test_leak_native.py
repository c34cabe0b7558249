"""Leak reports for native programs: tests/programs/leak_program.c (leaks from
known functions) and leak_exceptions.cc (C++ exceptions), run under
LD_PRELOAD=libspyreshim.so with SPYRESHIM_LEAK_CHECK=1."""
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

import pythons

MiB = 1 << 20


@pytest.fixture(scope="module")
def programs(builddir, shim_lib):
    d = Path(builddir) / "tests"
    prog = d / "leak_program"
    if not prog.exists():
        pytest.fail(f"{prog} is missing: ninja -C {builddir}")
    return d


def run_leaks(programs, shim_lib, steps, tmp_path, env=None, program="leak_program",
              preload=True, report=True):
    e = dict(os.environ)
    for k in list(e):
        if k.startswith("SPYRESHIM_") or k in ("LD_PRELOAD", "LD_DEBUG"):
            del e[k]
    e["SIMDEV_MEMORY"] = "1G"
    e["SPYRESHIM_LEAK_CHECK"] = "1"
    if preload:
        e["LD_PRELOAD"] = str(shim_lib)
    path = tmp_path / "report.%p.json"
    for old in tmp_path.glob("report.*.json"):
        old.unlink()
    if report:
        e["SPYRESHIM_REPORT"] = str(path)
    e.update({k: str(v) for k, v in (env or {}).items()})
    r = pythons.run([programs / program, *steps], env=e)
    assert not r.timed_out, r.describe()
    reports = sorted(tmp_path.glob("report.*.json"))
    data = json.loads(reports[0].read_text()) if reports else None
    return r, data, reports


def by_function(data):
    """Sums bytes and counts of the report's groups by their first native
    frame's function (the caller of simdevMalloc)."""
    out = {}
    for g in data["groups"]:
        native = [f for f in g["frames"] if f["kind"] == "native"]
        name = native[0]["function"] if native else None
        b, c, s = out.get(name, (0, 0, None))
        out[name] = (b + g["bytes"], c + g["count"], g["suppressed"] if s is None else s and g["suppressed"])
    return out


def test_report_names_functions_with_sizes_and_counts(programs, shim_lib, tmp_path):
    r, data, reports = run_leaks(programs, shim_lib, ["small", "big", "other", "clean"], tmp_path)
    assert r.returncode == 23, r.describe()
    assert "done" in r.stdout, "the program's buffered output survives the exit"
    assert len(reports) == 1 and reports[0].name == f"report.{data['pid']}.json"
    assert data["format"] == "spyreshim-report" and data["reason"] == "exit"
    f = by_function(data)
    assert f["leak_one_big"][:2] == (MiB, 1)
    assert f["leak_small_blocks"][:2] == (3000, 3)
    assert f["leak_in_other_function"][:2] == (8192, 2)
    assert "allocate_and_free" not in f, "freed memory is not a leak"
    assert data["live_bytes"] == MiB + 3000 + 8192
    assert data["live_allocations"] == 6
    sizes = [g["bytes"] for g in data["groups"]]
    assert sizes == sorted(sizes, reverse=True), "largest first"
    big = data["groups"][0]
    top = big["frames"][0]
    assert top["function"] == "leak_one_big"
    assert top["file"].endswith("leak_program.c") and top["line"] > 0
    assert top["object"].endswith("leak_program")
    assert any(fr["function"] == "main" for fr in big["frames"])
    assert not any("spyreshim" in (fr["object"] or "") for g in data["groups"] for fr in g["frames"]), \
        "the shim's own frames are dropped"
    err = r.stderr
    assert "ERROR: spyreshim: detected device memory leaks" in err
    assert "Leak of 1048576 B (1.0 MiB) in 1 allocation(s) of simdev memory" in err
    assert "Leak of 3000 B (2.9 KiB) in 3 allocation(s) of simdev memory" in err
    assert " in leak_small_blocks " in err and "leak_program.c:" in err
    assert "SUMMARY: spyreshim: 1059768 B (1.0 MiB) leaked in 6 allocation(s)." in err


def test_exit_status_is_configurable(programs, shim_lib, tmp_path):
    r, _, _ = run_leaks(programs, shim_lib, ["small"], tmp_path, env={"SPYRESHIM_EXITCODE": 42})
    assert r.returncode == 42, r.describe()
    r, _, _ = run_leaks(programs, shim_lib, ["small"], tmp_path, env={"SPYRESHIM_EXITCODE": 0})
    assert r.returncode == 0, r.describe()
    assert "Leak of 3000 B (2.9 KiB)" in r.stderr, "the report is printed even when the status is kept"


def test_clean_program_passes_and_still_writes_its_report(programs, shim_lib, tmp_path):
    r, data, _ = run_leaks(programs, shim_lib, ["clean"], tmp_path)
    assert r.returncode == 0, r.describe()
    assert "detected device memory leaks" not in r.stderr
    assert data["live_bytes"] == 0 and data["groups"] == []


def test_a_shell_that_never_touched_a_device_keeps_its_childs_report(programs, shim_lib, tmp_path):
    # A fixed path (no %p), as `spyreshim run --report leaks.json -- bash run.sh`.
    report = tmp_path / "leaks.json"
    script = tmp_path / "run.sh"
    script.write_text(f"{programs / 'leak_program'} small\necho child=$?\n")
    r, _, _ = run_leaks(programs, shim_lib, [script], tmp_path, program="/bin/bash",
                        report=False, env={"SPYRESHIM_REPORT": report})
    assert "child=23" in r.stdout, r.describe()
    assert r.returncode == 0, "bash itself leaked nothing: " + r.describe()
    data = json.loads(report.read_text())
    assert data["live_bytes"] == 3000 and data["pid"] != 0, data
    assert by_function(data)["leak_small_blocks"][:2] == (3000, 3)


def test_without_leak_checking_there_is_no_verdict(programs, shim_lib, tmp_path):
    r, data, _ = run_leaks(programs, shim_lib, ["small"], tmp_path, env={"SPYRESHIM_LEAK_CHECK": 0})
    assert r.returncode == 0, r.describe()
    assert data is None and "leaks" not in r.stderr


def test_suppressions_silence_exactly_what_they_match(programs, shim_lib, tmp_path):
    supp = tmp_path / "supp.txt"
    supp.write_text("# LeakSanitizer's format\n"
                    "leak:leak_small_blocks\n"
                    "\n"
                    "leak:^thread_le*$\n")
    r, data, _ = run_leaks(programs, shim_lib, ["small", "big", "threads:2"], tmp_path,
                           env={"SPYRESHIM_SUPPRESSIONS": supp})
    assert r.returncode == 23, "leak_one_big is not suppressed: " + r.describe()
    f = by_function(data)
    assert f["leak_small_blocks"] == (3000, 3, True)
    assert f["thread_leak"] == (1024, 2, True)
    assert f["leak_one_big"] == (MiB, 1, False)
    assert (data["live_bytes"], data["live_allocations"]) == (MiB, 1)
    assert (data["suppressed_bytes"], data["suppressed_allocations"]) == (4024, 5)
    err = r.stderr
    assert "Leak of 1048576 B (1.0 MiB)" in err
    assert "Leak of 3000 B (2.9 KiB)" not in err and " in thread_leak " not in err
    # Suppressed leaks are counted in one line, with each pattern's allocations.
    assert ("\nSuppressed: 4024 B (3.9 KiB) in 5 allocation(s) matched suppressions "
            "(leak_small_blocks: 3, ^thread_le*$: 2).\n") in err, err
    assert "Suppressions used:" not in err and err.count("Suppressed") == 1, err
    assert "SUMMARY: spyreshim: 1048576 B (1.0 MiB) leaked in 1 allocation(s)." in err

    # Suppress the rest by file name: nothing left, the status is clean.
    supp.write_text("leak:leak_small_blocks\nleak:thread_leak\nleak:leak_program.c\n")
    r, data, _ = run_leaks(programs, shim_lib, ["small", "big", "threads:2"], tmp_path,
                           env={"SPYRESHIM_SUPPRESSIONS": supp})
    assert r.returncode == 0, r.describe()
    assert data["live_bytes"] == 0 and data["suppressed_allocations"] == 6


def test_an_object_pattern_suppresses_the_frames_of_that_object(programs, shim_lib, tmp_path):
    # `leak:libc.so`: no function or source file of the program holds that
    # text; every stack reaches libc (__libc_start_call_main, start_thread),
    # so only the frames' object can match, and it matches every group.
    supp = tmp_path / "supp.txt"
    supp.write_text("leak:libc.so\n")
    r, data, _ = run_leaks(programs, shim_lib, ["small", "big", "threads:2"], tmp_path,
                           env={"SPYRESHIM_SUPPRESSIONS": supp})
    assert r.returncode == 0, "leak:libc.so matches no frame's object: " + r.describe()
    names = [f.get(k) or "" for g in data["groups"] for f in g["frames"]
             for k in ("function", "file")]
    assert not any("libc.so" in n for n in names), "the pattern must match objects only"
    assert any("libc.so" in (f.get("object") or "") for g in data["groups"] for f in g["frames"])
    assert data["live_bytes"] == 0 and data["suppressed_allocations"] == 6, data

    supp.write_text("leak:libfoo.so\n")
    r, data, _ = run_leaks(programs, shim_lib, ["small", "big", "threads:2"], tmp_path,
                           env={"SPYRESHIM_SUPPRESSIONS": supp})
    assert r.returncode == 23 and data["suppressed_allocations"] == 0, r.describe()


def test_bad_suppressions_file_warns_and_keeps_going(programs, shim_lib, tmp_path):
    supp = tmp_path / "bad.txt"
    supp.write_text("race:foo\nleak:leak_small_blocks\n")
    r, data, _ = run_leaks(programs, shim_lib, ["small"], tmp_path, env={"SPYRESHIM_SUPPRESSIONS": supp})
    assert r.returncode == 0, r.describe()
    assert "not a suppression" in r.stderr
    r, _, _ = run_leaks(programs, shim_lib, ["small"], tmp_path,
                        env={"SPYRESHIM_SUPPRESSIONS": tmp_path / "missing.txt"})
    assert r.returncode == 23 and "cannot read suppressions" in r.stderr


def suppression_warnings(r):
    return [l for l in r.stderr.splitlines() if "suppressions" in l]


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "huge"])
def test_odd_suppressions_files_warn_once_and_never_hang(programs, shim_lib, tmp_path, kind):
    if kind == "fifo":
        path = tmp_path / "supp.fifo"
        os.mkfifo(path)
        why = "not a regular file"
    elif kind == "dev-zero":
        path, why = "/dev/zero", "not a regular file"
    elif kind == "directory":
        path, why = tmp_path, "directory"
    else:
        path, why = tmp_path / "huge.txt", "larger than 1024 KiB"
        path.write_text("leak:leak_small_blocks\n" + "# padding\n" * 120000)
    r, data, _ = run_leaks(programs, shim_lib, ["small"], tmp_path,
                           env={"SPYRESHIM_SUPPRESSIONS": path})
    assert r.returncode == 23, "the file was ignored, the leak stands: " + r.describe()
    w = suppression_warnings(r)
    assert len(w) == 1 and why in w[0], r.stderr
    assert data["live_bytes"] == 3000


def test_a_fifo_as_suppressions_never_hangs_a_process_without_devices(shim_lib, tmp_path):
    fifo = tmp_path / "supp.fifo"
    os.mkfifo(fifo)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_PRELOAD": str(shim_lib),
           "SPYRESHIM_LEAK_CHECK": "1", "SPYRESHIM_SUPPRESSIONS": str(fifo)}
    r = pythons.run(["/bin/true"], env=env)
    assert not r.timed_out and r.returncode == 0, r.describe()
    assert len(r.stderr.splitlines()) <= 1, r.stderr


LIST_FDS = "import os; print(sorted(int(f) for f in os.listdir('/proc/self/fd')))"


def test_leak_checking_opens_no_descriptor_at_start_up(shim_lib):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_PRELOAD": str(shim_lib),
           "SPYRESHIM_LEAK_CHECK": "1"}
    for python in ("/usr/bin/python3", "/usr/bin/python3.11"):
        if not os.path.exists(python):
            continue
        r = pythons.run([python, "-c", LIST_FDS], env=env)
        assert r.returncode == 0, r.describe()
        # 0, 1, 2 and the listing's own descriptor, nothing of the shim's.
        assert r.stdout.split() == ["[0,", "1,", "2,", "3]"], r.describe()


def test_threads_get_native_stacks(programs, shim_lib, tmp_path):
    r, data, _ = run_leaks(programs, shim_lib, ["threads:8"], tmp_path)
    assert r.returncode == 23, r.describe()
    f = by_function(data)
    assert f["thread_leak"][:2] == (8 * 512, 8)
    g = data["groups"][0]
    names = [fr["function"] for fr in g["frames"]]
    assert "start_thread" in names or any(n and "clone" in n for n in names), names


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_stack_depth_counts_the_programs_frames_only(programs, shim_lib, tmp_path, depth):
    r, data, _ = run_leaks(programs, shim_lib, ["small"], tmp_path,
                           env={"SPYRESHIM_STACK_DEPTH": depth})
    frames = [f["function"] for f in data["groups"][0]["frames"]]
    assert len(frames) == depth, frames
    assert frames[:2] == ["leak_small_blocks", "main"][:depth], frames


def test_allocations_while_exiting_get_stacks(programs, shim_lib, tmp_path):
    r, data, _ = run_leaks(programs, shim_lib, ["atexit", "small"], tmp_path)
    assert r.returncode == 23, r.describe()
    f = by_function(data)
    assert f["leak_at_exit"][:2] == (777, 1)
    assert f["leak_small_blocks"][:2] == (3000, 3)


def test_report_file_is_private_and_symlinks_are_not_followed(programs, shim_lib, tmp_path):
    r, data, reports = run_leaks(programs, shim_lib, ["small"], tmp_path)
    assert stat.S_IMODE(reports[0].stat().st_mode) == 0o600

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "linked.json"
    link.symlink_to(victim)
    r, _, _ = run_leaks(programs, shim_lib, ["small"], tmp_path, report=False,
                        env={"SPYRESHIM_REPORT": link})
    assert r.returncode == 23, r.describe()
    assert victim.read_text() == "precious"
    assert link.is_symlink()
    assert "cannot write report" in r.stderr


def test_cxx_exceptions_still_bind_to_libgcc(programs, shim_lib, tmp_path):
    prog = programs / "leak_exceptions"
    if not prog.exists():
        pythons.need("g++", "no C++ compiler: leak_exceptions was not built")
    r, data, _ = run_leaks(programs, shim_lib, [], tmp_path, program="leak_exceptions",
                           env={"LD_DEBUG": "bindings"})
    assert "caught 1000" in r.stdout, r.describe()
    assert r.returncode == 23, r.describe()
    assert by_function(data)["leak_from_cxx()"][:2] == (3000, 1)
    bindings = [l for l in r.stderr.splitlines() if "`_Unwind_RaiseException'" in l]
    assert any("libunwind.so.8" in l for l in r.stderr.splitlines() if "binding file" in l), \
        "libunwind was loaded (else the check below proves nothing)"
    from_cxx = [l for l in bindings if "libstdc++" in l.split(" to ")[0]]
    assert from_cxx, "libstdc++ resolved _Unwind_RaiseException: " + "\n".join(bindings)
    for l in bindings:
        assert "libgcc_s" in l.split(" to ")[1], l

    # The control: libunwind in the global scope does take over, so the check
    # above can fail.
    r, _, _ = run_leaks(programs, shim_lib, [], tmp_path, program="leak_exceptions",
                        env={"LD_DEBUG": "bindings", "SPYRESHIM_LEAK_CHECK": 0,
                             "LD_PRELOAD": "libunwind.so.8 " + str(shim_lib)})
    taken = [l for l in r.stderr.splitlines()
             if "`_Unwind_RaiseException'" in l and "libstdc++" in l.split(" to ")[0]]
    assert taken and all("libunwind" in l.split(" to ")[1] for l in taken), "\n".join(taken)


def test_secure_mode_ignores_paths_from_the_environment(programs, shim_lib, tmp_path):
    if os.geteuid() != 0:
        pythons.need("root", "needs root to make a setuid program")
    src = programs / "leak_program_linked"
    prog = tmp_path / "suid" / "leak_program_linked"
    prog.parent.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(prog.parent, 0o755)
    shutil.copy(src, prog)
    os.chown(prog, 65534, 65534)
    os.chmod(prog, 0o4755)
    # Where the kernel ignores the setuid bit, the test does not apply; the
    # reasons are read from the system, never from the shim's output.
    if os.statvfs(prog).f_flag & os.ST_NOSUID:
        pythons.need("setuid", f"{tmp_path} is on a nosuid mount: the setuid bit has no effect here")
    with open("/proc/self/status") as f:
        if any(l.split() == ["NoNewPrivs:", "1"] for l in f):
            pythons.need("setuid", "no_new_privs is set for this process: exec ignores the setuid bit")
    supp = tmp_path / "supp.txt"
    supp.write_text("leak:leak_small_blocks\n")
    os.chmod(supp, 0o644)
    r, data, reports = run_leaks(prog.parent, shim_lib, ["small"], tmp_path,
                                 program=prog.name, preload=False,
                                 env={"SPYRESHIM_SUPPRESSIONS": supp, "SPYRESHIM_LOG": "debug",
                                      "SPYRESHIM_CONTROL": "1"})
    if "cannot open shared object" in r.stderr:
        pythons.need("setuid", "the setuid user cannot read the build directory: " + r.stderr[-300:])
    # The kernel honoured the setuid bit (checked above, before the run):
    # the shim must have seen AT_SECURE. A shim that misses it fails here,
    # it does not skip.
    assert "secure mode" in r.stderr, "AT_SECURE was set and the shim missed it: " + r.describe()
    assert reports == [], "SPYRESHIM_REPORT must be ignored in secure mode"
    # No control socket either: `spyreshim snapshot` is not for setuid programs.
    assert "SPYRESHIM_CONTROL is ignored in secure mode" in r.stderr
    assert "control: listening" not in r.stderr
    assert r.returncode == 23, "the suppressions file is ignored too: " + r.describe()
    assert "Leak of 3000 B (2.9 KiB)" in r.stderr


QUIET_OOM = "full report at exit if it does not recover"


# With a trace too: it numbers frees and collections from the counter that
# allocations take theirs from, and a program that only freed after its
# failure has not recovered from it.
TRACED = pytest.mark.parametrize("traced", [False, True], ids=["untraced", "traced"])


def _trace_env(traced, tmp_path):
    return {"SPYRESHIM_TRACE": str(tmp_path / "t.trace")} if traced else {}


@TRACED
def test_an_oom_the_program_recovers_from_prints_at_most_one_line(programs, shim_lib, tmp_path,
                                                                  traced):
    # Two failures, each followed by frees and a successful allocation, as a
    # caching allocator does: one quiet line, no report, no .oom file.
    steps = ["a:4M", "a:4M", "fill:1M", "f", "f", "a:512K", "fill:1M", "f", "a:256K", "F"]
    r, data, _ = run_leaks(programs, shim_lib, steps, tmp_path, program="simdev_ops",
                           env={"SIMDEV_MEMORY": "16M", "SPYRESHIM_OOM_REPORT": 5,
                                **_trace_env(traced, tmp_path)})
    assert r.returncode == 0, r.describe()
    assert r.stdout.count("filled") == 2, r.describe()
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("spyreshim: out of simdev memory for 1048576 B (1.0 MiB) (live: ")
    assert "in 1" in lines[0] and QUIET_OOM in lines[0], lines
    assert not list(tmp_path.glob("report.*.json.oom"))
    assert data["live_bytes"] == 0


@TRACED
def test_final_oom_prints_what_holds_device_memory(programs, shim_lib, tmp_path, traced):
    # The program ends on its failure (nothing allocated after it, though
    # everything is freed): the full report, at exit, of what held memory
    # when it failed.
    steps = ["a:4M", "a:4M", "fill:1M", "F"]
    r, data, _ = run_leaks(programs, shim_lib, steps, tmp_path, program="simdev_ops",
                           env={"SIMDEV_MEMORY": "16M", "SPYRESHIM_OOM_REPORT": 5,
                                **_trace_env(traced, tmp_path)})
    assert r.returncode == 0, "everything was freed before exit: " + r.describe()
    err = r.stderr
    assert err.count(QUIET_OOM) == 1, err
    assert "out of simdev memory: a request of 1048576 B (1.0 MiB) failed" in err, err
    # How many groups depends on the compiler (an unrolled loop has several
    # call sites); the first is the largest, and all of it is accounted for.
    live = [l for l in err.splitlines() if l.startswith("Live: ")]
    assert live and "of simdev memory, allocated from:" in live[0], err
    assert "SUMMARY: spyreshim: 16777216 B (16.0 MiB) live in 10 allocation(s)." in err, err
    assert "simdev_ops.c:" in err
    assert err.count("out of simdev memory: a request") == 1, "one failure, one report"
    oom = list(tmp_path.glob("report.*.json.oom"))
    assert len(oom) == 1
    d = json.loads(oom[0].read_text())
    assert d["reason"] == "oom" and d["live_bytes"] == 16 * MiB and d["live_allocations"] == 10
    assert sum(g["bytes"] for g in d["groups"]) == 16 * MiB
    assert all(g["frames"] and g["frames"][0]["function"] == "main" for g in d["groups"]), d
    assert data["live_bytes"] == 0

    r, _, _ = run_leaks(programs, shim_lib, steps, tmp_path, program="simdev_ops",
                        env={"SIMDEV_MEMORY": "16M", "SPYRESHIM_OOM_REPORT": 0})
    assert "out of simdev memory" not in r.stderr
