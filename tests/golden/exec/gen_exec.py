#!/usr/bin/python3
"""Golden training runs of PyTorch for pipescope's CPU executor (tests/test_exec.c).

Run with /usr/bin/python3 (the interpreter that has PyTorch 1.13):
    cd tests/golden/exec && /usr/bin/python3 gen_exec.py
Deterministic; the outputs are committed so the tests run without PyTorch.

What it mirrors (torchgpipe 0.0.7's GPipe, for the numerics; SEMANTICS.md sections 1, 5, 7):
  - the mini-batch is split with torch.chunk; partitions run per micro-batch in clock-cycle
    order (tick k: tasks (i, j) with i + j = k); every partition boundary is a detached tensor,
    as torchgpipe's copies make it;
  - a task with i < checkpoint_stop (always: chunks, except_last: chunks - 1, never: 0) runs
    under torch.no_grad() and keeps only its input; in backward, per partition j from the last,
    micro-batches m-1 .. 0: the recompute re-runs the partition with grad enabled just before its
    backward (torchgpipe's Recompute node runs right before the Checkpoint's backward), so the
    BN update ORDER per layer is forwards s_0..s_{m-1}, then recomputes in backward order;
  - the loss is computed on the gathered output of the whole mini-batch (torch.cat);
  - SGD: p -= lr * grad after each step, gradients zeroed per step.
BatchNorm policies:
  plain      nn.BatchNorm1d/2d (updates in every training forward, with or without grad)
  deferred   a copy of torchgpipe's DeferredBatchNorm (track when not recomputing, commit when
             `chunks` micro-batches were tracked; counters persist across steps), except that it
             also accepts 2D input (torchgpipe's _check_input_dim wants >= 3D)
  grad-only  fairscale's patch_batchnorm (checkpoint_utils.py): pre/post forward hooks that turn
             track_running_stats off while grad is disabled
No dropout (pipescope's dropout RNG is not PyTorch's).

Layout:
  models/<model>/weights/<layer>.<tensor>.npy   initial state_dict (PyTorch default init)
  models/<model>/x.npy, y.npy                   inputs and targets (2 mini-batches; step 2 wraps)
  cases/<case>/spec.json                        the pipescope spec (paths relative to it)
  cases/<case>/expected/<layer>.<tensor>.npy    state_dict after the steps
  cases/<case>/loss.npy                         loss per step (float64)
"""
import json
import os
import shutil

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
torch.set_num_threads(1)

RECOMPUTING = [False]


