#!/usr/bin/python3
"""Golden backward-execution orders for pipescope, produced by real PyTorch autograd.

Run with PyTorch 1.13 (``/usr/bin/python3 tests/golden/order/gen_order.py --out tests/golden/order``).

What this is
------------
torchgpipe is not installed here, so this file re-implements the part of torchgpipe 0.0.7 that shapes the
autograd graph, with real ``torch.autograd.Function`` classes, and builds exactly the same graph, in the
same creation order, in the same threads:

* ``Fork`` / ``Join`` (dependency.py): ``fork(x)`` applies Fork only when grad is on and ``x`` requires grad,
  otherwise it hands out a cached phony; ``join(x, phony)`` applies Join only when one of them requires
  grad. ``depend(a, b)`` forks ``a[0]`` and joins the phony into ``b[0]``.
* ``Copy`` / ``Wait`` (copy.py): stream no-ops on CPU, but the Functions are still applied, so each one
  creates an autograd node (``Copy`` returns its input tensor itself on CPU, ``Wait`` returns a detach).
* ``Checkpoint`` / ``Recompute`` / ``Checkpointing`` (checkpoint.py): Checkpoint runs the partition under
  ``no_grad`` with a requires-grad phony as its first input; Recompute hangs off a fork of the output and
  is joined back; in backward Recompute re-runs the partition with grad on and Checkpoint runs a
  reentrant ``torch.autograd.backward`` on the recomputed graph.
* ``Pipeline`` (pipeline.py): ``clock_cycles`` (tick k holds (i, j) with i + j = k, partition j
  ascending), ``fence`` (depend(batches[i-1], batches[i]) when i != 0, then Copy when j != 0) and
  ``compute`` (Wait in when j != 0; the task runs in the worker thread - Checkpoint.apply when
  i < checkpoint_stop, the plain partition otherwise; then, in schedule order in the MAIN thread, Wait
  out when j != n-1 and the task's finalize, which for a checkpointed task is fork/Recompute/join).
* ``spawn_workers`` (worker.py): one worker thread per distinct device, spawned afresh for every forward
  (all devices are "cpu" here, so exactly one worker thread); it inherits the caller's grad mode.
* GPipe.forward (gpipe.py): scatter with ``Tensor.chunk``, checkpoint_stop = chunks (always),
  chunks-1 (except_last) or 0 (never), Pipeline(...).run(), gather with ``torch.cat``; then here
  ``loss = output.sum()`` and ``loss.backward()``.

Indices: like SEMANTICS.md and torchgpipe >= 0.0.5, i = micro-batch and j = partition everywhere.

Why threads matter: autograd sequence numbers come from a THREAD-LOCAL counter (at::sequence_number), and
the engine's ready queue pops the largest (reentrant depth, sequence_nr) first. Nodes created in the
worker thread and in the main thread are numbered by different counters. The worker's counter starts at
0 on every forward, the main thread's counter keeps running across iterations.

  main thread  : Fork, Join (depend), Copy, both Waits, Fork/Recompute/Join (finalize), cat, sum,
                 and, during backward, the recomputed partition graph (reentrant depth 1).
  worker thread: the partition's own nodes (non-checkpointed tasks) or the single Checkpoint node.

Every ``Function.apply`` takes a sequence number even when no input requires grad; built-in ops take one
only when they record a node.

Each case runs in a fresh Python thread that plays the role of the training script's main thread, so
its sequence counter starts at 0 (the same as the real main thread of a fresh process right after
``import torch``; ``--single CASE`` runs one case in the real main thread to cross-check).

Recording protocol (what the golden means)
-----------------------------------------
* Each partition is an ``nn.Sequential``; each task gets its own closure carrying (i, j).
* ``F(i,j)``: the closure is entered for a normal or checkpointed (no_grad) forward (worker thread).
* ``R(i,j)``: the closure is entered inside Recompute's backward (thread-local "recomputing" flag).
* ``B(i,j)``: a tensor hook fires; for a non-checkpointed task it is registered (in the worker, inside
  the task) on the partition's output tensor, so it fires when that tensor's grad_fn is about to run;
  for a checkpointed task it is registered on the Checkpoint node's output. No extra autograd Function is
  used for recording, so sequence numbers are those of the real pipeline.
* The .order file holds the F lines in recording order, then the R/B lines in recording order.
* Iteration 0 is recorded with a freshly built model; iteration 1 is a second forward + backward of the
  same model in the same "main" thread (its counter has moved on, the new worker's restarts at 0). When
  the orders differ, ``<case>.iter1.order`` holds iteration 1. ``index.json`` lists every case, its
  counters and whether iteration 1 differs.

Outputs (into --out): ``<case>.json`` (pipescope spec, src/SPEC.md), ``<case>.order``,
``<case>.iter1.order`` where needed, ``index.json``, and ``nodes_m2_n2_except_last.txt`` /
``nodes_m2_n2_always.txt`` (every autograd node reachable from the loss with creation thread, class,
sequence number, next_functions, execution order as seen by the engine, the reentrant recompute graphs,
a per-layer node census). With ``--verify`` also ``engine_model_check.json``: every case is captured
under the profiler and replayed on two engine models (see simulate_engine); the exact libstdc++
std::priority_queue emulation must reproduce every real order, because (depth, sequence_nr) ties between
main-thread and worker-thread nodes do occur and are broken by the heap's layout.

Regenerate: /usr/bin/python3 tests/golden/order/gen_order.py --out tests/golden/order --verify
(about 6 s without --verify, about 90 s with it).
"""
import argparse
import contextlib
import ctypes
import json
import os
import sys
import threading
from queue import Queue

import torch
from torch import nn

torch.set_num_threads(1)

