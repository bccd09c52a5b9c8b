#!/usr/bin/python3
"""Export a PyTorch nn.Sequential to a pipescope spec (the PyTorch bridge).

    /usr/bin/python3 examples/export_pytorch.py mlp OUT [--balance 3,4] [--chunks 4]
        [--checkpoint except_last] [--batchnorm plain] [--batch 16] [--steps 3] [--lr 0.1]
        [--samples 64] [--seed 0]
    /usr/bin/python3 examples/export_pytorch.py --module mypkg.models:make OUT ...

Models: "mlp" and "conv" are built in; --module path.to:factory imports a function returning an
nn.Sequential (it may take no arguments). Writes
    OUT/spec.json           pipescope spec (data: npy, weights: the folder below)
    OUT/weights/*.npy       the initial state_dict, named like it (0.weight.npy, 1.running_var.npy)
    OUT/inputs.npy, OUT/targets.npy   sample inputs and integer labels (cross_entropy)
    OUT/bridge.json         what load_state.py needs to rebuild the same nn.Sequential
Then:  pipescope run OUT/spec.json --save-state STATE
       /usr/bin/python3 examples/load_state.py OUT STATE [--compare]
Supported modules: Linear, Conv2d (square kernel, symmetric padding, no groups/dilation),
BatchNorm1d/2d, ReLU, Dropout, MaxPool2d, Flatten. The module also holds the torchgpipe-style
micro-batching mirror (train_pipeline) that load_state.py --compare runs.
"""
import argparse
import importlib
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

RECOMPUTING = [False]


def demo(name):
    if name == "mlp":
        return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(),
                             nn.Linear(32, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 5)), [16]
    if name == "conv":
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8),
                             nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 5)), [3, 8, 8]
    raise SystemExit("unknown demo model %r (mlp, conv, or --module path.to:factory)" % name)


def from_module(spec):
    path, _, fn = spec.partition(":")
    mod = importlib.import_module(path)
    seq = getattr(mod, fn or "model")()
    if not isinstance(seq, nn.Sequential):
        raise SystemExit("%s did not return an nn.Sequential" % spec)
    shape = getattr(seq, "input_shape", None)
    if shape is None:
        raise SystemExit("set seq.input_shape = [C,H,W] or [F] on the returned nn.Sequential")
    return seq, list(shape)


def layers_of(seq):
    out = []
    for k, m in enumerate(seq):
        if isinstance(m, nn.Linear):
            out.append({"op": "linear", "out": m.out_features, "bias": m.bias is not None})
        elif isinstance(m, nn.Conv2d):
            kh, kw = m.kernel_size
            if kh != kw or m.groups != 1 or m.dilation != (1, 1) or m.stride[0] != m.stride[1] \
                    or m.padding[0] != m.padding[1]:
                raise SystemExit("layer %d: only square, ungrouped, undilated Conv2d" % k)
            out.append({"op": "conv2d", "out": m.out_channels, "kernel": kh,
                        "stride": m.stride[0], "padding": m.padding[0],
                        "bias": m.bias is not None})
        elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            out.append({"op": "batchnorm", "momentum": m.momentum, "eps": m.eps,
                        "affine": m.affine})
        elif isinstance(m, nn.ReLU):
            out.append({"op": "relu"})
        elif isinstance(m, nn.Dropout):
            out.append({"op": "dropout", "p": m.p})
        elif isinstance(m, nn.MaxPool2d):
            k = m.kernel_size
            out.append({"op": "maxpool2d", "kernel": k, "stride": m.stride or k,
                        "padding": m.padding})
        elif isinstance(m, nn.Flatten):
            out.append({"op": "flatten"})
        else:
            raise SystemExit("layer %d: %s has no pipescope op" % (k, type(m).__name__))
    return out


