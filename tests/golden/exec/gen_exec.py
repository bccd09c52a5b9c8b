#!/usr/bin/python3
"""Golden training runs of PyTorch for pipescope's CPU executor (tests/test_exec.c).

Run with /usr/bin/python3 (the interpreter that has PyTorch 1.13):
    cd tests/golden/exec && /usr/bin/python3 gen_exec.py --fairscale DIR --torchgpipe DIR
(the two source checkouts are described under "Forward-only cases" below). Deterministic; the outputs are committed so the tests run without PyTorch.

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
Every training case is also run by torchgpipe.GPipe itself (imported from source, below; grad-only
with fairscale's patch_batchnorm on the BN layers), loss.backward() through it and the same SGD
step, and the script stops unless the state and the losses are bitwise equal to the mirror's.
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
  cases.txt                                     the training cases (forward and backward)
  cases_forward.txt                             the forward-only cases (below)

Forward-only cases (fwd_*; tests/test_exec.c runs them with ps_exec_opts.forward_only): `steps`
train-mode forwards, no backward and no optimizer step, as a user adapting BatchNorm statistics
to new data would run them (issue [bn-adaptation]). They are made by the REAL upstream code,
imported unmodified from source checkouts given on the command line:
    gen_exec.py --fairscale DIR --torchgpipe DIR
  DIR for fairscale: a checkout of github.com/facebookresearch/fairscale (the goldens were made
      at 146f160241651e1211c4247979f159a4ef43b54a); only fairscale/nn/checkpoint/
      checkpoint_activations.py, checkpoint_utils.py and fairscale/internal/containers.py are
      imported (the package __init__ files are bypassed: they pull in FSDP, Pipe, MoE).
  DIR for torchgpipe: a checkout of github.com/kakaobrain/torchgpipe (tag v0.0.7,
      a1b4ee25574864e7650e7905a69ce156da9752ec); the package is imported whole.
  plain, deferred   torchgpipe.GPipe(seq, balance, devices=["cpu", ...], chunks, checkpoint,
                    deferred_batch_norm=policy == "deferred") in train mode, called on each
                    mini-batch; its checkpointed micro-batches run under no_grad in
                    torchgpipe.checkpoint.Checkpoint.forward.
  grad-only         fairscale's checkpoint_wrapper (which calls patch_batchnorm) around each
                    partition, called for the micro-batches i < checkpoint_stop with grad
                    enabled (CheckpointFunction.forward runs them under no_grad); the other
                    micro-batches call the same partition unwrapped (its BN layers patched).
                    Cross-checked: torchgpipe.GPipe over the same model with fairscale's
                    patch_batchnorm applied gives bitwise the same state, or the script stops.
"""
import argparse
import importlib
import json
import os
import shutil
import sys
import types
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
torch.set_num_threads(1)

# the PyTorch mirror of torchgpipe's micro-batching (DeferredBatchNorm, fairscale's
# patch_batchnorm, the GPipe training loop) lives in the bridge example, shared with it
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "examples"))
import export_pytorch as ex  # noqa: E402


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
    return ex.from_spec(cfg["input"], cfg["layers"])


save_state = ex.save_state


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
    X, Y = DATA[model]
    losses = ex.train_pipeline(seq, X, Y, batch, cfg["balance"], chunks, checkpoint, policy,
                               steps, cfg_lr(cfg, loss_name), loss=loss_name)
    other, _ = build(cfg)
    other.load_state_dict(INIT[model])
    other, real_losses = train_torchgpipe(other, X, Y, batch, cfg["balance"], chunks, checkpoint,
                                          policy, steps, cfg_lr(cfg, loss_name), loss_name)
    same_state(name, "the mirror (export_pytorch.train_pipeline)", seq, "torchgpipe.GPipe", other)
    if real_losses != losses:
        raise SystemExit("%s: losses differ between the mirror and torchgpipe.GPipe: %s, %s"
                         % (name, losses, real_losses))
    write_case(name, model, cfg, batch, chunks, checkpoint, policy, steps, loss_name, seq, losses)
    CASES.append(name)


def write_case(name, model, cfg, batch, chunks, checkpoint, policy, steps, loss_name, seq,
               losses):
    bal = cfg["balance"]
    n = len(bal)
    Y = DATA[model][1]
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


