#!/usr/bin/python3
"""Load a `pipescope run --save-state STATE` folder back into the exported nn.Sequential.

    /usr/bin/python3 examples/load_state.py EXPORT STATE [--compare] [--tol 1e-4]

EXPORT is the folder export_pytorch.py wrote (bridge.json says how to rebuild the model).
Loads every STATE/<layer>.<tensor>.npy with load_state_dict (strict) and prints each BatchNorm
layer's running statistics. --compare also trains the exported model in PyTorch with
torchgpipe's micro-batching (same chunks, checkpoint, BN policy, steps, lr, data order) and
compares every tensor of the state_dict: exit 1 when one differs by more than --tol (absolute,
relative to max(1, |value|)).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_pytorch as ex  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("export")
    ap.add_argument("state")
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    torch.set_num_threads(2)
    with open(os.path.join(a.export, "bridge.json")) as fh:
        bridge = json.load(fh)
    seq, _ = ex.build(bridge)
    want = seq.state_dict()
    sd = {}
    for k, v in want.items():
        p = os.path.join(a.state, k + ".npy")
        if not os.path.exists(p):
            raise SystemExit("%s: missing (is this a pipescope --save-state folder?)" % p)
        sd[k] = torch.from_numpy(np.load(p)).to(v.dtype).reshape(v.shape)
    seq.load_state_dict(sd, strict=True)
    for k, m in enumerate(seq):
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            print("layer %d %s: num_batches_tracked %d" % (k, type(m).__name__,
                                                           int(m.num_batches_tracked)))
            print("  running_mean", np.array2string(m.running_mean.numpy(), precision=5))
            print("  running_var ", np.array2string(m.running_var.numpy(), precision=5))
    if not a.compare:
        return 0
    ref, _ = ex.build(bridge)
    ref.load_state_dict({k: torch.from_numpy(np.load(os.path.join(a.export, "weights",
                                                                    k + ".npy")))
                         for k in want})
    X = torch.from_numpy(np.load(os.path.join(a.export, "inputs.npy")))
    Y = torch.from_numpy(np.load(os.path.join(a.export, "targets.npy")))
    losses = ex.train_pipeline(ref, X, Y, bridge["batch"], bridge["balance"], bridge["chunks"],
                               bridge["checkpoint"], bridge["batchnorm"], bridge["steps"],
                               bridge["lr"])
    print("pytorch losses:", " ".join("%.6f" % v for v in losses))
    worst, where = 0.0, ""
    for k, v in ref.state_dict().items():
        if k not in sd:
            continue
        d = (sd[k].double() - v.double()).abs() / v.double().abs().clamp(min=1.0)
        e = float(d.max()) if d.numel() else 0.0
        if e > worst:
            worst, where = e, k
    print("max difference pipescope vs pytorch: %.3g (%s), tolerance %g"
          % (worst, where or "-", a.tol))
    return 0 if worst <= a.tol else 1


if __name__ == "__main__":
    sys.exit(main())
