#!/bin/sh
# The CSVs `pipescope schedule --csv` writes run correctly under both of PyTorch's CSV executors,
# as tests/replay_pytorch_csv.py models them: PipelineScheduleMulti step by step (an action reads
# only what earlier steps produced) and _PipelineScheduleRuntime rank by rank. Controls that must
# fail: the back-to-back rows pipescope wrote before (the committed goldens of tests/golden/sched
# are that format) compute before their input arrives under the step executor; a grid with one
# action moved a step too early, and a row order that deadlocks.
set -u
bin=${PIPESCOPE:?PIPESCOPE not set}
root=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}
py=${PYTHON3:-python3}
replay="$root/tests/replay_pytorch_csv.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

n=0
while read -r spec sched chunks vs; do
    n=$((n + 1))
    out="$tmp/$n-$sched.csv"
    set -- --schedule "$sched" --chunks "$chunks"
    [ "$vs" = - ] || set -- "$@" --virtual-stages "$vs"
    "$bin" schedule "$root/examples/$spec" "$@" --csv "$out" >/dev/null 2>"$tmp/err" ||
        fail "schedule $spec $* exited $?: $(cat "$tmp/err")"
done <<'CASES'
small-3x3.json 1f1b 3 -
small-3x3.json 1f1b 6 -
small-3x3.json pytorch-gpipe 6 -
small-3x3.json zb-h1 6 -
small-3x3.json looped-bfs 4 1
schedules-8stage.json 1f1b 16 -
schedules-8stage.json pytorch-gpipe 8 -
schedules-8stage.json zb-h1 8 -
schedules-8stage.json zb-h2 16 -
schedules-8stage.json interleaved-1f1b 4 2
schedules-8stage.json interleaved-1f1b 16 2
schedules-8stage.json interleaved-1f1b 2 4
schedules-8stage.json interleaved-zb 8 2
schedules-8stage.json interleaved-zb 4 4
schedules-8stage.json looped-bfs 8 2
schedules-8stage.json looped-bfs 4 4
schedules-8stage.json zb-v 8 2
schedules-8stage.json dualpipe-v 8 2
schedules-8stage.json dualpipe-v 16 2
CASES
[ "$(ls "$tmp"/*.csv | wc -l)" -eq 19 ] || fail "expected 19 CSVs"
"$py" "$replay" steps "$tmp"/*.csv || fail "a written CSV is wrong under PipelineScheduleMulti's steps"
"$py" "$replay" runtime "$tmp"/*.csv || fail "a written CSV is wrong under _PipelineScheduleRuntime"
grep -q ',,' "$tmp/6-1f1b.csv" || fail "1f1b on 8 stages has no idle steps"

# controls: back-to-back rows run under the runtime executor only
g="$root/tests/golden/sched"
"$py" "$replay" runtime "$g"/*_p*_v*_m*.csv || fail "a golden order fails the runtime executor"
"$py" "$replay" steps "$g/zb-h1_p4_v1_m8.csv" >"$tmp/o" && fail "back-to-back zb-h1 passed steps"
grep -q "rank 1, step 0: 1F0 computes before its input (0F0, produced in step 0) arrives" "$tmp/o" ||
    fail "unexpected steps report: $(cat "$tmp/o")"
printf '0F0,0F1,,0B0,0B1\n,1F0,1F1,1B0,1B1\n' >"$tmp/early.csv"
"$py" "$replay" steps "$tmp/early.csv" >"$tmp/o" && fail "1B0 in the step of 1F1 passed"
grep -q "rank 1, step 3: 1B0 computes before its input (1F0" "$tmp/o" && fail "wrong culprit"
grep -q "rank 0, step 3: 0B0 computes before its input (1B0, produced in step 3) arrives" \
    "$tmp/o" || fail "unexpected report: $(cat "$tmp/o")"
printf '0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n' >"$tmp/dead.csv"
"$py" "$replay" runtime "$tmp/dead.csv" >"$tmp/o" && fail "a deadlocking CSV passed runtime"
grep -q "deadlock: rank 0 at 0B0, rank 1 at 1F1" "$tmp/o" || fail "unexpected report: $(cat "$tmp/o")"
echo "ok: 19 written CSVs run under both executors; controls fail as they should"
