#!/bin/sh
# tests/gpu/run.sh: the CUDA backend's checks on a machine with one H200 (CUDA 13, driver).
#
#   sh tests/gpu/run.sh --stage   on a build machine (nvcc and the -dev packages; no GPU needed):
#                                 configures and builds build-gpu (release, CUDA forced on), then
#                                 copies what the checks run into gpu-stage/ at the repository
#                                 root: pipescope, pipescope-cuda.so, test_gpu, bench_gpu and the
#                                 shared libraries they load that are neither the C runtime nor
#                                 CUDA's (cJSON, cmocka, ...). Carry gpu-stage/ to the GPU machine.
#   sh tests/gpu/run.sh           on the GPU machine: runs gpu-stage/ when it is there (no build,
#                                 no network, nothing installed: a GPU machine may have neither
#                                 meson's dependencies nor a way to fetch them); otherwise builds
#                                 build-gpu as --stage does and runs from it.
#
# The run: nvidia-smi; the build options; test_gpu (ops vs the CPU backend, BN statistics per
# policy, the trace and the stream waits of the executor, on virtual devices when there are
# fewer GPUs; its skip, exit 77, is a failure on a GPU machine); bench_gpu (BN kernel bandwidth
# vs 4.8 TB/s, time per pipeline iteration, CUPTI overhead); the simulator's held-out accuracy
# on the GPU (tests/bench_predict.sh with --backend cuda --virtual-devices, PREDICT_REPS runs of
# each configuration, default 3; PREDICT_DIR keeps the traces, default a temporary folder).
# Everything prints figures; the whole script stays under 8 minutes. Extra arguments go to
# bench_gpu.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
B=${BUILD_DIR:-build-gpu}
S=${STAGE_DIR:-gpu-stage}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 8)}
start=$(date +%s)

build() {
    if [ ! -f "$B/build.ninja" ]; then
        for dep in libcjson libcgraph libgvc zlib cmocka; do
            pkg-config --exists "$dep" 2>/dev/null ||
                echo "run.sh: pkg-config does not find $dep: meson setup will fail (apt-get install the -dev package)" >&2
        done
        meson setup "$B" --buildtype=release -Dcuda=enabled
    fi
    grep -q 'PS_HAVE_CUDA 1' "$B/ps_config.h" || { echo "run.sh: $B was configured without CUDA" >&2; exit 1; }
    echo "== build ($jobs jobs)"
    ninja -C "$B" -j"$jobs" pipescope pipescope-cuda.so tests/test_gpu tests/bench_gpu
}

if [ "${1:-}" = "--stage" ]; then
    build
    rm -rf "$S"
    mkdir -p "$S/lib"
    cp "$B/pipescope" "$B/pipescope-cuda.so" "$B/tests/test_gpu" "$B/tests/bench_gpu" "$S/"
    # the libraries the four load, less the C/C++ runtime and CUDA's own (the GPU machine's)
    for f in "$S/pipescope" "$S/pipescope-cuda.so" "$S/test_gpu" "$S/bench_gpu"; do
        ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
    done | sort -u | while read -r lib; do
        case $(basename "$lib") in
        libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | libutil.so* | libresolv.so* | \
            ld-linux* | libstdc++.so* | libgcc_s.so* | libcuda.so* | libcudart.so* | libcublas*.so* | \
            libcupti.so* | libnvrtc*) ;;
        *) cp -L "$lib" "$S/lib/" ;;
        esac
    done
    echo "run.sh: staged in $S ($(du -sh "$S" | cut -f1)): carry it to the GPU machine"
    exit 0
fi

echo "== nvidia-smi"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
if [ -x "$S/test_gpu" ]; then
    echo "== staged binaries from $S (nothing built here)"
    cli=$S/pipescope test=$S/test_gpu bench=$S/bench_gpu
    # the staged libraries; CUDA's come from the binaries' run paths
    LD_LIBRARY_PATH="$root/$S/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export LD_LIBRARY_PATH
else
    build
    cli=$B/pipescope test=$B/tests/test_gpu bench=$B/tests/bench_gpu
fi
echo "== build options"
"$cli" version --build-options
echo "== test_gpu"
rc=0
PS_SOURCE_ROOT=$root timeout 150 "$test" || rc=$?
# exit 77 is a skip (no usable CUDA device): on the GPU machine that is a failure
if [ "$rc" = 77 ]; then
    echo "run.sh: test_gpu was SKIPPED: no usable CUDA device" >&2
    rc=1
fi
echo "== bench_gpu"
timeout 120 "$bench" "$@" || { r=$?; [ "$rc" != 0 ] || rc=$r; }
echo "== predict (calibrate on chunks 2 never + 16 except_last, the six others held out)"
case $cli in /*) ;; *) cli=$root/$cli ;; esac
PIPESCOPE=$cli RUN_ARGS="--backend cuda --virtual-devices" REPS=${PREDICT_REPS:-3} \
    timeout 180 sh tests/bench_predict.sh || { r=$?; [ "$rc" != 0 ] || rc=$r; }
echo "== done in $(( $(date +%s) - start )) s (exit $rc)"
exit $rc
