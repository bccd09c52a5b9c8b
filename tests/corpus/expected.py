#!/usr/bin/env python3
"""Expected error lines of the bad-input corpora, written from the rules, not from the program.

    python3 tests/corpus/expected.py            # check: every n_*.err equals what the rules give
    python3 tests/corpus/expected.py --write    # (re)write the .err files from the rules

Covers tests/corpus/spec (n_*.json: `pipescope check` and `graph` print "pipescope: " + the line),
tests/corpus/trace (n_*.json read against examples/small-3x3.json's graph) and the CLI cases whose
line quotes a graph's size or memory (tests/corpus/cli: node bound, graph memory, picture nodes).
Not covered: n_mem_limit_run_steps and n_compare_trace_mem_limit, whose executor and trace-reader
memory estimates are not restated here.

Every case below names the rule it breaks and the JSON path of the culprit; the line is composed
from the rule's wording (one template per kind of problem below: "PATH: required field is missing
(expected WHAT)", "PATH: expected a positive NOUN, found VALUE", ...; src/SPEC.md: one line naming
the file and the JSON path) and from values read out of the case's own
input (the value found, list lengths, shapes computed here from the layer parameters, malformed
JSON positions found by searching the text). Nothing is copied from pipescope's output: a case
whose committed line differs from the rule's is reported, and the test (meson test
`corpus-rules`) fails.
"""
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# ---- values and paths ------------------------------------------------------------------------


def get(doc, path):
    """Value at a path like model.layers[3].out (keys may not contain '.' or '[')."""
    cur = doc
    for part in path.replace("[", ".[").split("."):
        if part.startswith("["):
            cur = cur[int(part[1:-1])]
        else:
            cur = cur[part]
    return cur


