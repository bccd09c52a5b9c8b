#!/bin/sh
# Engine-order goldens: for every tests/golden/order/CASE.json, `pipescope graph CASE.json
# --order` must print exactly CASE.order, the F/R/B order recorded from PyTorch 1.13 running a
# torchgpipe mirror (tests/golden/order/gen_order.py). Prints each mismatch with a diff.
set -u
bin=${PIPESCOPE:?PIPESCOPE not set}
dir=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}/tests/golden/order
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
total=0
bad=0
for spec in "$dir"/*.json; do
    case_=$(basename "$spec" .json)
    want="$dir/$case_.order"
    case "$case_" in index | engine_model_check) continue ;; esac
    [ -f "$want" ] || { echo "missing $want"; bad=$((bad + 1)); continue; }
    total=$((total + 1))
    if ! "$bin" graph "$spec" --order -q >"$tmp/got" 2>"$tmp/err"; then
        echo "FAIL $case_: exit $?: $(cat "$tmp/err")"
        bad=$((bad + 1))
        continue
    fi
    if ! cmp -s "$tmp/got" "$want"; then
        echo "FAIL $case_"
        diff "$want" "$tmp/got" | head -20
        bad=$((bad + 1))
    fi
done
# iteration 1 in the same process, where the order differs from iteration 0
for want in "$dir"/*.iter1.order; do
    [ -f "$want" ] || continue
    case_=$(basename "$want" .iter1.order)
    total=$((total + 1))
    if ! "$bin" graph "$dir/$case_.json" --order --iteration 1 -q >"$tmp/got" 2>"$tmp/err" ||
        ! cmp -s "$tmp/got" "$want"; then
        echo "FAIL $case_ (iteration 1)"
        diff "$want" "$tmp/got" | head -20
        bad=$((bad + 1))
    fi
done
# every case PyTorch recorded (index.json, written by gen_order.py) was checked: a golden file
# that went missing, or a new case without its files, is a failure
want=$(python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))["cases"]
print(len(c) + sum(1 for x in c if x.get("iter1_differs")))' "$dir/index.json") ||
    { echo "FAIL: cannot read $dir/index.json"; exit 1; }
echo "engine order goldens: $total cases (index.json lists $want), $bad mismatches"
[ "$total" -eq "$want" ] && [ "$bad" -eq 0 ]
