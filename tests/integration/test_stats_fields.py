"""The statistics fields exist once: the SPYRESHIM_STATS_FIELDS X-macro in
spyreshim.h makes the C struct and the JSON; the Python package and the
README must list the same fields, in the struct's order for the package
(its ctypes Structure mirrors the C layout)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "package"))
import spyreshim  # noqa: E402


def header_fields():
    text = (REPO / "shim/include/spyreshim.h").read_text()
    block = text[text.index("#define SPYRESHIM_STATS_FIELDS(X)"):]
    block = block[:block.index("\n\n")]
    return re.findall(r"X\((\w+),", block)


def test_python_package_lists_the_header_fields_in_order():
    assert spyreshim._STATS_FIELDS == header_fields()


def test_readme_names_every_field():
    readme = (REPO / "README.md").read_text()
    missing = [f for f in header_fields() if f"`{f}`" not in readme
               and not (f.startswith("gc_") and "`gc_*`" in readme)]
    assert not missing


def test_stats_json_has_every_field(tmp_path):
    build = Path(os.environ.get("SPYRESHIM_BUILD", REPO / "build"))
    out = tmp_path / "s.json"
    env = dict(os.environ, LD_PRELOAD=str(build / "libspyreshim.so"),
               SPYRESHIM_STATS=str(out), SIMDEV_MEMORY="64M")
    subprocess.run([str(build / "tests/simdev_ops"), "a:1M", "f"], env=env,
                   check=True, capture_output=True, timeout=60)
    stats = json.loads(out.read_text())
    for f in header_fields():
        assert isinstance(stats[f], int), f
    assert stats["allocs"] >= 1 and stats["frees"] >= 1
