"""The preload library in real processes: programs linked against the
simulated device, the simdev Python module (a runtime in a local scope),
unrelated programs, bad configuration."""
import json
import os

import pytest

import pythons


def ops(*args, env=None, preload=True):
    exe = pythons.builddir() / "tests" / "simdev_ops"
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SIMDEV_MEMORY": "1G"}
    if preload:
        full["LD_PRELOAD"] = str(pythons.shim_lib())
    full.update(env or {})
    return pythons.run([str(exe), *args], env=full)


def stats_of(tmp_path, *args, env=None):
    path = tmp_path / "stats.json"
    r = ops(*args, env={"SPYRESHIM_STATS": str(path), **(env or {})})
    r.check()
    return r, json.loads(path.read_text())


def test_programs_that_never_touch_a_device_stay_silent(shim_lib):
    for argv in (["ls", "/"], ["/usr/bin/python3.11", "-c", "pass"], ["python3", "-c", "pass"]):
        r = pythons.run(argv, env={"PATH": os.environ["PATH"], "LD_PRELOAD": str(shim_lib)})
        assert r.returncode == 0, r
        assert r.stderr == "", r


def test_the_shim_never_loads_a_runtime(shim_lib):
    r = pythons.run(["/usr/bin/python3.11", "-c", "print(open('/proc/self/maps').read())"],
                    env={"LD_PRELOAD": str(shim_lib)})
    r.check()
    assert "libspyreshim.so" in r.stdout
    assert "cudart" not in r.stdout and "libsimdev" not in r.stdout


def test_allocations_are_served_by_the_shim(tmp_path, shim_lib):
    r, s = stats_of(tmp_path, *["a:1M"] * 20, "F", "i")
    assert "freeall corrupt=0" in r.stdout
    for key in ("reserved_bytes", "used_bytes", "peak_reserved_bytes", "peak_used_bytes",
                "allocs", "frees", "pressure_events"):
        assert key in s
    assert s["allocs"] == 20 and s["frees"] == 20
    assert s["used_bytes"] == 0
    assert s["peak_used_bytes"] == 20 << 20
    assert s["regions_reserved"] < 20  # regions, not one runtime call per block


def test_limit_caps_what_is_served(tmp_path, shim_lib):
    r, s = stats_of(tmp_path, "fill:1M", "i", env={"SPYRESHIM_LIMIT": "64M"})
    filled = int(r.stdout.split("filled ")[1].split()[0])
    assert filled == 64, r.stdout
    assert "rc=2" in r.stdout.split("filled ")[1].splitlines()[0]
    info = [l for l in r.stdout.splitlines() if l.startswith("info")][0]
    total = int(info.split("total=")[1])
    free = int(info.split("free=")[1].split()[0])
    assert total == 64 << 20 and free <= total
    assert s["peak_reserved_bytes"] <= 64 << 20


def test_double_free_is_reported_and_rejected(shim_lib):
    r = ops("a:1M", "a:2M", "f", "d", "a:4M", "F")
    assert r.returncode == 0, r
    assert "doublefree rc=1" in r.stdout
    assert "freeall corrupt=0" in r.stdout
    lines = [l for l in r.stderr.splitlines() if "invalid free" in l]
    assert len(lines) == 1 and "double free" in lines[0] and "region" in lines[0], r.stderr


def test_invalid_free_warnings_are_rate_limited_and_counts_stay_exact(tmp_path, shim_lib):
    r, s = stats_of(tmp_path, "a:1M", "f", *["d"] * 30)
    lines = [l for l in r.stderr.splitlines() if "invalid free" in l]
    assert len(lines) == 11, r.stderr
    assert all("double free" in l for l in lines[:10]), r.stderr
    assert "further invalid frees not reported" in lines[10], r.stderr
    assert s["invalid_frees"] == 30


def test_fork_child_allocates_and_frees(shim_lib):
    r = ops("a:1M", "fork", "F")
    assert r.returncode == 0, r
    assert "child ok" in r.stdout and "fork status=0" in r.stdout


@pytest.mark.parametrize("name,value", [
    ("SPYRESHIM_LIMIT", "lots"),
    ("SPYRESHIM_LOG", "loud"),
    ("SPYRESHIM_GC_TIMEOUT_MS", "-5"),
    ("SPYRESHIM_PRESSURE_ROUNDS", "999"),
    ("SPYRESHIM_REGION_SIZE", "12"),
])
def test_bad_variable_warns_once_and_runs(shim_lib, name, value):
    r = ops("a:1M", "F", env={name: value})
    assert r.returncode == 0, r
    warnings = [l for l in r.stderr.splitlines() if name in l]
    assert len(warnings) == 1, r.stderr
    assert "default" in warnings[0]


@pytest.mark.parametrize("name", ["SPYRESHIM_LIMIT", "SPYRESHIM_REGION_SIZE"])
@pytest.mark.parametrize("value", ["9223372036854775808", "8388608T", "18446744073709551615",
                                   "99999999999999999999"])
