#!/usr/bin/env python3
"""Benchmark (meson benchmark 'trace'): reading a large Kineto trace (default 1 GiB).

    python3 tests/bench_trace.py PIPESCOPE [--mib 1024] [--gzip]

Writes a Kineto-shaped trace of the requested size into a fresh folder under /tmp (rank 0 of
tests/golden/traces/pp-1f1b-2x4.spec.json: per training step the PP:0F<i>/PP:0B<i> ranges of a
1F1B stage, each around cpu_op events, cudaLaunchKernel calls with correlation ids and their
kernels on two streams, ac2g flows), runs `pipescope compare` on it under /usr/bin/time, prints
seconds (wall and CPU), MB/s of JSON text per CPU second, peak RSS and RSS / text size, then the
same file under a memory limit of 1/64 of its size, too small for the events it keeps (the
refusal line), and deletes the folder. Figures only, never a pass/fail on
time; numbers on this shared machine are noisy.
"""
import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.environ.get("PS_SOURCE_ROOT", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SPEC = os.path.join(ROOT, "tests", "golden", "traces", "pp-1f1b-2x4.spec.json")


def step_block(step, t, corr, ext):
    """One training step of stage 0: 4 forwards, 4 backwards (1F1B order of stage 0 of 2)."""
    out = []
    order = [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    for kind, i in order:
        t0 = t
        for k in range(12):  # cpu_op events, ignored by the reader
            out.append('{"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 41000, '
                       '"tid": 41000, "ts": %.3f, "dur": 3.5, "args": {"External id": %d, '
                       '"Record function id": 0, "Sequence number": %d, "Fwd thread id": 0, '
                       '"Ev Idx": %d}}' % (t + 1 + k * 4, ext + k, ext + k, ext + k))
        for k in range(8):
            c = corr + k
            lt = t + 2 + k * 6
            kt = lt + 40
            out.append('{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 41000, '
                       '"tid": 41000, "ts": %.3f, "dur": 4.0, "args": {"External id": %d, '
                       '"cbid": 211, "correlation": %d}}' % (lt, ext, c))
            out.append('{"ph": "X", "cat": "kernel", "name": "ampere_sgemm_32x32_sliced1x4_tn", '
                       '"pid": 0, "tid": %d, "ts": %.3f, "dur": 5.0, "args": {"External id": %d, '
                       '"queued": 0, "device": 0, "context": 1, "stream": %d, "correlation": %d, '
                       '"registers per thread": 64, "shared memory": 8192, "grid": [64, 1, 1], '
                       '"block": [128, 1, 1]}}' % (7 + 13 * (k % 2), kt, ext, 7 + 13 * (k % 2), c))
            out.append('{"ph": "s", "id": %d, "pid": 41000, "tid": 41000, "ts": %.3f, '
                       '"cat": "ac2g", "name": "ac2g"}' % (c, lt))
            out.append('{"ph": "f", "id": %d, "pid": 0, "tid": 7, "ts": %.3f, "cat": "ac2g", '
                       '"name": "ac2g", "bp": "e"}' % (c, kt))
        corr += 8
        ext += 12
        t += 60
        out.append('{"ph": "X", "cat": "user_annotation", "name": "PP:0%s%d", "pid": 41000, '
                   '"tid": 41000, "ts": %.3f, "dur": %.3f, "args": {"External id": %d}}'
                   % (kind, i, t0, t - t0 - 1, ext))
    return out, t, corr, ext


def write_trace(path, size, gz):
    opener = (lambda p: gzip.open(p, "wt", compresslevel=1)) if gz else (lambda p: open(p, "w"))
    written = 0
    with opener(path) as f:
        head = ('{"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, '
                '"world_size": 2}, "baseTimeNanoseconds": 1700000000000000000, "traceEvents": [\n')
        f.write(head)
        written += len(head)
        t, corr, ext, step, first = 1000.0, 1, 1, 0, True
        while written < size:
            evs, t, corr, ext = step_block(step, t, corr, ext)
            step += 1
            chunk = (",\n" if not first else "") + ",\n".join(evs)
            first = False
            f.write(chunk)
            written += len(chunk)
        f.write("\n]}\n")
    return written, step


def run(cmd, env):
    t = time.time()
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, env=env, capture_output=True, text=True)
    wall = time.time() - t
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    rss = int(m.group(1)) * 1024 if m else -1
    u = re.search(r"User time \(seconds\): ([0-9.]+)", p.stderr)
    s = re.search(r"System time \(seconds\): ([0-9.]+)", p.stderr)
    cpu = (float(u.group(1)) if u else 0) + (float(s.group(1)) if s else 0)
    return p, wall, rss, cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pipescope")
    ap.add_argument("--mib", type=int, default=int(os.environ.get("PS_BENCH_TRACE_MIB", "1024")))
    ap.add_argument("--gzip", action="store_true")
    a = ap.parse_args()
    if not os.path.exists("/usr/bin/time"):
        print("bench_trace: /usr/bin/time is missing (apt-get install time): no peak RSS")
        return 0
    tmp = tempfile.mkdtemp(prefix="pipescope-bench-trace-", dir="/tmp")
    try:
        path = os.path.join(tmp, "rank0.json" + (".gz" if a.gzip else ""))
        t = time.time()
        text, steps = write_trace(path, a.mib << 20, a.gzip)
        disk = os.path.getsize(path)
        print("bench_trace: wrote %s: %.0f MiB of JSON text (%d steps), %.0f MiB on disk, in %.1f s"
              % (path, text / 2**20, steps, disk / 2**20, time.time() - t))
        env = dict(os.environ)
        env.pop("PIPESCOPE_MEM_LIMIT", None)
        p, wall, rss, cpu = run([a.pipescope, "compare", SPEC, "--measured", path, "--tolerance",
                                 "makespan=1e9,task=1e9"], env)
        prog = [l for l in p.stderr.splitlines() if l.startswith("compare: reading")]
        print("bench_trace: compare exit %d, %.2f s wall, %.2f s CPU (%.0f MB/s of text per CPU "
              "second), peak RSS %.1f MiB = %.3f x the text (%d progress lines on stderr)"
              % (p.returncode, wall, cpu, text / max(cpu, 1e-3) / 1e6, rss / 2**20, rss / text,
                 len(prog)))
        for l in prog[:2] + prog[-1:]:
            print("  stderr: " + l)
        for l in p.stdout.splitlines():
            if "gpu:" in l or "measured:" in l:
                print("  " + l.strip())
        lim = "%dM" % max(1, (a.mib // 64))
        env["PIPESCOPE_MEM_LIMIT"] = lim
        p, wall, rss, cpu = run([a.pipescope, "compare", SPEC, "--measured", path], env)
        err = [l for l in p.stderr.splitlines() if l.startswith("pipescope:")]
        print("bench_trace: under PIPESCOPE_MEM_LIMIT=%s: exit %d after %.2f s, peak RSS %.1f MiB:"
              % (lim, p.returncode, wall, rss / 2**20))
        print("  " + (err[0] if err else "(no error line)"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
