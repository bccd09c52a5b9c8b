#!/usr/bin/python3
"""Real multi-stream Kineto traces for the GPU-attribution, gzip and several-rank paths, with the
figures pipescope must find in them computed here, independently of pipescope's C code.

    python3 tests/golden/traces/make_hta_excerpt.py HTA_REPO/tests/data/trace_filter

Source: facebookresearch/HolisticTraceAnalysis (MIT License, Copyright (c) Meta Platforms, Inc.
and affiliates), commit f4d0062, tests/data/trace_filter/sampled_rank-0.json.gz and
sampled_rank-1.json.gz: two ranks of a real training job (Kineto, 5 CUDA streams per rank,
sampled by HTA's trace filter). hta/rank0.json.gz and hta/rank1.json.gz are those files with ONE
change: the first occurrence of four user_annotation names on each rank's main thread is renamed
to a PyTorch pipelining name, so the ranges land on tasks of pp-1f1b-2x4.spec.json (stage = rank),
chosen so that the pipeline's cross-rank edges can hold (rank 0's forwards early, its backwards
late):

    rank 0: ## sdd_preprocess_splits ## -> PP:0F0   ## data_load ##                  -> PP:0F1
            ## optimizer ##             -> PP:0B0   ## recmetrics_update ##          -> PP:0B1
    rank 1: ## forward ##               -> PP:1F0   ## sdd_preprocess_tensors ##     -> PP:1F1
            ## all2all_data:kjt lengths ## -> PP:1B0 ## backward ##                  -> PP:1B1

Every other byte of every event (times, streams, correlation ids, flows, nested annotations) is
as HTA published it. hta-expected.json holds, per task, what the rule of src/trace_read.h gives,
computed here in Python: the CUDA runtime calls with a correlation id whose host interval lies in
the task's range on the same (pid, tid) and in no smaller task range there; the kernels, copies
and memsets with those correlation ids; their span (the task's device span), the stream of the
earliest, whether there is more than one stream; the host range; and the clock correction of
rank 1 (neither file has baseTimeNanoseconds, so both start from offset 0; the graph's cross-rank
edges F(i,0) -> F(i,1) and B(i,1) -> B(i,0) then give the least non-negative corrections, shifted
so the smaller is 0). Times in expected.json are shifted as pipescope shifts them: 0 = the
earliest start of a mapped task's device span or host range.
"""
import gzip
import json
import os
import sys

RENAME = [{"## sdd_preprocess_splits ##": "F0", "## data_load ##": "F1",
           "## optimizer ##": "B0", "## recmetrics_update ##": "B1"},
          {"## forward ##": "F0", "## sdd_preprocess_tensors ##": "F1",
           "## all2all_data:kjt lengths ##": "B0", "## backward ##": "B1"}]
GPU = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME = ("cuda_runtime", "cuda_driver")


def load(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)


def rename(doc, rank):
    seen = set()
    ev = doc["traceEvents"]
    main_tid = None
    for e in ev:
        if e.get("cat") == "user_annotation" and e.get("name") == "## forward ##":
            main_tid = (e["pid"], e["tid"])
            break
    for e in ev:
        n = e.get("name")
        if (e.get("ph") == "X" and e.get("cat") == "user_annotation" and n in RENAME[rank]
                and n not in seen and (e["pid"], e["tid"]) == main_tid):
            seen.add(n)
            e["name"] = "PP:%d%s" % (rank, RENAME[rank][n])
    assert len(seen) == 4, seen
    return doc


def tasks(doc):
    ev = doc["traceEvents"]
    rng = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "user_annotation"
           and e["name"].startswith("PP:")]
    launches = [e for e in ev if e.get("ph") == "X" and e.get("cat") in RUNTIME
                and "correlation" in e.get("args", {})]
    gops = {}
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") in GPU and "correlation" in e.get("args", {}):
            gops.setdefault(e["args"]["correlation"], []).append(e)
    out = {}
    for r in rng:
        out[r["name"]] = {"host": [r["ts"], r["ts"] + r["dur"]], "gpu": None, "stream": None,
                          "device": None, "streams": set(), "first": None}
    for l in launches:
        inside = [r for r in rng if (r["pid"], r["tid"]) == (l["pid"], l["tid"])
                  and r["ts"] <= l["ts"] and l["ts"] + l["dur"] <= r["ts"] + r["dur"]]
        if not inside:
            continue
        r = min(inside, key=lambda r: r["dur"])  # the innermost
        t = out[r["name"]]
        for g in gops.get(l["args"]["correlation"], []):
            a, b = g["ts"], g["ts"] + g["dur"]
            t["gpu"] = [a, b] if t["gpu"] is None else [min(t["gpu"][0], a), max(t["gpu"][1], b)]
            t["streams"].add(g["args"].get("stream", g["tid"]))
            if t["first"] is None or a < t["first"]:
                t["first"] = a
                t["stream"] = g["args"].get("stream", g["tid"])
                t["device"] = g["args"].get("device", g["pid"])
    return out


def span(t):
    return t["gpu"] if t["gpu"] is not None else t["host"]


def main():
    src = sys.argv[1]
    top = os.path.dirname(os.path.abspath(__file__))
    here = os.path.join(top, "hta")
    os.makedirs(here, exist_ok=True)
    docs = [rename(load(os.path.join(src, "sampled_rank-%d.json.gz" % r)), r) for r in (0, 1)]
    for r, d in enumerate(docs):
        with open(os.path.join(here, "rank%d.json.gz" % r), "wb") as f:
            with gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as z:
                z.write(json.dumps(d).encode())
    per = [tasks(d) for d in docs]
    # cross-rank edges of the 1f1b graph: F(i,0) -> F(i,1), B(i,1) -> B(i,0)
    L01 = max(span(per[0]["PP:0F%d" % i])[1] - span(per[1]["PP:1F%d" % i])[0] for i in (0, 1))
    L10 = max(span(per[1]["PP:1B%d" % i])[1] - span(per[0]["PP:0B%d" % i])[0] for i in (0, 1))
    x = [0.0, 0.0]
    for _ in range(3):
        x[1] = max(x[1], x[0] + L01)
        x[0] = max(x[0], x[1] + L10)
    assert L01 + L10 <= 0, "the edges contradict each other"
    lo = min(x)
    x = [v - lo for v in x]
    t0 = min(min(span(t)[0], t["host"][0]) + x[r] for r in (0, 1) for t in per[r].values())
    exp = {"skew_us": x, "tasks": {}}
    for r in (0, 1):
        for name, t in per[r].items():
            s = span(t)
            exp["tasks"][name] = {
                "start_us": s[0] + x[r] - t0, "dur_us": s[1] - s[0],
                "cpu_start_us": t["host"][0] + x[r] - t0, "cpu_dur_us": t["host"][1] - t["host"][0],
                "stream": -1 if t["stream"] is None else t["stream"],
                "device": -1 if t["device"] is None else t["device"],
                "several_streams": len(t["streams"]) > 1}
    with open(os.path.join(top, "hta-expected.json"), "w") as f:
        json.dump(exp, f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps(exp, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
