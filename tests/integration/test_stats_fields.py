"""The statistics fields exist once: the SPYRESHIM_STATS_FIELDS X-macro in
spyreshim.h makes the C struct and the JSON; the Python package and the
statistics reference (docs/report-format.md, "Statistics") must list the
same fields, in the struct's order for the package (its ctypes Structure
mirrors the C layout)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from spyreshim import _preloaded  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))
import pythons  # noqa: E402


def header_fields():
    text = (REPO / "shim/include/spyreshim.h").read_text()
    block = text[text.index("#define SPYRESHIM_STATS_FIELDS(X)"):]
    block = block[:block.index("\n\n")]
    return re.findall(r"X\((\w+),", block)


def test_python_package_lists_the_header_fields_in_order():
    assert _preloaded.STATS_FIELDS == header_fields()


def test_docs_name_every_field():
    text = (REPO / "docs/report-format.md").read_text()
    text = text[text.index("## Statistics"):]
    missing = [f for f in header_fields() if f"`{f}`" not in text
               and not (f.startswith("gc_") and "`gc_*`" in text)]
    assert not missing


def test_stats_json_has_every_field(tmp_path):
    build = Path(os.environ.get("SPYRESHIM_BUILD", REPO / "build"))
    out = tmp_path / "s.json"
    env = dict(os.environ, LD_PRELOAD=str(build / "libspyreshim.so"),
               SPYRESHIM_STATS=str(out), SIMDEV_MEMORY="64M")
    subprocess.run([str(build / "tests/simdev_ops"), "a:1M", "f"], env=env,
                   check=True, capture_output=True, timeout=pythons.HANG_S)
    stats = json.loads(out.read_text())
    for f in header_fields():
        assert isinstance(stats[f], int), f
    assert stats["allocs"] >= 1 and stats["frees"] >= 1


def test_each_runtimes_entry_counts_its_own_allocations_and_frees(tmp_path):
    # Three allocations and one free: unequal, so swapped fields show.
    build = Path(os.environ.get("SPYRESHIM_BUILD", REPO / "build"))
    out = tmp_path / "s.json"
    env = dict(os.environ, LD_PRELOAD=str(build / "libspyreshim.so"),
               SPYRESHIM_STATS=str(out), SIMDEV_MEMORY="64M")
    subprocess.run([str(build / "tests/simdev_ops"), "a:1M", "a:2M", "a:1M", "f"], env=env,
                   check=True, capture_output=True, timeout=pythons.HANG_S)
    stats = json.loads(out.read_text())
    (rt,) = stats["runtimes"]
    assert rt["name"] == "simdev"
    assert (rt["allocs"], rt["frees"]) == (3, 1), rt
    assert (stats["allocs"], stats["frees"]) == (3, 1), stats
    assert rt["used_bytes"] == stats["used_bytes"] == 3 << 20, rt
    assert rt["peak_used_bytes"] == stats["peak_used_bytes"] == 4 << 20, rt
    assert rt["reserved_bytes"] == stats["reserved_bytes"] >= rt["used_bytes"], rt
    assert rt["peak_reserved_bytes"] >= rt["reserved_bytes"], rt
    assert rt["pressure_events"] == stats["pressure_events"] == 0, rt
    assert rt["arenas"] == stats["arenas"] >= 1, rt
