"""How long `spyreshim snapshot PID` stops the program: a process with N
live simdev blocks (default 100,000) under the shim (SPYRESHIM_CONTROL=1,
SPYRESHIM_LEAK_CHECK=1), one of its threads allocating and freeing in a
loop (build/bench/snapshot_target); each snapshot is asked through the
CLI's client (spyreshim.cli.control) and timed three ways:

  held    the shim's own figure (the answer's longest_ns): the longest
          time one arena lock was held while the live records were copied
          (they are copied one arena at a time); an allocating thread can
          be stopped only inside such a hold
  cpu     the same hold in the copying thread's CPU time (longest_cpu_ns),
          which a busy machine's preemption does not inflate
  pair    the longest allocation+free pair of the allocating thread during
          the snapshot, against the longest in as long a time without one
          (baseline): what the program saw
  total   the whole request as the CLI sees it (the report is built and
          sent after the locks are released, on the shim's thread)

A benchmark: it prints numbers and asserts nothing.

    python3 bench/snapshot_pause.py [--blocks 100000] [--repeat 5] [--build build]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from spyreshim.cli import control  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=100000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--build", default=os.environ.get("SPYRESHIM_BUILD",
                                                      os.path.join(HERE, "..", "build")))
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    env = dict(os.environ, LD_PRELOAD=os.path.join(build, "libspyreshim.so"),
               SPYRESHIM_CONTROL="1", SPYRESHIM_LEAK_CHECK="1", SPYRESHIM_EXITCODE="0",
               SIMDEV_MEMORY="1G")
    p = subprocess.Popen([os.path.join(build, "bench", "snapshot_target"), str(a.blocks)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    pid = int(p.stdout.readline().split()[1])

    def cmd(c):
        p.stdin.write(c + "\n")
        p.stdin.flush()
        return p.stdout.readline().strip()

    held, cpu, pair, base, total = [], [], [], [], []
    for _ in range(a.repeat):
        cmd("reset")
        t0 = time.monotonic()
        figures, text = control.take(pid, 60)
        dt = time.monotonic() - t0
        pair.append(int(cmd("max")))
        assert figures["blocks"] >= a.blocks, figures
        held.append(figures["longest_ns"])
        cpu.append(figures["longest_cpu_ns"])
        total.append(dt * 1e9)
        cmd("reset")
        time.sleep(dt)
        base.append(int(cmd("max")))
    p.stdin.write("quit\n")
    p.stdin.close()
    p.wait()

    def ms(v):
        return "median %.2f ms, max %.2f ms" % (statistics.median(v) / 1e6, max(v) / 1e6)
    print("snapshot of %d live blocks, %d times (report of %d bytes):" % (
        a.blocks, a.repeat, len(text)))
    print("  held  (longest allocator lock hold, the shim's): %s" % ms(held))
    print("  cpu   (the same hold, CPU time):                 %s" % ms(cpu))
    print("  pair  (longest alloc+free during the snapshot):  %s" % ms(pair))
    print("  base  (longest alloc+free, as long without one): %s" % ms(base))
    print("  total (the request, as the CLI waits for it):    %s" % ms(total))


if __name__ == "__main__":
    main()
