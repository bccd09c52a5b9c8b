#!/bin/sh
# diagnose on a spec whose real data set is missing (digits-bn on a machine without Debian's
# python3-sklearn): the report says the data is missing, with the install hint, and does not
# blame the time budget for the drift sweep it could not run.
set -u
bin=${PIPESCOPE:?PIPESCOPE not set}
root=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed 's|"path": "/usr/lib/python3/dist-packages/sklearn/|"path": "'"$tmp"'/absent/sklearn/|' \
    "$root/examples/digits-bn.json" >"$tmp/digits.json"
grep -q "$tmp/absent/sklearn/" "$tmp/digits.json" || { echo "FAIL: could not point the data away"; exit 1; }
"$bin" diagnose "$tmp/digits.json" -o "$tmp/out" >"$tmp/log" 2>&1
rc=$?
fail=0
[ $rc -eq 0 ] || { echo "FAIL: diagnose exit $rc"; fail=1; }
grep -q 'apt-get install python3-sklearn' "$tmp/log" || { echo "FAIL: no install hint:"; cat "$tmp/log"; fail=1; }
grep -q 'cannot open' "$tmp/log" || { echo "FAIL: the missing file is not named"; fail=1; }
if grep -q 'time budget' "$tmp/log" "$tmp/out/index.html"; then
    echo "FAIL: the time budget is blamed for what missing data stopped:"; grep 'time budget' "$tmp/log"; fail=1
fi
grep -q 'that run failed' "$tmp/out/index.html" || { echo "FAIL: the page does not say why no drift sweep"; fail=1; }
[ $fail -eq 0 ] && echo "missing data: named, with the install hint, no budget blamed"
exit $fail
