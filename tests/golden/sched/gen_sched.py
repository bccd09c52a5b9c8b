#!/usr/bin/env python3
"""Reference per-rank action lists of PyTorch's pipelining schedules, written from reading
torch/distributed/pipelining/schedules.py (PyTorch main, 2025): ScheduleLoopedBFS,
ScheduleInterleaved1F1B and ScheduleInterleavedZeroBubble (_get_warmup_ops, _get_1f1b_rank_ops),
ScheduleZBVZeroBubble and ScheduleDualPipeV (_calculate_single_rank_operations), Schedule1F1B and
ScheduleGPipe (their _step_microbatches loops, one stage per rank). Idle steps (None)
are dropped: pipescope derives waits from dependencies. Actions use _Action's grammar:
<stage><F|I|W|B><micro-batch>; DualPipeV's overlapped pairs are written "(a;b)OVERLAP_F_B".

Usage: /usr/bin/python3 tests/golden/sched/gen_sched.py tests/golden/sched
writes one CSV per case (rows = ranks, like _dump_csv) and cases.txt. Anchor: the DualPipeV case
p=4, m=10 must equal PyTorch's own regression artifact (test/distributed/pipelining/artifacts/
dualpipev_4rank_10mb.csv, committed beside the output as pytorch_dualpipev_4rank_10mb.csv), and
the interleaved zero-bubble case p=2, v=2, m=8 its zb1p_2rank_2stagep_compute.csv; the script
checks both before writing anything. ZB-H2 is not in PyTorch (src/sched/zbh2.c is tested against
closed forms instead). interleaved-1f1b at m == p is PyTorch's 1F1B order (Megatron-LM would run
every forward first there; pipescope follows PyTorch).
"""
import os
import sys


def looped_bfs(p, v, m):
    out = []
    for r in range(p):
        stages = [r + k * p for k in range(v)]
        ops = [f"{s}F{i}" for s in stages for i in range(m)]
        ops += [f"{s}B{i}" for s in reversed(stages) for i in reversed(range(m))]
        out.append(ops)
    return out


