#!/usr/bin/python3
"""Per-rank Kineto traces shaped exactly like those of torch.distributed.pipelining (no GPU here).

    python3 tests/golden/traces/gen_pp_kineto.py -o tests/golden/traces/pp-1f1b

writes pp-1f1b/rank0.json and pp-1f1b/rank1.json for tests/golden/traces/pp-1f1b-2x4.spec.json
(Schedule1F1B: 2 stages on 2 ranks, 4 micro-batches), and prints the clock correction the
traces call for.

How the shape is known (read, not guessed), torch/distributed/pipelining/schedules.py:
  * _PipelineScheduleRuntime._step_microbatches runs every action of pipeline_order_with_comms
    inside `with record_function(_get_profiler_function_name(action))`, and
    _get_profiler_function_name(action) = f"PP:{str(action)}" with _Action.__repr__ = stage index
    + computation type value + micro-batch index (if any): PP:0F3, PP:1B0, PP:0SEND_F1,
    PP:1RECV_F1, PP:0UNSHARD, PP:0REDUCE_GRAD.
  * The lowering adds those actions: _add_unshard_reshard (UNSHARD before a stage's first action,
    RESHARD after its last), _add_reduce_grad (REDUCE_GRAD after a stage's last backward) and
    _add_send_recv (SEND_F after F on a stage whose successor is on another rank, with RECV_F on
    that rank; SEND_B / RECV_B for B the other way).
  * Schedule1F1B's compute order: stage s runs min(S - s - 1, m) warm-up forwards, then
    one forward and one backward in turn, then the remaining backwards.
Kineto's layout (as in the Holistic Trace Analysis project's real traces, tests/data): a
record_function range is {"ph": "X", "cat": "user_annotation"} on the host thread, and a
{"cat": "gpu_user_annotation"} range of the same name on the GPU stream; each kernel launch is a
{"cat": "cuda_runtime", "name": "cudaLaunchKernel"} event with args.correlation, and the kernel
{"cat": "kernel", "pid": device, "tid": stream, "args": {"device", "stream", "correlation"}};
"ac2g" flow events s/f join them; the file carries distributedInfo (backend, rank, world_size)
and baseTimeNanoseconds (unix time = baseTimeNanoseconds + 1000 ts).

Times are made up but consistent: the GPU runs each task's kernels after its input arrived
(P2P latency 20 us); rank 1's baseTimeNanoseconds is 250 us too small (its events appear 250 us
early on the common clock), so the graph's cross-rank edges must move it by 250 - 20 = 230 us.
"""
import argparse
import json
import os

S, M = 2, 4
LAUNCH = 6.0           # host time per launch call
KERNELS = {"F": [(31.0, "ampere_sgemm_32x32_sliced1x4_tn"), (9.0, "vectorized_elementwise_kernel")],
           "B": [(35.0, "ampere_sgemm_32x32_sliced1x4_nt"), (28.0, "ampere_sgemm_32x32_sliced1x4_nn"),
                 (7.0, "reduce_kernel")]}
P2P = 20.0             # send -> receive arrival
BASE = 1_700_000_000_000_000_000
SKEW_NS = 250_000      # rank 1's base time is this much too small


def compute_order(s):
    warm = min(S - s - 1, M)
    acts = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < M:
        acts.append(("F", f)); f += 1
        acts.append(("B", b)); b += 1
    while b < M:
        acts.append(("B", b)); b += 1
    return acts


