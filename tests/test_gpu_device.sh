#!/bin/sh
# tests/test_gpu_device.sh: the GPU-less rehearsal of tests/gpu/device.sh. It runs the script
# with OUT set to a fresh folder (DEVICE_NO_GPU=1, so it behaves the same on any machine) and
# checks what a device session gets back: exit 77 (no GPU), at most 8 files, names of letters,
# digits and ._- only, each under 16 MiB, no folder deeper than 2, device.log and summary.json
# present and summary.json valid JSON whose "exit" is 77. Then the full flow on a fake GPU
# machine (a fake nvidia-smi and a fake stage whose test_gpu fails unless CUDA_LAUNCH_BLOCKING=1
# and whose bench_gpu hangs): the same contract, the blocking rerun, exit 1, the budget kept.
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d) || exit 1
fake=$(mktemp -d) || exit 1
trap 'rm -rf "$out" "$fake"' EXIT
fail() { echo "test_gpu_device: $*" >&2; exit 1; }
contract() {
    n=$(find "$out" -type f | wc -l)
    [ "$n" -le 8 ] || fail "$n files under OUT (at most 8)"
    [ -z "$(find "$out" ! -type f ! -type d)" ] || fail "something under OUT is not a plain file"
    [ -z "$(find "$out" -mindepth 3 -type d)" ] || fail "a folder deeper than 2 under OUT"
    [ -z "$(find "$out" -size +16M)" ] || fail "a file over 16 MiB under OUT"
    for f in $(cd "$out" && find . -mindepth 1 | sed 's|^\./||'); do
        case $(basename "$f") in *[!A-Za-z0-9._-]*) fail "bad name under OUT: $f" ;; esac
    done
    [ -s "$out/device.log" ] || fail "no device.log"
    [ -s "$out/summary.json" ] || fail "no summary.json"
    python3 -m json.tool "$out/summary.json" >/dev/null || fail "summary.json is not valid JSON"
}
OUT=$out DEVICE_NO_GPU=1 sh "$root/tests/gpu/device.sh" >"$out.stdout" 2>&1
rc=$?
cat "$out.stdout"; rm -f "$out.stdout"
[ "$rc" = 77 ] || fail "device.sh exited $rc without a GPU (want 77)"
contract
grep -q '"exit": 77' "$out/summary.json" || fail "summary.json does not record exit 77"
echo "test_gpu_device: no GPU: OUT holds $n files: $(cd "$out" && ls | tr '\n' ' ')"

# the fake GPU machine
mkdir -p "$fake/bin" "$fake/stage/lib" "$fake/out"
printf '#!/bin/sh\necho "NVIDIA H200, 570.00"\n' >"$fake/bin/nvidia-smi"
printf '#!/bin/sh\necho "max |gpu-cpu| = 3e-6 (tol 1e-4)"\n[ "${CUDA_LAUNCH_BLOCKING:-0}" = 1 ] || { echo "fake failure"; exit 1; }\necho "blocking rerun passed"\n' >"$fake/stage/test_gpu"
printf '#!/bin/sh\nexec sleep 600\n' >"$fake/stage/bench_gpu"
printf '#!/bin/sh\necho "fake pipescope $*"\nexit 3\n' >"$fake/stage/pipescope"
: >"$fake/stage/pipescope-cuda.so"
chmod +x "$fake/bin/nvidia-smi" "$fake/stage/test_gpu" "$fake/stage/bench_gpu" "$fake/stage/pipescope"
out=$fake/out
t0=$(date +%s)
PATH=$fake/bin:$PATH OUT=$out STAGE_DIR=$fake/stage DEVICE_BUDGET_S=30 \
    sh "$root/tests/gpu/device.sh" >"$fake/stdout" 2>&1
rc=$?
t=$(($(date +%s) - t0))
cat "$fake/stdout"
[ "$rc" = 1 ] || fail "device.sh exited $rc on the fake GPU machine (want 1: test_gpu failed)"
[ "$t" -le 35 ] || fail "device.sh took ${t}s under a 30 s budget"
contract
[ -s "$out/test_gpu.log" ] || fail "no test_gpu.log"
grep -q "blocking rerun passed" "$out/test_gpu.log" || fail "no CUDA_LAUNCH_BLOCKING=1 rerun"
grep -q '"name": "test_gpu-blocking", "exit": 0' "$out/summary.json" || fail "summary lacks the rerun"
grep -q '"name": "bench_gpu", "exit": 124' "$out/summary.json" || fail "summary lacks bench_gpu's timeout"
grep -q '"exit": 1,' "$out/summary.json" || fail "summary.json does not record exit 1"
echo "test_gpu_device: fake GPU: ${t}s, OUT holds $n files: $(cd "$out" && ls | tr '\n' ' ')"