def from_spec(input_shape, layers):
    """The inverse of layers_of: an nn.Sequential from a spec's model.input and model.layers,
    and its per-sample output shape (modules built in layer order, so a seeded build is
    reproducible)."""
    mods, shape = [], list(input_shape)
    for ly in layers:
        op = ly["op"]
        if op == "linear":
            mods.append(nn.Linear(shape[0], ly["out"], bias=ly.get("bias", True)))
            shape = [ly["out"]]
        elif op == "conv2d":
            k, s, p = ly["kernel"], ly.get("stride", 1), ly.get("padding", 0)
            mods.append(nn.Conv2d(shape[0], ly["out"], k, stride=s, padding=p,
                                  bias=ly.get("bias", True)))
            shape = [ly["out"], (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1]
        elif op == "batchnorm":
            cls = nn.BatchNorm1d if len(shape) == 1 else nn.BatchNorm2d
            mods.append(cls(shape[0], eps=ly.get("eps", 1e-5), momentum=ly.get("momentum", 0.1)))
        elif op == "relu":
            mods.append(nn.ReLU())
        elif op == "dropout":
            mods.append(nn.Dropout(ly.get("p", 0.5)))
        elif op == "maxpool2d":
            k = ly["kernel"]
            mods.append(nn.MaxPool2d(k))
            shape = [shape[0], shape[1] // k, shape[2] // k]
        elif op == "flatten":
            mods.append(nn.Flatten())
            shape = [int(np.prod(shape))]
        else:
            raise SystemExit("unknown op %r" % op)
    return nn.Sequential(*mods), shape


STD_KEYS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def save_state(seq, folder):
    os.makedirs(folder, exist_ok=True)
    for k, v in seq.state_dict().items():
        if k.split(".", 1)[1] in STD_KEYS:
            np.save(os.path.join(folder, k + ".npy"), np.ascontiguousarray(v.detach().numpy()))


# ---- torchgpipe's micro-batching, for the comparison -------------------------------------------

class DeferredBatchNorm(nn.modules.batchnorm._BatchNorm):
    """torchgpipe.batchnorm.DeferredBatchNorm line for line (float32 sums; 2D input allowed),
    wrapping `bn` and sharing its parameters and running statistics."""

    def __init__(self, bn, chunks):
        super().__init__(bn.num_features, bn.eps, bn.momentum, bn.affine, True)
        self.register_parameter('weight', bn.weight)
        self.register_parameter('bias', bn.bias)
        self.register_buffer('running_mean', bn.running_mean)
        self.register_buffer('running_var', bn.running_var)
        self.register_buffer('num_batches_tracked', bn.num_batches_tracked)
        self.register_buffer('sum', torch.zeros_like(self.running_mean))
        self.register_buffer('sum_squares', torch.zeros_like(self.running_var))
        self.counter = 0
        self.tracked = 0
        self.chunks = chunks

    def _check_input_dim(self, input):
        pass

    def _track(self, input):
        dim = [0]
        dim.extend(range(2, input.dim()))
        with torch.no_grad():
            self.sum += input.sum(dim)
            self.sum_squares += (input**2).sum(dim)
        size = input.size().numel() // input.size(1)
        self.counter += size
        self.tracked += 1
        return (self.tracked == self.chunks)

    def _commit(self):
        self.num_batches_tracked += 1
        if self.momentum is None:
            exponential_average_factor = 1.0 / float(self.num_batches_tracked)
        else:
            exponential_average_factor = self.momentum
        mean = self.sum / self.counter
        var = self.sum_squares / self.counter - mean**2
        m = exponential_average_factor
        self.running_mean *= 1 - m
        self.running_mean += mean * m
        self.running_var *= 1 - m
        self.running_var += var * m
        self.sum.zero_()
        self.sum_squares.zero_()
        self.counter = 0
        self.tracked = 0

    def forward(self, input):
        if not RECOMPUTING[0]:
            if self._track(input):
                self._commit()
        return F.batch_norm(input, running_mean=None, running_var=None, weight=self.weight,
                            bias=self.bias, training=True, momentum=0.0, eps=self.eps)


def patch_batchnorm(seq):
    """fairscale's patch_batchnorm: track running stats only when grad is enabled."""
    def pre(mod, inp):
        if not torch.is_grad_enabled():
            mod._bk = mod.track_running_stats
            mod.track_running_stats = False

    def post(mod, inp, out):
        if not torch.is_grad_enabled():
            mod.track_running_stats = mod._bk
    for m in seq.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.register_forward_pre_hook(pre)
            m.register_forward_hook(post)


def train_pipeline(seq, X, Y, batch, balance, chunks, checkpoint, policy, steps, lr,
                   loss="cross_entropy"):
    """GPipe clock cycles, checkpointed tasks under no_grad, recompute before backward, loss on
    the gathered mini-batch (sum | mse | cross_entropy), SGD; returns the losses. Modifies seq
    (its state is the result). tests/golden/exec/gen_exec.py makes the executor's goldens with it."""
    loss_name = loss
    run = seq
    if policy == "deferred":
        run = nn.Sequential(*[DeferredBatchNorm(m, chunks)
                              if isinstance(m, nn.modules.batchnorm._BatchNorm) else m
                              for m in seq])
    elif policy == "grad-only":
        patch_batchnorm(seq)
    run.train()
    parts, f = [], 0
    for c in balance:
        parts.append(run[f:f + c])
        f += c
    n = len(parts)
    stop = {"always": chunks, "except_last": chunks - 1, "never": 0}[checkpoint]
    S, losses = X.shape[0], []
    for step in range(steps):
        idx = [(step * batch + b) % S for b in range(batch)]
        xs = torch.chunk(X[idx], chunks)
        y = Y[idx] if Y is not None else None
        m = len(xs)
        ins = [[None] * n for _ in range(m)]
        outs = [[None] * n for _ in range(m)]
        for k in range(m + n - 1):
            for j in range(max(0, k - m + 1), min(k, n - 1) + 1):
                i = k - j
                inp = (xs[i] if j == 0 else outs[i][j - 1]).detach().requires_grad_(j > 0)
                if i < stop:
                    with torch.no_grad():
                        out = parts[j](inp)
                else:
                    out = parts[j](inp)
                ins[i][j], outs[i][j] = inp, out
        last = [outs[i][n - 1].detach().requires_grad_(True) for i in range(m)]
        out = torch.cat(last)
        if loss_name == "sum":
            loss = out.sum()
        elif loss_name == "mse":
            loss = F.mse_loss(out, y)
        else:
            loss = F.cross_entropy(out, y)
        loss.backward()
        grads = [t.grad for t in last]
        for j in range(n - 1, -1, -1):
            for i in range(m - 1, -1, -1):
                if i < stop:
                    inp = ins[i][j].detach().requires_grad_(j > 0)
                    RECOMPUTING[0] = True
                    out = parts[j](inp)
                    RECOMPUTING[0] = False
                else:
                    inp, out = ins[i][j], outs[i][j]
                torch.autograd.backward(out, grads[i])
                grads[i] = inp.grad if j > 0 else None
        with torch.no_grad():
            for p in seq.parameters():
                p -= lr * p.grad
                p.grad = None
        losses.append(loss.item())
    return losses


def build(bridge):
    if bridge.get("module"):
        return from_module(bridge["module"])
    return demo(bridge["model"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="mlp", help="mlp | conv (ignored with --module)")
    ap.add_argument("out")
    ap.add_argument("--module", help="path.to:factory returning an nn.Sequential")
    ap.add_argument("--balance", help="layers per partition, e.g. 3,4 (default: two halves)")
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--checkpoint", default="except_last",
                    choices=["always", "except_last", "never"])
    ap.add_argument("--batchnorm", default="plain", choices=["plain", "deferred", "grad-only"])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    bridge = {"model": a.model, "module": a.module}
    seq, shape = build(bridge)
    layers = layers_of(seq)
    if a.balance:
        balance = [int(v) for v in a.balance.split(",")]
    else:
        balance = [len(layers) // 2, len(layers) - len(layers) // 2]
    if sum(balance) != len(layers):
        raise SystemExit("--balance sums to %d but the model has %d layers"
                         % (sum(balance), len(layers)))
    with torch.no_grad():
        classes = seq.eval()(torch.zeros(2, *shape)).shape[1]
    seq.train()
    os.makedirs(a.out, exist_ok=True)
    save_state(seq, os.path.join(a.out, "weights"))
    x = torch.randn(a.samples, *shape)
    y = torch.randint(0, classes, (a.samples,), dtype=torch.int64)
    np.save(os.path.join(a.out, "inputs.npy"), x.numpy())
    np.save(os.path.join(a.out, "targets.npy"), y.numpy())
    spec = {
        "pipescope": 1, "name": "export-" + (a.module or a.model), "batch": a.batch,
        "model": {"input": shape, "layers": layers, "loss": "cross_entropy",
                  "weights": "weights"},
        "pipeline": {"schedule": "gpipe", "balance": balance, "devices": ["cpu"] * len(balance),
                     "chunks": a.chunks, "checkpoint": a.checkpoint, "batchnorm": a.batchnorm,
                     "phony": True},
        "data": {"source": "npy", "inputs": "inputs.npy", "targets": "targets.npy"},
        "train": {"steps": a.steps, "optimizer": "sgd", "lr": a.lr},
    }
    with open(os.path.join(a.out, "spec.json"), "w") as fh:
        json.dump(spec, fh, indent=1)
        fh.write("\n")
    bridge.update({"balance": balance, "chunks": a.chunks, "checkpoint": a.checkpoint,
                   "batchnorm": a.batchnorm, "batch": a.batch, "steps": a.steps, "lr": a.lr})
    with open(os.path.join(a.out, "bridge.json"), "w") as fh:
        json.dump(bridge, fh, indent=1)
        fh.write("\n")
    print("wrote %s/spec.json (%d layers, balance %s), weights/, inputs.npy, targets.npy"
          % (a.out, len(layers), balance))


if __name__ == "__main__":
    sys.exit(main())
