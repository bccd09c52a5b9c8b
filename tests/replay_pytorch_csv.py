#!/usr/bin/env python3
"""Replays a pipelining schedule CSV the way PyTorch's two CSV executors run it, on data
dependencies only (no torch needed).

  steps    PipelineScheduleMulti._step_microbatches: step t runs column t of every row; the
           tensors an action sends are received at the end of its step, so an action reads only
           what was produced in an earlier step. An action whose input is not there yet computes
           on a stale buffer in PyTorch (no error): here it is reported.
  runtime  _PipelineScheduleRuntime: every rank runs its own row in order, idle (empty) cells
           skipped, each action waiting until its inputs exist; a row that can never go on is
           a deadlock.

Dependencies (stage s of S, micro-batch i): F(i,s) reads F(i,s-1); B or I (i,s) reads F(i,s)
and, below the last stage, B or I (i,s+1); W(i,s) needs I(i,s). Every (stage, micro-batch) must
run F once and B once or I and W once each. Cells: <stage><F|I|W|B><mb>, (<a>;<b>)OVERLAP_F_B,
empty = idle; SEND/RECV/UNSHARD/RESHARD/REDUCE_GRAD are skipped.

Usage: replay_pytorch_csv.py {steps|runtime} FILE...   exit 0 when every file runs correctly,
1 with one line per file that does not, 2 on unreadable input.
"""
import re
import sys

ACT = re.compile(r"^(\d+)([FIWB])(\d+)$")
SKIP = ("SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD")


def parse_cell(cell, where):
    cell = cell.strip().strip('"')
    if not cell:
        return []
    m = re.match(r"^\((.*);(.*)\)OVERLAP_F_B$", cell)
    parts = [m.group(1), m.group(2)] if m else [cell]
    out = []
    for p in parts:
        if any(k in p for k in SKIP):
            continue
        a = ACT.match(p)
        if not a:
            raise ValueError(f"{where}: {p!r} is not an action")
        out.append((int(a.group(1)), a.group(2), int(a.group(3))))
    return out


def load(path):
    with open(path, newline="") as f:
        rows = [line.rstrip("\r\n").split(",") for line in f if line.strip()]
    return [[parse_cell(c, f"{path}: rank {r}, step {t}") for t, c in enumerate(row)]
            for r, row in enumerate(rows)]


def needs(act, S):
    s, k, i = act
    if k == "F":
        return [("F", s - 1, i)] if s > 0 else []
    if k == "W":
        return [("I", s, i)]
    return [("F", s, i)] + ([("G", s + 1, i)] if s < S - 1 else [])


def produced_key(act):
    s, k, i = act
    if k == "F":
        return [("F", s, i)]
    if k == "I":
        return [("I", s, i), ("G", s, i)]
    if k == "B":
        return [("B", s, i), ("G", s, i)]
    return [("W", s, i)]


def name(act):
    return f"{act[0]}{act[1]}{act[2]}"


def complete(done, S, m):
    for s in range(S):
        for i in range(m):
            if ("F", s, i) not in done:
                return f"{s}F{i} never runs"
            full, inp, w = (("B", s, i) in done), (("I", s, i) in done), (("W", s, i) in done)
            if full == inp or inp != w:
                return f"stage {s}, micro-batch {i}: needs B, or I and W"
    return None


def check_once(done, act):
    for key in produced_key(act):
        if key in done:
            return f"{name(act)} runs twice"
    return None


def replay_steps(grid, S, m):
    done = {}
    for t in range(max(len(r) for r in grid)):
        for row in grid:
            for act in row[t] if t < len(row) else []:
                err = check_once(done, act)
                if err:
                    return err
                for key in produced_key(act):
                    done[key] = t
    for t in range(max(len(r) for r in grid)):
        for r, row in enumerate(grid):
            for act in row[t] if t < len(row) else []:
                for key in needs(act, S):
                    have = done.get(key)
                    if have is None or have >= t:
                        what = f"{key[1]}{'B' if key[0] == 'G' else key[0]}{key[2]}"
                        when = "never" if have is None else f"in step {have}"
                        return (f"rank {r}, step {t}: {name(act)} computes before its input "
                                f"({what}, produced {when}) arrives")
    return complete(done, S, m)


def replay_runtime(grid, S, m):
    rows = [[a for cell in row for a in cell] for row in grid]
    pos = [0] * len(rows)
    done = {}
    clock = 0
    while True:
        moved = False
        for r, row in enumerate(rows):
            while pos[r] < len(row) and all(k in done for k in needs(row[pos[r]], S)):
                act = row[pos[r]]
                err = check_once(done, act)
                if err:
                    return err
                for key in produced_key(act):
                    done[key] = clock
                clock += 1
                pos[r] += 1
                moved = True
        if not moved:
            break
    stuck = [f"rank {r} at {name(rows[r][pos[r]])}" for r in range(len(rows)) if pos[r] < len(rows[r])]
    if stuck:
        return "deadlock: " + ", ".join(stuck)
    return complete(done, S, m)


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("steps", "runtime"):
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    bad = 0
    for path in sys.argv[2:]:
        try:
            grid = load(path)
        except (OSError, ValueError) as e:
            print(f"{path}: {e}", file=sys.stderr)
            return 2
        acts = [a for row in grid for cell in row for a in cell]
        if not acts:
            print(f"{path}: no actions", file=sys.stderr)
            return 2
        S = max(a[0] for a in acts) + 1
        m = max(a[2] for a in acts) + 1
        run = replay_steps if sys.argv[1] == "steps" else replay_runtime
        err = run(grid, S, m)
        if err:
            print(f"{path}: {sys.argv[1]}: {err}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
