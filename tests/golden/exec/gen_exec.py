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
import sys

import numpy as np
import torch

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
    bal = cfg["balance"]
    n = len(bal)
    X, Y = DATA[model]
    losses = ex.train_pipeline(seq, X, Y, batch, bal, chunks, checkpoint, policy, steps,
                               cfg_lr(cfg, loss_name), loss=loss_name)

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
