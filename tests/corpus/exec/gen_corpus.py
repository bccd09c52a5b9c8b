#!/usr/bin/python3
"""Bad-input corpus for `pipescope run` (tests/run_corpus_exec.sh).

    cd tests/corpus/exec && /usr/bin/python3 gen_corpus.py

Every n_<case>/ folder holds spec.json and the files it names, with ONE thing wrong; n_<case>.err
is the exact error line `pipescope run` must print (after "pipescope: "), with exit code 2 and
no output file. y_<case>/ folders must run (exit 0). Expected lines are written by hand below,
not captured from the binary.
"""
import gzip
import json
import os
import shutil

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(3)

LAYERS = [{"op": "linear", "out": 3}, {"op": "batchnorm"}, {"op": "relu"},
          {"op": "linear", "out": 2}]


def weights():
    return {
        "0.weight": rng.standard_normal((3, 4)).astype(np.float32),
        "0.bias": rng.standard_normal(3).astype(np.float32),
        "1.weight": np.ones(3, np.float32), "1.bias": np.zeros(3, np.float32),
        "1.running_mean": np.zeros(3, np.float32), "1.running_var": np.ones(3, np.float32),
        "1.num_batches_tracked": np.array(0, np.int64),
        "3.weight": rng.standard_normal((2, 3)).astype(np.float32),
        "3.bias": rng.standard_normal(2).astype(np.float32),
    }


def case(name, err, w=None, x=None, y=None, csv=None, data=None, drop=(), raw=None):
    d = os.path.join(HERE, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "weights"))
    w = weights() if w is None else w
    for k, v in w.items():
        if k not in drop:
            np.save(os.path.join(d, "weights", k + ".npy"), v)
    for k, v in (raw or {}).items():
        os.makedirs(os.path.dirname(os.path.join(d, k)), exist_ok=True)
        with open(os.path.join(d, k), "wb") as fh:
            fh.write(v)
    if csv is not None:
        opener = gzip.open if csv[0].endswith(".gz") else open
        with opener(os.path.join(d, csv[0]), "wt") as fh:
            fh.write(csv[1])
    x = rng.standard_normal((8, 4)).astype(np.float32) if x is None else x
    y = rng.integers(0, 2, 8).astype(np.int64) if y is None else y
    np.save(os.path.join(d, "x.npy"), x)
    np.save(os.path.join(d, "y.npy"), y)
    spec = {"pipescope": 1, "name": name, "batch": 4,
            "model": {"input": [4], "layers": LAYERS, "loss": "cross_entropy",
                      "weights": "weights"},
            "pipeline": {"balance": [2, 2], "devices": ["cpu", "cpu"], "chunks": 2,
                         "checkpoint": "except_last", "batchnorm": "plain"},
            "data": data or {"source": "npy", "inputs": "x.npy", "targets": "y.npy"},
            "train": {"steps": 2, "lr": 0.1}}
    with open(os.path.join(d, "spec.json"), "w") as fh:
        json.dump(spec, fh, indent=1)
        fh.write("\n")
    if err is not None:
        with open(os.path.join(HERE, name + ".err"), "w") as fh:
            fh.write(err.replace("@", name) + "\n")


def npy_bytes(a):
    import io
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


w = weights(); w["0.weight"] = np.zeros((3, 5), np.float32)
case("n_weights_shape", "@/weights/0.weight.npy: shape (3, 5): layer 0 (linear) expects (3, 4)", w)
w = weights(); w["0.weight"] = np.zeros((3, 4), np.complex64)
case("n_weights_complex", "@/weights/0.weight.npy: unsupported dtype '<c8' (hint: use float32, "
     "float64, int32, int64, uint8 or bool)", w)
w = weights(); w["3.bias"] = np.array([1, 2], np.int64)
case("n_weights_int", "@/weights/3.bias.npy: dtype '<i8': expected float32 or float64", w)
w = weights(); w["1.num_batches_tracked"] = np.array(2.0, np.float32)
case("n_nbt_float", "@/weights/1.num_batches_tracked.npy: dtype '<f4': expected an integer "
     "(int64)", w)