class DeferredBatchNorm(nn.modules.batchnorm._BatchNorm):
    """torchgpipe.batchnorm.DeferredBatchNorm, line for line (2D input allowed)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, chunks=1):
        super().__init__(num_features, eps, momentum, affine, track_running_stats=True)
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
        exponential_average_factor = 0.0
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


def patch_batchnorm(module):
    """fairscale.nn.checkpoint.checkpoint_utils.patch_batchnorm."""
    def pre_forward(mod, input):
        if torch.is_grad_enabled():
            return
        mod._track_running_stats_backup = mod.track_running_stats
        mod.track_running_stats = False

    def post_forward(mod, input, result):
        if torch.is_grad_enabled():
            return
        mod.track_running_stats = mod._track_running_stats_backup

    for _, child in module.named_modules():
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            child.register_forward_pre_hook(pre_forward)
            child.register_forward_hook(post_forward)


# ---- models ----------------------------------------------------------------------------------

MODELS = {
    "mlp": {
        "input": [8],
        "layers": [
            {"op": "linear", "out": 16, "bias": True},
            {"op": "batchnorm", "momentum": 0.1, "eps": 1e-5},
            {"op": "relu"},
            {"op": "linear", "out": 12, "bias": True},
            {"op": "batchnorm", "momentum": None, "eps": 1e-5},
            {"op": "relu"},
            {"op": "linear", "out": 4, "bias": True},
        ],
        "balance": [3, 4],
        "loss": "cross_entropy",
        "lr": 0.1,
        "samples": 32,
    },
    "conv": {
        "input": [3, 8, 8],
        "layers": [
            {"op": "conv2d", "out": 4, "kernel": 3, "stride": 1, "padding": 1},
            {"op": "batchnorm", "momentum": 0.1, "eps": 1e-5},
            {"op": "relu"},
            {"op": "maxpool2d", "kernel": 2},
            {"op": "conv2d", "out": 6, "kernel": 3, "stride": 1, "padding": 1},
            {"op": "batchnorm", "momentum": None, "eps": 1e-5},
            {"op": "relu"},
            {"op": "flatten"},
            {"op": "linear", "out": 5, "bias": True},
        ],
        "balance": [4, 5],
        "loss": "mse",
        "lr": 0.05,
        "samples": 20,
    },
}


def build(cfg):
    mods = []
    shape = list(cfg["input"])
    for ly in cfg["layers"]:
        op = ly["op"]
        if op == "linear":
            mods.append(nn.Linear(shape[0], ly["out"], bias=ly.get("bias", True)))
            shape = [ly["out"]]
        elif op == "conv2d":
            k, s, p = ly["kernel"], ly.get("stride", 1), ly.get("padding", 0)
            mods.append(nn.Conv2d(shape[0], ly["out"], k, stride=s, padding=p))
            shape = [ly["out"], (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1]
        elif op == "batchnorm":
            cls = nn.BatchNorm1d if len(shape) == 1 else nn.BatchNorm2d
            mods.append(cls(shape[0], eps=ly["eps"], momentum=ly["momentum"]))
        elif op == "relu":
            mods.append(nn.ReLU())
        elif op == "maxpool2d":
            k = ly["kernel"]
            mods.append(nn.MaxPool2d(k))
            shape = [shape[0], shape[1] // k, shape[2] // k]
        elif op == "flatten":
            mods.append(nn.Flatten())
            shape = [int(np.prod(shape))]
    return nn.Sequential(*mods), shape


def to_deferred(seq, chunks):
    mods = []
    for mod in seq:
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            d = DeferredBatchNorm(mod.num_features, mod.eps, mod.momentum, mod.affine, chunks)
            d.register_parameter('weight', mod.weight)
            d.register_parameter('bias', mod.bias)
            d.register_buffer('running_mean', mod.running_mean)
            d.register_buffer('running_var', mod.running_var)
            d.register_buffer('num_batches_tracked', mod.num_batches_tracked)
            mods.append(d)
        else:
            mods.append(mod)
    return nn.Sequential(*mods)


STD_KEYS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def save_state(seq, folder):
    os.makedirs(folder, exist_ok=True)
    for k, v in seq.state_dict().items():
        if k.split(".", 1)[1] not in STD_KEYS:
            continue
        a = v.detach().numpy()
        np.save(os.path.join(folder, k + ".npy"), np.ascontiguousarray(a))


def make_model_files(name, cfg):
    torch.manual_seed({"mlp": 11, "conv": 12}[name])
    seq, out_shape = build(cfg)
    root = os.path.join(HERE, "models", name)
    save_state(seq, os.path.join(root, "weights"))
    S = cfg["samples"]
    x = torch.randn(S, *cfg["input"])
    np.save(os.path.join(root, "x.npy"), x.numpy())
    if cfg["loss"] == "cross_entropy":
        y = torch.randint(0, out_shape[0], (S,), dtype=torch.int64)
    elif cfg["loss"] == "mse":
        y = torch.randn(S, *out_shape)
    else:
        y = None
    if y is not None:
        np.save(os.path.join(root, "y.npy"), y.numpy())
    return seq.state_dict(), x, y


# ---- the pipeline ------------------------------------------------------------------------------

def run_case(name, model, cfg, batch, chunks, checkpoint, policy, steps, loss_name=None):
    loss_name = loss_name or cfg["loss"]
    seq, _ = build(cfg)
    seq.load_state_dict(INIT[model])
    if policy == "deferred":
        seq = to_deferred(seq, chunks)
    elif policy == "grad-only":
        patch_batchnorm(seq)
    seq.train()
    bal = cfg["balance"]
    parts, f = [], 0
    for c in bal:
        parts.append(seq[f:f + c])
        f += c
    n = len(parts)
    stop = {"always": chunks, "except_last": chunks - 1, "never": 0}[checkpoint]
    X, Y = DATA[model]
    S = X.shape[0]
    losses = []
    for step in range(steps):
        idx = [(step * batch + b) % S for b in range(batch)]
        x = X[idx]
        y = Y[idx] if Y is not None else None
        xs = torch.chunk(x, chunks)
        m = len(xs)
        ins = [[None] * n for _ in range(m)]
        outs = [[None] * n for _ in range(m)]
        for k in range(m + n - 1):
            for j in range(max(0, k - m + 1), min(k, n - 1) + 1):
                i = k - j
                src = xs[i] if j == 0 else outs[i][j - 1]
                inp = src.detach().requires_grad_(j > 0)
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
                p -= cfg_lr(cfg, loss_name) * p.grad
                p.grad = None
        losses.append(loss.item())

    spec = {
        "pipescope": 1,
        "name": name,
        "batch": batch,
        "model": {
            "input": cfg["input"],
            "layers": cfg["layers"],
            "loss": loss_name,
            "weights": "../../models/%s/weights" % model,
        },
        "pipeline": {
            "schedule": "gpipe",
            "balance": bal,
            "devices": ["cpu"] * n,
            "chunks": chunks,
            "checkpoint": checkpoint,
            "batchnorm": policy,
        },
        "data": {"source": "npy", "inputs": "../../models/%s/x.npy" % model},
        "train": {"steps": steps, "optimizer": "sgd", "lr": cfg_lr(cfg, loss_name)},
    }
    if Y is not None:  # the spec wants targets with npy data even for the sum loss
        spec["data"]["targets"] = "../../models/%s/y.npy" % model
    cdir = os.path.join(HERE, "cases", name)
    os.makedirs(cdir, exist_ok=True)
    with open(os.path.join(cdir, "spec.json"), "w") as fh:
        json.dump(spec, fh, indent=1)
        fh.write("\n")
    save_state(seq, os.path.join(cdir, "expected"))
    np.save(os.path.join(cdir, "loss.npy"), np.array(losses, dtype=np.float64))
    CASES.append(name)


def cfg_lr(cfg, loss_name):
    return 0.01 if loss_name == "sum" else cfg["lr"]


if __name__ == "__main__":
    for sub in ("models", "cases"):
        shutil.rmtree(os.path.join(HERE, sub), ignore_errors=True)
    INIT, DATA, CASES = {}, {}, []
    for mname, mcfg in MODELS.items():
        st, xx, yy = make_model_files(mname, mcfg)
        INIT[mname] = st
        DATA[mname] = (xx, yy)
    for mname, batch in (("mlp", 16), ("conv", 8)):
        for ck in ("never", "always", "except_last"):
            for pol in ("plain", "deferred", "grad-only"):
                run_case("%s_%s_%s" % (mname, ck, pol), mname, MODELS[mname], batch, 4, ck, pol,
                         3)
    # batch 10, chunks 4: micro-batches 3, 3, 3, 1 (BN2d still has 16 values per channel).
    # Not the sum loss: its gradient is the same for every sample, so BN's backward cancels it
    # to rounding noise and float32 results differ at 1e-4 between any two implementations.
    for pol in ("plain", "deferred", "grad-only"):
        run_case("conv_uneven_%s" % pol, "conv", MODELS["conv"], 10, 4, "except_last", pol, 3)
    # batch 9, chunks 4: only 3 micro-batches (3, 3, 3): deferred commits across steps (not batch
    # 6: BatchNorm1d over 2 samples outputs +-1 whatever the input, its input gradient is noise)
    run_case("mlp_short_deferred", "mlp", MODELS["mlp"], 9, 4, "always", "deferred", 3)
    run_case("mlp_short_plain", "mlp", MODELS["mlp"], 9, 4, "except_last", "plain", 3)
    with open(os.path.join(HERE, "cases.txt"), "w") as fh:
        fh.write("\n".join(CASES) + "\n")
    print("%d cases" % len(CASES))
