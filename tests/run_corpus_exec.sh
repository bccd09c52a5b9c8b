#!/bin/sh
# Bad input for the executor through the real binary: every tests/corpus/exec/n_*/spec.json
# must make `pipescope run` exit 2 with exactly one stderr line, "pipescope: " + n_*.err, and
# write nothing: neither the --save-state folder (nor DIR.tmp) nor the --trace/--json files.
# Every y_*/spec.json must run (exit 0) and write all three.
set -u
bin=${PIPESCOPE:?PIPESCOPE not set}
root=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
total=0
bad=0
fail() { echo "FAIL $1"; bad=$((bad + 1)); }

cd "$root/tests/corpus/exec" || exit 1
for d in n_* y_*; do
    [ -d "$d" ] || continue
    total=$((total + 1))
    out="$tmp/out"
    rm -rf "$out"
    mkdir -p "$out"
    "$bin" run "$d/spec.json" --save-state "$out/state" --trace "$out/t.json" \
        --json "$out/r.json" >"$tmp/stdout" 2>"$tmp/err"
    rc=$?
    got=$(grep -v '^pipescope: warning:' "$tmp/err")
    case "$d" in
    y_*)
        [ $rc -eq 0 ] || { fail "$d: exit $rc, expected 0 ($got)"; continue; }
        for f in state/0.weight.npy state/1.num_batches_tracked.npy t.json r.json; do
            [ -f "$out/$f" ] || fail "$d: $f was not written"
        done
        [ ! -e "$out/state.tmp" ] || fail "$d: state.tmp left behind"
        ;;
    *)
        want="pipescope: $(cat "$d.err")"
        [ $rc -eq 2 ] || { fail "$d: exit $rc, expected 2 ($got)"; continue; }
        [ "$got" = "$want" ] || { fail "$d: got '$got', want '$want'"; continue; }
        [ -z "$(ls -A "$out")" ] || fail "$d: left output files: $(ls -A "$out")"
        ;;
    esac
done
echo "exec bad-input corpus: $total cases, $bad failures"
[ $bad -eq 0 ]
