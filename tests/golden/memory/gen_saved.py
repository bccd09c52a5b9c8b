#!/usr/bin/python3
"""What PyTorch 1.13's autograd keeps for backward, per partition, for the memory model's test
(tests/test_model.c, test_saved_by_pytorch): each case's partitions run as torchgpipe runs them,
one nn.Sequential per partition on a micro-batch of its own input (which requires grad once a
layer with parameters came before), in train mode with grad on. A saved_tensors_hooks pack hook
sees every tensor autograd saves; the distinct storages among them are summed, leaving out
parameters and buffers (the model counts activations only) and 1-D tensors (BatchNorm's
per-channel save_mean and save_invstd; every activation here is [N, ...] with N >= 2).
The result is what the model calls a partition's kept bytes: in_bytes + fwd.net per sample,
times the micro-batch size (src/model.c "Activation memory"). Every case starts with a layer
with parameters (PyTorch saves nothing for a parameterless layer in front of it, where the
model and the cpu executor keep what its backward reads) and has no dropout (the CPU saves a
float mask, CUDA's native_dropout a 1-byte one: the model follows CUDA).

    /usr/bin/python3 tests/golden/memory/gen_saved.py   (writes saved.json beside it)
"""
import json
import os
import sys

import torch
from torch.autograd.graph import saved_tensors_hooks

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "examples"))
import export_pytorch as ex  # noqa: E402

MB = 3
CONV = lambda out, k, p=0: {"op": "conv2d", "out": out, "kernel": k, "padding": p}  # noqa: E731
CASES = [
    ("unet-block", [3, 8, 8],
     [CONV(4, 3, 1), {"op": "batchnorm"}, {"op": "relu"}, CONV(4, 3, 1), {"op": "batchnorm"},
      {"op": "relu"}, {"op": "maxpool2d", "kernel": 2}, CONV(2, 1), {"op": "flatten"},
      {"op": "linear", "out": 3}],
     [[10], [3, 4, 3], [2, 5, 3], [6, 4]]),
    ("mlp", [6],
     [{"op": "linear", "out": 8}, {"op": "relu"}, {"op": "linear", "out": 5}, {"op": "relu"},
      {"op": "linear", "out": 2}],
     [[5], [2, 2, 1], [1, 2, 2], [3, 2]]),
    ("pool-ends", [2, 6, 6],
     [CONV(3, 3, 1), {"op": "batchnorm"}, {"op": "relu"}, {"op": "maxpool2d", "kernel": 2},
      CONV(4, 3), {"op": "relu"}, {"op": "flatten"}, {"op": "linear", "out": 2}],
     [[8], [4, 2, 2], [4, 4]]),
]


def shapes(input_shape, layers):
    out, shape = [], list(input_shape)
    for k in range(len(layers)):
        out.append(shape)
        _, shape = ex.from_spec(shape, layers[k:k + 1])
    return out


def saved_bytes(seq, first, count, in_shape, grad):
    params = {p.storage().data_ptr() for p in seq.parameters()}
    params |= {b.storage().data_ptr() for b in seq.buffers()}
    seen = {}

    def pack(t):
        if t.dim() >= 2 and t.storage().data_ptr() not in params:
            seen[t.storage().data_ptr()] = t.storage().nbytes()
        return t

    x = torch.randn([MB] + in_shape, requires_grad=grad)
    part = torch.nn.Sequential(*list(seq)[first:first + count]).train()
    with saved_tensors_hooks(pack, lambda t: t):
        part(x)
    return sum(seen.values())


def main():
    torch.manual_seed(0)
    out = {"generator": "tests/golden/memory/gen_saved.py", "torch": torch.__version__,
           "micro_batch": MB, "cases": []}
    for name, input_shape, layers, balances in CASES:
        seq, _ = ex.from_spec(input_shape, layers)
        ins = shapes(input_shape, layers)
        for balance in balances:
            kept, first = [], 0
            for count in balance:
                grad = any(p.requires_grad for m in list(seq)[:first] for p in m.parameters())
                kept.append(saved_bytes(seq, first, count, ins[first], grad))
                first += count
            out["cases"].append({"name": name, "input": input_shape, "layers": layers,
                                 "balance": balance, "saved_bytes": kept})
    with open(os.path.join(HERE, "saved.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
