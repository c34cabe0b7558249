"""Training scripts modelled on pytorch/examples (tests/torch_examples/
train.py: mnist, an LSTM language model, a small transformer, a ResNet) on
the simdev device, on PyTorch 1.13 and 2.x (torchrun.VERSIONS):

  - the device's losses equal the CPU's: bit for bit for mnist, resnet and
    the transformer (the device runs the CPU's kernels, LayerNorm's and
    attention's included), to float rounding for the LSTM (PyTorch takes
    CUDA's path on an out-of-tree device: the fused LSTM cell, the input
    projection per step, the biases added in the cell, where the CPU
    projects the whole sequence with its bias at once: the sums round in
    another order);
  - with each step's activations in a reference cycle and gc.disable(), a
    small SIMDEV_MEMORY runs out at a step before the last without the shim
    (the cycle-free run fits), and completes with LD_PRELOAD=libspyreshim.so
    with the cycle-free run's losses, bit for bit.

Run with -s for the table of steps reached (the closing note's figures)."""
import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torchrun  # noqa: E402

TRAIN = torchrun.REPO / "tests" / "torch_examples" / "train.py"
STEPS = 8
# model: (SIMDEV_MEMORY, batch, relative tolerance against the CPU; 0: exact)
MODELS = {
    "mnist": ("56M", 16, 0),
    "lstm": ("4M", 32, 1e-5),
    "transformer": ("6M", 32, 0),
    "resnet": ("4M", 16, 0),
}


@pytest.fixture(scope="module", autouse=True, params=torchrun.VERSIONS)
def torch_here(request, builddir, shim_lib):
    return torchrun.require(request.param)


def train(model, tmp_path, device, tag, cycles=False, steps=STEPS, **env):
    memory, batch, _ = MODELS[model] if model in MODELS else ("1G", None, None)
    out = tmp_path / f"{tag}.json"
    args = [model, "--device", device, "--steps", str(steps), "--losses", out]
    if batch:
        args += ["--batch", str(batch)]
    if device == "simdev":
        args += ["--import", "simdev_torch"]
    if cycles:
        args.append("--cycles")
    r = torchrun.run(path=TRAIN, args=args, simdev_memory=memory, SPYRESHIM_LOG="warn", **env)
    m = re.search(r"^step (\d+): out of device memory: (.*)$", r.stdout, re.M)
    done = re.search(r"^train: completed (\d+) steps\b", r.stdout, re.M)
    steps = int(done.group(1)) if done else (int(m.group(1)) - 1 if m else None)
    losses = json.loads(out.read_text()) if out.exists() else None
    return r, steps, losses


@pytest.mark.parametrize("model", sorted(MODELS))
def test_example_on_the_device_equals_the_cpu_and_the_shim_rescues_its_cycles(model, tmp_path):
    memory, batch, tolerance = MODELS[model]
    r, steps, cpu = train(model, tmp_path, "cpu", "cpu")
    assert r.returncode == 0 and steps == STEPS, r
    r, steps, dev = train(model, tmp_path, "simdev", "device")
    assert r.returncode == 0 and steps == STEPS, r
    if tolerance:
        a, b = [float.fromhex(x) for x in dev], [float.fromhex(x) for x in cpu]
        assert a == pytest.approx(b, rel=tolerance), (dev, cpu)
    else:
        assert dev == cpu
    # Without the shim the cycles fill the device before the last step.
    r, bare_steps, _ = train(model, tmp_path, "simdev", "bare", cycles=True)
    assert r.returncode == 1, r
    assert "out of device memory: simdev: out of memory" in r.stdout, r.stdout
    assert bare_steps is not None and 0 < bare_steps < STEPS, r.stdout
    # With it every step runs, as if there were no cycles.
    r, shim_steps, shim = train(model, tmp_path, "simdev", "shim", cycles=True, preload=True)
    assert r.returncode == 0 and shim_steps == STEPS, r
    assert shim == dev
    print(f"\n{torchrun.VERSION:>4} {model:<12} SIMDEV_MEMORY={memory:<4} batch {batch:<3} "
          f"steps of {STEPS} with cycles: without the shim {bare_steps} (out of memory at "
          f"step {bare_steps + 1}), with it {shim_steps}")


# Programs whose losses are compared with the CPU's only: model: (steps,
# relative tolerance; 0: exact). mnist_rnn's LSTM rounds as the lstm model's.
COMPARED = {"forward_forward": (40, 0), "vae": (8, 0), "mnist_rnn": (8, 1e-5),
            "regression": (20, 0)}


def warning_lines(stderr):
    """The Python warnings a run printed (their message lines)."""
    return sorted(line.split("Warning: ", 1)[1] for line in stderr.splitlines()
                  if "Warning: " in line)


@pytest.mark.parametrize("model", sorted(COMPARED))
def test_example_losses_on_the_device_equal_the_cpu(model, tmp_path):
    """forward_forward builds each layer's optimizer before moving the layer
    to the device: it trains the device's parameters only where .to() keeps
    the Parameter objects (else its loss stays at its first value)."""
    steps, tolerance = COMPARED[model]
    r, done, cpu = train(model, tmp_path, "cpu", "cpu", steps=steps)
    assert r.returncode == 0 and done == steps, r
    cpu_warnings = warning_lines(r.stderr)
    r, done, dev = train(model, tmp_path, "simdev", "device", steps=steps)
    assert r.returncode == 0 and done == steps, r
    # No warning the CPU's run does not give (the reducing losses' out=
    # path warned on every F.smooth_l1_loss and F.mse_loss on the device).
    assert warning_lines(r.stderr) == cpu_warnings, r.stderr
    a, b = [float.fromhex(x) for x in dev], [float.fromhex(x) for x in cpu]
    if tolerance:
        assert a == pytest.approx(b, rel=tolerance), (dev, cpu)
    else:
        assert dev == cpu
    assert b[-1] < b[0], b
    # The shim serves the device's memory and changes nothing computed.
    r, done, shim = train(model, tmp_path, "simdev", "shim", steps=steps, preload=True)
    assert r.returncode == 0 and done == steps, r
    assert shim == dev
    print(f"\n{torchrun.VERSION:>4} {model:<16} {steps} steps, loss {b[0]:.4f} -> {b[-1]:.4f} "
          f"on the CPU, largest relative difference on the device "
          f"{max(abs(x - y) / abs(y) for x, y in zip(a, b)):.1e}")
