#!/usr/bin/env python3
"""Per-rank programs of PyTorch's own pipelining schedules, computed by PyTorch's code itself.

gen_sched.py beside this file is a reading of PyTorch's schedules.py written out in Python; this
script instead loads the real torch/distributed/pipelining/schedules.py and _utils.py (a PyTorch
wheel holds them; nothing of PyTorch is committed here), replaces the modules they import with
empty stand-ins (no torch, no process group), builds every schedule class with fake stages (the
attributes a constructor reads: group_size, group_rank, num_stages, stage_index), and dumps
`pipeline_order`: the programs PyTorch's constructors compute, their own refusals included
(a constructor that raises ValueError is recorded as refused, with its message).

Getting the files (any recent wheel; the programs below were made with torch 2.15.0):
    python3 -m pip download --no-deps --only-binary=:all: torch -d /tmp/pt
    unzip -q /tmp/pt/torch-*.whl 'torch/distributed/pipelining/*' -d /tmp/pt/src

Usage:
    python3 tests/golden/sched/gen_sched_pytorch.py /tmp/pt/src/torch/distributed/pipelining \\
        tests/golden/sched/pytorch
writes one file per pipescope schedule name, `<name>.txt`: one block per case,
    case p=P v=V m=M           (then one line per rank: its compute actions, idle steps dropped)
    refused p=P v=V m=M: MESSAGE
and `torch_version.txt`. Communication and FSDP actions (SEND/RECV, REDUCE_GRAD, UNSHARD, ...)
are dropped: pipescope's programs hold compute actions; the grid is p 2..8, v 1..4 (the classes
that take a fixed number of stages per rank use theirs), m 1..4pv.
"""
import importlib.util
import os
import sys
import types

# pipescope's schedule name -> (PyTorch class, stages per rank: None = the grid's v)
SCHEDULES = {
    "pytorch-gpipe": ("ScheduleGPipe", 1),
    "1f1b": ("Schedule1F1B", 1),
    "looped-bfs": ("ScheduleLoopedBFS", None),
    "interleaved-1f1b": ("ScheduleInterleaved1F1B", None),
    "interleaved-zb": ("ScheduleInterleavedZeroBubble", None),
    "zb-v": ("ScheduleZBVZeroBubble", 2),
    "dualpipe-v": ("ScheduleDualPipeV", 2),
}
COMPUTE = {"F", "B", "I", "W", "OVERLAP_F_B"}


class _Anything(types.ModuleType):
    """A module whose every attribute is a class: enough for imports, bases and annotations."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        cls = type(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(self, name, cls)
        return cls


def _stub(name):
    mod = _Anything(name)
    mod.__path__ = []
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, mod)
    return mod


def load(folder):
    for name in ("torch", "torch.distributed", "torch._dynamo", "torch.cuda",
                 "torch.cuda.graph_annotations", "torch.distributed.fsdp", "torch.nn",
                 "torch.nn.modules", "torch.nn.modules.loss", "torch.profiler", "torch.fx",
                 "torch.distributed._mesh_layout", "torch.distributed.tensor", "torch.utils",
                 "torch.utils._pytree"):
        _stub(name)
    pkg = types.ModuleType("ptpl")
    pkg.__path__ = [folder]
    sys.modules["ptpl"] = pkg
    for sub in ("_p2p", "_recv_buffers", "microbatch", "stage"):
        _stub("ptpl." + sub)
    mods = {}
    for sub in ("_utils", "schedules"):
        spec = importlib.util.spec_from_file_location("ptpl." + sub, os.path.join(folder, sub + ".py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules["ptpl." + sub] = mod
        spec.loader.exec_module(mod)
        mods[sub] = mod
    sch = mods["schedules"]
    sch.record_function = _NoContext
    # No compile check and no lowering to communication: the compute programs are what we want
    # (the lowering needs a process group's peers).
    sch._check_torch_compile_compatibility = lambda *a, **k: None
    sch._PipelineScheduleRuntime._prepare_schedule_with_comms = lambda self, *a, **k: None
    return sch


class _NoContext:
    def __init__(self, *a, **k):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class RecordingStage:
    """A stage whose forward and backward only write down their micro-batch: what a
    single-stage schedule's own runtime loop (_step_microbatches) calls, in order."""

    def __init__(self, stage_index, num_stages):
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = num_stages
        self.group_rank = stage_index
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.submod = object()
        self.calls = []

    def forward_one_chunk(self, i, *a, **k):
        self.calls.append(f"{self.stage_index}F{i}")

    def backward_one_chunk(self, i, *a, **k):
        self.calls.append(f"{self.stage_index}B{i}")

    def __getattr__(self, name):  # p2p op lists (empty: one process), releases, reductions
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: []


