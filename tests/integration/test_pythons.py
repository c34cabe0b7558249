"""The shared test infrastructure itself (pythons.py): the interpreter
matrix is complete and honest, and a runaway script cannot hang the run."""
import os
import signal
import struct
import time
from pathlib import Path

import pythons


def test_every_expected_interpreter_is_reported():
    names = [i.name for i in pythons.interpreters()]
    assert names == list(pythons.NAMES)
    for i in pythons.interpreters():
        if i.available:
            assert os.access(i.exe, os.X_OK), i
            assert i.kind in ("cpython", "pypy") and len(i.version) == 3, i
            assert i.ext_suffix.endswith(".so") and os.path.isdir(i.include), i
        else:
            assert isinstance(i.skip_reason, str) and i.skip_reason, i


def test_flags_match_the_names():
    for i in pythons.interpreters():
        if not i.available:
            continue
        assert i.free_threaded == i.name.endswith("t"), i
        assert i.kind == ("pypy" if i.name.startswith("pypy") else "cpython"), i
        if i.name == "cpython3.11-shared":
            assert not i.static, i
        if i.name in ("cpython3.11-dbg", "cpython3.14-dbg"):
            assert i.debug, i
        if i.name in pythons.DEBIAN_UNSTABLE:
            # Debian's static executables, with unstable's own C library
            # and a libpython next to it for embedders.
            assert i.static and i.loader and os.path.exists(i.loader), i
            assert os.path.exists(i.libpython), i
            assert len(i.include_dirs) == 2, i
        if i.kind == "cpython":
            assert i.name.startswith("cpython%d.%d" % i.version[:2]), i


def elf_needed(path):
    """DT_NEEDED of a 64-bit little-endian ELF file, read from its dynamic
    segment (no binutils needed)."""
    data = Path(path).read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, path
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []              # a fully static executable
    def offset(vaddr):
        for v, o, n in loads:
            if v <= vaddr < v + n:
                return o + vaddr - v
        raise AssertionError(f"{path}: address {vaddr:#x} in no segment")
    needed, strtab = [], None
    for i in range(0, dynamic[1], 16):
        tag, val = struct.unpack_from("<qQ", data, dynamic[0] + i)
        if tag == 0:
            break
        if tag == 1:
            needed.append(val)
        elif tag == 5:
            strtab = offset(val)
    return [data[strtab + n:data.index(b"\0", strtab + n)].decode() for n in needed]


def test_the_static_interpreter_has_no_libpython():
    i = {i.name: i for i in pythons.interpreters()}["cpython3.11-static"]
    if not i.available:
        return
    assert i.static, i
    needed = elf_needed(os.path.realpath(i.exe))
    assert needed and "libc.so.6" in needed, needed
    assert not [n for n in needed if n.startswith("libpython")], needed
    shared = {i.name: i for i in pythons.interpreters()}["cpython3.11-shared"]
    if shared.available:  # the control: the shared build does need it
        assert [n for n in elf_needed(os.path.realpath(shared.exe)) if n.startswith("libpython")]


def test_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "grandchild"
    res = pythons.run(["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"], timeout=2)
    assert res.timed_out and res.returncode == -signal.SIGKILL, res.describe()
    pid = int(pidfile.read_text())
    for _ in range(100):             # the kernel reaps it asynchronously
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(") ")[1].startswith("Z"):
                break                # a zombie is dead too
        time.sleep(0.05)
    else:
        raise AssertionError(f"grandchild {pid} survived the timeout")


def test_run_python_environment(interpreter, tmp_path):
    res = pythons.run_python(interpreter, """
import os, sys, simdev
print(os.environ.get("LD_PRELOAD", "-"), os.environ["SIMDEV_MEMORY"], os.environ["EXTRA"])
print(simdev.mem_info()[1])
""", preload=False, simdev_memory="2M", env={"EXTRA": "x"})
    res.check()
    lines = res.stdout.split("\n")
    assert lines[0] == "- 2M x", res.describe()
    assert lines[1] == str(2 << 20), res.describe()
