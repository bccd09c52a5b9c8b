#!/bin/sh
# Benchmark (meson benchmark 'cpu'): pipescope's CPU backend vs PyTorch 1.13 on the CPU, time per
# training step and peak RSS (tests/bench_cpu.py) on seed1, digits and unet-timeline (2 steps:
# one step is tens of seconds; UNET_STEPS overrides, 0 leaves it out). Prints and exits 0 when
# torch is not importable.
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
[ "${UNET_STEPS:-2}" != 0 ] && SPECS="$SPECS $ROOT/examples/unet-timeline.json:${UNET_STEPS:-2}"
PIN=""; command -v taskset >/dev/null && PIN="taskset -c 0,1"
# PyTorch's OpenMP workers spin while waiting by default: on a shared, loaded machine that made a
# seed1 step take 2.4 s instead of 72 ms; passive waiting, as pipescope's threads do
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
exec $PIN "$PY" "$ROOT/tests/bench_cpu.py" "$PIPESCOPE" $SPECS --steps "${STEPS:-20}"