# ---------------------------------------------------------------------------------------------------
# Sequence-number probe: at::sequence_number::peek() of the CALLING thread (read-only, via ctypes).
# ---------------------------------------------------------------------------------------------------
_peek = None
try:
    _lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), 'lib', 'libtorch_cpu.so'))
    _peek = _lib._ZN2at15sequence_number4peekEv
    _peek.restype = ctypes.c_uint64
    _peek.argtypes = []
except (OSError, AttributeError):  # pragma: no cover - other builds
    _peek = None


def seq_peek():
    return int(_peek()) if _peek is not None else None


# ---------------------------------------------------------------------------------------------------
# Streams: CPU only, so a stream is an inert token and all stream operations are no-ops.
# ---------------------------------------------------------------------------------------------------
class CPUStreamToken:
    def __repr__(self):
        return 'CPUStream'


CPU_STREAM = CPUStreamToken()


def new_stream(device):
    return CPU_STREAM


def current_stream(device):
    return CPU_STREAM


@contextlib.contextmanager
def use_stream(stream):
    yield


def wait_stream(source, target):
    pass


def record_stream(tensor, stream):
    pass


# ---------------------------------------------------------------------------------------------------
# phony.py
# ---------------------------------------------------------------------------------------------------
_phony_cache = {}


def get_phony(device, *, requires_grad):
    key = (device, requires_grad)
    if key not in _phony_cache:
        _phony_cache[key] = torch.empty(0, device=device, requires_grad=requires_grad)
    return _phony_cache[key]


# ---------------------------------------------------------------------------------------------------
# dependency.py
# ---------------------------------------------------------------------------------------------------
class Fork(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input):
        phony = get_phony(input.device, requires_grad=False)
        return input.detach(), phony.detach()

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


def fork(input):
    if torch.is_grad_enabled() and input.requires_grad:
        input, phony = Fork.apply(input)
    else:
        phony = get_phony(input.device, requires_grad=False)
    return input, phony


def join(input, phony):
    if torch.is_grad_enabled() and (input.requires_grad or phony.requires_grad):
        input = Join.apply(input, phony)
    return input


# ---------------------------------------------------------------------------------------------------
# copy.py
# ---------------------------------------------------------------------------------------------------
class Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, prev_stream, next_stream, *input):
        ctx.prev_stream = prev_stream
        ctx.next_stream = next_stream
        outputs = []
        with use_stream(prev_stream), use_stream(next_stream):
            for x in input:
                y = x.to('cpu')  # same device: returns x itself, exactly as torchgpipe on one CPU
                outputs.append(y)
                record_stream(x, prev_stream)
                record_stream(y, next_stream)
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grad_output):
        grads = []
        with use_stream(ctx.prev_stream), use_stream(ctx.next_stream):
            for g in reversed(grad_output):
                grads.insert(0, g.to('cpu'))
        return (None, None) + tuple(grads)


class Wait(torch.autograd.Function):
    @staticmethod
    def forward(ctx, prev_stream, next_stream, *input):
        ctx.prev_stream = prev_stream
        ctx.next_stream = next_stream
        wait_stream(next_stream, prev_stream)
        return tuple(x.detach() for x in input)

    @staticmethod
    def backward(ctx, *grad_input):
        wait_stream(ctx.prev_stream, ctx.next_stream)
        return (None, None) + grad_input


# ---------------------------------------------------------------------------------------------------
# checkpoint.py
# ---------------------------------------------------------------------------------------------------
class _ThreadFlags(threading.local):
    def __init__(self):
        self.is_checkpointing = False
        self.is_recomputing = False
        self.reentrant_depth = 0
        self.reentrant_probe = None


_flags = _ThreadFlags()


@contextlib.contextmanager
def _flag(name):
    old = getattr(_flags, name)
    setattr(_flags, name, True)
    try:
        yield
    finally:
        setattr(_flags, name, old)


def is_recomputing():
    return _flags.is_recomputing


class Checkpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, phony, recomputed, rng_states, function, input_atomic, *input):
        ctx.recomputed = recomputed
        ctx.rng_states = rng_states
        rng_states.append((torch.get_rng_state(), None))
        ctx.function = function
        ctx.input_atomic = input_atomic
        ctx.save_for_backward(*input)
        with torch.no_grad(), _flag('is_checkpointing'):
            output = function(input[0] if input_atomic else input)
        return output

    @staticmethod
    def backward(ctx, *grad_output):
        output, input_leaf = ctx.recomputed.pop()
        tensors = output if isinstance(output, tuple) else (output,)
        if any(y.requires_grad for y in tensors):
            probe = _flags.reentrant_probe  # instrumentation for the node dump only (no nodes)
            if probe is not None:
                probe.enter(tensors)
            _flags.reentrant_depth += 1
            try:
                torch.autograd.backward(tensors, grad_output)  # reentrant backward, depth + 1
            finally:
                _flags.reentrant_depth -= 1
                if probe is not None:
                    probe.exit()
        grads = [None, None, None, None, None]
        grads.extend(x.grad for x in input_leaf)
        return tuple(grads)


class Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, phony, recomputed, rng_states, function, input_atomic, *input):
        ctx.recomputed = recomputed
        ctx.rng_states = rng_states
        ctx.function = function
        ctx.input_atomic = input_atomic
        ctx.save_for_backward(*input)
        return phony

    @staticmethod
    def backward(ctx, *grad_output):
        input = ctx.saved_tensors
        input_leaf = tuple(x.detach().requires_grad_(x.requires_grad) for x in input)
        cpu_state, _ = ctx.rng_states.pop()
        with torch.random.fork_rng([]):
            torch.set_rng_state(cpu_state)
            with torch.enable_grad(), _flag('is_recomputing'):
                output = ctx.function(input_leaf[0] if ctx.input_atomic else input_leaf)
        ctx.recomputed.append((output, input_leaf))
        grads = [None, None, None, None, None]
        grads.extend(None for _ in input)
        return tuple(grads)


