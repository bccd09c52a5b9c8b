#!/usr/bin/python3
"""Measured over simulated activation memory, per device: the memory model (src/model.c
"Activation memory", src/analysis.c along the executed order) against the cpu executor's
buffer accounting (kernels/exec_cpu.c M1-M4), as `pipescope run --json` reports them in
execution.memory[].measured_over_simulated.

    /usr/bin/python3 tests/mem_sweep.py PIPESCOPE [--serial-only] [--no-examples] [--no-unet]

Rows: every spec of examples/ at its own settings, then examples/unet-timeline.json at batch 4
and 8 x chunks 2, 4, 8 (not 8 chunks of a batch of 4) x checkpoint never, except_last, always
(one training step each). Each
row is run with --serial (one sequence: the model follows the same order, so the two agree
exactly) and, unless --serial-only, with a thread per device (the default of `run`: the devices'
tasks interleave in another order than the one the model follows, so a device can read a little
either side of 1). The last line is the largest deviation from 1 of each mode.
Figures only; nothing is asserted (tests/test_exec.c pins the serial equality on small specs).
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def ratios(pipescope, spec, serial, tmp):
    out = os.path.join(tmp, "run.json")
    cmd = [pipescope, "run", spec, "--steps", "1", "-q", "--json", out]
    if serial:
        cmd.append("--serial")
    subprocess.run(cmd, check=True)
    with open(out) as f:
        mem = json.load(f)["execution"]["memory"]
    return [m.get("measured_over_simulated") for m in mem]


def row(name, rs):
    cells = " ".join("%.3f" % r if r is not None else "  -  " for r in rs)
    return "%-38s %s" % (name, cells)


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    pipescope = os.path.abspath(args[0])
    modes = [("serial", True)] if "--serial-only" in args else [("serial", True), ("threads", False)]
    specs = []
    if "--no-examples" not in args:
        for path in sorted(glob.glob(os.path.join(ROOT, "examples", "*.json"))):
            specs.append((os.path.basename(path)[:-5], path, None))
    if "--no-unet" not in args:
        with open(os.path.join(ROOT, "examples", "unet-timeline.json")) as f:
            unet = json.load(f)
        for batch in (4, 8):
            for chunks in (2, 4, 8):
                if chunks > batch:  # every micro-batch needs a sample
                    continue
                for ck in ("never", "except_last", "always"):
                    s = json.loads(json.dumps(unet))
                    s["batch"] = batch
                    s["pipeline"]["chunks"] = chunks
                    s["pipeline"]["checkpoint"] = ck
                    specs.append(("unet b%d c%d %s" % (batch, chunks, ck), None, s))
    worst = {m: 0.0 for m, _ in modes}
    missing = 0
    with tempfile.TemporaryDirectory() as tmp:
        print("measured / simulated activation peak per device (device 0 first)")
        for name, path, spec in specs:
            if spec is not None:
                path = os.path.join(tmp, "spec.json")
                with open(path, "w") as f:
                    json.dump(spec, f)
            for mode, serial in modes:
                rs = ratios(pipescope, path, serial, tmp)
                print(row("%s [%s]" % (name, mode), rs), flush=True)
                for r in rs:
                    if r is None:
                        missing += 1
                    else:
                        worst[mode] = max(worst[mode], abs(r - 1.0))
    print("largest |measured/simulated - 1|: " +
          ", ".join("%s %.4f" % (m, w) for m, w in worst.items()) +
          ("; %d device(s) without a ratio" % missing if missing else ""))


if __name__ == "__main__":
    main()
