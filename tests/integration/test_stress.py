"""Threads allocating under constant pressure while a pressure callback
empties a framework-style cache (tests/programs/pressure_stress.c): blocks
are never handed out twice, the callback's lock order holds, nothing hangs.
scripts/tsan_gc.sh runs this file under ThreadSanitizer too, where a race or
a lock-order inversion fails it."""
import json

import pytest

import gc_support
import pythons


@pytest.mark.parametrize("arenas", ["1", "4"])
def test_threads_with_a_cache_emptied_by_the_callback(shim_lib, tmp_path, arenas):
    """With one arena, and with up to four (threads that contend move to
    arenas of their own: pressure events, frees across arenas and the
    shared limit all under load)."""
    stats = tmp_path / "stats.json"
    env = {"SIMDEV_MEMORY": "48M", "SPYRESHIM_STATS": str(stats),
           "SPYRESHIM_ARENAS": arenas, **gc_support.preload_env(shim_lib)}
    iters = "600" if gc_support.tsan_runtime() else "4000"
    r = pythons.run([str(pythons.builddir() / "tests" / "pressure_stress"), "4", iters],
                    env=env)
    assert r.returncode == 0, r
    assert "corrupt=0" in r.stdout, r
    s = json.loads(stats.read_text())
    assert s["pressure_events"] > 0 and s["callback_runs"] > 0, s
    assert s["used_bytes"] == 0 and s["allocs"] == s["frees"], s
    assert 1 <= s["arenas"] <= int(arenas), s
    assert [d["arenas"] for d in s["runtimes"]] == [s["arenas"]], s
    assert s["peak_reserved_bytes"] <= 48 << 20, s