# ---- forward only, with the upstream code --------------------------------------------------------

def load_upstream(fairscale_dir, torchgpipe_dir):
    """fairscale's checkpoint_activations module (checkpoint_wrapper, patch_batchnorm) and the
    torchgpipe package, imported from their source checkouts."""
    for name in ("fairscale", "fairscale.internal", "fairscale.nn", "fairscale.nn.checkpoint"):
        if name in sys.modules:
            continue
        pkg = types.ModuleType(name)  # empty package: its __init__.py is not run
        pkg.__path__ = [os.path.join(fairscale_dir, *name.split("."))]
        sys.modules[name] = pkg
    fs = importlib.import_module("fairscale.nn.checkpoint.checkpoint_activations")
    sys.path.insert(0, torchgpipe_dir)
    tg = importlib.import_module("torchgpipe")
    for mod in (fs, tg):
        if not os.path.abspath(mod.__file__).startswith(os.path.abspath(
                fairscale_dir if mod is fs else torchgpipe_dir)):
            raise SystemExit("%s was imported from %s, not from the checkout given"
                             % (mod.__name__, mod.__file__))
    return fs, tg


def mb_loss(out, y, loss_name):
    if loss_name == "sum":
        return out.sum().item()
    if loss_name == "mse":
        return F.mse_loss(out, y).item()
    return F.cross_entropy(out, y).item()


def layers_of_gpipe(g):
    """The GPipe's layers as one nn.Sequential (state_dict named like the spec's layers)."""
    return nn.Sequential(*[layer for part in g.partitions for layer in part])


def forward_only_torchgpipe(seq, X, Y, batch, balance, chunks, checkpoint, policy, steps,
                            loss_name, patch=False):
    if patch:
        FS.patch_batchnorm(seq)
    g = TG.GPipe(seq, balance=balance, devices=["cpu"] * len(balance), chunks=chunks,
                 checkpoint=checkpoint, deferred_batch_norm=policy == "deferred")
    g.train()
    losses = []
    S = X.shape[0]
    for step in range(steps):
        idx = [(step * batch + b) % S for b in range(batch)]
        out = g(X[idx])
        losses.append(mb_loss(out, Y[idx] if Y is not None else None, loss_name))
    return layers_of_gpipe(g), losses


def forward_only_fairscale(seq, X, Y, batch, balance, chunks, checkpoint, steps, loss_name):
    parts, f = [], 0
    for c in balance:
        parts.append(nn.Sequential(*seq[f:f + c]))
        f += c
    # checkpoint_wrapper patches the BN layers (shared with `parts`) and replaces the forward of
    # the nn.Sequential it is given; the unwrapped partitions are separate Sequentials
    wrapped = [FS.checkpoint_wrapper(nn.Sequential(*p)) for p in parts]
    seq.train()
    n = len(parts)
    stop = {"always": chunks, "except_last": chunks - 1, "never": 0}[checkpoint]
    losses = []
    S = X.shape[0]
    for step in range(steps):
        idx = [(step * batch + b) % S for b in range(batch)]
        xs = torch.chunk(X[idx], chunks)
        m = len(xs)
        outs = [[None] * n for _ in range(m)]
        for k in range(m + n - 1):  # clock cycles, as torchgpipe
            for j in range(max(0, k - m + 1), min(k, n - 1) + 1):
                i = k - j
                inp = xs[i] if j == 0 else outs[i][j - 1]
                with warnings.catch_warnings():
                    # "None of the inputs have requires_grad=True": the model input
                    warnings.simplefilter("ignore", UserWarning)
                    outs[i][j] = (wrapped[j] if i < stop else parts[j])(inp)
        out = torch.cat([outs[i][n - 1] for i in range(m)])
        losses.append(mb_loss(out, Y[idx] if Y is not None else None, loss_name))
    return seq, losses


def same_state(name, what_a, a, what_b, b):
    """Stops the script unless the two models' state_dicts are bitwise equal."""
    sa, sb = a.state_dict(), b.state_dict()
    for k in sa:
        if k.split(".", 1)[1] in ex.STD_KEYS and not torch.equal(sa[k], sb[k]):
            raise SystemExit("%s: %s differs between %s and %s" % (name, k, what_a, what_b))


