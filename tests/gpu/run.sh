#!/bin/sh
# tests/gpu/run.sh: the CUDA backend's checks on a machine with one H200 (CUDA 13, driver).
#
#   sh tests/gpu/run.sh            (from anywhere; builds into build-gpu at the repository root)
#
# 1. configures a release build with the CUDA feature forced on (fails loudly without nvcc),
# 2. builds only what the GPU checks need (pipescope, test_gpu, bench_gpu),
# 3. runs the 'gpu' test suite (ops vs the CPU backend, BN statistics per policy, the trace and
#    the event ordering of the executor, on virtual devices when there are fewer GPUs),
# 4. runs bench_gpu: BN kernel bandwidth vs 4.8 TB/s, time per pipeline iteration, CUPTI
#    overhead. Everything prints figures; the whole script stays well under 5 minutes.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
B=${BUILD_DIR:-build-gpu}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 8)}
start=$(date +%s)
echo "== nvidia-smi"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
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
echo "== build options"
"$B/pipescope" version --build-options
echo "== test suite 'gpu'"
rc=0
# half of the suite's 300 s timeout, so that build + tests + bench stay within 5 minutes
meson test -C "$B" --no-rebuild --suite gpu -v --print-errorlogs --timeout-multiplier 0.5 \
    > "$B/gpu-suite.log" 2>&1 || rc=$?
cat "$B/gpu-suite.log"
# test_gpu exits 77 (a SKIP, which meson counts as success) when it finds no device: on the GPU
# machine that is a failure
if grep -Eq '^Skipped: +[1-9]' "$B/gpu-suite.log"; then
    echo "run.sh: the gpu suite was SKIPPED: no usable CUDA device" >&2
    rc=1
fi
echo "== bench_gpu"
timeout 120 "$B/tests/bench_gpu" "$@" || rc=$?
echo "== done in $(( $(date +%s) - start )) s (exit $rc)"
exit $rc