def rounds_of(p, m):
    rounds = max(1, m // p)
    if m % rounds:
        raise ValueError(f"m={m} is not a multiple of the number of rounds {rounds}")
    return m // rounds


def one_f_one_b_ops(p, v, m, r, zero_bubble):
    per_round = rounds_of(p, m) if v > 1 else m  # one local stage: rounds do not matter
    factor = 1 if zero_bubble else 2
    warm = min((v - 1) * per_round + factor * (p - 1 - r), m * v)
    total_mb_ops = v * m
    steady = total_mb_ops - warm
    total = warm + steady + (total_mb_ops - steady)

    def fwd_stage(step):
        return ((step // per_round) % v) * p + r

    def bwd_stage(step):
        return (v - 1 - ((step - warm) // per_round) % v) * p + r

    nf, nb, nw = {}, {}, {}

    def take(counter, stage):
        k = counter.get(stage, 0)
        counter[stage] = k + 1
        return k

    bkind = "I" if zero_bubble else "B"
    ops, bsteps, wdone = [], [], 0
    for step in range(total):
        if step < warm:
            s = fwd_stage(step)
            ops.append(f"{s}F{take(nf, s)}")
            continue
        if step < warm + steady:
            s = fwd_stage(step)
            ops.append(f"{s}F{take(nf, s)}")
        s = bwd_stage(step)
        ops.append(f"{s}{bkind}{take(nb, s)}")
        bsteps.append(step)
        if zero_bubble and step - warm >= r:  # rank r delays its first W by r backwards
            ws = bwd_stage(bsteps[wdone])
            ops.append(f"{ws}W{take(nw, ws)}")
            wdone += 1
    while zero_bubble and wdone < len(bsteps):
        ws = bwd_stage(bsteps[wdone])
        ops.append(f"{ws}W{take(nw, ws)}")
        wdone += 1
    return ops


def one_f_one_b(p, m):
    """Schedule1F1B: stage r runs min(m, p - r) forwards, then backward, forward, ... pairs."""
    out = []
    for r in range(p):
        warm = min(m, p - r)
        ops = [f"{r}F{i}" for i in range(warm)]
        f = warm
        for b in range(m):
            ops.append(f"{r}B{b}")
            if f < m:
                ops.append(f"{r}F{f}")
                f += 1
        out.append(ops)
    return out


def pytorch_gpipe(p, m):
    """ScheduleGPipe: every forward, then every backward, both in ascending micro-batch order."""
    return [[f"{r}F{i}" for i in range(m)] + [f"{r}B{i}" for i in range(m)] for r in range(p)]


def interleaved(p, v, m, zero_bubble=False):
    return [one_f_one_b_ops(p, v, m, r, zero_bubble) for r in range(p)]


def zbv(p, m):
    out = []
    S = 2 * p
    for r in range(p):
        n = max(2 * p - 1, m)
        s0, s1 = r, S - 1 - r
        ops = []
        f0 = f1 = b0 = b1 = 0
        for _ in range(2 * (p - r) - 1):
            ops.append((s0, "F", f0)); f0 += 1
        for _ in range(r):
            ops.append((s1, "F", f1)); f1 += 1
            ops.append((s0, "F", f0)); f0 += 1
        for _ in range(p - r):
            ops.append((s1, "F", f1)); f1 += 1
            ops.append((s1, "I", b1)); ops.append((s1, "W", b1)); b1 += 1
        while f1 < f0 or f0 < n:
            if f0 < n:
                ops.append((s0, "F", f0)); f0 += 1
            ops.append((s0, "I", b0)); ops.append((s0, "W", b0)); b0 += 1
            ops.append((s1, "F", f1)); f1 += 1
            ops.append((s1, "I", b1)); ops.append((s1, "W", b1)); b1 += 1
        w0, w1 = b0, b1
        for _ in range(r):
            ops.append((s0, "I", b0)); b0 += 1
            ops.append((s1, "I", b1)); b1 += 1
        for _ in range(p - r):
            ops.append((s0, "I", b0)); b0 += 1
            ops.append((s0, "W", w0)); w0 += 1
        while w1 < b1:
            ops.append((s1, "W", w1)); w1 += 1
        while w0 < b0:
            ops.append((s0, "W", w0)); w0 += 1
        out.append([f"{s}{k}{i}" for s, k, i in ops if i < m])
    return out


def dualpipev(p, m):
    if m < 2 * p:
        raise ValueError("DualPipeV needs m >= 2p")
    out = []
    for r in range(p):
        s0, s1 = r, 2 * p - 1 - r
        cnt = {}
        wq = []
        ops = []

        def nxt(s, k):
            return cnt.get((s, k), 0)

        def full_b(s):
            cnt[(s, "I")] = nxt(s, "I") + 1
            cnt[(s, "W")] = nxt(s, "W") + 1

        def act(s, k):
            key = "I" if k == "B" else k
            i = nxt(s, key)
            ops.append(f"{s}{k}{i}")
            if k == "B":
                full_b(s)
            else:
                if k == "I":
                    wq.append((s, i))
                cnt[(s, key)] = i + 1

        def overlap(fs, bs):
            fi, bi = nxt(fs, "F"), nxt(bs, "I")
            ops.append(f"({fs}F{fi};{bs}B{bi})OVERLAP_F_B")
            cnt[(fs, "F")] = fi + 1
            full_b(bs)

        def pending_w():
            if wq:
                s, i = wq.pop(0)
                ops.append(f"{s}W{i}")
                cnt[(s, "W")] = nxt(s, "W") + 1

        for _ in range((p - r - 1) * 2):
            act(s0, "F")
        for _ in range(r + 1):
            act(s0, "F"); act(s1, "F")
        for _ in range(p - r - 1):
            act(s1, "I"); pending_w(); act(s1, "F")
        for i in range(m - 2 * p + r + 1):
            if i == 0 and r == p - 1:
                act(s0, "F"); act(s1, "B")
            else:
                overlap(s0, s1)
            overlap(s1, s0)
        for _ in range(p - r - 1):
            act(s1, "B"); overlap(s1, s0)
        zb = False
        for i in range(r + 1):
            if i == (r + 1) // 2 and r % 2 == 1:
                zb = True
            act(s1, "I" if zb else "B")
            if i == (r + 1) // 2 and r % 2 == 0:
                zb = True
            act(s0, "I" if zb else "B")
        for _ in range(p - r - 1):
            pending_w(); act(s0, "I" if zb else "B")
        for _ in range(r + 1):
            pending_w()
        out.append(ops)
    return out


CASES = []
for p in (2, 3, 4):
    for m in sorted({p, 2 * p, 2 * p + 2, 3 * p, 8, 10}):
        if m < p:
            continue
        for v in (2, 3):
            CASES.append(("looped-bfs", p, v, m, looped_bfs(p, v, m)))
            try:
                CASES.append(("interleaved-1f1b", p, v, m, interleaved(p, v, m)))
                CASES.append(("interleaved-zb", p, v, m, interleaved(p, v, m, True)))
            except ValueError:
                pass
        CASES.append(("zb-h1", p, 1, m, interleaved(p, 1, m, True)))
        CASES.append(("1f1b", p, 1, m, one_f_one_b(p, m)))
        CASES.append(("pytorch-gpipe", p, 1, m, pytorch_gpipe(p, m)))
        CASES.append(("zb-v", p, 2, m, zbv(p, m)))
        if m >= 2 * p:
            CASES.append(("dualpipe-v", p, 2, m, dualpipev(p, m)))


def main():
    outdir = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "pytorch_dualpipev_4rank_10mb.csv")) as f:
        ref = [row.split(",") for row in f.read().split()]
    if dualpipev(4, 10) != ref:
        sys.exit("dualpipev(4, 10) differs from PyTorch's artifact: the mirror is wrong")
    # PyTorch's ScheduleInterleavedZeroBubble artifact for 2 ranks x 2 stages, m = 8 (idle
    # steps are empty cells there)
    with open(os.path.join(here, "pytorch_zb1p_2rank_2stagep_compute.csv")) as f:
        ref = [[c for c in row.split(",") if c] for row in f.read().split()]
    if interleaved(2, 2, 8, True) != ref:
        sys.exit("interleaved zero bubble (2, 2, 8) differs from PyTorch's artifact")
    os.makedirs(outdir, exist_ok=True)
    index = []
    for name, p, v, m, ranks in CASES:
        fn = f"{name}_p{p}_v{v}_m{m}.csv"
        with open(os.path.join(outdir, fn), "w") as f:
            for row in ranks:
                f.write(",".join(row) + "\n")
        index.append(f"{name} {p} {v} {m} {fn}")
    with open(os.path.join(outdir, "cases.txt"), "w") as f:
        f.write("\n".join(index) + "\n")


if __name__ == "__main__":
    main()
