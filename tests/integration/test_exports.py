"""What libspyreshim.so exports: the public API of shim/include/spyreshim.h
and the entry points it intercepts, nothing else (no test code in the
product). The allow-list is read from the sources that declare each one,
so a new entry point is one edit:
- the API: every SPYRESHIM_API declaration in spyreshim.h;
- the runtimes' entry points: the X-macro tables (`*_ENTRY_POINTS(X)`) of
  hooks/*.c, the functions hooks/*.c define with EXPORT, and the global
  symbols of hooks/*.S (dlsym).
And the functions only tests and benchmarks link (alloc_inspect, the
hooks of the test build) are not in the library at all, exported or not.
"""
import re
import shutil
import subprocess

import pytest

import pythons

REPO = pythons.REPO


def nm(*args):
    tool = shutil.which("nm")
    if not tool:
        pytest.fail("nm (binutils) is missing: scripts/deps.sh installs it")
    r = subprocess.run([tool, *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def defined(nm_output, kinds="TDBRVWi"):
    """Names of the defined symbols in `nm` output, of the given kinds
    (upper case: global)."""
    out = set()
    for line in nm_output.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in kinds:
            out.add(parts[2].split("@")[0])
    return out


def api_names():
    text = (REPO / "shim/include/spyreshim.h").read_text()
    return set(re.findall(r"^SPYRESHIM_API\b[^;(]*?\b(spyreshim_\w+)\s*\(", text, re.M))


def entry_point_names():
    names = set()
    for src in sorted((REPO / "hooks").glob("*.c")):
        text = src.read_text()
        # The hook tables: #define FOO_ENTRY_POINTS(X) X(ROLE, name) ...
        for table in re.finditer(r"#define\s+\w+_ENTRY_POINTS\(X\)((?:.*\\\n)*.*)", text):
            names |= set(re.findall(r"\bX\(\s*\w+\s*,\s*(\w+)\s*\)", table.group(1)))
        # Entry points served by functions of their own.
        names |= set(re.findall(r"^EXPORT\b[^;(]*?\b(\w+)\s*\(", text, re.M))
    for src in sorted((REPO / "hooks").glob("*.S")):
        names |= set(re.findall(r"^\s*\.globl\s+(\w+)", src.read_text(), re.M))
    return names


def test_the_allow_list_is_read_from_the_sources():
    api, entries = api_names(), entry_point_names()
    # What the sources say today, so that a parser gone blind fails here.
    assert {"spyreshim_register_pressure_callback", "spyreshim_get_stats",
            "spyreshim_snapshot_take"} <= api
    assert {"simdevMalloc", "simdevFree", "simdevMemGetInfo", "cudaMalloc", "cudaFree",
            "cuMemAlloc_v2", "cuMemFree_v2", "cuGetProcAddress_v2", "dlsym",
            "clCreateBuffer", "clReleaseMemObject", "clSVMAlloc"} <= entries


def test_the_library_exports_the_api_and_the_entry_points_only(shim_lib):
    exported = defined(nm("-D", "--defined-only", shim_lib))
    allowed = api_names() | entry_point_names()
    extra = sorted(exported - allowed)
    missing = sorted(allowed - exported)
    assert not extra, f"exported but neither API (spyreshim.h) nor an entry point: {extra}"
    assert not missing, f"declared but not exported: {missing}"


def test_test_only_functions_are_not_in_the_library(builddir, shim_lib):
    symbols = nm("--defined-only", shim_lib)
    if not symbols.strip():
        pythons.need("symbol-table", f"{shim_lib} is stripped: its static symbol table is gone "
                    "(the export list is checked above)")
    inspect = builddir / "shim" / "alloc" / "liballoc_inspect.a"
    test_only = defined(nm("--defined-only", inspect), kinds="T")
    # The hook of the test build (libspyreshim_testhooks.so).
    test_only.add("spyreshim_test_publishing")
    assert "shim_arena_check" in test_only, "alloc_inspect no longer holds the arena's check"
    inside = sorted(test_only & defined(symbols, kinds="TtDdBbRr"))
    assert not inside, f"test-only code in {shim_lib.name}: {inside}"