def train_torchgpipe(seq, X, Y, batch, balance, chunks, checkpoint, policy, steps, lr,
                     loss_name):
    """Training with torchgpipe.GPipe itself (grad-only: with fairscale's patch_batchnorm):
    loss on the gathered output, loss.backward(), p -= lr * grad."""
    if policy == "grad-only":
        FS.patch_batchnorm(seq)
    g = TG.GPipe(seq, balance=balance, devices=["cpu"] * len(balance), chunks=chunks,
                 checkpoint=checkpoint, deferred_batch_norm=policy == "deferred")
    g.train()
    losses = []
    S = X.shape[0]
    for step in range(steps):
        idx = [(step * batch + b) % S for b in range(batch)]
        out = g(X[idx])
        y = Y[idx] if Y is not None else None
        loss = out.sum() if loss_name == "sum" else \
            F.mse_loss(out, y) if loss_name == "mse" else F.cross_entropy(out, y)
        loss.backward()
        with torch.no_grad():
            for p in g.parameters():
                p -= lr * p.grad
                p.grad = None
        losses.append(loss.item())
    return layers_of_gpipe(g), losses


def run_forward_case(name, model, cfg, batch, chunks, checkpoint, policy, steps):
    loss_name = cfg["loss"]
    X, Y = DATA[model]
    bal = cfg["balance"]

    def fresh():
        seq, _ = build(cfg)
        seq.load_state_dict(INIT[model])
        return seq

    if policy == "grad-only":
        res, losses = forward_only_fairscale(fresh(), X, Y, batch, bal, chunks, checkpoint,
                                             steps, loss_name)
        other, _ = forward_only_torchgpipe(fresh(), X, Y, batch, bal, chunks, checkpoint,
                                           policy, steps, loss_name, patch=True)
        same_state(name, "fairscale's checkpoint_wrapper", res, "torchgpipe.GPipe + "
                   "patch_batchnorm", other)
    else:
        res, losses = forward_only_torchgpipe(fresh(), X, Y, batch, bal, chunks, checkpoint,
                                              policy, steps, loss_name)
    write_case(name, model, cfg, batch, chunks, checkpoint, policy, steps, loss_name, res,
               losses)
    nbt = [int(v) for k, v in res.state_dict().items() if k.endswith("num_batches_tracked")]
    print("  %-28s num_batches_tracked after %d forwards: %s" % (name, steps, nbt))
    FORWARD.append(name)


def cfg_lr(cfg, loss_name):
    return 0.01 if loss_name == "sum" else cfg["lr"]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="golden runs for tests/test_exec.c")
    ap.add_argument("--fairscale", required=True,
                    help="fairscale source checkout (the folder holding fairscale/)")
    ap.add_argument("--torchgpipe", required=True,
                    help="torchgpipe v0.0.7 source checkout (the folder holding torchgpipe/)")
    args = ap.parse_args()
    FS, TG = load_upstream(args.fairscale, args.torchgpipe)
    for sub in ("models", "cases"):
        shutil.rmtree(os.path.join(HERE, sub), ignore_errors=True)
    INIT, DATA, CASES, FORWARD = {}, {}, [], []
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
    print("%d training cases" % len(CASES))
    # forward only: every policy x checkpoint mode, 3 forwards each (step 3 wraps the samples)
    for mname, batch in (("mlp", 16), ("conv", 8)):
        for ck in ("never", "always", "except_last"):
            for pol in ("plain", "deferred", "grad-only"):
                run_forward_case("fwd_%s_%s_%s" % (mname, ck, pol), mname, MODELS[mname], batch,
                                 4, ck, pol, 3)
    # micro-batches 3, 3, 3, 1
    for pol in ("plain", "deferred", "grad-only"):
        run_forward_case("fwd_conv_uneven_%s" % pol, "conv", MODELS["conv"], 10, 4,
                         "except_last", pol, 3)
    with open(os.path.join(HERE, "cases_forward.txt"), "w") as fh:
        fh.write("\n".join(FORWARD) + "\n")
    print("%d forward-only cases" % len(FORWARD))
