#!/usr/bin/python3
"""Record a real fairscale Pipe training step with PyTorch's profiler (the trace compare reads).

    /usr/bin/python3 tests/golden/traces/gen_fairscale.py --fairscale SRC -o tests/golden/traces/fairscale-3x3.trace.json

SRC is a checkout of https://github.com/facebookresearch/fairscale (the committed trace was made
from commit 146f160, "fix: use torch.empty instead of torch.Tensor (#1196)"). fairscale is not
installed here, so its pipe modules are imported from that source: `fairscale` and `fairscale.nn`
become bare packages whose __path__ points into SRC (their __init__ files import FSDP and other
parts this PyTorch build does not have), and `fairscale.nn.pipe.pipe` is imported from there
unchanged. Pipe's pipeline.py wraps each task's partition call in
record_function("chunk%d-part%d" % (chunk_id, part_id)); for a checkpointed task the same
function runs again at recompute, so the trace holds a second range of the same name.

The spec is tests/golden/traces/fairscale-3x3.spec.json (small-3x3 with variant fairscale): 3
partitions of an 8-8-8-4 MLP, balance [2, 2, 1], all on "cpu", 6 samples in 3 micro-batches,
checkpoint except_last, loss sum.

One change to how fairscale runs, and why it keeps the order: Debian's PyTorch 1.13 has no
Kineto, and its legacy profiler records only the thread that entered it; Pipe's worker threads
(one per distinct device: here one, "cpu") would not appear. So create_workers is replaced by
queues whose put() runs the body of fairscale's worker loop (worker.py: use_device, task.compute(),
out_queue.put) in the calling thread. With one worker that takes tasks first-in first-out, and a
main thread that puts a whole clock tick before it gets the results, this is the same sequence of
tasks as the thread would run. Backward (and so every recompute) runs on the thread that called
backward() for CPU tensors and is recorded as it is.
"""
import argparse
import json
import os
import sys
import types


def import_pipe(src):
    for name, sub in (("fairscale", ""), ("fairscale.nn", "nn")):
        mod = types.ModuleType(name)
        mod.__path__ = [os.path.join(src, "fairscale", sub)]
        sys.modules[name] = mod
    pkg = types.ModuleType("fairscale.nn.pipe")
    pkg.__path__ = [os.path.join(src, "fairscale", "nn", "pipe")]
    sys.modules["fairscale.nn.pipe"] = pkg
    import importlib

    pipe = importlib.import_module("fairscale.nn.pipe.pipe")
    pipeline = importlib.import_module("fairscale.nn.pipe.pipeline")
    worker = importlib.import_module("fairscale.nn.pipe.worker")
    stream = importlib.import_module("fairscale.nn.pipe.stream")
    return pipe, pipeline, worker, stream


class InlineQueue:
    """fairscale's worker loop body (worker.py), run when the task is put."""

    def __init__(self, out_queue, device, use_device):
        self.out_queue, self.device, self.use_device = out_queue, device, use_device

    def put(self, task):
        if task is None:  # join_workers: the worker answers 'done'
            self.out_queue.put((False, None))
            return
        with self.use_device(self.device):
            try:
                batch = task.compute()
            except Exception:
                self.out_queue.put((False, sys.exc_info()))
                return
            self.out_queue.put((True, (task, batch)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fairscale", required=True, help="fairscale source checkout")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import torch
    from queue import Queue
    from torch import nn

    pipe_mod, pipeline_mod, worker_mod, stream_mod = import_pipe(os.path.abspath(a.fairscale))

    def create_workers(devices):
        workers, ins, outs = {}, [], []
        for d in devices:
            d = torch.device("cpu") if d.type == "cpu" else d
            if d not in workers:
                out = Queue()
                workers[d] = (InlineQueue(out, d, stream_mod.use_device), out)
            ins.append(workers[d][0])
            outs.append(workers[d][1])
        return ins, outs

    pipeline_mod.create_workers = create_workers
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    pipe = pipe_mod.Pipe(model, balance=[2, 2, 1], devices=["cpu", "cpu", "cpu"], chunks=3,
                         checkpoint="except_last")
    x = torch.randn(6, 8)
    for _ in range(2):  # warm-up step, not recorded
        pipe(x).sum().backward()
    with torch.autograd.profiler.profile() as prof:
        pipe(x).sum().backward()
    prof.export_chrome_trace(a.output)
    with open(a.output) as f:
        ev = json.load(f)
    names = sorted(e["name"] for e in ev if e.get("name", "").startswith("chunk"))
    print(f"{a.output}: {len(ev)} events, {len(names)} chunk ranges: {' '.join(names)}")


if __name__ == "__main__":
    main()
