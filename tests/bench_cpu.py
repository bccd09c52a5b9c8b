#!/usr/bin/python3
"""CPU backend vs PyTorch 1.13 on the CPU: time per training step and peak memory, same model,
same micro-batching (the torchgpipe mirror of examples/export_pytorch.py), same machine, same
threads. PyTorch gets torch.set_num_threads(2); pipescope's sgemm uses the online CPUs (at most
16) and `run` a worker thread per device: run it on a 2-core machine (or under taskset -c 0,1,
as tests/bench_cpu.sh does) for equal threads.

    /usr/bin/python3 tests/bench_cpu.py PIPESCOPE SPEC[:STEPS]... [--steps N]

Per spec (STEPS overrides --steps for that spec; at least 2): pipescope ms per step (median over
steps 2..N of `pipescope run`'s own step times) with a thread per device and with --serial,
PyTorch ms per step (median, same steps, same loss), the ratio pipescope / PyTorch (< 1 =
pipescope faster), and the peak RSS of each process (pipescope `run` and a Python process that
imports torch and trains, each measured alone by wait4; the PyTorch figure includes the
interpreter and torch's libraries, about 0.25 GB), and pipescope's steady state: the minor page
faults and the RSS that steps 3..N add over a 2-step run, per step (the step's mini-batch only,
and RSS 0.00, when every step reuses the memory the first ones touched). bench_cpu.sh sets OMP_WAIT_POLICY=PASSIVE
unless it is set: spinning OpenMP workers make PyTorch tens of times slower on a loaded machine.
Figures only; nothing is asserted.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))


def run_measured(argv, minflt=False):
    """Runs argv; returns (stdout text, peak RSS in MB of that process alone), and with minflt
    also its minor page faults."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit("%s exited %d" % (argv[0], p.returncode))
    if minflt:
        return out.decode(), ru.ru_maxrss / 1024.0, ru.ru_minflt
    return out.decode(), ru.ru_maxrss / 1024.0


def torch_child(path, steps):
    """In a child process: PyTorch's training steps; prints the step times (s) as JSON."""
    import torch
    import export_pytorch as ex
    torch.set_num_threads(2)
    with open(path) as fh:
        spec = json.load(fh)
    seq, out_shape = ex.from_spec(spec["model"]["input"], spec["model"]["layers"])
    N, p = spec["batch"], spec["pipeline"]
    loss = spec["model"].get("loss", "cross_entropy")
    torch.manual_seed(0)
    X = torch.randn(N * steps, *spec["model"]["input"])
    if loss == "cross_entropy":
        Y = torch.randint(0, out_shape[0], (N * steps,))
    elif loss == "mse":
        Y = torch.randn(N * steps, *out_shape)
    else:
        Y = None
    times = []
    for s in range(steps):
        t0 = time.perf_counter()
        ex.train_pipeline(seq, X[s * N:(s + 1) * N], None if Y is None else Y[s * N:(s + 1) * N],
                          N, p["balance"], p["chunks"], p["checkpoint"], "plain", 1, 0.01,
                          loss=loss)
        times.append(time.perf_counter() - t0)
    print(json.dumps(times))


def steady_state(pipescope, path, steps):
    """Minor page faults and RSS MB per step that steps 3..steps add to a 2-step `run` (no report
    written: its BN log grows with the steps)."""
    if steps <= 2:
        return 0.0, 0.0
    _, rss2, flt2 = run_measured([pipescope, "run", path, "--steps", "2", "-q"], minflt=True)
    _, rss, flt = run_measured([pipescope, "run", path, "--steps", str(steps), "-q"], minflt=True)
    return (flt - flt2) / (steps - 2), (rss - rss2) / (steps - 2)


def pipescope_ms(pipescope, path, steps, serial):
    """ms per step (median of steps 2..), peak RSS MB and minor page faults of one `run`."""
    with tempfile.TemporaryDirectory() as tmp:
        rep = os.path.join(tmp, "r.json")
        argv = [pipescope, "run", path, "--steps", str(steps), "--json", rep, "-q"]
        if serial:
            argv.append("--serial")
        _, rss, flt = run_measured(argv, minflt=True)
        with open(rep) as fh:
            us = json.load(fh)["execution"]["step_us"]
    return statistics.median(us[1:]) / 1000.0, rss, flt


def main():
    args = sys.argv[1:]
    if args and args[0] == "--torch-child":
        torch_child(args[1], int(args[2]))
        return 0
    steps = 20
    if "--steps" in args:
        k = args.index("--steps")
        steps = int(args[k + 1])
        del args[k:k + 2]
    pipescope, specs = args[0], args[1:]
    print("%-20s %5s %6s %-11s %10s %10s %10s %6s %10s %10s %11s %12s" % (
        "spec", "batch", "chunks", "checkpoint", "ps ms", "ps serial", "torch ms", "ratio",
        "ps RSS MB", "torch RSS", "faults/step", "RSS MB/step"))
    for arg in specs:
        path, _, n = arg.partition(":")
        n = max(2, int(n) if n else steps)
        with open(path) as fh:
            spec = json.load(fh)
        p = spec["pipeline"]
        ps, ps_rss, _ = pipescope_ms(pipescope, path, n, False)
        ps_serial, _, _ = pipescope_ms(pipescope, path, n, True)
        # steady state: what steps 3..n add over a 2-step run (page faults, RSS): the mini-batch
        # of each step (synthetic data, about 24 faults a step for seed1) and nothing else when
        # every step reuses the memory the first ones touched (kernels/exec_cpu.c M5)
        flt_step, rss_step = steady_state(pipescope, path, n)
        out, pt_rss = run_measured([sys.executable, os.path.abspath(__file__), "--torch-child",
                                    path, str(n)])
        pt = statistics.median(json.loads(out)[1:]) * 1000.0
        print("%-20s %5d %6d %-11s %10.1f %10.1f %10.1f %6.2f %10.0f %10.0f %11d %12.2f" % (
            spec.get("name", os.path.basename(path))[:20], spec["batch"], p["chunks"],
            p["checkpoint"], ps, ps_serial, pt, ps / pt, ps_rss, pt_rss, int(round(flt_step)), rss_step),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