class Checkpointing:
    """Pair of Checkpoint and Recompute for one task. ``on_output`` is the recorder's hook installer,
    called (in the worker, inside the task) on the Checkpoint node's output."""

    def __init__(self, function, batch, on_output=None):
        self.function = function
        self.batch = batch
        self.on_output = on_output
        self.recomputed = __import__('collections').deque(maxlen=1)
        self.rng_states = __import__('collections').deque(maxlen=1)

    def checkpoint(self):
        input_atomic = self.batch.atomic
        input = tuple(self.batch)
        phony = get_phony(self.batch[0].device, requires_grad=True)
        output = Checkpoint.apply(phony, self.recomputed, self.rng_states,
                                  self.function, input_atomic, *input)
        out = Batch(output)
        if self.on_output is not None:
            self.on_output(out[0])
        return out

    def recompute(self, batch):
        input_atomic = self.batch.atomic
        input = tuple(self.batch)
        batch[0], phony = fork(batch[0])
        phony = Recompute.apply(phony, self.recomputed, self.rng_states,
                                self.function, input_atomic, *input)
        batch[0] = join(batch[0], phony)


# ---------------------------------------------------------------------------------------------------
# microbatch.py (atomic and tuple batches)
# ---------------------------------------------------------------------------------------------------
class Batch:
    def __init__(self, value):
        self.value = value
        self.atomic = torch.is_tensor(value)

    def call(self, function):
        return Batch(function(self.value))

    def __iter__(self):
        if self.atomic:
            yield self.value
        else:
            yield from self.value

    def __len__(self):
        return 1 if self.atomic else len(self.value)

    def __getitem__(self, index):
        if not self.atomic:
            return self.value[index]
        if index != 0:
            raise IndexError('atomic batch allows index 0 only')
        return self.value

    def __setitem__(self, index, value):
        if isinstance(index, int):
            if self.atomic:
                if index != 0:
                    raise IndexError('atomic batch allows index 0 only')
                self.value = value
            else:
                self.value = self.value[:index] + (value,) + self.value[index + 1:]
        else:
            if self.atomic:
                if len(value) != 1:
                    raise IndexError('atomic batch cannot be replaced with multiple tensors')
                self.value = value[0]
            else:
                self.value = tuple(value)


def scatter(input, chunks):
    return [Batch(x) for x in input.chunk(chunks)]


def gather(outputs):
    return torch.cat(tuple(b[0] for b in outputs))


# ---------------------------------------------------------------------------------------------------
# worker.py
# ---------------------------------------------------------------------------------------------------
class Task:
    def __init__(self, stream, *, compute, finalize):
        self.stream = stream
        self._compute = compute
        self._finalize = finalize

    def compute(self):
        with use_stream(self.stream):
            return self._compute()

    def finalize(self, batch):
        if self._finalize is None:
            return
        with use_stream(self.stream):
            self._finalize(batch)


def _worker_main(in_queue, out_queue, grad_mode, registry):
    torch.set_grad_enabled(grad_mode)
    registry.add(threading.get_ident())
    while True:
        task = in_queue.get()
        if task is None:
            break
        try:
            batch = task.compute()
        except Exception:
            out_queue.put((False, sys.exc_info()))
            continue
        out_queue.put((True, (task, batch)))
    out_queue.put((False, None))


@contextlib.contextmanager
def spawn_workers(devices, registry):
    """One worker thread per distinct (normalised) device, for the duration of one forward."""
    in_queues, out_queues, workers = [], [], {}
    for device in devices:
        device = torch.device(device)
        if device.type == 'cpu':
            device = torch.device('cpu')
        if device not in workers:
            iq, oq = Queue(), Queue()
            workers[device] = (iq, oq)
            threading.Thread(target=_worker_main,
                             args=(iq, oq, torch.is_grad_enabled(), registry),
                             daemon=True).start()
        iq, oq = workers[device]
        in_queues.append(iq)
        out_queues.append(oq)
    try:
        yield in_queues, out_queues
    finally:
        for iq in set(in_queues):
            iq.put(None)
        running = set(out_queues)
        while running:
            oq = running.pop()
            ok, payload = oq.get()
            if (ok, payload) == (False, None):
                continue
            running.add(oq)


# ---------------------------------------------------------------------------------------------------
# Tracing of node creation (only for the node dump; adds no autograd node).
# ---------------------------------------------------------------------------------------------------
class Tracer:
    """Logs, per creation step, the calling thread and its sequence counter before/after."""

    def __init__(self, main_ident):
        self.main_ident = main_ident
        self.steps = []  # (thread, label, seq_before, seq_after)

    def thread_name(self):
        return 'main' if threading.get_ident() == self.main_ident else 'worker'

    def reserve(self):
        """Called by the main thread when it issues a worker task, so that the task's step is listed
        where it was issued (deterministic), not where the worker happened to finish it."""
        self.steps.append(None)
        return len(self.steps) - 1

    @contextlib.contextmanager
    def step(self, label, slot=None):
        before = seq_peek()
        yield
        entry = (self.thread_name(), label, before, seq_peek())
        if slot is None:
            self.steps.append(entry)
        else:
            self.steps[slot] = entry


@contextlib.contextmanager
def _maybe(tracer, label, slot=None):
    if tracer is None:
        yield
    else:
        with tracer.step(label, slot):
            yield


# ---------------------------------------------------------------------------------------------------
# pipeline.py
# ---------------------------------------------------------------------------------------------------
def depend(fork_from, join_to):
    fork_from[0], phony = fork(fork_from[0])
    join_to[0] = join(join_to[0], phony)


def copy(batch, prev_stream, next_stream):
    batch[:] = Copy.apply(prev_stream, next_stream, *batch)


def wait(batch, prev_stream, next_stream):
    batch[:] = Wait.apply(prev_stream, next_stream, *batch)


def clock_cycles(m, n):
    for k in range(m + n - 1):
        yield [(k - j, j) for j in range(max(1 + k - m, 0), min(1 + k, n))]