def num(v):
    """A number as the error lines print it: integers in full, others as %g."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return "%g" % v


def found(v):
    """How a line describes a value of the wrong kind."""
    if v is None:
        return "null"
    if isinstance(v, str):
        return 'string "%s"' % v
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return num(v)


def hint(text):
    return " (hint: %s)" % text if text else ""


# ---- spec rules ---------------------------------------------------------------------------------
# Each returns f(doc, text) -> the line after "FILE: ".

def missing(path, what, h=None):
    return lambda d, t: "%s: required field is missing (expected %s)%s" % (path, what, hint(h))


def positive(path, noun):
    return lambda d, t: "%s: expected a positive %s, found %s" % (path, noun, num(get(d, path)))


def at_least(path, kind, lo, h=None):
    return lambda d, t: "%s: expected %s >= %s, found %s%s" % (path, kind, lo, num(get(d, path)), hint(h))


def above(path, lo):
    return lambda d, t: "%s: expected a number > %s, found %s" % (path, lo, num(get(d, path)))


def in_range(path, rng, h=None):
    return lambda d, t: "%s: expected a number in %s, found %s%s" % (path, rng, num(get(d, path)), hint(h))


def kind(path, what):
    return lambda d, t: "%s: expected %s, found %s" % (path, what, found(get(d, path)))


def unknown(path, noun, choices, suggest=None):
    def f(d, t):
        h = 'did you mean "%s"?' % suggest if suggest else None
        return '%s: unknown %s "%s" (expected one of %s)%s' % (path, noun, get(d, path),
                                                                ", ".join(choices), hint(h))
    return f


def unknown_key(path, valid, owner="", suggest=None):
    def f(d, t):
        h = ('did you mean "%s"? ' % suggest if suggest else "") + "valid keys: " + ", ".join(valid)
        return "%s: unknown key%s%s" % (path, owner, hint(h))
    return f


def duplicate(path):
    return lambda d, t: "%s: duplicate key (an object may name each key only once)" % path


def over_limit(path, k):
    return lambda d, t: "%s: %s exceeds the limit of %d (2^%d)" % (path, num(get(d, path)), 2 ** k, k)


def count_limit(path, noun, limit):
    return lambda d, t: "%s: %d %s exceed the limit of %d" % (path, len(get(d, path)), noun, limit)


def empty_array(path, what):
    return lambda d, t: "%s: expected at least one %s, found an empty array" % (path, what)


def literal(line):
    return lambda d, t: line


def pos_of(text, needle):
    """1-based line:column of the first occurrence of needle; None = the end of the input."""
    k = len(text) if needle is None else text.index(needle)
    line = text.count("\n", 0, k) + 1
    col = k - (text.rfind("\n", 0, k) + 1) + 1
    return "%d:%d" % (line, col)


def malformed(needle, what, h=None):
    """Malformed JSON: the position of the offending text (needle; None = end of input)."""
    return ("malformed", needle, what, h)


SPEC_OPS = ["linear", "conv2d", "batchnorm", "relu", "dropout", "maxpool2d", "flatten"]
SPEC_KEYS_TOP = ["pipescope", "name", "batch", "model", "pipeline", "data", "hardware", "costs", "train"]
SPEC_KEYS_PIPELINE = ["schedule", "balance", "devices", "chunks", "checkpoint", "batchnorm", "phony",
                      "variant", "virtual_stages"]
DEVICE = 'a device string "cpu" or "cuda:N"'
LAYER = "model.layers[%d]"


def balance_sum(d, t):
    return "pipeline.balance: sums to %d layers but model.layers has %d" % (
        sum(d["pipeline"]["balance"]), len(d["model"]["layers"]))


def chunks_gt_batch(d, t):
    c, b = d["pipeline"]["chunks"], d["batch"]
    return ("pipeline.chunks: %d chunks exceed the batch of %d samples (hint: every micro-batch "
            "needs at least one sample: use chunks <= %d)" % (c, b, b))


def zero_entry(d, t):
    bal = d["pipeline"]["balance"]
    k = bal.index(0)
    return ("pipeline.balance[%d]: expected a positive number of layers, found 0 (hint: every "
            "partition needs at least one layer)" % k)


def devices_length(d, t):
    return "pipeline.devices: has %d devices but pipeline.balance has %d partitions" % (
        len(d["pipeline"]["devices"]), len(d["pipeline"]["balance"]))


def bad_device(k, h=None):
    return lambda d, t: ('pipeline.devices[%d]: unknown device "%s" (expected "cpu" or "cuda:N")%s'
                         % (k, d["pipeline"]["devices"][k], hint(h)))


def shapes(d, upto=None):
    """Per-sample output shape of the layers before `upto` (all: None), computed here with
    PyTorch's formulas."""
    shape = list(d["model"]["input"])
    out = []
    for L in d["model"]["layers"][:upto]:
        op = L["op"]
        if op == "conv2d":
            k, s, p = L["kernel"], L.get("stride", 1), L.get("padding", 0)
            shape = [L["out"], (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1]
        elif op == "maxpool2d":
            k = L["kernel"]
            s, p = L.get("stride", k), L.get("padding", 0)
            shape = [shape[0], (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1]
        elif op == "flatten":
            shape = [math.prod(shape)]
        elif op == "linear":
            shape = [L["out"]]
        out.append(shape)
    return out


def dims(shape):
    return "[" + ",".join(str(x) for x in shape) + "]"


def conv_kernel_too_big(k):
    def f(d, t):
        L = d["model"]["layers"][k]
        C, H, W = d["model"]["input"] if k == 0 else shapes(d, k)[k - 1]
        p, ker, s = L.get("padding", 0), L["kernel"], L.get("stride", 1)
        return ("%s: conv2d kernel %d does not fit the padded input %dx%d (output size "
                "floor((H + 2*%d - %d) / %d) + 1 would be < 1) (hint: use a kernel of at most %d or "
                "more padding)" % (LAYER % k, ker, H + 2 * p, W + 2 * p, p, ker, s, min(H, W) + 2 * p))
    return f


def needs_chw(k, op):
    def f(d, t):
        shape = d["model"]["input"] if k == 0 else shapes(d, k)[k - 1]
        return "%s: %s needs [C,H,W] input but gets %s" % (LAYER % k, op, dims(shape))
    return f


def needs_flat(k):
    def f(d, t):
        return ('%s: linear needs a flat input but gets %s (hint: add {"op": "flatten"} before it)'
                % (LAYER % k, dims(shapes(d, k)[k - 1])))
    return f


def maxpool_padding(k):
    def f(d, t):
        L = d["model"]["layers"][k]
        return ("%s.padding: padding %d is more than half the kernel %d (PyTorch's max_pool2d "
                "rejects it) (hint: use a padding of at most %d)"
                % (LAYER % k, L["padding"], L["kernel"], L["kernel"] // 2))
    return f


def layer_output_limit(k):
    def f(d, t):
        shape = shapes(d, k + 1)[k]
        return ("%s: output %s has %d elements per sample, more than the limit of %d (2^31)"
                % (LAYER % k, dims(shape), math.prod(shape), 2 ** 31))
    return f


def input_numel_limit(d, t):
    return "model.input: %d elements per sample exceed the limit of %d (2^31)" % (
        math.prod(d["model"]["input"]), 2 ** 31)


def linear_params_limit(k):
    def f(d, t):
        L = d["model"]["layers"][k]
        fan_in = math.prod(d["model"]["input"] if k == 0 else shapes(d, k)[k - 1])
        params = fan_in * L["out"] + (L["out"] if L.get("bias", True) else 0)
        return ("%s: linear has %d parameters, more than the limit of %d (2^40) per layer"
                % (LAYER % k, params, 2 ** 40))
    return f


def input_dims(d, t):
    n = len(d["model"]["input"])
    return "model.input: expected [features] or [C,H,W], found an array of %d elements" % n


SPEC = {
    # malformed JSON: position of the offending text
    "n_bad_token": malformed("eight", " near 'eight'"),
    "n_comment": malformed("//", ": comment", "JSON has no comments"),
    "n_single_quotes": malformed("'", ": single quote", "JSON strings use double quotes"),
    "n_trailing_comma": malformed(",\n}", ": trailing comma before '}'",
                                  "JSON does not allow a comma after the last element"),
    "n_trailing_garbage": malformed("x", ": unexpected text after the top-level value",
                                    "a spec is exactly one JSON object"),
    "n_unterminated": malformed(None, ": unexpected end of input",
                                "an object, array or string is not closed"),
    "n_empty": malformed(None, ": empty document", 'a spec is a JSON object: {"pipescope": 1, ...}'),
    "n_whitespace_only": malformed(None, ": empty document",
                                   'a spec is a JSON object: {"pipescope": 1, ...}'),
    "n_top_array": literal("expected a JSON object at the top level, found an array"),
    "n_duplicate_layer": duplicate("model.layers[0].out"),
    "n_duplicate_top": duplicate("batch"),
    # the format version comes first
    "n_version_2": lambda d, t: "pipescope: unsupported format version %s (this build reads version 1)"
    % num(d["pipescope"]),
    "n_version_missing": missing("pipescope", "an integer", 'start the spec with "pipescope": 1'),
    "n_version_string": kind("pipescope", "an integer"),
    # required fields
    "n_missing_batch": missing("batch", "an integer"),
    "n_missing_chunks": missing("pipeline.chunks", "an integer"),
    "n_missing_conv_kernel": missing("model.layers[0].kernel", "an integer"),
    "n_missing_layer_out": missing("model.layers[3].out", "an integer"),
    "n_missing_loss": missing("model.loss", "one of sum, mse, cross_entropy"),
    "n_missing_model": missing("model", "an object"),
    "n_missing_npy_targets": missing("data.targets", "a string"),
    "n_missing_op": missing("model.layers[2].op", "one of " + ", ".join(SPEC_OPS)),
    # kinds
    "n_type_balance_entry": kind("pipeline.balance[1]", "an integer"),
    "n_type_balance_object": kind("pipeline.balance", "an array of layer counts"),
    "n_type_batch_fraction": kind("batch", "an integer"),
    "n_type_batch_huge": kind("batch", "an integer within int64 range"),
    "n_type_batch_string": kind("batch", "an integer"),
    "n_type_bias_string": kind("model.layers[0].bias", "true or false"),
    "n_type_device_number": kind("pipeline.devices[0]", DEVICE),
    "n_type_devices_string": kind("pipeline.devices", "an array of device strings"),
    "n_type_eps_string": kind("model.layers[1].eps", "a number"),
    "n_type_input_scalar": kind("model.input", "an array [features] or [C,H,W]"),
    "n_type_layer_string": kind("model.layers[2]", 'a layer object like {"op": "relu"}'),
    "n_type_lr_infinite": kind("train.lr", "a finite number"),
    "n_type_model_array": kind("model", "an object"),
    "n_type_name_number": kind("name", "a string"),
    "n_type_phony_null": kind("pipeline.phony", "true or false"),
    "n_type_target_column_float": kind("data.target_column", "an integer"),
    # ranges
    "n_batch_negative": positive("batch", "batch size"),
    "n_batch_zero": positive("batch", "batch size"),
    "n_chunks_zero": positive("pipeline.chunks", "number of chunks"),
    "n_steps_zero": positive("train.steps", "number of steps"),
    "n_virtual_stages_zero": positive("pipeline.virtual_stages", "number of virtual stages"),
    "n_input_dim_zero": positive("model.input[1]", "size"),
    "n_kernel_zero": positive("model.layers[0].kernel", "size"),
    "n_out_zero": positive("model.layers[0].out", "size"),
    "n_stride_zero": positive("model.layers[3].stride", "size"),
    "n_padding_negative": at_least("model.layers[0].padding", "an integer", 0),
    "n_seed_negative": at_least("data.seed", "an integer", 0),
    "n_latency_negative": at_least("hardware.link.latency_us", "a number", 0),
    "n_lr_negative": at_least("train.lr", "a number", 0),
    "n_eps_zero": above("model.layers[1].eps", 0),
    "n_flops_zero": above("hardware.device.flops", 0),
    "n_dropout_p_negative": in_range("model.layers[3].p", "[0, 1)"),
    "n_dropout_p_one": in_range("model.layers[3].p", "[0, 1)"),
    "n_momentum_above_one": in_range("model.layers[1].momentum", "[0, 1]",
                                     "null means a cumulative moving average"),
    "n_momentum_negative": in_range("model.layers[1].momentum", "[0, 1]",
                                    "null means a cumulative moving average"),
    # names from a fixed list
    "n_unknown_batchnorm": unknown("pipeline.batchnorm", "batchnorm policy",
                                   ["plain", "deferred", "grad-only"]),
    "n_unknown_checkpoint": unknown("pipeline.checkpoint", "checkpoint mode",
                                    ["always", "except_last", "never"], "except_last"),
    "n_unknown_loss": unknown("model.loss", "loss", ["sum", "mse", "cross_entropy"]),
    "n_unknown_op": unknown("model.layers[2].op", "op", SPEC_OPS, "conv2d"),
    "n_unknown_op_case": unknown("model.layers[0].op", "op", SPEC_OPS, "linear"),
    "n_unknown_optimizer": unknown("train.optimizer", "optimizer", ["sgd"]),
    "n_unknown_schedule": unknown("pipeline.schedule", "schedule",
                                  ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v",
                                   "looped-bfs", "interleaved-zb", "dualpipe-v", "pytorch-gpipe"]),
    "n_unknown_source": unknown("data.source", "data source", ["synthetic", "npy", "csv"]),
    "n_unknown_variant": unknown("pipeline.variant", "variant", ["torchgpipe", "fairscale"]),
    "n_device_unknown": bad_device(1),
    "n_device_leading_zero": bad_device(1),
    "n_device_no_index": bad_device(0, 'name the device index, e.g. "cuda:0"'),
    # keys
    "n_unknown_key_top": unknown_key("bacth", SPEC_KEYS_TOP, suggest="batch"),
    "n_unknown_key_pipeline": unknown_key("pipeline.micro_batches", SPEC_KEYS_PIPELINE),
    "n_unknown_key_layer": unknown_key("model.layers[2].inplace", ["op"], ' for op "relu"'),
    "n_unknown_key_data": unknown_key("data.inputs", ["source", "seed"], ' for source "synthetic"'),
    "n_unknown_key_odd": unknown_key('model["a.b \\"c\\""]', ["input", "layers", "loss", "weights"]),
    # counts and sizes
    "n_balance_empty": empty_array("pipeline.balance", "partition"),
    "n_layers_empty": empty_array("model.layers", "layer"),
    "n_balance_sum": balance_sum,
    "n_balance_zero_entry": zero_entry,
    "n_chunks_gt_batch": chunks_gt_batch,
    "n_devices_length": devices_length,
    "n_input_two_dims": input_dims,
    "n_limit_batch": over_limit("batch", 20),
    "n_limit_chunks": over_limit("pipeline.chunks", 16),
    "n_limit_dim": over_limit("model.layers[0].out", 24),
    "n_limit_input_dim": over_limit("model.input[0]", 24),
    "n_limit_layers": count_limit("model.layers", "layers", 4096),
    "n_limit_partitions": count_limit("pipeline.balance", "partitions", 4096),
    "n_limit_numel": input_numel_limit,
    "n_limit_layer_output": layer_output_limit(0),
    "n_limit_params": linear_params_limit(0),
    # shapes, computed here from the layer parameters
    "n_conv_kernel_too_big": conv_kernel_too_big(0),
    "n_conv_needs_chw": needs_chw(0, "conv2d"),
    "n_maxpool_needs_chw": needs_chw(3, "maxpool2d"),
    "n_linear_needs_flat": needs_flat(4),
    "n_maxpool_padding": maxpool_padding(3),
}

# ---- trace rules (viz/REPORT.md, "Trace naming contract") ------------------------------------
SMALL_NODES = None  # nodes of examples/small-3x3.json's graph, from the rule in src/graph.h


def gpipe_graph_nodes(m, n, checkpointed, phony=True):
    """Nodes of a GPipe (torchgpipe) task graph, counted from the graph's rules (SEMANTICS.md):
    per task F(i,j); per checkpointed task (all micro-batches but the last with except_last)
    rfork, r, rjoin; per micro-batch at each of the n-1 partition boundaries C, W (wait in) and
    Wo (wait out); with phony edges, depend()'s fork and join between consecutive micro-batches
    of a partition. Every one of them has a backward twin (B, R, primed copies, waits, forks,
    joins); plus loss and loss'."""
    fwd = m * n
    fwd += checkpointed * n * 3
    fwd += m * (n - 1) * 3
    if phony:
        fwd += (m - 1) * n * 2
    return 2 * fwd + 2


def small_graph_nodes():
    """examples/small-3x3.json: 3 micro-batches x 3 partitions, except_last (2 checkpointed)."""
    return gpipe_graph_nodes(3, 3, 2)


def trace_task_out_of_range(d, t):
    task = d["traceEvents"][0]["args"]["task"]
    return ("traceEvents[0].args.task: task %d is not a node of the graph (it has %d nodes) (hint: "
            "the trace was written for another spec)" % (task, small_graph_nodes()))


def trace_name_mismatch(d, t):
    return ("traceEvents[0].args.task: task %d is F(0,0) in the spec's graph, but the event is named "
            "%s (hint: the trace was written for another spec)"
            % (d["traceEvents"][0]["args"]["task"], d["traceEvents"][0]["name"]))


def trace_no_tasks(d, t):
    ev = d["traceEvents"] if isinstance(d, dict) else d
    nx = sum(1 for e in ev if e.get("ph") == "X")
    return ("no event names a task of the graph (%d X events, none with args.task or a name such "
            "as %s) (hint: name record_function ranges F(i,j), B(i,j), R(i,j): see "
            "examples/PROFILER.md)" % (nx, TASK_NAMES))


# the task-name forms a trace may use (viz/REPORT.md): pipescope's, PyTorch pipelining's
# record_function names and Megatron-style chunk names
TASK_NAMES = "F(0,0), PP:0F0 or chunk0-part0"
SMALL_PARTITIONS = 3  # examples/small-3x3.json: pipeline.balance [2, 2, 1]


def trace_stage_out_of_range(d, t):
    ev = d["traceEvents"]
    nx = sum(1 for e in ev if e.get("ph") == "X")
    bad = next(e["name"] for e in ev if e["name"].startswith("PP:")
               and int(e["name"][3:].split("F")[0].split("B")[0].split("W")[0]) >= SMALL_PARTITIONS)
    stage = int(bad[3:].split("F")[0])
    return ("no event names a task of the graph (%d X events, none with args.task or a name such "
            "as %s; some names are recognised but name no task of the spec's graph) (hint: %s: "
            "stage %d, but the spec has %d (pipeline.balance))"
            % (nx, TASK_NAMES, bad, stage, SMALL_PARTITIONS))


def time_limit(k, field, what, bound):
    """A time or duration outside what microseconds as a double can count exactly (2^53 us,
    285 years), printed with 7 significant digits."""
    return lambda d, t: "traceEvents[%d].%s: %s is not a %s in microseconds (%s must be below 2^53, 285 years)" % (
        k, field, "%.7g" % d["traceEvents"][k][field], what, bound)


def trailing_data(name, text):
    """Where the second JSON document starts (Python's json finds the end of the first)."""
    _, end = json.JSONDecoder().raw_decode(text)
    while text[end] in " \t\r\n":
        end += 1
    return "%s.json:%s: trailing data after the JSON document" % (name, pos_of(text, text[end:]))


def ev_missing(k, field):
    return literal("traceEvents[%d].%s: missing" % (k, field))


TRACE = {
    "n_args_array": literal("traceEvents[0].args: expected an object"),
    "n_dur_missing": ev_missing(0, "dur"),
    "n_ph_missing": ev_missing(0, "ph"),
    "n_ts_missing": ev_missing(1, "ts"),
    "n_dur_negative": literal("traceEvents[0].dur: expected a number >= 0"),
    "n_empty": literal("empty file (expected a Chrome trace)"),
    "n_event_not_object": literal("traceEvents[1]: expected an object"),
    "n_name_missing": literal("traceEvents[0].name: expected a string"),
    "n_no_tasks": trace_no_tasks,
    "n_no_trace_events": literal('traceEvents: missing (not a Chrome trace: expected an object with '
                                 '"traceEvents" or an array of events)'),
    "n_not_json": ("json-error", "not valid JSON (the file ends inside a value)"),
    "n_base_time_float": literal("baseTimeNanoseconds: expected an integer >= 0 below 2^63 (nanoseconds)"),
    "n_correlation_negative": literal("traceEvents[0].args.correlation: expected an integer >= 0"),
    "n_dur_huge": time_limit(0, "dur", "duration", "it"),
    "n_kernel_ts_huge": time_limit(0, "ts", "time", "|ts|"),
    "n_ts_huge": time_limit(1, "ts", "time", "|ts|"),
    "n_gzip_truncated": literal("corrupt gzip stream: truncated"),
    "n_pp_stage_out_of_range": trace_stage_out_of_range,
    "n_trailing_data": ("position", trailing_data),
    "n_pid_bool": literal("traceEvents[0].pid: expected an integer or a string"),
    "n_task_name_mismatch": trace_name_mismatch,
    "n_task_not_int": literal("traceEvents[0].args.task: expected a node id (an integer >= 0)"),
    "n_task_out_of_range": trace_task_out_of_range,
    "n_top_level_string": literal('expected a JSON object with "traceEvents" or an array of events'),
    "n_trace_events_object": literal("traceEvents: expected an array"),
    "n_ts_string": literal("traceEvents[0].ts: expected a number"),
}

# ---- CLI lines that quote an estimate -----------------------------------------------------------


def graph_nodes_bound(m, n, checkpointed):
    """Upper bound of graph nodes (src/graph.h): per task (i,j) at most F, W, Wo, C, fork, join
    and, with checkpointing, rfork, r, rjoin, each with a backward twin; plus 4 (gather, loss
    and their twins) and 2 per partition (optimizer step and its twin)."""
    per = 2 * (9 if checkpointed else 6)
    return m * n * per + 4 + 2 * n


def cli_graph_too_big(d):
    m = d["pipeline"]["chunks"]
    n = len(d["pipeline"]["balance"])
    est = graph_nodes_bound(m, n, d["pipeline"].get("checkpoint", "except_last") != "never")
    return ("@ROOT/tests/corpus/cli/graph_too_big.json: %d micro-batches x %d partitions would need "
            "%s graph nodes; the limit is 50000000 (hint: use fewer chunks or partitions)"
            % (m, n, "%.3g" % est))


def graph_edges_bound(m, n, checkpointed):
    """Upper bound of graph edges: per task at most 2 per node bound above plus 4 (data, phony
    and host edges of the task's chain), plus 4 per micro-batch (gather, loss)."""
    per = 2 * (9 if checkpointed else 6)
    return m * n * (2 * per + 4) + 4 * m


# Bytes a graph takes at most (src/graph.h, ps_graph_estimate_bytes): per node its struct
# ps_node (72 bytes on x86-64) plus 128 bytes of per-node arrays (order, analysis, simulation),
# per edge slot (edges + nodes: the CSR) its struct ps_edge (12 bytes) plus 8.
NODE_BYTES, EDGE_BYTES = 72 + 128, 12 + 8


def iec(b):
    """A size as the memory-limit lines print it: 3 significant digits in KiB, MiB, ..."""
    units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]
    k = 0
    while b >= 1024 and k < 6:
        b /= 1024
        k += 1
    return ("%.3g %s" if k else "%.0f %s") % (b, units[k])


def cli_mem_limit_graph(d):
    m, n = d["pipeline"]["chunks"], len(d["pipeline"]["balance"])
    ck = d["pipeline"].get("checkpoint", "except_last") != "never"
    nodes, edges = graph_nodes_bound(m, n, ck), graph_edges_bound(m, n, ck)
    need = nodes * NODE_BYTES + (edges + nodes) * EDGE_BYTES
    return ("@SPEC: the graph of %d micro-batches x %d partitions (%d nodes) would need %s of "
            "memory; the limit is 1 KiB (hint: use fewer chunks or partitions, or raise the limit "
            "with PIPESCOPE_MEM_LIMIT=SIZE (e.g. 64G))" % (m, n, nodes, iec(need)))


def cli_svg_too_big(d):
    p = d["pipeline"]
    m, n = p["chunks"], len(p["balance"])
    ck = {"always": m, "except_last": m - 1, "never": 0}[p["checkpoint"]]
    return ("svg: the picture would have %d nodes; laying out more than 2000 takes minutes (hint: "
            "draw the tasks only (graph --tasks), or write --dot FILE for another layout tool)"
            % gpipe_graph_nodes(m, n, ck, p.get("phony", True)))


CLI_JSON = {
    "n_graph_svg_too_big": ("svg_too_big.json", cli_svg_too_big),
    "n_mem_limit_graph": ("../../../examples/small-3x3.json", cli_mem_limit_graph),
    "n_graph_too_big": ("graph_too_big.json", cli_graph_too_big),
    "n_simulate_graph_too_big": ("graph_too_big.json", cli_graph_too_big),
}


# ---- driver ---------------------------------------------------------------------------------

def expected_spec(name, rule, text):
    if isinstance(rule, tuple) and rule[0] == "malformed":
        _, needle, what, h = rule
        return "%s.json:%s: malformed JSON%s%s" % (name, pos_of(text, needle), what, hint(h))
    doc = json.loads(text)
    return "%s.json: %s" % (name, rule(doc, text))


def expected_trace(name, rule, text):
    if isinstance(rule, tuple) and rule[0] == "position":
        return rule[1](name, text)
    if isinstance(rule, tuple) and rule[0] == "json-error":
        try:
            json.loads(text)
            raise SystemExit("%s: parses as JSON" % name)
        except json.JSONDecodeError as e:
            return "%s.json:%d:%d: %s" % (name, e.lineno, e.colno, rule[1])
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None  # empty, or not JSON at all (a gzip stream): the rule does not read it
    return "%s.json: %s" % (name, rule(doc, text))


def main():
    write = "--write" in sys.argv[1:]
    bad = checked = 0
    jobs = []
    for folder, table, fn in (("spec", SPEC, expected_spec), ("trace", TRACE, expected_trace)):
        d = os.path.join(HERE, folder)
        cases = sorted(f[:-5] for f in os.listdir(d) if f.startswith("n_") and f.endswith(".json"))
        for c in cases:
            if c not in table:
                print("FAIL %s/%s.json: no rule names its error (add it to expected.py)" % (folder, c))
                bad += 1
                continue
            raw = open(os.path.join(d, c + ".json"), "rb").read()
            text = raw.decode("utf-8", errors="replace")
            jobs.append((os.path.join(d, c + ".err"), fn(c, table[c], text)))
        for c in sorted(set(table) - set(cases)):
            print("FAIL %s/%s: a rule without its case" % (folder, c))
            bad += 1
    for c, (spec, rule) in CLI_JSON.items():
        doc = json.load(open(os.path.join(HERE, "cli", spec)))
        jobs.append((os.path.join(HERE, "cli", c + ".err"), "pipescope: " + rule(doc)))
    for path, want in jobs:
        checked += 1
        if write:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(want + "\n")
            continue
        have = open(path, encoding="utf-8").read().rstrip("\n") if os.path.exists(path) else None
        if have != want:
            print("FAIL %s:\n  committed: %s\n  the rule:  %s" % (os.path.relpath(path, HERE), have, want))
            bad += 1
    print("corpus rules: %d expected lines %s, %d differ" % (checked, "written" if write else "checked", bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