w = weights(); w["1.running_var"] = np.array([1, -1, 1], np.float32)
case("n_running_var_negative", "@/weights/1.running_var.npy: element 1 is negative (-1), a "
     "variance cannot be", w)
w = weights(); w["0.bias"] = np.array([0, np.nan, 0], np.float32)
case("n_weights_nan", "@/weights/0.bias.npy: element 1 is NaN", w)
case("n_weights_truncated", "@/weights/0.weight.npy: truncated data: expected 48 bytes for shape "
     "(3, 4) of '<f4', found 20", drop=("0.weight",),
     raw={"weights/0.weight.npy": npy_bytes(np.zeros((3, 4), np.float32))[:-28]})
case("n_weights_not_npy", "@/weights/0.weight.npy: not a .npy file (bad magic: expected "
     "\\x93NUMPY) (hint: write it with numpy.save)", drop=("0.weight",),
     raw={"weights/0.weight.npy": b"0.1,0.2,0.3\n"})
case("n_weights_missing", "@/weights/3.bias.npy: missing: layer 3 (linear) needs its bias in the "
     "weights folder (hint: a weights folder must hold the full state_dict of the model "
     "(torch.save each tensor with numpy.save), or leave model.weights out)", drop=("3.bias",))
y = np.array([0, 1, 1, 0, 2, 1, 0, 1], np.int64)
case("n_labels_range", "@/y.npy: label of sample 4 is 2, expected 0..1 (hint: the model's last "
     "layer has 2 outputs (classes))", y=y)
y = np.array([0, 1, 1, 0, 1, 1, 0, 1], np.float32)
case("n_labels_float", "@/y.npy: dtype '<f4': expected integer labels (int32 or int64)", y=y)
x = rng.standard_normal((8, 4)).astype(np.float32); x[5, 2] = np.nan
case("n_data_nan", "@/x.npy: input of sample 5: element 2 is NaN", x=x)
x = rng.standard_normal((8, 4)).astype(np.float32); x[7, 0] = np.inf
case("n_data_inf", "@/x.npy: input of sample 7: element 0 is infinite", x=x)
case("n_data_shape", "@/x.npy: shape [8, 5] does not match the model input: expected [S] + [4] "
     "(S >= 1)", x=rng.standard_normal((8, 5)).astype(np.float32))
case("n_targets_count", "@/y.npy: shape [6]: expected [8] integer labels, one per input sample",
     y=np.zeros(6, np.int64))
CSV = {"source": "csv", "path": "d.csv", "target_column": -1}
case("n_csv_columns", "@/d.csv:3: 4 columns, expected 5 (4 features for input numel + 1 target)",
     csv=("d.csv", "1,2,3,4,0\n1,2,3,4,1\n1,2,3,1\n"), data=CSV)
case("n_csv_label", "@/d.csv:2: label (column 5) is 3, expected an integer in 0..1",
     csv=("d.csv", "1,2,3,4,0\n1,2,3,4,3\n"), data=CSV)
case("n_csv_nan", "@/d.csv:2: column 2 is NaN", csv=("d.csv", "1,2,3,4,0\n1,nan,3,4,1\n"),
     data=CSV)
case("n_csv_text", "@/d.csv:3: column 1: 'abc' is not a number",
     csv=("d.csv", "a,b,c,d,e\n1,2,3,4,0\nabc,2,3,4,1\n"), data=CSV)
case("n_csv_gz_columns", "@/d.csv.gz:1: 6 columns, expected 5 (4 features for input numel + 1 "
     "target)", csv=("d.csv.gz", "1,2,3,4,0,9\n"),
     data={"source": "csv", "path": "d.csv.gz", "target_column": -1})
case("n_csv_missing", "@/nope.csv: cannot open: No such file or directory",
     data={"source": "csv", "path": "nope.csv", "target_column": -1})
case("y_csv_gz", None, csv=("d.csv.gz", "f1,f2,label,f3,f4\n" +
                            "".join("%d,%d.5,%d,-%d,%d\n" % (k, k, k % 2, k, k * k)
                                    for k in range(6))),
     data={"source": "csv", "path": "d.csv.gz", "target_column": 2})