class Recorder:
    def __init__(self):
        self.forward = []   # F lines (worker thread)
        self.backward = []  # R/B lines (engine thread)

    def task_function(self, partition, i, j):
        """The per-task closure handed to the worker / Checkpointing; records F or R."""
        def function(input):
            if is_recomputing():
                self.backward.append('R(%d,%d)' % (i, j))
            else:
                self.forward.append('F(%d,%d)' % (i, j))
            return partition(input)
        return function

    def backward_hook(self, i, j):
        def install(tensor):
            def hook(grad):
                self.backward.append('B(%d,%d)' % (i, j))
            tensor.register_hook(hook)
        return install

    def lines(self):
        return self.forward + self.backward


class Pipeline:
    def __init__(self, batches, partitions, devices, copy_streams, checkpoint_stop,
                 recorder, phony=True, variant='torchgpipe', tracer=None, workers=None):
        self.batches = batches
        self.partitions = partitions
        self.devices = devices
        self.copy_streams = copy_streams
        self.checkpoint_stop = checkpoint_stop
        self.recorder = recorder
        self.phony = phony
        self.variant = variant
        self.tracer = tracer
        self.workers = workers if workers is not None else set()

    def _depends(self, j):
        if not self.phony:
            return False
        if self.variant == 'fairscale':
            return j != 0
        return True

    def run(self):
        m, n = len(self.batches), len(self.partitions)
        with spawn_workers(self.devices, self.workers) as (in_queues, out_queues):
            for schedule in clock_cycles(m, n):
                self.fence(schedule)
                self.compute(schedule, in_queues, out_queues)

    def fence(self, schedule):
        batches, cs, tr = self.batches, self.copy_streams, self.tracer
        for i, j in schedule:
            if i != 0 and self._depends(j):
                with _maybe(tr, 'depend: Fork(out of mb %d) + Join(into mb %d) at partition %d'
                            % (i - 1, i, j)):
                    depend(batches[i - 1], batches[i])
            next_stream = cs[j][i]
            if j != 0:
                with _maybe(tr, 'Copy C(%d,%d->%d)' % (i, j - 1, j)):
                    copy(batches[i], cs[j - 1][i], next_stream)

    def compute(self, schedule, in_queues, out_queues):
        batches, partitions, cs = self.batches, self.partitions, self.copy_streams
        n = len(partitions)
        tr, rec = self.tracer, self.recorder
        streams = [current_stream(d) for d in self.devices]
        exc_info = None

        for i, j in schedule:
            batch = batches[i]
            partition = partitions[j]
            if j != 0:
                with _maybe(tr, 'Wait in W(%d,%d) copy->compute' % (i, j)):
                    wait(batch, cs[j][i], streams[j])

            function = rec.task_function(partition, i, j)
            slot = tr.reserve() if tr is not None else None
            if i < self.checkpoint_stop:
                chk = Checkpointing(function, batch, on_output=rec.backward_hook(i, j))

                def compute(chk=chk, i=i, j=j, slot=slot):
                    with _maybe(tr, 'task (%d,%d): Checkpoint (partition under no_grad)' % (i, j),
                                slot):
                        return chk.checkpoint()

                def finalize(b, chk=chk, i=i, j=j):
                    with _maybe(tr, 'finalize (%d,%d): Fork + Recompute + Join' % (i, j)):
                        chk.recompute(b)

                task = Task(streams[j], compute=compute, finalize=finalize)
                del chk
            else:
                def compute(batch=batch, function=function, i=i, j=j, slot=slot):
                    with _maybe(tr, 'task (%d,%d): partition forward' % (i, j), slot):
                        out = batch.call(function)
                    rec.backward_hook(i, j)(out[0])
                    return out

                task = Task(streams[j], compute=compute, finalize=None)
            del compute
            in_queues[j].put(task)

        for i, j in schedule:
            ok, payload = out_queues[j].get()
            if exc_info is not None:
                continue
            if not ok:
                exc_info = payload
                continue
            task, batch = payload
            if j != n - 1:
                with _maybe(tr, 'Wait out W(%d,%d) compute->copy' % (i, j)):
                    wait(batch, streams[j], cs[j][i])
            task.finalize(batch)
            batches[i] = batch

        if exc_info is not None:
            raise exc_info[1].with_traceback(exc_info[2])


# ---------------------------------------------------------------------------------------------------
# gpipe.py (the parts of GPipe.forward that matter) and the case runner
# ---------------------------------------------------------------------------------------------------
CHECKPOINT_MODES = ('always', 'except_last', 'never')


def checkpoint_stop_for(mode, chunks):
    return {'always': chunks, 'except_last': chunks - 1, 'never': 0}[mode]


def layer_specs(recipe):
    if recipe == 'bn':
        return [{'op': 'linear', 'out': 4, 'bias': True},
                {'op': 'batchnorm', 'momentum': 0.1, 'eps': 1e-5},
                {'op': 'relu'}]
    return [{'op': 'linear', 'out': 4, 'bias': True}, {'op': 'relu'}]


def build_partition(recipe):
    if recipe == 'bn':
        return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, momentum=0.1, eps=1e-5), nn.ReLU())
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU())


class Case:
    def __init__(self, m, n, mode, phony=True, variant='torchgpipe', recipe='default'):
        self.m, self.n, self.mode, self.phony, self.variant, self.recipe = m, n, mode, phony, variant, recipe

    @property
    def name(self):
        s = 'm%d_n%d_%s' % (self.m, self.n, self.mode)
        if self.recipe == 'bn':
            s = 'bn_' + s
        if not self.phony:
            s += '_nophony'
        if self.variant == 'fairscale':
            s += '_fairscale'
        return s

    def spec(self):
        per = layer_specs(self.recipe)
        pipeline = {'schedule': 'gpipe', 'balance': [len(per)] * self.n, 'devices': ['cpu'] * self.n,
                    'chunks': self.m, 'checkpoint': self.mode, 'batchnorm': 'plain',
                    'phony': self.phony}
        if self.variant == 'fairscale':
            pipeline['variant'] = 'fairscale'
        return {'pipescope': 1, 'name': self.name, 'batch': 2 * self.m,
                'model': {'input': [4], 'layers': per * self.n, 'loss': 'sum'},
                'pipeline': pipeline}


