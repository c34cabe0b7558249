"""The cost of the leak report's "collections" section (what each collection
run for a pressure event freed, by allocation site: shim/leak/collections.c),
beyond the collection itself: with leak checking on, each measured event
fills the simulated device with unreachable reference cycles holding
tensors and requests one more; the shim collects, and the request succeeds
(as bench/gc_latency.py's inline path). `event` is that request's wall time,
`collect` the time inside gc.collect() (the shim's gc_time_ns counter),
`overhead` the difference, which holds the section's two copies of the live
records per collection. Run with the library before and after the section
to compare, with LIVE long-lived small blocks (their records are what the
copies walk). A benchmark: it prints numbers and asserts nothing.

    python3 bench/gc_collections_cost.py --lib build/libspyreshim.so [--lib OTHER.so] \\
        [--live 0 100000] [--repeat 15]

Each run's own figure, from its exit report (`collections.runs[].cost_ns`),
is printed as `section` (median per collection, wall time) and `cpu` (the
collecting thread's CPU time on it, which a busy machine does not inflate;
both absent before the section).
"""
import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def child(live, repeat):
    import simdev
    sys.path.insert(0, os.path.join(HERE, ".."))
    import spyreshim
    gc.disable()
    keep = [simdev.Tensor(256) for _ in range(live)]

    def fill():
        while simdev.mem_info()[0] >= MiB:
            t = simdev.Tensor(MiB)
            t.me = t
            del t

    rows = []
    for _ in range(repeat):
        fill()
        before = spyreshim.stats()
        t0 = time.perf_counter_ns()
        t = simdev.Tensor(MiB)
        wall = time.perf_counter_ns() - t0
        after = spyreshim.stats()
        del t
        if after["gc_collections"] == before["gc_collections"] + 1:
            rows.append((wall, after["gc_time_ns"] - before["gc_time_ns"]))
    print(json.dumps(rows))
    del keep


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", action="append", required=True)
    ap.add_argument("--live", type=int, nargs="*", default=[0, 100000])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--simdev", default=os.path.join(HERE, "..", "build", "tests", "simdev"),
                    help="the folder of the simdev module (default build/tests/simdev)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        return child(a.child, a.repeat)
    print("gc_collections_cost: leak checking on, median of %d events (ms)" % a.repeat)
    print("%-40s %8s %9s %9s %9s %9s %9s" % ("library", "live", "event", "collect",
                                              "overhead", "section", "cpu"))
    for lib in a.lib:
        for live in a.live:
            with tempfile.TemporaryDirectory() as tmp:
                rep = os.path.join(tmp, "r.json")
                env = dict(os.environ, LD_PRELOAD=os.path.abspath(lib), SIMDEV_MEMORY="128M",
                           SPYRESHIM_LEAK_CHECK="1", SPYRESHIM_EXITCODE="0",
                           SPYRESHIM_REPORT=rep, PYTHONPATH=os.path.abspath(a.simdev))
                p = subprocess.run([sys.executable, os.path.abspath(__file__), "--lib", lib,
                                    "--child", str(live), "--repeat", str(a.repeat)],
                                   env=env, capture_output=True, text=True)
                if p.returncode != 0:
                    sys.exit("gc_collections_cost: the run failed:\n" + p.stderr[-2000:])
                rows = json.loads(p.stdout.splitlines()[-1])
                with open(rep) as f:
                    c = json.load(f).get("collections")
            if not rows:
                print("%-40s %8d  (no clean measurement)" % (lib[-40:], live))
                continue
            ms = lambda v: "%9.3f" % (statistics.median(v) / 1e6)  # noqa: E731
            have = c and c["runs"]
            section = ms([r["cost_ns"] for r in c["runs"]]) if have else "%9s" % "-"
            cpu = ms([r["cost_cpu_ns"] for r in c["runs"]]) if have else "%9s" % "-"
            print("%-40s %8d %s %s %s %s %s" % (lib[-40:], live, ms([r[0] for r in rows]),
                                               ms([r[1] for r in rows]),
                                               ms([r[0] - r[1] for r in rows]), section, cpu))


if __name__ == "__main__":
    main()