def test_a_size_of_2_to_the_63_or_more_is_too_large(shim_lib, name, value):
    r = ops("a:1M", "F", env={name: value})
    assert r.returncode == 0, r
    assert r.stderr.count("\n") == 1, r.stderr
    assert name in r.stderr and "too large" in r.stderr, r.stderr
    assert "minimum" not in r.stderr, r.stderr


def test_a_value_with_a_newline_warns_on_one_line(shim_lib):
    r = ops("a:1M", "F", env={"SPYRESHIM_LIMIT": "1M\nX", "SPYRESHIM_LOG": "lo\nud"})
    assert r.returncode == 0, r
    lines = r.stderr.splitlines()
    assert len(lines) == 2, r.stderr
    assert any('SPYRESHIM_LIMIT="1M\\nX"' in l for l in lines), r.stderr
    assert any('SPYRESHIM_LOG="lo\\nud"' in l for l in lines), r.stderr


def test_info_log_prints_one_summary_line(shim_lib):
    r = ops("a:1M", "F", env={"SPYRESHIM_LOG": "info"})
    r.check()
    lines = [l for l in r.stderr.splitlines() if l.startswith("spyreshim:")]
    assert len(lines) == 1 and "1 allocs" in lines[0], r.stderr


def test_same_program_without_the_shim_runs_alone():
    r = ops("a:1M", "fill:1M", "F", preload=False)
    r.check()
    assert "freeall corrupt=0" in r.stdout


@pytest.mark.parametrize("name", ["cpython3.11-shared", "cpython3.11-static"])
def test_python_module_in_a_local_scope_is_intercepted(tmp_path, name, shim_lib):
    interp = pythons.get(name).require()
    stats = tmp_path / "s.json"
    r = pythons.run_python(interp, source=(
        "import simdev\n"
        "ts = [simdev.Tensor(1 << 20) for _ in range(8)]\n"
        "ts[0].write(b'x' * 16)\n"
        "assert ts[0].read()[:16] == b'x' * 16\n"
        "free, total = simdev.mem_info()\n"
        "assert total == 64 << 20 and free <= total - (8 << 20), (free, total)\n"
        "del ts\n"),
        simdev_memory="1G", env={"SPYRESHIM_STATS": str(stats), "SPYRESHIM_LIMIT": "64M"})
    r.check()
    s = json.loads(stats.read_text())
    assert s["allocs"] == 8 and s["frees"] == 8


def stats_warnings(r):
    return [l for l in r.stderr.splitlines() if "SPYRESHIM_STATS" in l]


def test_stats_into_a_fifo_never_blocks(tmp_path, shim_lib):
    fifo = tmp_path / "stats.fifo"
    os.mkfifo(fifo)
    # No reader (a plain open for writing would block forever), then a
    # reader that waits (the write would block once the pipe is full).
    r = ops("a:1M", env={"SPYRESHIM_STATS": str(fifo)})
    assert not r.timed_out and r.returncode == 0, r
    assert len(stats_warnings(r)) == 1 and "not a regular file" in r.stderr, r.stderr
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        r = ops("a:1M", env={"SPYRESHIM_STATS": str(fifo)})
        assert not r.timed_out and r.returncode == 0, r
        assert len(stats_warnings(r)) == 1 and "not a regular file" in r.stderr, r.stderr
        try:
            got = os.read(reader, 1)
        except BlockingIOError:
            got = b""
        assert got == b"", "nothing was written into the FIFO"
    finally:
        os.close(reader)


def test_stats_never_overwrite_a_hard_link_or_another_users_file(tmp_path, shim_lib):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = tmp_path / "stats.json"
    os.link(victim, link)
    r = ops("a:1M", env={"SPYRESHIM_STATS": str(link)})
    assert r.returncode == 0, r
    assert len(stats_warnings(r)) == 1 and "other links" in r.stderr, r.stderr
    assert victim.read_text() == "precious"
    if os.geteuid() != 0:
        return  # giving a file to another user needs root
    other = tmp_path / "other.json"
    other.write_text("theirs")
    os.chown(other, 65534, 65534)
    r = ops("a:1M", env={"SPYRESHIM_STATS": str(other)})
    assert r.returncode == 0, r
    assert len(stats_warnings(r)) == 1 and "another user" in r.stderr, r.stderr
    assert other.read_text() == "theirs"


@pytest.mark.parametrize("path", ["/dev/full", "/proc/version", "/dev/null"])
def test_stats_into_a_device_or_proc_file_gives_one_warning(shim_lib, path):
    r = ops("a:1M", env={"SPYRESHIM_STATS": path})
    assert not r.timed_out and r.returncode == 0, r
    w = stats_warnings(r)
    assert len(w) == 1 and path in w[0], r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