class Model:
    """A GPipe-like wrapper: n partitions on 'cpu', chunks = m."""

    def __init__(self, case):
        torch.manual_seed(0)
        self.case = case
        self.partitions = [build_partition(case.recipe) for _ in range(case.n)]
        self.devices = [torch.device('cpu')] * case.n
        self.chunks = case.m

    def parameters(self):
        for p in self.partitions:
            yield from p.parameters()

    def forward(self, x, recorder, tracer=None, workers=None):
        batches = scatter(x, self.chunks)
        copy_streams = [[new_stream(d) for _ in range(self.chunks)] for d in self.devices]
        stop = checkpoint_stop_for(self.case.mode, self.chunks)
        Pipeline(batches, self.partitions, self.devices, copy_streams, stop, recorder,
                 phony=self.case.phony, variant=self.case.variant, tracer=tracer,
                 workers=workers).run()
        with _maybe(tracer, 'gather: torch.cat'):
            out = gather(batches)
        return out


def run_iterations(case, iterations=2):
    """Runs in the calling thread (the pipeline's 'main' thread). Returns per-iteration records."""
    model = Model(case)
    g = torch.Generator().manual_seed(1)
    results = []
    for it in range(iterations):
        for p in model.parameters():
            p.grad = None
        x = torch.randn(2 * case.m, 4, generator=g)
        rec = Recorder()
        main_seq_start = seq_peek()
        out = model.forward(x, rec)
        loss = out.sum()
        main_seq_after_forward = seq_peek()
        loss.backward()
        results.append({'lines': rec.lines(), 'main_seq_start': main_seq_start,
                        'main_seq_after_forward': main_seq_after_forward,
                        'main_seq_after_backward': seq_peek()})
    return results


def in_fresh_thread(fn, *args):
    box = {}

    def body():
        try:
            box['value'] = fn(*args)
        except BaseException as e:  # pragma: no cover
            box['error'] = e
    t = threading.Thread(target=body)
    t.start()
    t.join()
    if 'error' in box:
        raise box['error']
    return box['value']


def all_cases():
    sizes = [(m, n) for m in range(1, 9) for n in range(1, 7)] + [(16, 4), (12, 8), (32, 3)]
    cases = []
    for m, n in sizes:
        for mode in CHECKPOINT_MODES:
            for phony in (True, False):
                cases.append(Case(m, n, mode, phony=phony))
    for m, n in [(2, 2), (3, 2), (3, 3), (4, 3), (4, 4), (5, 2), (8, 4)]:
        for mode in CHECKPOINT_MODES:
            cases.append(Case(m, n, mode, variant='fairscale'))
    for m, n in [(2, 2), (3, 2), (3, 3), (4, 3), (5, 4), (8, 3)]:
        for mode in CHECKPOINT_MODES:
            for phony in (True, False):
                cases.append(Case(m, n, mode, phony=phony, recipe='bn'))
    return cases


# ---------------------------------------------------------------------------------------------------
# Node dump
# ---------------------------------------------------------------------------------------------------
def _fmt_seq(s):
    if s is None:
        return '?'
    if s < 0 or s >= 2 ** 63:
        return 'MAX'  # AccumulateGrad: UINT64_MAX
    return str(s)


def layer_census():
    """Sequence numbers a layer consumes when called (grad on, training mode)."""
    rows = []

    def count(label, fn):
        def body():
            before = seq_peek()
            fn()
            return seq_peek() - before
        rows.append((label, in_fresh_thread(body)))

    torch.manual_seed(0)
    lin, bn, relu = nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU()
    xg = lambda: torch.randn(2, 4).requires_grad_()  # noqa: E731
    x0 = lambda: torch.randn(2, 4)  # noqa: E731
    count('Linear(4,4,bias) on input requiring grad   (TBackward0 + AddmmBackward0)',
          lambda: lin(xg()))
    count('Linear(4,4,bias) on input NOT requiring grad (weight still does)', lambda: lin(x0()))
    count('BatchNorm1d(4) training, input requiring grad (NativeBatchNormBackward0)',
          lambda: bn(xg()))
    count('ReLU on input requiring grad (ReluBackward0)', lambda: relu(xg()))
    count('ReLU on input NOT requiring grad', lambda: relu(x0()))

    def nograd():
        with torch.no_grad():
            relu(bn(lin(xg())))
    count('Linear+BatchNorm1d+ReLU under no_grad (Checkpoint forward)', nograd)
    count('custom Function.apply, no input requires grad (PyNode still built)',
          lambda: Join.apply(x0(), torch.empty(0)))
    count('custom Function.apply, an input requires grad', lambda: Join.apply(xg(), torch.empty(0)))
    count('x.chunk(k) on input NOT requiring grad (scatter)', lambda: x0().chunk(2))
    count('torch.cat of tensors requiring grad (gather)', lambda: torch.cat([xg(), xg()]))
    count('tensor.sum() requiring grad (loss)', lambda: xg().sum())
    return rows


