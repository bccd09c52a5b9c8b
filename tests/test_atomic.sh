#!/bin/sh
# Atomic outputs (viz/out.c O1-O4), through the real binary: a command that fails, early or
# late (bad data found only when `run` reads it, an output folder that does not exist, a bad
# trace), exits 2 and leaves every output that existed before byte for byte as it was, creates
# no new file or folder and no temporary file; a command that succeeds writes all of its outputs.
set -u
bin=${PIPESCOPE:?PIPESCOPE not set}
root=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}
export PIPESCOPE_MEM_LIMIT=16G
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
total=0
bad=0
fail() { echo "FAIL $1"; bad=$((bad + 1)); }
ex="$root/tests/corpus/exec"
small="$root/examples/small-3x3.json"

# fresh output folder with old outputs: r.json, t.json, g.dot, p.svg, state/ (marker), dir/
setup() {
    rm -rf "$tmp/o"
    mkdir -p "$tmp/o/state" "$tmp/o/dir"
    for f in r.json t.json g.dot p.svg state/0.weight.npy dir/sweep.json; do
        echo "old $f" >"$tmp/o/$f"
    done
    (cd "$tmp/o" && find . | sort && cat r.json t.json g.dot p.svg state/0.weight.npy dir/sweep.json) >"$tmp/before"
}
unchanged() { # NAME: everything in $tmp/o as setup left it
    (cd "$tmp/o" && find . | sort && cat r.json t.json g.dot p.svg state/0.weight.npy dir/sweep.json) >"$tmp/after" 2>&1
    cmp -s "$tmp/before" "$tmp/after" || fail "$1: outputs changed: $(diff "$tmp/before" "$tmp/after" | head -5 | tr '\n' ' ')"
}
expect_fail() { # NAME CMD...: exit 2 and nothing changed
    name=$1
    shift
    total=$((total + 1))
    setup
    "$@" >/dev/null 2>"$tmp/err"
    rc=$?
    [ $rc -eq 2 ] || { fail "$name: exit $rc, expected 2 ($(head -n 1 "$tmp/err"))"; return; }
    unchanged "$name"
}
o="$tmp/o"
missing="$tmp/o/missing/x"

expect_fail "run: bad csv row found late" "$bin" run "$ex/n_csv_text/spec.json" \
    --json "$o/r.json" --trace "$o/t.json" --save-state "$o/state"
expect_fail "run: bad weights" "$bin" run "$ex/n_weights_nan/spec.json" \
    --json "$o/r.json" --trace "$o/t.json" --save-state "$o/state"
expect_fail "run: --json folder missing after --trace" "$bin" run "$ex/y_npy/spec.json" \
    --trace "$o/t.json" --save-state "$o/state" --json "$missing.json"
expect_fail "run: --save-state under a file" "$bin" run "$ex/y_npy/spec.json" \
    --trace "$o/t.json" --json "$o/r.json" --save-state "$o/r.json/state"
expect_fail "run: memory limit" env PIPESCOPE_MEM_LIMIT=1K "$bin" run "$small" \
    --json "$o/r.json" --trace "$o/t.json" --save-state "$o/state"
expect_fail "check: bad spec" "$bin" check "$root/tests/corpus/spec/n_balance_sum.json" \
    --json "$o/r.json"
expect_fail "graph: --json folder missing after --dot" "$bin" graph "$small" --dot "$o/g.dot" \
    --svg "$o/p.svg" --json "$missing.json"
expect_fail "simulate: --svg folder missing after --trace" "$bin" simulate "$small" \
    --trace "$o/t.json" --json "$o/r.json" --svg "$missing.svg"
expect_fail "sweep: -o folder under a file" "$bin" sweep "$small" --chunks 1,2 \
    --json "$o/r.json" -o "$o/r.json/out"
expect_fail "sweep: new -o folder, --json folder missing" "$bin" sweep "$small" --chunks 1,2 \
    -o "$o/new" --json "$missing.json"
expect_fail "drift: bad csv row found late" "$bin" drift "$ex/n_csv_text/spec.json" \
    --chunks 1,2 --steps 1 --json "$o/r.json" --svg "$o/p.svg" -o "$o/dir"
expect_fail "compare: bad measured trace" "$bin" compare "$small" \
    --measured "$root/tests/corpus/trace/n_dur_negative.json" --json "$o/r.json" --svg "$o/p.svg" \
    --dot "$o/g.dot"
expect_fail "balance: bad spec" "$bin" balance "$root/tests/corpus/spec/n_balance_sum.json" \
    --json "$o/r.json"
expect_fail "diagnose: bad spec" "$bin" diagnose "$root/tests/corpus/spec/n_balance_sum.json" \
    -o "$o/dir" --no-drift

# success: every output is replaced, nothing temporary stays
expect_ok() { # NAME FILES CMD...
    name=$1
    files=$2
    shift 2
    total=$((total + 1))
    setup
    "$@" >/dev/null 2>"$tmp/err"
    rc=$?
    [ $rc -eq 0 ] || { fail "$name: exit $rc ($(head -n 1 "$tmp/err"))"; return; }
    for f in $files; do
        [ -s "$o/$f" ] || { fail "$name: $f missing"; continue; }
        ! grep -q "^old " "$o/$f" || fail "$name: $f not replaced"
    done
    left=$(find "$o" -name '*.tmp*')
    [ -z "$left" ] || fail "$name: temporary files left: $left"
}
expect_ok "run" "r.json t.json state/0.weight.npy" "$bin" run "$ex/y_npy/spec.json" \
    --json "$o/r.json" --trace "$o/t.json" --save-state "$o/state"
expect_ok "graph" "g.dot p.svg r.json" "$bin" graph "$small" --dot "$o/g.dot" --svg "$o/p.svg" \
    --json "$o/r.json"
expect_ok "sweep" "r.json dir/sweep.json dir/makespan.svg" "$bin" sweep "$small" \
    --chunks 1,2 --json "$o/r.json" -o "$o/dir"
echo "atomic outputs: $total cases, $bad failures"
[ $bad -eq 0 ]
