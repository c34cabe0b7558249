"""The `spyreshim` command line: `report` on fixture files (text, merging of
per-pid files, bad input), `run` (environment, library lookup, exit status,
exec), meson's installed tree, and end to end under the real shim.

Run: /usr/bin/python3 -m pytest tests/integration/test_cli.py
(SPYRESHIM_BUILD names the build dir, default <repo>/build.)
"""
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPT = REPO / "scripts" / "spyreshim"
DATA = HERE / "data"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from spyreshim.reading import report as rpt  # noqa: E402
import pythons  # noqa: E402

# Any library that is harmless to preload, for the tests of `run` that only
# look at the environment: the real shim changes nothing for `sh`.
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def cli(*args, env=None, cwd=None):
    e = dict(os.environ)
    e.pop("SPYRESHIM_LIB", None)
    e.update(env or {})
    return subprocess.run([str(SCRIPT)] + [str(a) for a in args], env=e, cwd=cwd,
                          capture_output=True, text=True, timeout=pythons.HANG_S)


def one_line_error(r, status=2):
    assert r.returncode == status, r
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("spyreshim: "), r.stderr
    return lines[0]


# ------------------------------------------------------------------ report

def test_report_lists_groups_largest_first_with_sizes_counts_and_frames():
    r = cli("report", DATA / "leak_single.json")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "==4242==ERROR: spyreshim: detected device memory leaks\n(/usr/bin/python3.11)\n" in out
    first = out.index("Leak of 2097152 B (2.0 MiB) in 2 allocation(s) of simdev memory, "
                      "allocated from:\n")
    second = out.index("Leak of 1048576 B (1.0 MiB) in 1 allocation(s) of cuda memory")
    assert first < second
    # Python frames first, with file:line, then the native ones below them.
    assert "    #0 in make_leak /t/leak.py:12 [python]\n" in out
    assert "    #1 in <module> /t/leak.py:20 [python]\n" in out
    assert ("    #2 0x7f3a2c001234 in Tensor_init simdevmodule.c:88 "
            "(/b/simdev.cpython-311-x86_64-linux-gnu.so+0x1234)\n") in out
    # The interpreter's own frames, by default one frame named after it
    # (issue 48: a library's frames folded); --native-frames=all lists them.
    assert "    #3 [python3.11: 2 frames]\n" in out
    every = cli("report", "--native-frames=all", DATA / "leak_single.json").stdout
    assert "    #3 0x55d0c0a1b2c3 in _PyEval_EvalFrameDefault (/usr/bin/python3.11+0x1b2c3)\n" in every
    # No symbol: object+offset still locate it.
    assert "    #1 0x7f3a2d000900 (/b/libworker.so+0x900)\n" in out
    # Suppressed groups are counted, not listed.
    assert "known_cache_alloc" not in out
    assert "Suppressed: 4096 B (4.0 KiB) in 1 allocation(s) matched suppressions.\n" in out
    assert out.endswith("\nSUMMARY: spyreshim: 3145728 B (3.0 MiB) leaked in 3 allocation(s).\n")


def test_report_show_suppressed_lists_them_marked():
    r = cli("report", "--show-suppressed", DATA / "leak_single.json")
    assert r.returncode == 0, r.stderr
    assert ("Suppressed: 4096 B (4.0 KiB) in 1 allocation(s) of simdev memory, "
            "allocated from:\n") in r.stdout
    assert "in known_cache_alloc (/b/libcache.so+0x10)" in r.stdout


def _groups(text):
    return re.findall(r"^(?:Leak of|Live:) (\d+) B(?: \(.*\))? in (\d+) allocation\(s\) "
                      r"of (\w+) memory(.*)$", text, re.M)


def test_report_merges_identical_stacks_of_several_pids():
    r = cli("report", DATA / "rank0_pid101.json", DATA / "rank1_pid102.json")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "==101,102==ERROR: spyreshim: detected device memory leaks\n" in out
    assert "(merged from 2 reports: identical stacks summed)" in out
    groups = _groups(out)
    # The shared stack (8 MiB in 4 allocations in each rank) once, summed.
    assert groups == [
        ("16777216", "8", "simdev", " in pids 101, 102, allocated from:"),
        ("16777216", "1", "simdev", " in pid 102, allocated from:"),
    ]
    shared = out[out.index("in pids 101, 102"):out.index("in pid 102,")]
    assert "#0 in forward /job/model.py:77 [python]" in shared
    # Load addresses differ between the processes: a merged group shows none.
    assert "0x7f1000091234" not in shared and "0x7f2000091234" not in shared
    assert "in Tensor_init simdevmodule.c:88 (/b/simdev.so+0x1234)" in shared
    assert "SUMMARY: spyreshim: 33554432 B (32.0 MiB) leaked in 9 allocation(s)." in out


def test_report_merge_does_not_depend_on_file_order():
    a = cli("report", DATA / "rank0_pid101.json", DATA / "rank1_pid102.json")
    b = cli("report", DATA / "rank1_pid102.json", DATA / "rank0_pid101.json")
    assert a.returncode == 0, a.stderr
    assert b.returncode == 0, b.stderr
    assert len(_groups(a.stdout)) == 2, a.stdout
    assert sorted(g[:3] for g in _groups(a.stdout)) == sorted(g[:3] for g in _groups(b.stdout))


def test_report_merges_a_file_with_itself_as_two_processes(tmp_path):
    d = json.loads((DATA / "leak_single.json").read_text())
    d["pid"] = 4243
    other = tmp_path / "other.json"
    other.write_text(json.dumps(d))
    r = cli("report", DATA / "leak_single.json", other)
    assert r.returncode == 0, r.stderr
    assert [g[:3] for g in _groups(r.stdout)] == [("4194304", "4", "simdev"),
                                                  ("2097152", "2", "cuda")]
    assert "Suppressed: 8192 B (8.0 KiB) in 2 allocation(s) matched suppressions." in r.stdout