class GraphProbe:
    """Instrumentation for capture_graph: collects the outer graph and every reentrant (recompute)
    graph, and logs each node pre-hook firing as (graph id, node index). Adds no autograd node."""

    def __init__(self):
        self.graphs = []   # [{'nodes': [...], 'index': {id: k}, 'depth': d, 'parent': (gid, k)}]
        self.fires = []    # (gid, k) in engine execution order, all depths
        self.stack = []    # gids of the graph tasks currently running

    def add_graph(self, root, depth, parent):
        gid = len(self.graphs)
        nodes, index, queue = [root], {id(root): 0}, [root]
        while queue:
            node = queue.pop(0)
            for nxt, _ in node.next_functions:
                if nxt is not None and id(nxt) not in index:
                    index[id(nxt)] = len(nodes)
                    nodes.append(nxt)
                    queue.append(nxt)
        self.graphs.append({'nodes': nodes, 'index': index, 'depth': depth, 'parent': parent,
                            'children': {}})
        for k, node in enumerate(nodes):
            node.register_prehook(
                lambda grads, k=k, gid=gid, probe=self:
                probe.fires.append((gid, k)) if probe.stack and probe.stack[-1] == gid else None)
        return gid

    def enter(self, tensors):
        parent = self.fires[-1]  # the CheckpointBackward whose pre-hook just fired
        gid = self.add_graph(tensors[0].grad_fn, len(self.stack), parent)
        self.graphs[parent[0]]['children'][parent[1]] = gid
        self.stack.append(gid)

    def exit(self):
        self.stack.pop()


def capture_graph(case, iterations=1):
    """Builds the pipeline with creation tracing, runs backward under the autograd profiler and
    node pre-hooks, and returns the graphs of the LAST iteration. Call in a fresh 'main' thread."""
    from torch.autograd import profiler

    main_ident = threading.get_ident()
    model = Model(case)
    gen = torch.Generator().manual_seed(1)
    for it in range(iterations):
        for prm in model.parameters():
            prm.grad = None
        tracer = Tracer(main_ident)
        x = torch.randn(2 * case.m, 4, generator=gen)
        rec = Recorder()
        main_seq_start = seq_peek()
        out = model.forward(x, rec, tracer=tracer)
        with tracer.step('loss: sum'):
            loss = out.sum()
        probe = GraphProbe()
        probe.add_graph(loss.grad_fn, 0, None)
        probe.stack.append(0)
        _flags.reentrant_probe = probe
        try:
            with profiler.profile() as prof:
                loss.backward()
        finally:
            _flags.reentrant_probe = None

    # The engine's "autograd::engine::evaluate_function: <node>" profiler events carry the node's own
    # sequence_nr and its forward (creating) thread id. Event ids follow the order in which the
    # ranges were opened, which is the engine's execution order; the pre-hook log gives the node.
    prefix = 'autograd::engine::evaluate_function: '
    events = sorted((e for e in prof.function_events if e.name.startswith(prefix)),
                    key=lambda e: e.id)

    if len(events) != len(probe.fires):
        raise RuntimeError('%s: profiler/pre-hook mismatch: %d vs %d'
                           % (case.name, len(events), len(probe.fires)))
    main_tid = [e.fwd_thread for e in events if e.name == prefix + 'SumBackward0'][0]
    seq, thread, pos = {}, {}, {}
    for p, (e, (gid, k)) in enumerate(zip(events, probe.fires)):
        e.node_name = e.name[len(prefix):]
        e.depth = probe.graphs[gid]['depth']  # (the profiler's own nesting is not always exact)
        e.gid, e.k = gid, k
        node = probe.graphs[gid]['nodes'][k]
        if node.name() != e.node_name:
            raise RuntimeError('%s: order mismatch: %s vs %s' % (case.name, node.name(), e.node_name))
        if e.node_name == 'torch::autograd::AccumulateGrad':
            e.thread = '-'
        else:
            e.thread = 'main' if e.fwd_thread == main_tid else 'worker'
        seq[(gid, k)] = e.sequence_nr
        thread[(gid, k)] = e.thread
        pos[(gid, k)] = p

    # Names of leaves behind AccumulateGrad nodes.
    leaf_names = {}
    for j, part in enumerate(model.partitions):
        for pname, prm in part.named_parameters():
            leaf_names[id(prm)] = 'partition %d param %s' % (j, pname)
    for (dev, rg), ph in _phony_cache.items():
        leaf_names[id(ph)] = 'Checkpoint phony (requires_grad=%s)' % rg

    def label_of(k, gid=0):
        node = probe.graphs[gid]['nodes'][k]
        if node.name() == 'torch::autograd::AccumulateGrad':
            return 'leaf: ' + leaf_names.get(id(node.variable), 'recompute input leaf')
        s, th = seq[(gid, k)], thread[(gid, k)]
        for st_th, label, lo, hi in tracer.steps:
            if st_th == th and lo <= s < hi:
                return label
        return 'created during backward (Recompute, reentrant graph)'

    g0 = probe.graphs[0]
    return {'probe': probe, 'nodes': g0['nodes'], 'index': g0['index'], 'events': events,
            'seq': seq, 'thread': thread, 'pos': pos, 'label_of': label_of,
            'tracer': tracer, 'recorder': rec, 'main_seq_start': main_seq_start}


UINT64_MAX = 2 ** 64 - 1


def _key(g, gid, k):
    s = g['seq'][(gid, k)]
    return (g['probe'].graphs[gid]['depth'], UINT64_MAX if s < 0 else s)