def lowered(s):
    out = [("UNSHARD", None)]
    for k, i in compute_order(s):
        out.append((k, i))
        if k == "F" and s < S - 1:
            out.append(("SEND_F", i))
        if k == "B" and s > 0:
            out.append(("SEND_B", i))
        if k == "B" and i == M - 1:
            out.append(("REDUCE_GRAD", None))
    out.append(("RESHARD", None))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--outdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    # event-driven: each rank's host walks its list; a compute action needs its input
    ready = {}              # (kind, stage, mb) -> true time the input is on the device
    gpu_free = [0.0] * S
    host = [100.0, 130.0]   # host clocks start at different real times
    idx = [0] * S
    plans = [lowered(s) for s in range(S)]
    events = [[] for _ in range(S)]
    gpu_span = {}
    corr = [1000, 5000]
    ext = [1, 1]
    pid = [41000, 41100]
    done = False
    while not done:
        done = True
        for s in range(S):
            while idx[s] < len(plans[s]):
                kind, i = plans[s][idx[s]]
                need = None
                if kind == "F" and s > 0:
                    need = ("F", s - 1, i)
                if kind == "B" and s < S - 1:
                    need = ("B", s + 1, i)
                if need is not None and need not in gpu_span:
                    break  # RECV not complete: the other rank first
                done = False
                name = f"PP:{s}{kind}{'' if i is None else i}"
                t0 = host[s]
                ev = events[s]
                if kind in ("F", "B"):
                    if need is not None:  # the RECV the lowering put before it
                        rname = f"PP:{s}RECV_{kind}{i}"
                        ev.append({"ph": "X", "cat": "user_annotation", "name": rname, "pid": pid[s],
                                   "tid": pid[s], "ts": t0, "dur": 4.0, "args": {"External id": ext[s]}})
                        ext[s] += 1
                        t0 += 5.0
                    start_gpu = max(gpu_free[s], gpu_span[need][1] + P2P if need else 0.0)
                    t = t0 + 2.0
                    g = start_gpu
                    g0 = None
                    for dur, kname in KERNELS[kind]:
                        c = corr[s]; corr[s] += 1
                        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                                   "pid": pid[s], "tid": pid[s], "ts": t, "dur": LAUNCH - 1,
                                   "args": {"External id": ext[s], "cbid": 211, "correlation": c}})
                        g = max(g, t + 3.0)
                        if g0 is None:
                            g0 = g
                        ev.append({"ph": "X", "cat": "kernel", "name": kname, "pid": s, "tid": 7,
                                   "ts": g, "dur": dur,
                                   "args": {"External id": ext[s], "queued": 0, "device": s,
                                            "context": 1, "stream": 7, "correlation": c}})
                        ev.append({"ph": "s", "id": c, "pid": pid[s], "tid": pid[s], "ts": t,
                                   "cat": "ac2g", "name": "ac2g"})
                        ev.append({"ph": "f", "id": c, "pid": s, "tid": 7, "ts": g, "cat": "ac2g",
                                   "name": "ac2g", "bp": "e"})
                        g += dur
                        t += LAUNCH
                    gpu_free[s] = g
                    gpu_span[(kind, s, i)] = (g0, g)
                    host_dur = t - t0 + 1.0
                    ev.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": pid[s],
                               "tid": pid[s], "ts": t0, "dur": host_dur, "args": {"External id": ext[s]}})
                    ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": s,
                               "tid": 7, "ts": g0, "dur": g - g0, "args": {"External id": ext[s]}})
                    ext[s] += 1
                    host[s] = t0 + host_dur + 2.0
                else:
                    ev.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": pid[s],
                               "tid": pid[s], "ts": t0, "dur": 3.0, "args": {"External id": ext[s]}})
                    ext[s] += 1
                    host[s] = t0 + 4.0
                idx[s] += 1
    # the clock correction the cross-rank edges call for: rank 1's times appear SKEW earlier
    skew = SKEW_NS / 1000.0
    fwd = min(gpu_span[("F", 1, i)][0] - gpu_span[("F", 0, i)][1] for i in range(M))
    bwd = min(gpu_span[("B", 0, i)][0] - gpu_span[("B", 1, i)][1] for i in range(M))
    print(f"rank 1 must move by {skew - fwd:.3f} us at least (its base time is {skew} us "
          f"early; the smallest forward slack is {fwd:.3f} us, backward {bwd:.3f} us)")
    for s in range(S):
        base = BASE - (SKEW_NS if s == 1 else 0)
        off = 0.0  # rank 1 records its true times against a base time 250 us too small
        evs = []
        for e in sorted(events[s], key=lambda e: (e["ts"], e["ph"] != "X")):
            e = dict(e)
            e["ts"] = round(e["ts"] + off, 3)
            evs.append(e)
        meta = [{"name": "process_name", "ph": "M", "ts": 0, "pid": pid[s], "tid": 0,
                 "args": {"name": "python3"}},
                {"name": "process_name", "ph": "M", "ts": 0, "pid": s, "tid": 0,
                 "args": {"name": "python3"}},
                {"name": "thread_name", "ph": "M", "ts": 0, "pid": s, "tid": 7,
                 "args": {"name": "stream 7"}}]
        doc = {"schemaVersion": 1,
               "distributedInfo": {"backend": "nccl", "rank": s, "world_size": S},
               "deviceProperties": [{"id": s, "name": "NVIDIA H100"}],
               "traceEvents": meta + evs,
               "traceName": f"rank{s}.json",
               "baseTimeNanoseconds": base}
        with open(os.path.join(a.outdir, f"rank{s}.json"), "w") as f:
            json.dump(doc, f, indent=0)
            f.write("\n")


if __name__ == "__main__":
    main()