def executed(sch, cls, p, m):
    """The programs ScheduleGPipe and Schedule1F1B run: their _step_microbatches, one rank at a
    time. (Their pipeline_order is only a picture of the schedule, and Schedule1F1B's differs
    from what it runs: on the last rank it starts with F1 and names a micro-batch m.)"""
    rows = []
    for r in range(p):
        stage = RecordingStage(r, p)
        sched = cls(stage, m, loss_fn=lambda *a: None)
        sched._check_inputs = lambda a, k, t, l: (a, k)
        sched._initialize_stage = lambda *a, **k: None
        sched._maybe_compute_loss = lambda *a, **k: None
        sched._maybe_get_loss = lambda *a, **k: None
        sched._update_losses = lambda *a, **k: None
        sched._step_microbatches([()] * m, [{}] * m, [None] * m, None)
        rows.append(stage.calls)
    return rows


class FakeStage:
    def __init__(self, stage_index, num_stages, group_size, group_rank):
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = group_rank
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1


def stage_indices(sch, p, v, rank, style):
    mapping = sch.generate_stage_to_rank_mapping(p, p * v, style=style)
    return sorted(s for s, r in mapping.items() if r == rank)


def action_text(a):
    if a is None:
        return None
    kind = a.computation_type.value if hasattr(a.computation_type, "value") else str(a.computation_type)
    if kind not in COMPUTE:
        return None
    return str(a)


def programs(sch, cls_name, p, v, m):
    cls = getattr(sch, cls_name)
    style = "v" if cls_name in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV") else "loop"
    loss = lambda *a: None  # noqa: E731 (a loss makes the schedules train: backwards included)
    if cls_name in ("ScheduleGPipe", "Schedule1F1B"):
        return executed(sch, cls, p, m)
    stages = [FakeStage(s, p * v, p, 0) for s in stage_indices(sch, p, v, 0, style)]
    sched = cls(stages, m, loss_fn=loss)
    order = sched.pipeline_order
    rows = []
    for r in range(p):
        rows.append([t for t in (action_text(a) for a in order[r]) if t is not None])
    return rows


def main():
    folder, outdir = sys.argv[1], sys.argv[2]
    sch = load(folder)
    os.makedirs(outdir, exist_ok=True)
    total = refused = 0
    for name, (cls_name, fixed_v) in SCHEDULES.items():
        lines = []
        for p in range(2, 9):
            for v in ([fixed_v] if fixed_v else range(1, 5)):
                for m in range(1, 4 * p * v + 1):
                    total += 1
                    try:
                        rows = programs(sch, cls_name, p, v, m)
                    except ValueError as e:
                        refused += 1
                        msg = " ".join(str(e).split())
                        lines.append(f"refused p={p} v={v} m={m}: {msg}")
                        continue
                    lines.append(f"case p={p} v={v} m={m}")
                    lines.extend(" ".join(r) for r in rows)
        with open(os.path.join(outdir, name + ".txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
    ver = "unknown"
    vfile = os.path.join(folder, "..", "..", "version.py")
    if os.path.exists(vfile):
        for line in open(vfile):
            if line.startswith("__version__"):
                ver = line.split("=", 1)[1].strip().strip("'\"")
    with open(os.path.join(outdir, "torch_version.txt"), "w") as f:
        f.write(ver + "\n")
    print(f"{total} cases, {refused} refused by PyTorch's constructors, torch {ver}")


if __name__ == "__main__":
    main()
