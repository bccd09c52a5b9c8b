#!/usr/bin/python3
"""Profile a torchgpipe-style GPipe run on the CPU and export a Chrome trace pipescope can read.

    /usr/bin/python3 examples/profile_torchgpipe.py SPEC.json -o trace.json [--steps N]
    pipescope compare SPEC.json --measured trace.json

Runs with Debian's python3-torch (1.13, CPU). The pipeline is a compact mirror of torchgpipe
0.0.7 (SEMANTICS.md sections 1-5): the mini-batch is split with Tensor.chunk, tasks (i, j) run
in clock-cycle order (tick k: i + j = k), depend() adds the fork/join phony edges, micro-batch
i < checkpoint_stop runs under no_grad with a Checkpoint/Recompute pair, the loss is computed on
the gathered output and backward is left to the autograd engine. Every task is one
record_function range named after the task, as examples/PROFILER.md describes:

    F(i,j)  the forward of partition j on micro-batch i (checkpointed or not)
    R(i,j)  the recomputation (inside Recompute.backward)
    B(i,j)  the backward: Checkpoint.backward for a checkpointed task, else the span from the
            gradient reaching the partition's output to the gradient leaving its input

Copies and waits are no-ops on one CPU and are not recorded. Only the spec's model, balance,
chunks, checkpoint and batch are used (linear/conv2d/batchnorm/relu/maxpool2d/flatten/dropout
layers; loss sum, mse or cross_entropy on synthetic data). The profiler of this PyTorch build
(no Kineto) records the calling thread only, so the single CPU worker runs in the main thread;
with devices all "cpu" torchgpipe has exactly one worker thread too, and the order of work is
the same. The LAST step is profiled (earlier steps warm up).
"""
import argparse
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile


def build_layers(spec):
    shape = list(spec['model']['input'])
    layers = []
    for L in spec['model']['layers']:
        op = L['op']
        if op == 'linear':
            layers.append(nn.Linear(shape[0], L['out'], bias=L.get('bias', True)))
            shape = [L['out']]
        elif op == 'conv2d':
            k, s, p = L['kernel'], L.get('stride', 1), L.get('padding', 0)
            layers.append(nn.Conv2d(shape[0], L['out'], k, s, p, bias=L.get('bias', True)))
            shape = [L['out'], (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1]
        elif op == 'batchnorm':
            bn = nn.BatchNorm1d if len(shape) == 1 else nn.BatchNorm2d
            layers.append(bn(shape[0], eps=L.get('eps', 1e-5), momentum=L.get('momentum', 0.1)))
        elif op == 'relu':
            layers.append(nn.ReLU())
        elif op == 'dropout':
            layers.append(nn.Dropout(L.get('p', 0.5)))
        elif op == 'maxpool2d':
            k = L['kernel']
            s = L.get('stride', k)
            layers.append(nn.MaxPool2d(k, s, L.get('padding', 0)))
            shape = [shape[0], (shape[1] - k) // s + 1, (shape[2] - k) // s + 1]
        elif op == 'flatten':
            layers.append(nn.Flatten())
            shape = [math.prod(shape)]
        else:
            raise SystemExit(f'unsupported op {op}')
    return layers


# ---- torchgpipe's dependency.py: fork / join through a phony --------------------------------

class Fork(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input):
        return input.detach(), torch.empty(0, device=input.device)

    @staticmethod
    def backward(ctx, grad_input, grad_grad):
        return grad_input


class Join(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, phony):
        return input.detach()

    @staticmethod
    def backward(ctx, grad_input):
        return grad_input, None


def depend(fork_from, join_to):
    if not (torch.is_grad_enabled() and fork_from.requires_grad):
        return fork_from, join_to
    fork_from, phony = Fork.apply(fork_from)
    return fork_from, Join.apply(join_to, phony)


# ---- checkpoint.py: Checkpoint / Recompute, with the task ranges ------------------------------

class Checkpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, phony, recomputed, task, function, input):
        ctx.recomputed, ctx.task = recomputed, task
        ctx.save_for_backward(input)
        with torch.no_grad():
            return function(input)

    @staticmethod
    def backward(ctx, grad_output):
        output, input_leaf = ctx.recomputed.pop()
        with record_function('B(%d,%d)' % ctx.task):
            torch.autograd.backward(output, grad_output)
        return None, None, None, None, input_leaf.grad


class Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, phony, recomputed, task, function, input):
        ctx.recomputed, ctx.task, ctx.function = recomputed, task, function
        ctx.save_for_backward(input)
        return phony

    @staticmethod
    def backward(ctx, grad_phony):
        (input,) = ctx.saved_tensors
        leaf = input.detach().requires_grad_(input.requires_grad)
        with record_function('R(%d,%d)' % ctx.task), torch.enable_grad():
            output = ctx.function(leaf)
        ctx.recomputed.append((output, leaf))
        return None, None, None, None, None