def test_report_top_limits_the_groups_and_says_what_is_left_out():
    r = cli("report", "--top", "1", DATA / "leak_single.json")
    assert r.returncode == 0, r.stderr
    assert len(_groups(r.stdout)) == 1
    assert "... and 1 more group(s): 1048576 B (1.0 MiB) in 1 allocation(s) (--top 1)" in r.stdout
    # The summary still counts everything.
    assert "SUMMARY: spyreshim: 3145728 B (3.0 MiB) leaked in 3 allocation(s)." in r.stdout


def test_report_of_nothing_live(tmp_path):
    p = tmp_path / "empty.json"
    p.write_text(json.dumps({"format": "spyreshim-report", "version": 1, "pid": 7,
                             "reason": "exit", "groups": []}))
    r = cli("report", p)
    assert r.returncode == 0, r.stderr
    assert "==7==spyreshim: no device memory leaks\n" in r.stdout
    assert "SUMMARY: spyreshim: 0 B leaked in 0 allocation(s)." in r.stdout
    assert cli("report", "--fail-on-leaks", p).returncode == 0
    assert cli("report", "--fail-on-leaks", DATA / "leak_single.json").returncode == 1


def test_report_reason_oom_and_group_without_stack(tmp_path):
    p = tmp_path / "oom.json"
    p.write_text(json.dumps({"format": "spyreshim-report", "version": 1, "pid": 9,
                             "reason": "oom", "groups": [
                                 {"bytes": 512, "count": 2, "runtime": "cuda", "frames": []}]}))
    r = cli("report", p)
    assert r.returncode == 0, r.stderr
    assert "==9==spyreshim: live device memory at out-of-memory\n" in r.stdout
    assert ("Live: 512 B in 2 allocation(s) of cuda memory, allocated from:\n"
            "    <no stack recorded>\n") in r.stdout
    assert "SUMMARY: spyreshim: 512 B live in 2 allocation(s)." in r.stdout