case("y_npy", None)
# csv, issue [hardening]: gzip files written with mtime 0 (byte-identical on every run)
def gz(text):
    return gzip.compress(text.encode(), mtime=0)


case("n_csv_float_range", "@/d.csv:2: column 1: 1e+39 is out of float32 range",
     csv=("d.csv", "1,2,3,4,0\n1e39,2,3,4,1\n"), data=CSV)
case("n_csv_label_huge", "@/d.csv:1: label (column 5) is -1e+300, expected an integer in 0..1",
     csv=("d.csv", "1,2,3,4,-1e300\n"), data=CSV)
case("n_csv_nul", "@/d.csv:2: a NUL byte in the line (not a text file?)",
     raw={"d.csv": b"1,2,3,4,0\n1,2\x00,3,4,1\n"}, data=CSV)
case("n_csv_empty", "@/d.csv: no data rows", raw={"d.csv": b""}, data=CSV)
case("n_csv_header_only", "@/d.csv: no data rows", csv=("d.csv", "a,b,c,d,label\n"), data=CSV)
case("n_csv_blank_lines", "@/d.csv: no data rows", csv=("d.csv", "\n\n\r\n"), data=CSV)
case("n_csv_blank_field", "@/d.csv:2: column 2: '' is not a number",
     csv=("d.csv", "1,2,3,4,0\n1,,3,4,1\n"), data=CSV)
case("n_csv_trailing_comma", "@/d.csv:1: 6 columns, expected 5 (4 features for input numel + 1 "
     "target)", csv=("d.csv", "1,2,3,4,0,\n"), data=CSV)
case("n_csv_inf", "@/d.csv:1: column 2 is infinite", csv=("d.csv", "1,inf,3,4,0\n"), data=CSV)
case("n_csv_label_fraction", "@/d.csv:1: label (column 5) is 0.5, expected an integer in 0..1",
     csv=("d.csv", "1,2,3,4,0.5\n"), data=CSV)
case("n_csv_label_negative", "@/d.csv:2: label (column 5) is -1, expected an integer in 0..1",
     csv=("d.csv", "1,2,3,4,1\n1,2,3,4,-1\n"), data=CSV)
case("n_csv_target_column", "@/d.csv:1: target_column 5 is outside the 5 columns",
     csv=("d.csv", "1,2,3,4,0\n"), data={"source": "csv", "path": "d.csv", "target_column": 5})
case("n_csv_gz_truncated", "@/d.csv.gz: corrupt gzip stream: truncated",
     raw={"d.csv.gz": gz("1,2,3,4,0\n" * 400)[:40]},
     data={"source": "csv", "path": "d.csv.gz", "target_column": -1})
case("n_csv_gz_text", "@/d.csv.gz:2: column 3: 'x' is not a number",
     raw={"d.csv.gz": gz("1,2,3,4,0\n1,2,x,4,1\n")},
     data={"source": "csv", "path": "d.csv.gz", "target_column": -1})
case("n_csv_folder", "@/sub: cannot read: Is a directory", raw={"sub/keep": b""},
     data={"source": "csv", "path": "sub", "target_column": -1})
case("n_npy_inputs_missing", "@/nope.npy: cannot open: No such file or directory",
     data={"source": "npy", "inputs": "nope.npy", "targets": "y.npy"})
# issue [data-safety] 7: a device as data is read within the memory limit, never whole
case("n_npy_inputs_dev_zero", "/dev/zero: not a .npy file (bad magic: expected \\x93NUMPY) "
     "(hint: write it with numpy.save)",
     data={"source": "npy", "inputs": "/dev/zero", "targets": "y.npy"})
case("n_csv_dev_zero", "/dev/zero:1: a NUL byte in the line (not a text file?)",
     data={"source": "csv", "path": "/dev/zero", "target_column": -1})
# issue [data-safety] 8: a count at INT64_MAX (training overflowed it, UBSan in batchnorm.c, and
# the saved state was refused): it saturates, the run works and its state loads again
w = weights(); w["1.num_batches_tracked"] = np.array(2**63 - 1, np.int64)
case("y_weights_nbt_max", None, w)
print("ok")
