#!/bin/sh
# Fuzz smoke run: every libFuzzer target of a -Dfuzz=true build for a few seconds, one at a
# time, from its seed corpus (tests/fuzz/corpus/<target>, read only: new inputs go to a
# temporary folder). A crash, leak or sanitizer report fails the run and leaves the input in
# BUILDDIR/fuzz-artifacts/<target>-crash-*; keep it as tests/fuzz/regress/<target>/NAME once fixed.
#   tests/fuzz/smoke.sh BUILDDIR [SECONDS per target, default 30]
set -u
build=${1:?usage: smoke.sh BUILDDIR [SECONDS]}
secs=${2:-30}
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$build/fuzz-artifacts"
status=0
for t in spec npy csv trace; do
    bin="$build/tests/fuzz/fuzz_$t"
    [ -x "$bin" ] || { echo "fuzz smoke: $bin missing (configure with -Dfuzz=true)"; status=1; continue; }
    mkdir -p "$tmp/$t"
    "$bin" "$tmp/$t" "$root/tests/fuzz/corpus/$t" -max_total_time="$secs" -timeout=20 \
        -rss_limit_mb=2048 -artifact_prefix="$build/fuzz-artifacts/$t-" -print_final_stats=1 \
        >"$tmp/$t.log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tmp/$t.log")
    if [ $rc -eq 0 ]; then
        echo "fuzz smoke: $t: ${runs:-?} executions in ${secs}s, no crash"
    else
        echo "fuzz smoke: $t: FAILED (exit $rc)"
        grep -E "ERROR|SUMMARY|fuzz check|runtime error|Test unit written" "$tmp/$t.log" | head -20
        status=1
    fi
done
exit $status
