#!/bin/sh
# diagnose's time budget (issue #12 point 2), through the binary:
#   - unet-timeline (192x192 convs, one CPU step takes minutes) under --budget 1: diagnose still
#     writes its report (exit 0), skips the CPU run, the drift sweep and the forward-only pass,
#     and says so in the findings (with --full), in the report's Budget section and in
#     report.json (budget.reduced, each with the command that runs the rest);
#   - progress on stderr: plain lines (stderr is not a terminal here) naming the phase, the
#     percentage, the elapsed time and an ETA; nothing at all with -q;
#   - seed 1 with --full: nothing reduced, budget.full true, every step and setting asked for ran.
# No wall-clock assertion: how long the work takes is the benchmark's business (bench_diagnose.sh).
set -u
bin=${PIPESCOPE:?PIPESCOPE not set}
root=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}
py=$(command -v python3 || true)
[ -n "$py" ] || { echo "SKIP: python3 is not installed"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# an ASan debug build needs a minute for unet's first convolution alone: the unet part needs
# an optimised build (the seed-1 part below still runs)
if nm "$bin" 2>/dev/null | grep -q __asan_init; then
    echo "unet part skipped: ASan build"
else
"$bin" diagnose "$root/examples/unet-timeline.json" -o "$tmp/unet" --budget 1 >"$tmp/out" 2>"$tmp/err" ||
    fail "diagnose --budget 1 exited $?: $(cat "$tmp/err")"
grep -q "time budget 1 s: the CPU run was skipped" "$tmp/out" || fail "no budget finding: $(cat "$tmp/out")"
grep -q -- "--full runs everything" "$tmp/out" || fail "the finding does not say how to run everything"
grep -q '<h2 id="budget">Budget</h2>' "$tmp/unet/index.html" || fail "no Budget section in index.html"
grep -q "diagnose: cpu run, [0-9]*%, [0-9.]* s, ETA " "$tmp/err" || fail "no progress line for the CPU run: $(cat "$tmp/err")"
grep -q "diagnose: cpu run stopped (over the budget)" "$tmp/err" || fail "the CPU run's end is not reported"
"$py" - "$tmp/unet/report.json" <<'PY' || fail "report.json: budget section (above)"
import json, sys
b = json.load(open(sys.argv[1]))['budget']
assert b['limit_s'] == 1 and b['full'] is False, b
r = b['reduced']
assert any(x.startswith('the CPU run was skipped') and 'pipescope run ' in x for x in r), r
assert any('drift sweep was skipped' in x and 'pipescope drift ' in x for x in r), r
assert any('BN adaptation pass was skipped' in x and '--forward-only' in x for x in r), r
assert 'execution' not in json.load(open(sys.argv[1])) or 'cpu' not in json.load(open(sys.argv[1]))['execution'], 'a CPU run was reported'
print('report.json budget:', len(r), 'reductions')
PY
"$bin" diagnose "$root/examples/unet-timeline.json" -o "$tmp/unet-q" --budget 1 -q >"$tmp/outq" 2>"$tmp/errq" ||
    fail "diagnose -q exited $?"
[ ! -s "$tmp/errq" ] || fail "-q still printed on stderr: $(cat "$tmp/errq")"
fi

"$bin" diagnose "$root/examples/seed1-convergence.json" -o "$tmp/seed1" --full --chunks 2,8 -q ||
    fail "diagnose --full exited $?"
"$py" - "$tmp/seed1/report.json" <<'PY' || fail "seed1 --full report.json (above)"
import json, sys
d = json.load(open(sys.argv[1]))
assert d['budget'] == {'limit_s': 0, 'full': True, 'reduced': []}, d['budget']
assert d['execution']['cpu']['steps'] == 3, d['execution']['cpu']['steps']
assert [(r['chunks'], r['policy']) for r in d['drift']['runs']] == [
    (2, 'plain'), (2, 'deferred'), (8, 'plain'), (8, 'deferred')], d['drift']['runs']
PY
"$bin" diagnose "$root/examples/seed1-convergence.json" -o "$tmp/x" --budget 0 2>"$tmp/e0" && fail "--budget 0 was accepted"
grep -q "budget takes seconds" "$tmp/e0" || fail "--budget 0: $(cat "$tmp/e0")"
echo "budget: ok"
