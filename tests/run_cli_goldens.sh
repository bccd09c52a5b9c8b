#!/bin/sh
# Golden outputs of the real binary on small examples: DOT, the check report JSON, the engine
# order, the simulated Chrome trace and the Gantt SVG must equal tests/golden/cli/* byte for
# byte (the simulator and the writers are deterministic). These are SNAPSHOTS of pipescope's own
# output: they catch any change, not a wrong number (the numbers are checked against hand-worked
# timelines and closed forms in test_sim.c, test_graph.c, test_compare.c, test_exec.c).
# PS_REGEN_GOLDEN=1 rewrites them and exits 77 (skip): a rewrite is never a pass.
set -u
bin=${PIPESCOPE:?PIPESCOPE not set}
root=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}
gold=$root/tests/golden/cli
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$root" || exit 1
bad=0
total=0
check() { # name: the file in $tmp to compare with $gold/name
    total=$((total + 1))
    if [ "${PS_REGEN_GOLDEN:-0}" = 1 ]; then
        mkdir -p "$gold" && cp "$tmp/$1" "$gold/$1" && echo "regenerated $1"
    elif ! cmp -s "$tmp/$1" "$gold/$1"; then
        echo "FAIL $1 differs from tests/golden/cli/$1:"
        diff "$gold/$1" "$tmp/$1" | head -10
        bad=$((bad + 1))
    fi
}
run() { "$@" >/dev/null 2>"$tmp/err" || { echo "FAIL: $*: $(cat "$tmp/err")"; bad=$((bad + 1)); }; }
for ex in small-3x3 seed2-checkpoint-bn; do
    spec=examples/$ex.json
    run "$bin" graph "$spec" --dot "$tmp/$ex.dot"
    check "$ex.dot"
    "$bin" graph "$spec" --order >"$tmp/$ex.order" 2>/dev/null
    check "$ex.order"
    run "$bin" check "$spec" --json "$tmp/$ex.check.json"
    check "$ex.check.json"
    run "$bin" simulate "$spec" --trace "$tmp/$ex.trace.json" --svg "$tmp/$ex.gantt.svg"
    check "$ex.trace.json"
    check "$ex.gantt.svg"
done
# determinism: a second run gives the same bytes
run "$bin" simulate examples/seed1-convergence.json --trace "$tmp/a.json" --json "$tmp/a.report.json"
run "$bin" simulate examples/seed1-convergence.json --trace "$tmp/b.json" --json "$tmp/b.report.json"
total=$((total + 1))
cmp -s "$tmp/a.json" "$tmp/b.json" && cmp -s "$tmp/a.report.json" "$tmp/b.report.json" ||
    { echo "FAIL: two simulate runs differ"; bad=$((bad + 1)); }
echo "cli goldens: $total checks, $bad failures"
[ $bad -eq 0 ] || exit 1
if [ "${PS_REGEN_GOLDEN:-0}" = 1 ]; then
    echo "SKIP: PS_REGEN_GOLDEN=1 rewrote tests/golden/cli; review the diff and rerun without it"
    exit 77
fi