def simulate_engine(g, exact_heap):
    """Replays the captured graphs (outer + reentrant) on a model of the 1.13 CPU engine: one ready
    queue ordered by (reentrant depth, sequence_nr), largest first; a finished node pushes its newly
    ready successors in next_functions order; a CheckpointBackward runs its reentrant graph to
    completion on the same queue before its successors are pushed.
    exact_heap=True emulates libstdc++'s std::priority_queue (push_heap / pop_heap) so that ties in
    (depth, sequence_nr) break exactly as in the real engine; False breaks ties by "first pushed".
    Returns (reproduces_real_order, ties) where ties counts pops with more than one entry of the
    top key in the queue (not counting AccumulateGrad, whose keys are all UINT64_MAX)."""
    probe = g['probe']
    heap, order, ties, counter = [], [], [0], [0]

    def less(a, b):
        return a[0] < b[0]

    def push(item):
        if exact_heap:
            heap.append(item)
            hole = len(heap) - 1
            parent = (hole - 1) // 2
            while hole > 0 and less(heap[parent], item):
                heap[hole] = heap[parent]
                hole = parent
                parent = (hole - 1) // 2
            heap[hole] = item
        else:
            heap.append(item)

    def pop():
        top_key = max(it[0] for it in heap)
        if top_key[1] != UINT64_MAX and sum(1 for it in heap if it[0] == top_key) > 1:
            ties[0] += 1  # AccumulateGrad ties (all UINT64_MAX) are not counted
        if not exact_heap:
            best = min((it for it in heap if it[0] == top_key), key=lambda it: it[3])
            heap.remove(best)
            return best
        top = heap[0]
        last = heap.pop()
        n = len(heap)
        if n == 0:
            return top
        # std::__adjust_heap(first, 0, n, last)
        hole, second = 0, 0
        while second < (n - 1) // 2:
            second = 2 * (second + 1)
            if less(heap[second], heap[second - 1]):
                second -= 1
            heap[hole] = heap[second]
            hole = second
        if n % 2 == 0 and second == (n - 2) // 2:
            second = 2 * (second + 1)
            heap[hole] = heap[second - 1]
            hole = second - 1
        parent = (hole - 1) // 2
        while hole > 0 and less(heap[parent], last):
            heap[hole] = heap[parent]
            hole = parent
            parent = (hole - 1) // 2
        heap[hole] = last
        return top

    def run(gid):
        graph = probe.graphs[gid]
        nodes, index = graph['nodes'], graph['index']
        deps = [0] * len(nodes)
        for node in nodes:
            for nxt, _ in node.next_functions:
                if nxt is not None:
                    deps[index[id(nxt)]] += 1
        counter[0] += 1
        push((_key(g, gid, 0), gid, 0, counter[0]))
        outstanding = 1
        while outstanding:
            _, cgid, k, _ = pop()
            order.append((cgid, k))
            if k in graph['children']:
                run(graph['children'][k])
            for nxt, _ in nodes[k].next_functions:
                if nxt is not None:
                    t = index[id(nxt)]
                    deps[t] -= 1
                    if deps[t] == 0:
                        counter[0] += 1
                        push((_key(g, gid, t), gid, t, counter[0]))
                        outstanding += 1
            outstanding -= 1

    run(0)
    return order == probe.fires, ties[0]


def node_dump(case):
    g = capture_graph(case)
    probe, events, label_of = g['probe'], g['events'], g['label_of']
    seq, thread, pos = g['seq'], g['thread'], g['pos']
    tracer, rec = g['tracer'], g['recorder']
    exact_ok, ties = simulate_engine(g, exact_heap=True)
    fifo_ok, _ = simulate_engine(g, exact_heap=False)

    def tag(gid, k):
        return '#%d' % k if gid == 0 else 'r%d#%d' % (gid, k)

    L = []
    L.append('# Autograd node dump for %s (PyTorch %s), iteration 0, fresh main thread'
             % (case.name, torch.__version__))
    L.append('# spec: m=%d micro-batches, n=%d partitions of %s, chunks=%d, checkpoint=%s '
             '(checkpoint_stop=%d), phony=%s, variant=%s'
             % (case.m, case.n, '[Linear(4,4), ReLU]' if case.recipe == 'default' else
                '[Linear(4,4), BatchNorm1d(4), ReLU]', case.m, case.mode,
                checkpoint_stop_for(case.mode, case.m), case.phony, case.variant))
    L.append('# Engine (1.13, CPU): one ready queue per thread, a std::priority_queue popping the largest')
    L.append('# (reentrant depth, sequence_nr). AccumulateGrad has sequence_nr UINT64_MAX (shown MAX).')
    L.append('# Sequence numbers come from a THREAD-LOCAL counter: "main" and "worker" numbers are')
    L.append('# independent and collide. seq/thread per node: autograd profiler (evaluate_function events:')
    L.append('# sequence_nr, fwd_thread); execution order: node pre-hooks; creation steps: ctypes')
    L.append('# at::sequence_number::peek() of the creating thread before/after each step.')
    L.append('')
    L.append('## Layer census: sequence numbers consumed per call (= nodes created, except leaves)')
    for label, c in layer_census():
        L.append('  %-80s %d' % (label, c))
    L.append('')
    L.append('## Creation steps in program order (worker tasks listed where the main thread issued them;')
    L.append('## thread, seq range of that thread\'s own counter)')
    for th, label, lo, hi in tracer.steps:
        rng = '-' if hi == lo else ('%d' % lo if hi == lo + 1 else '%d..%d' % (lo, hi - 1))
        L.append('  %-6s seq %-7s %s' % (th, rng, label))
    L.append('')
    for gid, graph in enumerate(probe.graphs):
        if gid == 0:
            L.append('## Outer graph: nodes reachable from the loss. idx = BFS index from the loss;')
            L.append('## exec = position in the engine listing below; next = [idx:input_nr, ...]')
            L.append('## (None = an input that needs no grad)')
        else:
            L.append('## Reentrant graph r%d (depth %d): rebuilt by Recompute in backward, run by %s'
                     % (gid, graph['depth'], tag(*graph['parent'])))
        L.append('  %-6s %-5s %-7s %-5s %-32s %-58s %s' % ('idx', 'exec', 'thread', 'seq', 'class',
                                                           'created by', 'next'))
        for k, node in enumerate(graph['nodes']):
            nxt = ', '.join('%s:%d' % (tag(gid, graph['index'][id(f)]), nr) if f is not None
                            else 'None' for f, nr in node.next_functions)
            L.append('  %-6s %-5s %-7s %-5s %-32s %-58s [%s]' % (
                tag(gid, k), pos.get((gid, k), '-'), thread.get((gid, k), '?'),
                _fmt_seq(seq.get((gid, k))), node.name(),
                label_of(k, gid) if gid == 0 or node.name().startswith('torch::')
                else 'main thread during backward (Recompute)', nxt))
        L.append('')
    L.append('## Engine execution order (every node run, reentrant graphs nested; depth = reentrant depth)')
    for p, e in enumerate(events):
        L.append('  %3d  depth %d  %-6s seq %-4s %-7s %s%s' % (
            p, e.depth, e.thread, _fmt_seq(e.sequence_nr), tag(e.gid, e.k), '  ' * e.depth,
            e.node_name))
    L.append('')
    L.append('## Engine-model check, replaying these graphs (see simulate_engine):')
    L.append('##   libstdc++ std::priority_queue on (depth, sequence_nr): %s'
             % ('reproduces the real order' if exact_ok else 'does NOT reproduce the real order'))
    L.append('##   same keys, ties broken first-pushed-first:            %s'
             % ('reproduces the real order' if fifo_ok else 'does NOT reproduce the real order'))
    L.append('##   pops with more than one queued entry of the top (depth, seq), AccumulateGrad aside: %d'
             % ties)
    L.append('')
    L.append('## Recorded order (golden format)')
    L.extend('  ' + line for line in rec.lines())
    return '\n'.join(L) + '\n'


