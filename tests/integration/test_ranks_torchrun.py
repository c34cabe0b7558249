"""Two ranks under torchrun (issue 49): PyTorch 2.x's venv, gloo on the CPU
for the gradients' all-reduce, the model on the simdev device, rank 1 given
a smaller device, training that leaves reference cycles with gc.disable().
Bare, the small rank runs out of memory and the job fails; under the shim,
both as `spyreshim run -- torchrun ...` and as `torchrun --no-python
spyreshim run -- python ...`, every rank completes and computes what the
bare job computes where memory suffices, and each rank's trace carries its
rank."""
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import pythons  # noqa: E402
import torchrun  # noqa: E402

sys.path.insert(0, str(HERE.parents[1]))
from spyreshim.reading import trace as tr  # noqa: E402

TRAIN = textwrap.dedent("""\
    import gc
    import json
    import os
    import sys

    rank = int(os.environ["RANK"])
    # The program's own choice, before the device starts: one rank smaller.
    if os.environ.get("SMALL_RANK") == str(rank):
        os.environ["SIMDEV_MEMORY"] = os.environ["SMALL_MEMORY"]

    import torch
    import torch.distributed as dist
    import simdev_torch

    dev = simdev_torch.device
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    gc.disable()
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512).to(dev)           # 1 MiB of weight
    x = torch.randn(64, 512).to(dev) * (rank + 1)
    for step in range(24):
        out = model(x)
        loss = out.sum()
        loss.backward()                                  # 1 MiB of gradient
        for p in model.parameters():
            g = p.grad.cpu()
            dist.all_reduce(g)                           # gloo, on the CPU
            with torch.no_grad():
                p -= 1e-4 * (g / world).to(dev)
        # A cycle that holds the step's activations and gradient: only a
        # collection frees it.
        d = {"out": out, "grad": model.weight.grad}
        d["self"] = d
        model.weight.grad = None
        model.bias.grad = None
        del out, loss, d
    w = model.weight.detach().cpu()
    # One write of the whole line: both workers share torchrun's stdout,
    # and print's text and newline, written apart, interleaved there.
    os.write(1, (json.dumps({"rank": rank, "sum": float(w.double().sum()),
                             "preload": os.environ.get("LD_PRELOAD", "")}) + "\\n").encode())
    dist.destroy_process_group()
    """)

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


@pytest.fixture(scope="module")
def venv():
    torchrun.require("2")
    exe = Path(torchrun.PYTHON).parent / "torchrun"
    if not exe.exists():
        pythons.need("torch2", "the 2.x venv has no torchrun")
    return exe


def _launch(tmp_path, argv, preload=None, small="16M"):
    (tmp_path / "train.py").write_text(TRAIN)
    env = {"SMALL_RANK": "1", "SMALL_MEMORY": small, "SPYRESHIM_LIB": str(pythons.shim_lib()),
           "OMP_NUM_THREADS": "1"}
    if preload:
        env["LD_PRELOAD"] = preload
    e = torchrun.env(simdev_memory="1G", **env)
    if not preload:
        e.pop("LD_PRELOAD", None)
    return pythons.run(argv, env=e, cwd=tmp_path)


def _torchrun(venv, *rest):
    return [str(venv), "--standalone", "--nproc_per_node=2", "--max_restarts=0", *rest]


def _results(r):
    out = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    return {o["rank"]: o for o in out}


def test_two_ranks_bare_fail_under_the_shim_complete(venv, tmp_path):
    ample = _launch(tmp_path, _torchrun(venv, "train.py"), small="1G")
    assert ample.returncode == 0, ample
    want = {k: v["sum"] for k, v in _results(ample).items()}
    assert sorted(want) == [0, 1], ample.stdout

    bare = _launch(tmp_path, _torchrun(venv, "train.py"))
    assert bare.returncode != 0, bare
    assert "OutOfMemoryError" in bare.stderr and "simdev: out of memory" in bare.stderr, bare

    # The shim above the launcher, its workers under it; another preload
    # of the user's kept after it.
    r = _launch(tmp_path, [str(torchrun.SCRIPT), "run", "--trace", "--", *_torchrun(
        venv, "train.py")], preload=LIBC)
    assert r.returncode == 0, r
    got = _results(r)
    assert {k: v["sum"] for k, v in got.items()} == want, (got, want)
    for v in got.values():
        assert v["preload"].split(":") == [str(pythons.shim_lib()), LIBC], v
    ranks = {}
    for p in tmp_path.glob("spyreshim-*.trace"):
        t = tr.stream(p)
        if "rank" in t.process:
            assert p.name.endswith(".rank%d.trace" % t.process["rank"]), p
            assert t.process["world_size"] == 2 and t.process["local_rank"] == t.process["rank"]
            ranks[t.process["rank"]] = p
    assert sorted(ranks) == [0, 1], list(tmp_path.iterdir())
    small, big = tr.load(ranks[1]), tr.load(ranks[0])
    assert small.process["run_id"] == big.process["run_id"]
    # The small rank's shim collected garbage to go on: its trace says so.
    assert tr.GC in set(small.kind), "no collection on the small rank"
    # The cross-rank report names the small rank as the one with least room.
    rep = pythons.run([str(torchrun.SCRIPT), "report", str(ranks[0]), str(ranks[1])])
    assert rep.returncode == 0, rep
    assert "least headroom: rank 1, " in rep.stdout and "of 16777216 B (16.0 MiB)" in rep.stdout, rep.stdout
    assert "first OOM:      none" in rep.stdout, rep.stdout


def test_the_launcher_runs_spyreshim_per_worker(venv, tmp_path):
    r = _launch(tmp_path, _torchrun(venv, "--no-python", str(torchrun.SCRIPT), "run",
                                    "--trace", "w-%r.trace", "--", torchrun.PYTHON, "train.py"))
    assert r.returncode == 0, r
    got = _results(r)
    assert sorted(got) == [0, 1], r.stdout
    assert sorted(p.name for p in tmp_path.glob("w-*.trace")) == ["w-0.trace", "w-1.trace"]
