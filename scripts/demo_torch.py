"""An MLP trained with real PyTorch on the simulated accelerator (simdev),
through the PrivateUse1 device of tests/torch/simdev_torch, with the
reference cycles real training scripts make:

  - a forward hook whose closure keeps the layer's output and refers to
    itself (the hook stays reachable from the dict it writes into);
  - a dict of the step's tensors that refers to itself ("metrics");
  - a logged exception whose traceback holds the step's frame, whose locals
    hold the exception (the inputs, logits and loss of that step).

With Python's cyclic collector disabled (--gc enables it) those cycles are
freed by nobody: without spyreshim the device fills up and PyTorch raises
out-of-memory at a step this script prints; with LD_PRELOAD=libspyreshim.so
the shim collects them when the device is full and the run completes.

    SIMDEV_MEMORY=16M PYTHONPATH=build/tests/torch \\
        [LD_PRELOAD=build/libspyreshim.so] /usr/bin/python3 scripts/demo_torch.py

--device cpu runs the same training on the CPU (the losses are bit-for-bit
those of the simdev run: the device computes with PyTorch's CPU kernels);
--losses FILE writes every step's loss as JSON. Exit status 1 on
out-of-memory.
"""
import argparse
import gc
import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # deterministic CPU kernels, before torch
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import spyreshim  # noqa: E402  (the ctypes wrapper of the public API; never loads the shim)

MiB = 1 << 20
IN, HIDDEN, CLASSES = 256, 256, 10


class LossSpike(Exception):
    pass


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, CLASSES))


def batches(batch):
    """The same batches on every device: drawn on the CPU from one seed."""
    g = torch.Generator().manual_seed(1)
    centers = torch.randn(CLASSES, IN, generator=g)
    while True:
        y = torch.randint(0, CLASSES, (batch,), generator=g)
        x = centers[y] + 3.0 * torch.randn(batch, IN, generator=g)
        yield x, y


def watch(layer, store):
    """A forward hook as debugging code writes them: it keeps the last
    output in `store`, and `store` keeps the hook (to remove it later), so
    store -> hook -> closure -> store is a cycle holding the activation."""
    def hook(module, inputs, output):
        store["activation"] = output
        store["hook"] = hook
    return layer.register_forward_hook(hook)


def check(loss, step, log):
    """A numerical check that raises on spikes; the handler logs the
    exception and keeps it: exception -> traceback -> this frame -> `log`
    -> exception, holding `loss` (and through it the step's graph)."""
    try:
        if step % 4 == 0:
            raise LossSpike(f"loss {loss.item():.4f} at step {step}")
    except LossSpike as e:
        log.append(e)


def train_step(model, opt, x, y, step):
    store = {}
    handle = watch(model[2], store)
    logits = model(x)
    handle.remove()
    loss = F.cross_entropy(logits, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    metrics = {"loss": loss.detach(), "logits": logits.detach(), "inputs": x}
    metrics["history"] = metrics             # a dict that refers to itself
    check(loss, step, [])
    return loss.item()


def device_use():
    """Bytes in use on simdev, from the runtime itself (None on the CPU)."""
    import ctypes
    try:
        lib = ctypes.CDLL("libsimdev.so", mode=os.RTLD_NOLOAD)
    except OSError:
        return None
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    if lib.simdevMemGetInfo(ctypes.byref(free), ctypes.byref(total)) != 0:
        return None
    return total.value - free.value, total.value


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["simdev", "cpu"], default="simdev")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    ap.add_argument("--gc", action="store_true", help="leave Python's cyclic collector enabled")
    ap.add_argument("--losses", help="write every step's loss to this file (JSON)")
    ap.add_argument("--every", type=int, default=50, help="print every N steps")
    a = ap.parse_args(argv)

    if a.device == "simdev":
        import simdev_torch
        dev = simdev_torch.device
    else:
        dev = torch.device("cpu")
    if not a.gc:
        gc.disable()
    model = make_model().to(dev)
    if a.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    use = device_use() if a.device == "simdev" else None
    print(f"demo_torch: {a.steps} steps of a {IN}-{HIDDEN}-{HIDDEN}-{CLASSES} MLP, batch "
          f"{a.batch}, {a.optimizer}, on {dev}"
          + (f" ({use[1] / MiB:.0f} MiB)" if use else "")
          + ("" if a.gc else ", gc.disable()d"), flush=True)
    losses = []
    data = batches(a.batch)
    t0 = time.monotonic()
    for step in range(1, a.steps + 1):
        x, y = next(data)
        try:
            losses.append(train_step(model, opt, x.to(dev), y.to(dev), step))
        except RuntimeError as e:
            if "out of memory" not in str(e):
                raise
            use = device_use()
            print(f"step {step}: out of device memory: {str(e).splitlines()[0]}"
                  + (f" ({use[0] / MiB:.1f} of {use[1] / MiB:.0f} MiB in use, most of it "
                     f"unreachable cycles)" if use else ""), flush=True)
            return 1
        if step % a.every == 0 or step == 1:
            print(f"step {step:4d}: loss {losses[-1]:.6f}", flush=True)
    dt = time.monotonic() - t0
    print(f"demo_torch: completed {a.steps} steps in {dt:.2f} s ({a.steps / dt:.1f} steps/s); "
          f"final loss {losses[-1]:.6f}")
    if a.losses:
        with open(a.losses, "w") as f:
            json.dump([float(v).hex() for v in losses], f)
    if spyreshim.available():
        s = spyreshim.stats()
        print(f"spyreshim: {s['pressure_events']} pressure events, {s['gc_collections']} "
              f"collections ({s['gc_time_ns'] / 1e6:.1f} ms), "
              f"{s['gc_recovered_bytes'] / MiB:.1f} MiB recovered, "
              f"{s['failed_allocs']} failed allocations, peak "
              f"{s['peak_used_bytes'] / MiB:.1f} MiB used")
    return 0


if __name__ == "__main__":
    sys.exit(main())