BAD_FILES = {
    "missing": (None, "cannot read {p}: No such file or directory"),
    "empty": (b"", "{p}: empty file"),
    "truncated": (b'{"format": "spyreshim-report", "version": 1, "groups": [{"bytes": 1',
                  "{p}: not valid JSON"),
    "not_utf8": (b'{"format": "\xff"}', "{p}: not UTF-8"),
    "not_a_report": (b'{"hello": 1}', "{p}: not a spyreshim report"),
    "nested_too_deep": (b"[" * 100000 + b"]" * 100000, "{p}: not valid JSON (nested too deeply)"),
    "a_list": (b'[1, 2]', "{p}: not a spyreshim report"),
    "newer_version": (b'{"format": "spyreshim-report", "version": 99, "groups": []}',
                      "{p}: report version 99 is newer"),
    "groups_not_list": (b'{"format": "spyreshim-report", "version": 1, "groups": 3}',
                        "{p}: \"groups\": expected a list"),
    "bytes_not_int": (b'{"format": "spyreshim-report", "version": 1, '
                      b'"groups": [{"bytes": "x", "count": 1}]}',
                      "{p}: groups[0].bytes: expected a non-negative integer"),
    "bad_frame_kind": (b'{"format": "spyreshim-report", "version": 1, "groups": '
                       b'[{"bytes": 1, "count": 1, "frames": [{"kind": "java"}]}]}',
                       "{p}: groups[0].frames[0].kind: expected"),
    "line_not_int": (b'{"format": "spyreshim-report", "version": 1, "groups": '
                     b'[{"bytes": 1, "count": 1, "frames": [{"kind": "python", "line": "9"}]}]}',
                     "{p}: groups[0].frames[0].line: expected an integer"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_report_refuses_bad_files_with_one_line(tmp_path, case):
    content, expected = BAD_FILES[case]
    p = tmp_path / (case + ".json")
    if content is not None:
        p.write_bytes(content)
    for args in (["report", p], ["report", DATA / "leak_single.json", p],
                 ["report", "--html", tmp_path / "out.html", p]):
        line = one_line_error(cli(*args))
        assert line.startswith("spyreshim: " + expected.format(p=p)), line
    assert not (tmp_path / "out.html").exists()


def test_report_refuses_a_directory(tmp_path):
    line = one_line_error(cli("report", tmp_path))
    assert "cannot read %s" % tmp_path in line


def test_report_html_to_an_unwritable_place():
    line = one_line_error(cli("report", "--html", "/nonexistent/dir/out.html",
                              DATA / "leak_single.json"))
    assert "cannot write /nonexistent/dir/out.html" in line


def test_report_bad_top_is_a_usage_error():
    r = cli("report", "--top", "zero", DATA / "leak_single.json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--top: expected a positive integer" in r.stderr


def test_report_into_a_closed_pipe_is_quiet():
    p = subprocess.Popen([str(SCRIPT), "report", DATA / "leak_single.json", DATA / "rank0_pid101.json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=pythons.HANG_S)
    assert "Traceback" not in err


def test_size_parser():
    assert rpt.parse_size("4096") == 4096
    assert rpt.parse_size("2G") == 2 << 30
    assert rpt.parse_size("512MiB") == 512 << 20
    assert rpt.parse_size("1MB") == 1 << 20
    assert rpt.parse_size("1.5 k") == 1536
    for bad in ("", "G", "1.2.3", "12X", "-1", "1 G B"):
        with pytest.raises(ValueError):
            rpt.parse_size(bad)


# --------------------------------------------------------------------- run

def _env_of(r):
    return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)


def test_run_sets_preload_and_options_and_passes_the_status(tmp_path):
    supp = tmp_path / "supp.txt"
    supp.write_text("leak:known_cache\n")
    r = cli("run", "--leak-check", "--limit", "2G", "--report", "r-%p.json", "--exitcode", "42",
            "--suppressions", supp, "--stats", "stats.txt", "--log", "debug", "--stack-depth", "16",
            "--", "sh", "-c", "env; exit 7",
            env={"SPYRESHIM_LIB": LIBC, "LD_PRELOAD": "/other/libfoo.so", "PYTHONPATH": "/mine"},
            cwd=tmp_path)
    assert r.returncode == 7, r
    env = _env_of(r)
    # Ours first, the existing preload kept after it.
    assert env["LD_PRELOAD"] == LIBC + ":/other/libfoo.so"
    assert env["SPYRESHIM_LEAK_CHECK"] == "1"
    assert env["SPYRESHIM_LIMIT"] == str(2 << 30)
    # Paths made absolute: the program may change directory.
    assert env["SPYRESHIM_REPORT"] == str(tmp_path / "r-%p.json")
    assert env["SPYRESHIM_EXITCODE"] == "42"
    assert env["SPYRESHIM_SUPPRESSIONS"] == str(supp)
    assert env["SPYRESHIM_STATS"] == str(tmp_path / "stats.txt")
    assert env["SPYRESHIM_LOG"] == "debug"
    assert env["SPYRESHIM_STACK_DEPTH"] == "16"
    # The package, after the program's own entries, for -p spyreshim.pytest_plugin.
    assert env["PYTHONPATH"] == "/mine:" + str(REPO / "spyreshim" / "_child_path")


def test_run_nested_does_not_preload_twice():
    r = cli("run", "--", str(SCRIPT), "run", "--", "sh", "-c", "echo $LD_PRELOAD",
            env={"SPYRESHIM_LIB": LIBC, "LD_PRELOAD": "/a.so /b.so"})
    assert r.returncode == 0, r
    assert r.stdout.strip() == LIBC + ":/a.so:/b.so"


def test_run_does_not_preload_its_library_again_by_another_name(tmp_path):
    # The same file as a symlink and as a path relative to the working
    # directory (which ld.so resolves there): dropped, the others kept.
    lib = tmp_path / "lib" / "libspyreshim.so"
    lib.parent.mkdir()
    shutil.copy(LIBC, lib)
    (tmp_path / "link.so").symlink_to(lib)
    other = "/lib/x86_64-linux-gnu/libm.so.6"
    r = cli("run", "--", "sh", "-c", "echo $LD_PRELOAD", cwd=tmp_path,
            env={"SPYRESHIM_LIB": str(lib),
                 "LD_PRELOAD": "%s:lib/libspyreshim.so %s ./lib/../lib/libspyreshim.so"
                               % (tmp_path / "link.so", other)})
    assert r.returncode == 0, r
    assert r.stdout.strip() == "%s:%s" % (lib, other)


def test_run_sets_only_what_was_asked():
    r = cli("run", "--", "env", env={"SPYRESHIM_LIB": LIBC, "LD_PRELOAD": ""})
    assert r.returncode == 0, r
    env = _env_of(r)
    assert env["LD_PRELOAD"] == LIBC
    assert not [k for k in env if k.startswith("SPYRESHIM_") and k != "SPYRESHIM_LIB"
                and k not in os.environ]


def test_run_report_implies_leak_check():
    r = cli("run", "--report", "/tmp/x.json", "--", "env", env={"SPYRESHIM_LIB": LIBC})
    assert _env_of(r)["SPYRESHIM_LEAK_CHECK"] == "1"


def test_run_execs_the_command_in_place():
    # Same pid: signals, waits and exit statuses are the program's own.
    e = dict(os.environ, SPYRESHIM_LIB=LIBC)
    p = subprocess.Popen([str(SCRIPT), "run", "--", "sh", "-c", "echo $$; kill -TERM $$"],
                         stdout=subprocess.PIPE, text=True, env=e)
    out, _ = p.communicate(timeout=pythons.HANG_S)
    assert int(out.strip()) == p.pid
    assert p.returncode == -15


# What `run` has no use for: it parses its options and execs. The binding
# (ctypes, a thread lock), the readers and the other commands cost every
# launch CPU time when imported.
NOT_FOR_RUN = ("ctypes", "threading", "json", "tempfile", "spyreshim._preloaded",
               "spyreshim.reading.trace", "spyreshim.views.tracepeak", "spyreshim.views.timeline",
               "spyreshim.presets", "spyreshim.cli.doctor", "spyreshim.cli.control")


def test_run_imports_only_what_it_needs():
    # -S: the modules of this interpreter's site (a .pth's) are not ours.
    r = subprocess.run([sys.executable, "-S", "-X", "importtime", str(SCRIPT), "run", "--",
                        "true"], capture_output=True, text=True, timeout=pythons.HANG_S,
                       env=dict(os.environ, SPYRESHIM_LIB=LIBC))
    assert r.returncode == 0, r
    imported = {ln.rsplit("|", 1)[1].strip() for ln in r.stderr.splitlines()
                if ln.startswith("import time:") and "|" in ln}
    assert {"spyreshim", "spyreshim.cli", "argparse"} <= imported, r.stderr
    assert not imported & set(NOT_FOR_RUN), sorted(imported & set(NOT_FOR_RUN))


def test_run_without_double_dash():
    r = cli("run", "sh", "-c", "echo $0 $1", "--report", env={"SPYRESHIM_LIB": LIBC})
    assert r.returncode == 0 and r.stdout.strip() == "--report", r


@pytest.mark.parametrize("args,status,expected", [
    ([], 2, "run: no command given"),
    (["--"], 2, "run: no command given"),
    (["--", "/nonexistent/prog"], 127, "run: cannot run /nonexistent/prog: No such file or directory"),
    (["--", "/etc/passwd"], 126, "run: cannot run /etc/passwd: Permission denied"),
    (["--suppressions", "/nonexistent/supp", "--", "true"], 2,
     "run: --suppressions /nonexistent/supp: no such file"),
])
def test_run_errors_are_one_line(args, status, expected):
    line = one_line_error(cli("run", *args, env={"SPYRESHIM_LIB": LIBC}), status)
    assert line.startswith("spyreshim: " + expected), line


@pytest.mark.parametrize("args,expected", [
    (["--limit", "2X"], "argument --limit: invalid size '2X'"),
    (["--exitcode", "300"], "argument --exitcode: invalid exit code '300'"),
    (["--log", "loud"], "argument --log: invalid choice"),
])
def test_run_bad_options_are_usage_errors(args, expected):
    r = cli("run", *args, "--", "true", env={"SPYRESHIM_LIB": LIBC})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert expected in r.stderr


def test_the_names_the_library_does_not_warn_about_are_the_documented_ones():
    """options.c's `others[]` and docs/configuration.md's "Other
    variables" name the same SPYRESHIM_* variables."""
    code = (REPO / "shim" / "base" / "options.c").read_text()
    code = code[code.index("others[] = {"):]
    code = set(re.findall(r'"(SPYRESHIM_\w+)"', code[:code.index("};")]))
    doc = (REPO / "docs" / "configuration.md").read_text()
    doc = doc[doc.index("## Other variables"):]
    doc = set(re.findall(r"`(SPYRESHIM_\w+)`", doc[:doc.index("The library knows")]))
    assert code == doc and len(code) >= 10, (sorted(code - doc), sorted(doc - code))


@pytest.mark.parametrize("args,line", [
    (["run", "--leakcheck", "--", "sh", "-c", "echo ran"],
     "spyreshim run: error: unrecognized arguments: --leakcheck (did you mean --leak-check?)"),
    (["run", "--leak_check", "sh", "-c", "echo ran"],
     "spyreshim run: error: unrecognized arguments: --leak_check (did you mean --leak-check?)"),
    (["run", "--stack-depht", "8", "--", "sh", "-c", "echo ran"],
     "spyreshim run: error: unrecognized arguments: --stack-depht (did you mean --stack-depth?)"),
    (["run", "--shout", "--", "sh", "-c", "echo ran"],
     "spyreshim run: error: unrecognized arguments: --shout"),
    (["report", "--topp", "3", str(DATA / "leak_single.json")],
     "spyreshim report: error: unrecognized arguments: --topp (did you mean --top?)"),
])
def test_a_misspelt_option_is_one_line_naming_the_option_meant(args, line):
    """Nothing runs; one line (no usage block) with the option a misspelt
    one most likely meant, as git and pip suggest commands."""
    r = cli(*args, env={"SPYRESHIM_LIB": LIBC})
    assert (r.returncode, r.stdout, r.stderr) == (2, "", line + "\n"), r


def test_run_with_spyreshim_lib_missing():
    line = one_line_error(cli("run", "--", "true", env={"SPYRESHIM_LIB": "/nonexistent/lib.so"}))
    assert line == "spyreshim: SPYRESHIM_LIB=/nonexistent/lib.so: no such file"


@pytest.mark.parametrize("name,meant", [
    ("SPYRESHIM_LIMT", "SPYRESHIM_LIMIT"),
    ("SPYRESHIM_LEAKCHECK", "SPYRESHIM_LEAK_CHECK"),
    ("spyreshim_limit", "SPYRESHIM_LIMIT"),
    ("SPYRESHIM-STACK-DEPTH", "SPYRESHIM_STACK_DEPTH"),
    ("SPYRESHIM_GC_TIMEOUT", "SPYRESHIM_GC_TIMEOUT_MS"),
    ("SPYRESHIM_TRACEFILE", "SPYRESHIM_TRACE"),
    ("SPYRESHIM_SHOUT", None),
])
def test_a_name_that_is_no_option_gets_one_warning_naming_the_closest(shim_lib, name, meant):
    """A misspelt SPYRESHIM_* variable is not applied: the shim says so,
    once, in one line, with the option it most likely meant; the program
    runs as it does bare. Variables of spyreshim's tools are not options
    and get nothing; SPYRESHIM_LOG=off silences it."""
    base = {k: v for k, v in os.environ.items()
            if k != "LD_PRELOAD" and not k.lower().startswith("spyreshim")}
    argv = ["sh", "-c", "echo ran; exit 5"]
    bare = subprocess.run(argv, env=dict(base, **{name: "1"}), capture_output=True, text=True,
                          timeout=pythons.HANG_S)
    r = subprocess.run(argv, env=dict(base, LD_PRELOAD=str(shim_lib), **{name: "1"}),
                       capture_output=True, text=True, timeout=pythons.HANG_S)
    assert (r.returncode, r.stdout) == (bare.returncode, bare.stdout) == (5, "ran\n"), r
    if meant:
        want = "spyreshim: warning: %s is not an option (did you mean %s?); ignored" % (name,
                                                                                       meant)
    else:
        want = ("spyreshim: warning: %s is not an option; ignored (SPYRESHIM_LOG=debug lists "
                "the options)" % name)
    assert r.stderr.splitlines() == [want], r.stderr
    quiet = subprocess.run(argv, env=dict(base, LD_PRELOAD=str(shim_lib), SPYRESHIM_LOG="off",
                                          SPYRESHIM_LIB="x", SPYRESHIM_NO_NUMPY="1",
                                          **{name: "1"}),
                           capture_output=True, text=True, timeout=pythons.HANG_S)
    assert quiet.stderr == "", quiet
    ours = subprocess.run(argv, env=dict(base, LD_PRELOAD=str(shim_lib), SPYRESHIM_LIB="x",
                                         SPYRESHIM_BUILD="x", SPYRESHIM_PRESETS="torch",
                                         SPYRESHIM_NO_NUMPY="1", SPYRESHIM_LIMIT="1G"),
                          capture_output=True, text=True, timeout=pythons.HANG_S)
    assert ours.stderr == "", ours


def stack_depth_defaults():
    """SPYRESHIM_STACK_DEPTH's defaults as the C code has them."""
    text = (REPO / "shim" / "base" / "stackdepth.h").read_text()
    return tuple(int(re.search(r"#define SHIM_STACK_DEPTH_DEFAULT%s (\d+)" % s, text).group(1))
                 for s in ("", "_PYTHON"))


def test_run_help_gives_the_librarys_stack_depth_defaults(shim_lib):
    """--stack-depth's help says the defaults the library uses, read from
    the one header both use: the library's own table says the same."""
    native, python = stack_depth_defaults()
    r = cli("run", "--help")
    assert r.returncode == 0, r
    assert "(default %d, %d once Python frames are recorded)" % (native, python) in \
        " ".join(r.stdout.split()), r.stdout
    dump = subprocess.run(["true"], env=dict(os.environ, LD_PRELOAD=str(shim_lib),
                                             SPYRESHIM_LOG="debug"),
                          capture_output=True, text=True, timeout=pythons.HANG_S).stderr
    assert "SPYRESHIM_STACK_DEPTH=0  # native frames recorded per allocation (and Python " \
           "frames at most); 0 = %d, or %d once" % (native, python) in dump, dump


def test_version_is_meson_builds():
    want = re.search(r"project\(\s*'spyreshim'[^)]*?\bversion\s*:\s*'([^']+)'",
                     (REPO / "meson.build").read_text()).group(1)
    for argv in ([str(SCRIPT), "--version"], [sys.executable, "-m", "spyreshim", "--version"]):
        r = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=pythons.HANG_S)
        assert r.returncode == 0 and r.stdout.strip() == "spyreshim " + want, r


def test_doctor_in_a_checkout(tmp_path, shim_lib):
    # The configured build folder ($SPYRESHIM_BUILD, else build/): the
    # checkout's launcher finds it there, as the tests do.
    r = cli("doctor", env={"LD_PRELOAD": ""})
    assert r.returncode == 0, r
    assert "libspyreshim.so  %s" % shim_lib in r.stdout, r.stdout
    assert "loads (preloaded into" in r.stdout, r.stdout
    assert "\n  OpenCL " in r.stdout, "every runtime the shim serves is listed"
    # simdev, a name of this project's: its row says what it is, found or not.
    simdev = re.search(r"^  simdev +(.*)$", r.stdout, re.M).group(1)
    assert "simulated device, for trying the shim without a GPU" in simdev, simdev
    # A library that does not load: the loader's reason, status 1.
    bad = tmp_path / "bad.so"
    bad.write_bytes(b"not an ELF file")
    r = cli("doctor", env={"SPYRESHIM_LIB": str(bad)})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r
    assert "does not load: " in r.stdout, r.stdout


def _copy_tree(dst):
    (dst / "scripts").mkdir(parents=True)
    shutil.copy2(SCRIPT, dst / "scripts" / "spyreshim")
    shutil.copytree(REPO / "spyreshim", dst / "spyreshim",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dst / "scripts" / "spyreshim"


def test_run_finds_the_build_dir_next_to_the_script(tmp_path):
    script = _copy_tree(tmp_path / "repo")
    r = subprocess.run([str(script), "run", "--", "true"], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "SPYRESHIM_LIB"})
    line = one_line_error(r)
    assert "cannot find libspyreshim.so (looked in: %s)" % (tmp_path / "repo/build/libspyreshim.so") in line
    (tmp_path / "repo" / "build").mkdir()
    shutil.copy(LIBC, tmp_path / "repo" / "build" / "libspyreshim.so")
    r = subprocess.run([str(script), "run", "--", "sh", "-c", "echo $LD_PRELOAD"],
                       capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items()
                            if k not in ("SPYRESHIM_LIB", "LD_PRELOAD")})
    assert r.returncode == 0, r
    assert r.stdout.strip() == str(tmp_path / "repo" / "build" / "libspyreshim.so")


def test_meson_install_puts_script_package_and_library_together(tmp_path):
    """The installed launcher finds the installed package and library,
    relative to itself (here under a DESTDIR)."""
    if not shutil.which("meson"):
        pythons.need("meson", "meson is not installed")
    src = tmp_path / "src"
    _copy_tree(src)
    for f in ("meson.build", "version.py.in"):
        (src / "scripts" / f).write_text((REPO / "scripts" / f).read_text())
    (src / "shim" / "base").mkdir(parents=True)
    shutil.copy2(REPO / "shim" / "base" / "stackdepth.h", src / "shim" / "base")
    shutil.copy2(REPO / "meson_options.txt", src / "meson_options.txt")
    # A stand-in project around scripts/: the real one needs the whole build.
    (src / "meson.build").write_text(
        "project('t', 'c', meson_version: '>=1.0', version: '7.8.9')\n"
        "shared_library('spyreshim', 'empty.c', install: true)\n"
        "subdir('scripts')\n")
    (src / "empty.c").write_text("int spyreshim_test_empty;\n")
    b = tmp_path / "b"
    for argv in (["meson", "setup", "--prefix=/opt/sps", "--libdir=lib/x", b, src],
                 ["meson", "install", "-C", b, "--destdir", tmp_path / "dest"]):
        r = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                           timeout=pythons.HANG_S)
        assert r.returncode == 0, r.stdout + r.stderr
    root = tmp_path / "dest" / "opt" / "sps"
    script = root / "bin" / "spyreshim"
    assert os.access(script, os.X_OK)
    assert (root / "share/spyreshim/python/spyreshim/pytest_plugin.py").is_file()
    env = {k: v for k, v in os.environ.items() if k not in ("SPYRESHIM_LIB", "LD_PRELOAD", "PYTHONPATH")}
    r = subprocess.run([str(script), "run", "--", "sh", "-c", "echo $LD_PRELOAD; echo $PYTHONPATH"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r
    pkg = root / "share/spyreshim/python/spyreshim"
    assert r.stdout.split() == [str(root / "lib/x/libspyreshim.so"), str(pkg / "_child_path")]
    # The version meson wrote into the installed package.
    r = subprocess.run([str(script), "--version"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "spyreshim 7.8.9", r
    r = subprocess.run([str(script), "report", DATA / "leak_single.json"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0 and "SUMMARY: spyreshim: 3145728 B (3.0 MiB)" in r.stdout, r
    # --stack-depth's defaults, from the header installed beside the package.
    assert (pkg / "stackdepth.h").read_text() == (REPO / "shim/base/stackdepth.h").read_text()
    r = subprocess.run([str(script), "run", "--help"], capture_output=True, text=True, env=env)
    assert "(default %d, %d once Python frames are recorded)" % stack_depth_defaults() in \
        " ".join(r.stdout.split()), r.stdout


# ------------------------------------------------------ end to end, real shim

LEAKY = textwrap.dedent("""\
    import ctypes
    import simdev

    def make_leak(n):
        t = simdev.Tensor(n)                   # LEAK LINE
        # A reference leak, as a buggy extension makes: the tensor outlives
        # the interpreter's finalization.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))

    def clean():
        t = simdev.Tensor(4 << 20)
        del t

    def main():
        for _ in range(3):
            make_leak(1 << 20)
        clean()

    main()
    """)
LEAK_LINE = 1 + LEAKY.splitlines().index(
    [ln for ln in LEAKY.splitlines() if "LEAK LINE" in ln][0])



@pytest.fixture(scope="module")
def real_shim():
    """(pythons module, interpreter, simdev module dir) for Debian's python3.11."""
    assert pythons.shim_lib().exists(), "%s is not built" % pythons.shim_lib()
    interp = pythons.get("cpython3.11-static").require()
    return pythons, interp, pythons.build_module(interp)


def _run_leaky(real_shim, tmp_path, *cli_args):
    pythons, interp, moddir = real_shim
    (tmp_path / "leaky.py").write_text(LEAKY)
    env = pythons.module_env(interp, env={"SPYRESHIM_LIB": str(pythons.shim_lib())},
                             simdev_memory="1G")
    return subprocess.run([str(SCRIPT), "run"] + [str(a) for a in cli_args] +
                          ["--", interp.exe, str(tmp_path / "leaky.py")],
                          capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=pythons.HANG_S)


def test_e2e_run_leak_check_reports_the_leak(real_shim, tmp_path):
    r = _run_leaky(real_shim, tmp_path, "--leak-check=held", "--report", tmp_path / "r-%p.json")
    assert r.returncode == 23, r           # LeakSanitizer's default
    files = list(tmp_path.glob("r-*.json"))
    assert len(files) == 1, (files, r.stderr)
    pid = int(files[0].stem[2:])
    rep = cli("report", files[0])
    assert rep.returncode == 0, rep.stderr
    out = rep.stdout
    assert "==%d==ERROR: spyreshim: detected device memory leaks" % pid in out
    groups = _groups(out)
    assert [g[:3] for g in groups] == [("3145728", "3", "simdev")], out
    # The caller of simdevMalloc: the module's Tensor constructor.
    assert re.search(r"#\d+ 0x[0-9a-f]+ in Tensor_\w+ \S*simdevmodule\.c:\d+ \(\S+simdev\S+\.so\+0x", out), out
    assert "SUMMARY: spyreshim: 3145728 B (3.0 MiB) leaked in 3 allocation(s)." in out
    # The HTML of the same file carries the same stack.
    h = cli("report", "--html", tmp_path / "r.html", files[0])
    assert h.returncode == 0, h.stderr
    page = (tmp_path / "r.html").read_text()
    assert "3145728 B (3.0 MiB)" in page and "simdevmodule.c" in page


@pytest.mark.parametrize("cache", ["cache", "a b/cache"], ids=["cache", "cache-with-space"])
def test_run_installed_under_a_folder_with_a_space_still_preloads(real_shim, tmp_path, cache):
    """The package with its library (the wheel's layout) under "my envs/":
    ld.so splits LD_PRELOAD at spaces, so `run` preloads it through a link
    whose path has none (in the cache folder, else under /tmp when the
    cache's own path has a space); the leak is found, as from a folder
    without one, and the link stays for the program's later execs."""
    pythons, interp, moddir = real_shim
    site = tmp_path / "my envs" / "site-packages"
    shutil.copytree(REPO / "spyreshim", site / "spyreshim",
                    ignore=shutil.ignore_patterns("__pycache__"))
    lib = site / "spyreshim" / "libspyreshim.so"
    shutil.copy2(pythons.shim_lib(), lib)
    (tmp_path / "leaky.py").write_text(LEAKY + textwrap.dedent("""\
        import os, subprocess, sys
        print(os.environ["LD_PRELOAD"])
        subprocess.run([sys.executable, "-c", "import simdev; simdev.Tensor(1 << 20)"],
                       check=True)
        """))
    env = pythons.module_env(interp, env={}, simdev_memory="1G")
    for k in ("SPYRESHIM_LIB", "SPYRESHIM_BUILD", "LD_PRELOAD"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    env["XDG_CACHE_HOME"] = str(tmp_path / cache)
    r = subprocess.run([sys.executable, "-m", "spyreshim", "run", "--leak-check=held", "--report",
                        tmp_path / "r-%p.json", "--", interp.exe, tmp_path / "leaky.py"],
                       capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=pythons.HANG_S)
    assert r.returncode == 23, r
    assert "ERROR: spyreshim: detected device memory leaks" in r.stderr, r
    preload = r.stdout.split()[0]
    assert " " not in preload and os.path.realpath(preload) == str(lib), preload
    if " " in cache:
        assert preload.startswith("/tmp/spyreshim-%d/preload/" % os.getuid()), preload
    else:
        assert preload.startswith(str(tmp_path / cache / "spyreshim" / "preload")), preload
    assert os.path.islink(preload)
    # The program and its child each wrote a report: both ran under the shim.
    assert len(list(tmp_path.glob("r-*.json"))) == 2, r.stderr


def test_a_library_that_cannot_be_linked_to_is_refused_in_one_line(tmp_path, monkeypatch):
    from spyreshim.cli import launch
    lib = tmp_path / "a b" / "libspyreshim.so"
    lib.parent.mkdir()
    lib.write_bytes(b"")
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(launch, "_link_dirs", lambda: iter([(str(tmp_path / "file" / "x"), None)]))
    with pytest.raises(launch.PreloadError) as e:
        launch.compose_preload(str(lib), None)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(lib) + ": ld.so splits LD_PRELOAD at spaces "
                                               "and colons"), msg
    assert msg.endswith("install spyreshim in a folder without them"), msg
    assert launch.compose_preload(str(tmp_path / "lib.so"), "/a.so") == "%s:/a.so" % (
        tmp_path / "lib.so")


def test_e2e_report_has_the_python_function_and_line(real_shim, tmp_path):
    r = _run_leaky(real_shim, tmp_path, "--leak-check=held", "--report", tmp_path / "r-%p.json")
    assert r.returncode == 23, r
    out = cli("report", *tmp_path.glob("r-*.json")).stdout
    leaky = tmp_path / "leaky.py"
    m = re.search(r"#(\d+) in make_leak %s:%d \[python\]" % (re.escape(str(leaky)), LEAK_LINE), out)
    assert m, out
    assert re.search(r"#%d in main %s:\d+ \[python\]" % (int(m.group(1)) + 1, re.escape(str(leaky))),
                     out), out
    # True call order: the extension's native frames above (inner to) the
    # Python frames that called it; the interpreter's frames below folded.
    frames = re.findall(r"^    #\d+ .*$", out, re.M)
    kinds = ["python" if f.endswith("[python]") else "native" for f in frames]
    assert kinds == sorted(kinds, key=lambda k: k != "native"), frames
    assert "native" in kinds and "Tensor" in frames[0]


def test_e2e_run_exitcode_is_configurable(real_shim, tmp_path):
    r = _run_leaky(real_shim, tmp_path, "--leak-check=held", "--exitcode", "5")
    assert r.returncode == 5, r
    # The shim's own text report at exit, on stderr.
    assert "SUMMARY: spyreshim: 3145728 B (3.0 MiB) leaked in 3 allocation(s)." in r.stderr
    r = _run_leaky(real_shim, tmp_path)      # no leak check: the program's own status
    assert r.returncode == 0, r


def test_e2e_a_program_that_fails_keeps_its_status(real_shim, tmp_path):
    """A Python program that leaks and then fails on its own (an uncaught
    exception: status 1; sys.exit(4)): its status, not the leak verdict's;
    the report is given as always, and one line says the status is kept."""
    pythons, interp, moddir = real_shim
    env = pythons.module_env(interp, env={"SPYRESHIM_LIB": str(pythons.shim_lib())},
                             simdev_memory="1G")
    for tail, status in (("raise RuntimeError('no')\n", 1), ("import sys; sys.exit(4)\n", 4),
                         ("", 23)):
        (tmp_path / "fails.py").write_text(LEAKY + tail)
        bare = subprocess.run([interp.exe, "fails.py"], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=pythons.HANG_S)
        r = subprocess.run([str(SCRIPT), "run", "--leak-check=held", "--", interp.exe,
                            "fails.py"], capture_output=True, text=True, env=env, cwd=tmp_path,
                           timeout=pythons.HANG_S)
        assert r.returncode == status and bare.returncode == (status if tail else 0), (r, bare)
        assert r.stdout == bare.stdout, (r, bare)
        assert "SUMMARY: spyreshim: 3145728 B (3.0 MiB) leaked in 3 allocation(s)." in r.stderr, r
        kept = [ln for ln in r.stderr.splitlines() if "kept (leaks would" in ln]
        assert kept == ([] if status == 23 else [
            "spyreshim: the program exits with status %d, kept (leaks would have made it "
            "SPYRESHIM_EXITCODE=23)" % status]), r.stderr


RANKS = textwrap.dedent("""\
    import ctypes
    import subprocess
    import sys

    import simdev

    def leak(n):
        t = simdev.Tensor(n)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))

    def rank1_only():
        leak(2 << 20)

    if len(sys.argv) > 1:          # a worker, as torchrun starts them
        leak(1 << 20)
        if sys.argv[1] == "1":
            rank1_only()
    else:
        ranks = [subprocess.Popen([sys.executable, __file__, str(r)]) for r in range(2)]
        print(" ".join(str(p.pid) for p in ranks))
        sys.exit(max(p.wait() for p in ranks))
    """)


def test_e2e_one_report_per_process_merged(real_shim, tmp_path):
    pythons, interp, moddir = real_shim
    (tmp_path / "ranks.py").write_text(RANKS)
    env = pythons.module_env(interp, env={"SPYRESHIM_LIB": str(pythons.shim_lib())},
                             simdev_memory="1G")
    r = subprocess.run([str(SCRIPT), "run", "--leak-check=held", "--report", tmp_path / "r-%p.json", "--",
                        interp.exe, tmp_path / "ranks.py"],
                       capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=pythons.HANG_S)
    assert r.returncode == 23, r       # the workers' verdict, passed on by the launcher
    ranks = [int(p) for p in r.stdout.split()]
    files = {int(f.stem[2:]): f for f in tmp_path.glob("r-*.json")}
    assert set(ranks) <= set(files), (ranks, files, r.stderr)
    rep = cli("report", *[files[p] for p in sorted(files)])
    assert rep.returncode == 0, rep.stderr
    out = rep.stdout
    assert "(merged from %d reports: identical stacks summed)" % len(files) in out
    assert "SUMMARY: spyreshim: 4194304 B (4.0 MiB) leaked in 3 allocation(s)." in out
    # The worker's common leak, once, from both pids.
    both = " in pids %d, %d, allocated from:" % tuple(sorted(ranks))
    assert any(g[3] == both for g in _groups(out)), out
    assert [g[:3] for g in _groups(out)] == [(str(2 << 20), "2", "simdev"),
                                             (str(2 << 20), "1", "simdev")], out
    assert "in rank1_only %s:" % (tmp_path / "ranks.py") in out


OOM = textwrap.dedent("""\
    import simdev

    held = []

    def hold(n):
        held.append(simdev.Tensor(n))          # HOLD LINE

    try:
        for _ in range(100):
            hold(8 << 20)
    except Exception as e:
        print("OOM", type(e).__name__)
    held.clear()
    """)


def test_e2e_what_held_memory_at_out_of_memory(real_shim, tmp_path):
    """The shim's OOM report file (<report>.oom) through `report` and the page."""
    pythons, interp, moddir = real_shim
    (tmp_path / "oom.py").write_text(OOM)
    env = pythons.module_env(interp, env={"SPYRESHIM_LIB": str(pythons.shim_lib())},
                             simdev_memory="1G")
    r = subprocess.run([str(SCRIPT), "run", "--leak-check", "--limit", "64M",
                        "--report", tmp_path / "o-%p.json", "--", interp.exe, tmp_path / "oom.py"],
                       capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=pythons.HANG_S)
    assert r.returncode == 0 and r.stdout.startswith("OOM"), r
    oom = list(tmp_path.glob("o-*.json.oom"))
    assert len(oom) == 1, (list(tmp_path.iterdir()), r.stderr)
    out = cli("report", oom[0]).stdout
    assert "spyreshim: live device memory at out-of-memory" in out
    # Whatever fitted under the limit, all of it from hold().
    groups = _groups(out)
    assert len(groups) == 1, out
    nbytes, count = int(groups[0][0]), int(groups[0][1])
    assert 1 <= count <= 8 and nbytes == count * (8 << 20), out
    line = 1 + OOM.splitlines().index([ln for ln in OOM.splitlines() if "HOLD LINE" in ln][0])
    assert re.search(r"#\d+ in hold %s:%d \[python\]" % (re.escape(str(tmp_path / "oom.py")), line),
                     out), out
    h = cli("report", "--html", tmp_path / "oom.html", oom[0])
    assert h.returncode == 0, h.stderr
    assert "at out-of-memory" in (tmp_path / "oom.html").read_text()


def test_report_decides_from_the_first_bytes_in_bounded_memory(tmp_path):
    # A 1 GiB file (sparse: zeros) took 2.1 GB to be refused, /dev/zero ran
    # until memory ran out: both are one line now, within 512 MiB of
    # address space, as is a file of white space.
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(1 << 30)
    spaces = tmp_path / "spaces.json"
    spaces.write_bytes(b" " * (1 << 20) + b"{}")

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))
    for p, why in ((big, "it begins with b'\\x00"), ("/dev/zero", "it begins with b'\\x00"),
                   (spaces, "only white space in its first 65536 bytes")):
        r = subprocess.run([sys.executable, str(SCRIPT), "report", str(p)], capture_output=True,
                           text=True, timeout=pythons.HANG_S, preexec_fn=cap)
        line = one_line_error(r)
        assert line.startswith("spyreshim: %s: not a spyreshim report (%s" % (p, why)), line


@pytest.mark.parametrize("content", [b"hello\n", b'{"hello": 1}', b"\x7fELF\x02\x01",
                                     b"\x1f\x8b\x08\x00"])
def test_report_of_a_file_neither_report_nor_trace_says_what_it_expected(tmp_path, content):
    p = tmp_path / "x.bin"
    p.write_bytes(content)
    line = one_line_error(cli("report", p))
    assert line.startswith("spyreshim: %s: not a spyreshim report (" % p), line
    assert line.endswith("expected a leak report or snapshot (JSON with \"format\": "
                         "\"spyreshim-report\", written by --report, SPYRESHIM_REPORT or "
                         "spyreshim snapshot) or a trace (written by --trace; it begins with "
                         "SPYTRACE)"), line


def test_sizes_read_one_way(tmp_path):
    """Every size: its bytes, then from 1 KiB its binary-unit reading; the
    text report, the HTML page and the views share the one formatter."""
    from spyreshim.reading.units import format_size
    assert format_size(268435456) == "268435456 B (256.0 MiB)"
    assert format_size(512) == "512 B" and format_size(0) == "0 B"
    assert format_size(1536) == "1536 B (1.5 KiB)"
    assert format_size(3 << 40) == "3298534883328 B (3.0 TiB)"
    r = cli("report", DATA / "leak_single.json")
    sizes = re.findall(r"(\d+) B(?: \(([\d.]+ [KMGT]iB)\))?", r.stdout)
    assert sizes and all(format_size(int(n)) == ("%s B (%s)" % (n, u) if u else "%s B" % n)
                         for n, u in sizes), r.stdout
    assert "byte(s)" not in r.stdout and "bytes" not in r.stdout, r.stdout
