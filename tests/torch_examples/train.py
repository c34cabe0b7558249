"""Train a small model from a public PyTorch example for a few steps.

    train.py MODEL --device DEV --steps N [--batch B] [--cycles]
             [--losses FILE] [--import MODULE]

MODEL is one of:

  mnist        the Net of pytorch/examples mnist/main.py (two convolutions,
               dropout, two linear layers, log_softmax and nll_loss) with
               Adadelta(lr=1.0) and StepLR(step_size=1, gamma=0.7), on
               1x28x28 images
  lstm         the LSTM RNNModel of pytorch/examples word_language_model,
               trained as its main.py does: truncated BPTT with the hidden
               state detached between steps, clip_grad_norm_(0.25) and a
               plain SGD update of p.data
  transformer  a small transformer language model like the TransformerModel
               there (embedding, sinusoidal positional encoding, a causally
               masked nn.TransformerEncoder, a linear decoder), with AdamW
  resnet       a ResNet-style CIFAR net (stem, two BasicBlocks with
               BatchNorm2d, one with a downsampling shortcut, average
               pooling, linear) with SGD, momentum and weight decay, on
               3x16x16 images
  forward_forward
               mnist_forward_forward's Net: two linear layers trained one
               after the other by the forward-forward goodness loss, each
               with its own Adam built before the layer is moved to the
               device, on 784-pixel images with labels overlaid
  vae          vae/main.py's VAE (784-400-20 encoder, reparameterized
               sample, 20-400-784 decoder) with Adam, the loss binary
               cross-entropy plus KL divergence
  mnist_rnn    mnist_rnn/main.py's Net (a batch-first LSTM over an image's
               rows, BatchNorm1d, dropout, two linear layers) with
               Adadelta and StepLR

Options:

  --device DEV     cpu or any torch device string; "simdev" names the
                   device attribute of the module given with --import
  --steps N        number of training steps
  --batch B        batch size (default: mnist 16, lstm 8, transformer 8,
                   resnet 16, forward_forward 64, vae 32, mnist_rnn 32)
  --cycles         disable the garbage collector and leave each step's
                   activations in a reference cycle, as real scripts leak
                   them, so that their device memory is freed only by a
                   garbage collection
  --losses FILE    once all steps completed, write the per-step losses
                   there as a JSON list of float.hex() strings
  --import MODULE  import MODULE first (simdev_torch registers the device)

Each step prints "step K loss <float.hex>" (K from 1); the end prints
"train: completed N steps (T ms per step after the first)" (bench/torch_train.sh
reads it). Running out of device memory prints
"step K: out of device memory: ..." and exits with status 1.

The data are synthetic, drawn from a seeded CPU generator, and the model is
built on the CPU from a seeded global generator, then moved: so the losses
on the simdev device equal the CPU's, bit for bit where the device runs the
same kernels (its CPU fallback does).
"""
import argparse
import gc
import importlib
import inspect
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

NTOKEN = 200
BPTT = 16


def foreach(optimizer_class):
    """{"foreach": True} where the optimizer takes it (PyTorch 1.12 on)."""
    params = inspect.signature(optimizer_class).parameters
    return {"foreach": True} if "foreach" in params else {}