# ---------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------
def write(path, text):
    with open(path, 'w') as f:
        f.write(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', default=os.path.dirname(os.path.abspath(__file__)),
                    help='output folder (default: this script\'s folder)')
    ap.add_argument('--single', metavar='CASE',
                    help='run one case (by name) in the real main thread and print both iterations')
    ap.add_argument('--no-dump', action='store_true', help='skip the node dumps')
    ap.add_argument('--verify', action='store_true',
                    help='also capture every case under the profiler and replay it on the engine '
                         'models, writing engine_model_check.json (about 80 s more)')
    args = ap.parse_args(argv)

    cases = all_cases()
    if args.single:
        case = {c.name: c for c in cases}[args.single]
        for it, r in enumerate(run_iterations(case)):
            print('# iteration %d (main seq start %s)' % (it, r['main_seq_start']))
            print('\n'.join(r['lines']))
        return 0

    os.makedirs(args.out, exist_ok=True)
    index, checks = [], []
    n_diff = n_model_fail = n_fifo_fail = n_ties = n_tie_cases = 0
    for case in cases:
        res = in_fresh_thread(run_iterations, case)
        it0, it1 = res[0]['lines'], res[1]['lines']
        write(os.path.join(args.out, case.name + '.json'), json.dumps(case.spec(), indent=1) + '\n')
        write(os.path.join(args.out, case.name + '.order'), '\n'.join(it0) + '\n')
        iter1_path = os.path.join(args.out, case.name + '.iter1.order')
        differs = it0 != it1
        if differs:
            n_diff += 1
            write(iter1_path, '\n'.join(it1) + '\n')
        elif os.path.exists(iter1_path):
            os.remove(iter1_path)
        index.append({'case': case.name, 'm': case.m, 'n': case.n, 'checkpoint': case.mode,
                      'phony': case.phony, 'variant': case.variant, 'recipe': case.recipe,
                      'iter1_differs': differs,
                      'main_seq': [[r['main_seq_start'], r['main_seq_after_forward'],
                                    r['main_seq_after_backward']] for r in res]})
        if args.verify:
            entry = {'case': case.name}
            for it in (0, 1):
                g = in_fresh_thread(capture_graph, case, it + 1)
                if g['recorder'].lines() != res[it]['lines']:
                    raise RuntimeError('%s: instrumented run differs from the golden' % case.name)
                same, ties = simulate_engine(g, exact_heap=True)
                fifo, _ = simulate_engine(g, exact_heap=False)
                entry['iter%d' % it] = {'heap_model_reproduces': same,
                                        'fifo_tie_model_reproduces': fifo, 'tied_pops': ties}
                n_model_fail += 0 if same else 1
                n_fifo_fail += 0 if fifo else 1
                n_ties += ties
                n_tie_cases += 1 if ties else 0
            checks.append(entry)
    write(os.path.join(args.out, 'index.json'),
          json.dumps({'torch': torch.__version__,
                      'note': 'main_seq per iteration: the main thread\'s autograd sequence counter '
                              'at the start of the forward, after loss = out.sum(), and after '
                              'backward (iteration 1 starts where iteration 0 ended); the worker '
                              'thread\'s counter starts at 0 on every forward.',
                      'cases': index}, indent=1) + '\n')
    print('%d cases, %d with iteration 1 != iteration 0' % (len(cases), n_diff))
    if args.verify:
        summary = ('engine-model replay of %d case-iterations: libstdc++ heap model fails on %d, '
                   'first-pushed tie-break fails on %d; %d case-iterations have tied pops (%d pops)'
                   % (2 * len(cases), n_model_fail, n_fifo_fail, n_tie_cases, n_ties))
        print(summary)
        write(os.path.join(args.out, 'engine_model_check.json'),
              json.dumps({'torch': torch.__version__, 'summary': summary,
                          'note': 'For every case and iteration the real graphs (outer + reentrant '
                                  'recompute graphs) are captured with their profiler sequence '
                                  'numbers and replayed by simulate_engine(). heap_model_reproduces: '
                                  'an emulated libstdc++ std::priority_queue keyed (reentrant '
                                  'depth, sequence_nr), successors pushed in next_functions order, '
                                  'gives the real engine order. fifo_tie_model_reproduces: same '
                                  'keys, ties broken first-pushed-first. tied_pops: pops where '
                                  'several queued entries shared the top key (AccumulateGrad '
                                  'aside).',
                          'cases': checks}, indent=1) + '\n')

    if not args.no_dump:
        for mode in ('except_last', 'always'):
            case = Case(2, 2, mode)
            text = in_fresh_thread(node_dump, case)
            write(os.path.join(args.out, 'nodes_%s.txt' % case.name), text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
