#!/usr/bin/python3
"""CPU backend vs PyTorch 1.13 on the CPU: time per training iteration, same model, same
micro-batching (torchgpipe mirror of examples/export_pytorch.py), same machine. PyTorch gets torch.set_num_threads(2); pipescope's sgemm uses the online
CPUs (at most 16): run it on a 2-core machine (or under taskset -c 0,1) for equal threads.

    /usr/bin/python3 tests/bench_cpu.py PIPESCOPE SPEC... [--steps N]

Prints per spec: pipescope ms/iteration (median over steps 2..N of `pipescope run`'s own step
times), PyTorch ms/iteration (median, same steps), and the ratio pipescope / PyTorch (< 1 =
pipescope faster). Figures only; nothing is asserted.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import export_pytorch as ex  # noqa: E402


def build(spec):
    return ex.from_spec(spec["model"]["input"], spec["model"]["layers"])


def main():
    args = sys.argv[1:]
    steps = 20
    if "--steps" in args:
        k = args.index("--steps")
        steps = int(args[k + 1])
        del args[k:k + 2]
    pipescope, specs = args[0], args[1:]
    torch.set_num_threads(2)
    print("%-22s %7s %6s %-12s %-10s %14s %14s %8s" % ("spec", "batch", "chunks", "checkpoint",
                                                    "batchnorm", "pipescope ms", "pytorch ms",
                                                    "ratio"))
    for path in specs:
        with open(path) as fh:
            spec = json.load(fh)
        with tempfile.TemporaryDirectory() as tmp:
            rep = os.path.join(tmp, "r.json")
            subprocess.run([pipescope, "run", path, "--steps", str(steps), "--json", rep, "-q"],
                           check=True)
            with open(rep) as fh:
                us = json.load(fh)["execution"]["step_us"]
        ps_ms = statistics.median(us[1:]) / 1000.0
        seq, out_shape = build(spec)
        N, p = spec["batch"], spec["pipeline"]
        X = torch.randn(N * steps, *spec["model"]["input"])
        Y = torch.randint(0, out_shape[0], (N * steps,))
        times = []
        for s in range(steps):
            t0 = time.perf_counter()
            ex.train_pipeline(seq, X[s * N:(s + 1) * N], Y[s * N:(s + 1) * N], N, p["balance"],
                              p["chunks"], p["checkpoint"], "plain", 1, 0.01)
            times.append(time.perf_counter() - t0)
        pt_ms = statistics.median(times[1:]) * 1000.0
        print("%-22s %7d %6d %-12s %-10s %14.3f %14.3f %8.2f" % (
            spec.get("name", os.path.basename(path))[:22], N, p["chunks"], p["checkpoint"],
            p.get("batchnorm", "plain"), ps_ms, pt_ms, ps_ms / pt_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
