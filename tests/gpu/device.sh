#!/bin/sh
# tests/gpu/device.sh: the one script a GPU session runs, as `sh tests/gpu/device.sh` with the
# staged build carried (run tool: carry ["gpu-stage"], timeout_s 480). Stage it first on a build
# machine with `sh tests/gpu/run.sh --stage`.
#
# It stays under 7 minutes (each step under `timeout`, the prediction's repetitions sized to the
# time left) and always leaves at most 8 files in $OUT, even when a step fails or times out:
#   device.log     every step's full output
#   summary.json   the preflight and each step's exit code and seconds (figures in the logs)
#   test_gpu.log   test_gpu (and its rerun under CUDA_LAUNCH_BLOCKING=1 when it failed)
#   bench_gpu.log  bench_gpu's figures
#   cuda-trace.json  one `run --backend cuda --trace` of examples/seed1-convergence.json
#   predict.tar.gz the prediction's specs, traces and costs
# Without $OUT (CI, rehearsal) the files go to $DEVICE_OUT, or a temporary folder it names.
# Exit: 0 all steps passed; 77 no GPU (nvidia-smi absent or lists no device, or DEVICE_NO_GPU=1);
# 2 no gpu-stage/ on a GPU machine; otherwise the first failing step's exit code.
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 2
S=${STAGE_DIR:-gpu-stage}
O=${OUT:-${DEVICE_OUT:-}}
[ -n "$O" ] || O=$(mktemp -d /tmp/pipescope-device.XXXXXX) || exit 2
mkdir -p "$O" || exit 2
case $S in /*) ;; *) S=$root/$S ;; esac
BUDGET=${DEVICE_BUDGET_S:-420}
start=$(date +%s)
log=$O/device.log
: >"$log"
rc=0 steps= gpu=none driver=none stage=absent libs=
pdir=$(mktemp -d /tmp/pipescope-predict.XXXXXX)
steplog=$(mktemp /tmp/pipescope-step.XXXXXX)

say() { echo "device.sh: $*"; echo "device.sh: $*" >>"$log"; }
left() { echo $((BUDGET - ($(date +%s) - start))); }
jstr() { printf '"%s"' "$(printf '%s' "$1" | tr -d '"\\' | tr '\n\t' '  ')"; }

finish() {
    code=$1
    if [ -n "$(ls -A "$pdir" 2>/dev/null)" ]; then
        tar -czf "$O/predict.tar.gz" -C "$pdir" . 2>>"$log"
    fi
    rm -rf "$pdir" "$steplog"
    {
        printf '{\n  "exit": %s,\n  "seconds": %s,\n  "gpu": %s,\n  "driver": %s,\n' \
            "$code" "$(($(date +%s) - start))" "$(jstr "$gpu")" "$(jstr "$driver")"
        printf '  "stage": %s,\n  "cuda_lib_path": %s,\n  "steps": [%s\n  ]\n}\n' \
            "$(jstr "$stage")" "$(jstr "$libs")" "$steps"
    } >"$O/summary.json"
    echo "device.sh: exit $code after $(($(date +%s) - start)) s; files in $O:"
    ls -l "$O"
}
trap 'finish $rc' EXIT

# step NAME FILE LIMIT CMD...: runs CMD under timeout LIMIT (at most the time left less 10 s), output into FILE and device.log,
# the last lines printed; records NAME's exit code and seconds in the summary
step() {
    name=$1 file=$2 limit=$3
    shift 3
    sl=$(($(left) - 10))
    [ "$limit" -le "$sl" ] || limit=$sl
    [ "$limit" -gt 5 ] || { say "$name skipped: no time left"; limit=0; }
    t0=$(date +%s) sr=124
    if [ "$limit" -gt 0 ]; then
        say "== $name (limit ${limit}s)"
        timeout -k 5 "$limit" "$@" >"$steplog" 2>&1
        sr=$?
        [ "$file" = "$log" ] || cat "$steplog" >>"$file"
        cat "$steplog" >>"$log"
        tail -n 25 "$steplog"
    fi
    t=$(($(date +%s) - t0))
    say "$name: exit $sr in ${t}s"
    steps="$steps${steps:+,}
    {\"name\": \"$name\", \"exit\": $sr, \"seconds\": $t}"
    return $sr
}

# preflight: the staged build, the GPU, the driver, the CUDA libraries the module resolves
[ -x "$S/test_gpu" ] && [ -f "$S/pipescope-cuda.so" ] && stage=present
say "stage: $S $stage"
if [ "${DEVICE_NO_GPU:-0}" != 1 ] && command -v nvidia-smi >/dev/null 2>&1; then
    q=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>>"$log" | head -n 1)
    [ -z "$q" ] || { gpu=${q%%,*}; driver=${q#*, }; }
fi
say "gpu: $gpu; driver: $driver"
if [ "$gpu" = none ]; then
    say "no GPU: nothing to run (exit 77)"
    rc=77
    exit 77
fi
if [ "$stage" != present ]; then
    say "no staged build in $S: run 'sh tests/gpu/run.sh --stage' on a build machine and carry $S"
    rc=2
    exit 2
fi
LD_LIBRARY_PATH="$S/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
for lib in $(ldd "$S/pipescope-cuda.so" 2>>"$log" | awk '$3 == "not" { print $1 }'); do
    d=$(find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu /usr/lib64 /opt \
        /usr/local/lib/python3*/dist-packages/nvidia /usr/lib/python3/dist-packages/nvidia \
        -name "$lib*" 2>/dev/null | head -n 1)
    if [ -n "$d" ]; then
        say "$lib not found by the run path: found $d"
        LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$d")"
    else
        say "$lib not found anywhere searched"
    fi
done
libs=$LD_LIBRARY_PATH
ldd "$S/pipescope-cuda.so" >>"$log" 2>&1
cli=$S/pipescope
step build-options "$log" 20 "$cli" version --build-options

note() { [ "$rc" != 0 ] || rc=$1; }
PS_SOURCE_ROOT=$root step test_gpu "$O/test_gpu.log" 150 "$S/test_gpu"
r=$?
if [ "$r" != 0 ]; then
    [ "$r" = 77 ] && say "test_gpu SKIPPED on a GPU machine: no usable CUDA device"
    CUDA_LAUNCH_BLOCKING=1 PS_SOURCE_ROOT=$root \
        step test_gpu-blocking "$O/test_gpu.log" 90 "$S/test_gpu" || note $?
    note "$r"
fi
step bench_gpu "$O/bench_gpu.log" 90 "$S/bench_gpu" || note $?
step cuda-trace "$log" 30 "$cli" run examples/seed1-convergence.json --backend cuda \
    --steps 2 --trace "$O/cuda-trace.json" || note $?
# the prediction: 8 configurations x REPS runs, each paying CUDA and CUPTI start-up (~2 s)
l=$(($(left) - 10))
reps=$((l / 40))
[ "$reps" -le 3 ] || reps=3
[ "$reps" -ge 1 ] || reps=1
say "prediction: $l s left, REPS=$reps"
PIPESCOPE=$cli RUN_ARGS="--backend cuda --virtual-devices" REPS=$reps PREDICT_DIR=$pdir \
    step predict "$log" "$l" sh tests/bench_predict.sh || note $?
exit $rc