class MnistNet(nn.Module):
    """pytorch/examples mnist/main.py's Net, split so that a step can keep
    the convolutional features."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def features(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        return torch.flatten(x, 1)

    def classify(self, x):
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)

    def forward(self, x):
        return self.classify(self.features(x))


class RNNModel(nn.Module):
    """word_language_model's RNNModel with an LSTM, weights not tied."""

    def __init__(self, ntoken, ninp, nhid, nlayers, dropout):
        super().__init__()
        self.ntoken = ntoken
        self.nhid = nhid
        self.nlayers = nlayers
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout, max_len):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        position = torch.arange(max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float()
                             * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return self.dropout(x + self.pe[:x.size(0)])


class TransformerModel(nn.Module):
    """word_language_model's TransformerModel, sequence first."""

    def __init__(self, ntoken, d_model, nhead, d_hid, nlayers, dropout):
        super().__init__()
        self.d_model = d_model
        self.encoder = nn.Embedding(ntoken, d_model)
        self.pos_encoder = PositionalEncoding(d_model, dropout, BPTT)
        layer = nn.TransformerEncoderLayer(d_model, nhead, d_hid, dropout)
        # The nested-tensor fast path never runs in training, and asking
        # for it makes PyTorch 2 warn that a sequence-first layer lacks it.
        self.transformer_encoder = nn.TransformerEncoder(
            layer, nlayers, enable_nested_tensor=False)
        self.decoder = nn.Linear(d_model, ntoken)
        # A buffer, built on the CPU, so that every device gets the same mask.
        mask = torch.triu(torch.full((BPTT, BPTT), float("-inf")), diagonal=1)
        self.register_buffer("src_mask", mask)

    def forward(self, src):
        src = self.pos_encoder(self.encoder(src) * math.sqrt(self.d_model))
        output = self.transformer_encoder(src, self.src_mask)
        return self.decoder(output)


class BasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride, bias=False),
                nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class TinyResNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(16), nn.ReLU())
        self.layers = nn.Sequential(BasicBlock(16, 16, 1),
                                    BasicBlock(16, 32, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.linear = nn.Linear(32, num_classes)

    def features(self, x):
        return self.layers(self.stem(x))

    def classify(self, x):
        return self.linear(torch.flatten(self.pool(x), 1))

    def forward(self, x):
        return self.classify(self.features(x))


class VAE(nn.Module):
    """vae/main.py's VAE: a 784-400-(20, 20) encoder giving the mean and log
    variance of the latent code, a sample drawn from them by the
    reparameterization trick, a 20-400-784 decoder with a clamped sigmoid."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(784, 400)
        self.mu = nn.Linear(400, 20)
        self.logvar = nn.Linear(400, 20)
        self.dec1 = nn.Linear(20, 400)
        self.dec2 = nn.Linear(400, 784)

    def forward(self, x):
        h = F.relu(self.enc(x.view(-1, 784)))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(logvar / 2)
        recon = torch.sigmoid(self.dec2(F.relu(self.dec1(z))))
        return recon.clamp(1e-4, 1 - 1e-4), mu, logvar


class RowLSTM(nn.Module):
    """mnist_rnn/main.py's Net: an image read row by row by a batch-first
    LSTM, its last output through BatchNorm1d, dropout and two linear
    layers to log-probabilities."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(input_size=28, hidden_size=64, batch_first=True)
        self.norm = nn.BatchNorm1d(64)
        self.drop1 = nn.Dropout(0.25)
        self.drop2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        out, _ = self.rnn(x.reshape(-1, 28, 28))
        h = self.drop1(self.norm(out[:, -1]))
        h = self.drop2(F.relu(self.fc1(h)))
        return F.log_softmax(self.fc2(h), dim=1)


class FFLayer(nn.Linear):
    """mnist_forward_forward's Layer: a linear layer trained on its own by
    the forward-forward goodness loss, with an Adam of its own built in
    __init__, before the caller moves the layer to the device (the example
    does; on the device that needs Module.to() to keep the Parameter
    objects the optimizer holds)."""

    threshold = 2.0

    def __init__(self, in_features, out_features, lr=0.03):
        super().__init__(in_features, out_features)
        self.opt = torch.optim.Adam(self.parameters(), lr=lr)

    def forward(self, x):
        # The input's direction only: its length is the goodness of the
        # layer below.
        unit = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return F.relu(torch.mm(unit, self.weight.T) + self.bias.unsqueeze(0))

    def train_step(self, x_pos, x_neg):
        """One Adam step pushing the goodness (mean squared activation) of
        positive samples above the threshold and of negative ones below."""
        good_pos = self.forward(x_pos).pow(2).mean(1)
        good_neg = self.forward(x_neg).pow(2).mean(1)
        margins = torch.cat([self.threshold - good_pos, good_neg - self.threshold])
        loss = torch.log1p(torch.exp(margins)).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss


def overlay_label(x, y, classes=10):
    """mnist_forward_forward's overlay: the first `classes` pixels become a
    one-hot label, the hot one set to the batch's largest value."""
    out = x.clone()
    out[:, :classes] = 0
    out[torch.arange(len(x)), y] = x.max()
    return out


class ImageData:
    """Noisy copies of one random prototype per class: learnable in a few
    steps, unlike random labels."""

    def __init__(self, generator, shape, batch, num_classes=10):
        self.generator = generator
        self.shape = shape
        self.batch = batch
        self.prototypes = torch.randn((num_classes,) + shape,
                                      generator=generator)

    def draw(self, device):
        target = torch.randint(len(self.prototypes), (self.batch,),
                               generator=self.generator)
        noise = torch.randn((self.batch,) + self.shape,
                            generator=self.generator)
        data = self.prototypes[target] + noise
        return data.to(device), target.to(device)


def token_stream(generator, batch, steps):
    """A corpus laid out as word_language_model's batchify does, one column
    per batch entry: random picks from a few fixed phrases, so that the next
    token is predictable inside a phrase."""
    phrases = torch.randint(NTOKEN, (32, 8), generator=generator)
    needed = batch * (steps * BPTT + 1)
    picks = torch.randint(len(phrases), (needed // phrases.size(1) + 1,),
                          generator=generator)
    stream = phrases[picks].flatten()[:needed]
    return stream.view(batch, -1).t().contiguous()


def get_batch(source, i):
    """word_language_model's get_batch: inputs and next-token targets."""
    return source[i:i + BPTT], source[i + 1:i + 1 + BPTT].reshape(-1)


class ImageTask:
    """A classifier's training step on a batch of images, as in
    mnist/main.py's train(); the model's forward is split into features()
    and classify() so that the features are a tensor of the step's record."""

    def classify_step(self, loss_fn):
        data, target = self.data.draw(self.device)
        self.optimizer.zero_grad(set_to_none=True)
        features = self.model.features(data)
        output = self.model.classify(features)
        loss = loss_fn(output, target)
        loss.backward()
        self.optimizer.step()
        return {"data": data, "target": target, "features": features,
                "output": output, "loss": loss}


class MnistTask(ImageTask):
    default_batch = 16

    def __init__(self, device, batch, steps, generator):
        self.model = MnistNet().to(device)
        self.optimizer = torch.optim.Adadelta(self.model.parameters(), lr=1.0)
        self.scheduler = torch.optim.lr_scheduler.StepLR(
            self.optimizer, step_size=1, gamma=0.7)
        self.data = ImageData(generator, (1, 28, 28), batch)
        self.device = device
        # Forward hooks keep the convolutions' outputs for the step's
        # record, as scripts that log or visualize activations do.
        self.record = {}
        for name in ("conv1", "conv2"):
            getattr(self.model, name).register_forward_hook(
                lambda module, inputs, output, name=name: self.record.__setitem__(name, output))

    def step(self, k):
        self.record = {}
        self.record.update(self.classify_step(F.nll_loss))
        self.scheduler.step()
        return self.record


class LstmTask:
    default_batch = 8
    lr = 20.0
    clip = 0.25

    def __init__(self, device, batch, steps, generator):
        self.model = RNNModel(NTOKEN, 32, 32, 2, dropout=0.2).to(device)
        self.source = token_stream(generator, batch, steps).to(device)
        self.hidden = self.model.init_hidden(batch)

    def step(self, k):
        data, targets = get_batch(self.source, k * BPTT)
        self.model.zero_grad(set_to_none=True)
        # Detached, so that backpropagation stops at this step's start.
        hidden = tuple(h.detach() for h in self.hidden)
        output, self.hidden = self.model(data, hidden)
        loss = F.nll_loss(output, targets)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        for p in self.model.parameters():
            p.data.add_(p.grad, alpha=-self.lr)
        return {"data": data, "targets": targets, "output": output,
                "loss": loss}


class TransformerTask:
    default_batch = 8

    def __init__(self, device, batch, steps, generator):
        self.model = TransformerModel(NTOKEN, 32, 2, 64, 2,
                                      dropout=0.1).to(device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=1e-3,
            **foreach(torch.optim.AdamW))
        self.source = token_stream(generator, batch, steps).to(device)

    def step(self, k):
        data, targets = get_batch(self.source, k * BPTT)
        self.optimizer.zero_grad(set_to_none=True)
        output = self.model(data)
        loss = F.cross_entropy(output.view(-1, NTOKEN), targets)
        loss.backward()
        self.optimizer.step()
        return {"data": data, "targets": targets, "output": output,
                "loss": loss}


class ResnetTask(ImageTask):
    default_batch = 16

    def __init__(self, device, batch, steps, generator):
        self.model = TinyResNet().to(device)
        self.optimizer = torch.optim.SGD(
            self.model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4,
            **foreach(torch.optim.SGD))
        self.data = ImageData(generator, (3, 16, 16), batch)
        self.device = device

    def step(self, k):
        return self.classify_step(F.cross_entropy)


class VaeTask:
    """vae/main.py's training step: Adam, the loss the reconstruction's
    binary cross-entropy summed plus the latent code's KL divergence from a
    standard normal, on images squashed into [0, 1]."""
    default_batch = 32

    def __init__(self, device, batch, steps, generator):
        self.model = VAE().to(device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.data = ImageData(generator, (1, 28, 28), batch)
        self.device = device

    def step(self, k):
        data, _ = self.data.draw(self.device)
        data = torch.sigmoid(data)
        self.optimizer.zero_grad()
        recon, mu, logvar = self.model(data)
        bce = F.binary_cross_entropy(recon, data.view(-1, 784), reduction="sum")
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        loss = bce + kld
        loss.backward()
        self.optimizer.step()
        return {"data": data, "recon": recon, "loss": loss}


class MnistRnnTask:
    """mnist_rnn/main.py's training: Adadelta(lr=0.1), StepLR(gamma=0.7),
    nll_loss."""
    default_batch = 32

    def __init__(self, device, batch, steps, generator):
        self.model = RowLSTM().to(device)
        self.optimizer = torch.optim.Adadelta(self.model.parameters(), lr=0.1)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.7)
        self.data = ImageData(generator, (1, 28, 28), batch)
        self.device = device

    def step(self, k):
        data, target = self.data.draw(self.device)
        self.optimizer.zero_grad()
        output = self.model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        return {"data": data, "output": output, "loss": loss}


class ForwardForwardTask:
    """mnist_forward_forward's training: the layers one after the other,
    each on the outputs of the trained one below, positive samples carrying
    their label and negative ones a wrong one; a step is one of a layer's
    epochs, the steps shared out evenly."""
    default_batch = 64
    dims = (784, 100, 100)

    def __init__(self, device, batch, steps, generator):
        self.layers = [FFLayer(a, b).to(device) for a, b in zip(self.dims, self.dims[1:])]
        x, y = ImageData(generator, (784,), batch).draw(device)
        wrong = (y + torch.randint(1, 10, y.shape, generator=generator).to(device)) % 10
        self.h_pos, self.h_neg = overlay_label(x, y), overlay_label(x, wrong)
        self.per_layer = max(1, steps // len(self.layers))
        self.current = 0

    def step(self, k):
        if k // self.per_layer > self.current and self.current + 1 < len(self.layers):
            below = self.layers[self.current]
            self.h_pos, self.h_neg = below(self.h_pos).detach(), below(self.h_neg).detach()
            self.current += 1
        loss = self.layers[self.current].train_step(self.h_pos, self.h_neg)
        return {"positive": self.h_pos, "negative": self.h_neg, "loss": loss}


class RegressionTask:
    """regression/main.py: a linear layer fitted to a degree-4 polynomial
    of random inputs (features x, x^2, x^3, x^4), smooth L1 loss, and the
    example's own update, each parameter moved by -0.1 times its gradient
    in place (no optimizer). The target and the batches are drawn on the
    CPU from the run's generator, so both devices see the same numbers."""
    default_batch = 32
    degree = 4

    def __init__(self, device, batch, steps, generator):
        self.w_target = (torch.randn(self.degree, 1, generator=generator) * 5).to(device)
        self.b_target = (torch.randn(1, generator=generator) * 5).item()
        self.fc = nn.Linear(self.degree, 1).to(device)
        self.generator, self.batch, self.device = generator, batch, device

    def features(self, x):
        x = x.unsqueeze(1)
        return torch.cat([x ** i for i in range(1, self.degree + 1)], 1)

    def step(self, k):
        x = self.features(torch.randn(self.batch, generator=self.generator).to(self.device))
        y = x.mm(self.w_target) + self.b_target
        self.fc.zero_grad()
        output = F.smooth_l1_loss(self.fc(x), y)
        output.backward()
        with torch.no_grad():
            for param in self.fc.parameters():
                param.add_(-0.1 * param.grad)
        return {"x": x, "y": y, "loss": output}


TASKS = {"mnist": MnistTask, "lstm": LstmTask,
         "transformer": TransformerTask, "resnet": ResnetTask,
         "forward_forward": ForwardForwardTask, "vae": VaeTask,
         "mnist_rnn": MnistRnnTask, "regression": RegressionTask}


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(TASKS))
    parser.add_argument("--device", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--cycles", action="store_true")
    parser.add_argument("--losses")
    parser.add_argument("--import", dest="module")
    args = parser.parse_args(argv)
    if args.device == "simdev" and args.module is None:
        parser.error("--device simdev needs --import MODULE")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.cycles:
        gc.disable()
    module = importlib.import_module(args.module) if args.module else None
    device = (module.device if args.device == "simdev"
              else torch.device(args.device))
    torch.set_num_threads(1)

    task_class = TASKS[args.model]
    batch = args.batch or task_class.default_batch
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    task = task_class(device, batch, args.steps, generator)

    losses = []
    started = None  # after the first step: it pays for first-call setup
    for k in range(1, args.steps + 1):
        if k == 2:
            started = time.perf_counter()
        try:
            activations = task.step(k - 1)
            loss = activations["loss"].item()
        except RuntimeError as e:
            if "out of memory" not in str(e):
                raise
            print(f"step {k}: out of device memory: {str(e).splitlines()[0]}",
                  flush=True)
            sys.exit(1)
        if args.cycles:
            activations["self"] = activations
        del activations
        losses.append(loss.hex())
        print(f"step {k} loss {losses[-1]}", flush=True)

    per_step = ""
    if started is not None:
        ms = (time.perf_counter() - started) * 1e3 / (args.steps - 1)
        per_step = f" ({ms:.2f} ms per step after the first)"
    print(f"train: completed {args.steps} steps{per_step}", flush=True)
    if args.losses:
        with open(args.losses, "w") as f:
            json.dump(losses, f)


if __name__ == "__main__":
    main()