# ---- B(i,j) of a non-checkpointed task: identity Functions that open and close the range ----

class _BEnter(torch.autograd.Function):
    """At the partition's output: its backward runs first, so it opens B(i,j)."""
    @staticmethod
    def forward(ctx, x, box):
        ctx.box = box
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.box['range'] = record_function(ctx.box['name'])
        ctx.box['range'].__enter__()
        return g, None


class _BExit(torch.autograd.Function):
    """At the partition's input: its backward runs last, so it closes B(i,j)."""
    @staticmethod
    def forward(ctx, x, phony, box):
        ctx.box = box
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.box['range'].__exit__(None, None, None)
        return g, None, None


def run_task(partition, x, i, j, checkpointed):
    name = 'F(%d,%d)' % (i, j)
    if checkpointed:
        phony = torch.ones(0, requires_grad=True)
        recomputed = []
        with record_function(name):
            y = Checkpoint.apply(phony, recomputed, (i, j), partition, x)
        # collect: fork the output, hang Recompute on the phony lane, join back
        y, ph = Fork.apply(y) if y.requires_grad else (y, torch.empty(0))
        ph = Recompute.apply(ph, recomputed, (i, j), partition, x)
        return Join.apply(y, ph)
    box = {'name': 'B(%d,%d)' % (i, j)}
    # a requires-grad phony keeps _BExit in the graph even where x needs no gradient (j = 0)
    x = _BExit.apply(x, torch.ones(0, requires_grad=True), box)
    with record_function(name):
        y = partition(x)
    return _BEnter.apply(y, box)


def step(spec, partitions, x, target, checkpoint_stop):
    chunks = spec['pipeline']['chunks']
    batches = list(x.chunk(chunks))
    m, n = len(batches), len(partitions)
    for k in range(m + n - 1):
        for j in range(max(0, k - m + 1), min(k, n - 1) + 1):
            i = k - j
            if i != 0:  # fence: depend(batches[i-1], batches[i])
                batches[i - 1], batches[i] = depend(batches[i - 1], batches[i])
        for j in range(max(0, k - m + 1), min(k, n - 1) + 1):
            i = k - j
            batches[i] = run_task(partitions[j], batches[i], i, j, i < checkpoint_stop)
    out = torch.cat(batches)
    loss = spec['model'].get('loss', 'sum')
    if loss == 'cross_entropy':
        value = F.cross_entropy(out, target)
    elif loss == 'mse':
        value = F.mse_loss(out, target)
    else:
        value = out.sum()
    value.backward()
    return value.item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('spec')
    ap.add_argument('-o', '--output', required=True)
    ap.add_argument('--steps', type=int, default=2)
    ap.add_argument('--seed', type=int, default=0)
    a = ap.parse_args()
    spec = json.load(open(a.spec))
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    layers = build_layers(spec)
    balance = spec['pipeline']['balance']
    partitions, k = [], 0
    for b in balance:
        partitions.append(nn.Sequential(*layers[k:k + b]))
        k += b
    chunks = spec['pipeline']['chunks']
    mode = spec['pipeline'].get('checkpoint', 'except_last')
    checkpoint_stop = {'always': chunks, 'except_last': chunks - 1, 'never': 0}[mode]
    N = spec['batch']
    x = torch.randn(N, *spec['model']['input'])
    out_dim = partitions[-1](nn.Sequential(*layers[:-balance[-1]])(x[:2]) if len(balance) > 1 else x[:2]).shape[1]
    loss = spec['model'].get('loss', 'sum')
    target = (torch.randint(0, out_dim, (N,)) if loss == 'cross_entropy'
              else torch.randn(N, out_dim))
    opt = torch.optim.SGD([p for q in partitions for p in q.parameters()],
                          lr=spec.get('train', {}).get('lr', 0.05))
    for s in range(a.steps):
        opt.zero_grad()
        if s == a.steps - 1:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                v = step(spec, partitions, x, target, checkpoint_stop)
            prof.export_chrome_trace(a.output)
        else:
            v = step(spec, partitions, x, target, checkpoint_stop)
        opt.step()
        print('step %d loss %.6g' % (s, v))
    print('wrote', a.output)


if __name__ == '__main__':
    main()
