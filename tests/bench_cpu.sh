#!/bin/sh
# Benchmark (meson benchmark 'cpu'): pipescope's CPU backend vs PyTorch 1.13 on the CPU, time per
# training iteration (tests/bench_cpu.py). Prints and exits 0 when torch is not importable.
ROOT=${PS_SOURCE_ROOT:-$(dirname "$0")/..}
PIPESCOPE=${PIPESCOPE:-pipescope}
PY=/usr/bin/python3
if ! [ -x "$PY" ] || ! "$PY" -c 'import torch' 2>/dev/null; then
    echo "bench_cpu: $PY cannot import torch: no PyTorch comparison (apt-get install python3-torch)"
    exit 0
fi
SPECS="$ROOT/examples/seed1-convergence.json"
DIGITS=/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
[ -r "$DIGITS" ] && SPECS="$SPECS $ROOT/examples/digits-bn.json"
PIN=""; command -v taskset >/dev/null && PIN="taskset -c 0,1"
exec $PIN "$PY" "$ROOT/tests/bench_cpu.py" "$PIPESCOPE" $SPECS --steps "${STEPS:-20}"
