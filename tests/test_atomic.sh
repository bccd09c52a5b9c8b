#!/bin/sh
# Atomic outputs (viz/out.c O1-O6), through the real binary: a command that fails, early or
# late (bad data found only when `run` reads it, an output under a file, a bad trace), exits 2
# and leaves every output that existed before byte for byte as it was, creates no new file or
# folder and no temporary file; a command that succeeds writes all of its outputs. Then the
# cases of issue [data-safety] (11), numbered as there: folders pipescope did not write, links,
# devices, FIFOs, signals, concurrent runs, trailing slashes, long names, a full stdout.
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
    # state/ and dir/ are earlier outputs of pipescope: they carry its marker
    echo "pipescope" >"$tmp/o/state/.pipescope-output"
    echo "pipescope" >"$tmp/o/dir/.pipescope-output"
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
missing="$tmp/o/p.svg/x" # under a file: cannot be made

expect_fail "run: bad csv row found late" "$bin" run "$ex/n_csv_text/spec.json" \
    --json "$o/r.json" --trace "$o/t.json" --save-state "$o/state"
expect_fail "run: bad weights" "$bin" run "$ex/n_weights_nan/spec.json" \
    --json "$o/r.json" --trace "$o/t.json" --save-state "$o/state"
expect_fail "run: --json under a file after --trace" "$bin" run "$ex/y_npy/spec.json" \
    --trace "$o/t.json" --save-state "$o/state" --json "$missing.json"
expect_fail "run: --save-state under a file" "$bin" run "$ex/y_npy/spec.json" \
    --trace "$o/t.json" --json "$o/r.json" --save-state "$o/r.json/state"
expect_fail "run: memory limit" env PIPESCOPE_MEM_LIMIT=1K "$bin" run "$small" \
    --json "$o/r.json" --trace "$o/t.json" --save-state "$o/state"
expect_fail "check: bad spec" "$bin" check "$root/tests/corpus/spec/n_balance_sum.json" \
    --json "$o/r.json"
expect_fail "graph: --json under a file after --dot" "$bin" graph "$small" --dot "$o/g.dot" \
    --svg "$o/p.svg" --json "$missing.json"
expect_fail "simulate: --svg under a file after --trace" "$bin" simulate "$small" \
    --trace "$o/t.json" --json "$o/r.json" --svg "$missing.svg"
expect_fail "sweep: -o folder under a file" "$bin" sweep "$small" --chunks 1,2 \
    --json "$o/r.json" -o "$o/r.json/out"
expect_fail "sweep: new -o folder, --json under a file" "$bin" sweep "$small" --chunks 1,2 \
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
# a listing of a tree with every file's content, to compare before and after
snap() { (cd "$1" && find . | LC_ALL=C sort && find . -type f | LC_ALL=C sort | xargs cat) 2>&1; }
expect_ok "run" "r.json t.json state/0.weight.npy" "$bin" run "$ex/y_npy/spec.json" \
    --json "$o/r.json" --trace "$o/t.json" --save-state "$o/state"
expect_ok "graph" "g.dot p.svg r.json" "$bin" graph "$small" --dot "$o/g.dot" --svg "$o/p.svg" \
    --json "$o/r.json"
expect_ok "sweep" "r.json dir/sweep.json dir/makespan.svg" "$bin" sweep "$small" \
    --chunks 1,2 --json "$o/r.json" -o "$o/dir"
expect_ok "diagnose: missing parents made (README's first command)" "out/seed1/index.html" \
    "$bin" diagnose "$root/examples/small-3x3.json" -o "$o/out/seed1" --no-drift --steps 1

check() { # NAME CONDITION...: one case
    total=$((total + 1))
    name=$1
    shift
    "$@" || fail "$name"
}
# ---- 1. -o DIR never deletes what pipescope did not write --------------------------------------
u="$tmp/u"
rm -rf "$u"
mkdir -p "$u/p/sub"
echo k >"$u/p/notes.txt"
echo k >"$u/p/sub/a"
cp "$small" "$u/p/spec.json"
snap "$u" >"$tmp/before"
"$bin" diagnose "$u/p/spec.json" -o "$u/p" -q --no-drift >/dev/null 2>"$tmp/err"
rc=$?
check "1: diagnose -o over a user folder exits 2 (got $rc)" [ $rc -eq 2 ]
check "1: the error names the folder: $(cat "$tmp/err")" grep -q "^pipescope: $u/p: the folder holds files pipescope did not write" "$tmp/err"
snap "$u" >"$tmp/after"
check "1: the user folder is untouched" cmp -s "$tmp/before" "$tmp/after"
echo "a,b" >"$u/existing-file.csv"
snap "$u" >"$tmp/before"
"$bin" sweep "$small" --chunks 1,2 -o "$u/existing-file.csv" >/dev/null 2>"$tmp/err"
rc=$?
check "1: -o over a file exits 2 (got $rc)" [ $rc -eq 2 ]
check "1: ... saying so: $(cat "$tmp/err")" grep -q "existing-file.csv: exists and is not a folder" "$tmp/err"
snap "$u" >"$tmp/after"
check "1: the file is untouched" cmp -s "$tmp/before" "$tmp/after"
mkdir -p "$u/R.tmp"
echo mine >"$u/R.tmp/keep"
"$bin" sweep "$small" --chunks 1,2 -o "$u/R" >/dev/null 2>&1
"$bin" sweep "$small" --chunks 1,2 -o "$u/R" >/dev/null 2>"$tmp/err" # replaces its own R
rc=$?
check "1: -o R twice succeeds (got $rc: $(cat "$tmp/err"))" [ $rc -eq 0 ]
check "1: R is pipescope's" [ -f "$u/R/.pipescope-output" ] && [ -s "$u/R/sweep.json" ]
check "1: a user's R.tmp/ is untouched" [ "$(cat "$u/R.tmp/keep")" = mine ]
mkdir -p "$u/empty"
"$bin" sweep "$small" --chunks 1,2 -o "$u/empty" >/dev/null 2>&1
check "1: an empty folder may be written" [ -s "$u/empty/sweep.json" ]

# ---- 2. run --save-state DIR keeps a user's files --------------------------------------------
rm -rf "$u"
mkdir -p "$u/st" "$u/st2.tmp" "$u/st2.old"
for d in st st2.tmp st2.old; do echo mine >"$u/$d/x.npy"; done
snap "$u" >"$tmp/before"
"$bin" run "$small" --steps 1 --save-state "$u/st" >/dev/null 2>"$tmp/err"
rc=$?
check "2: --save-state over a user folder exits 2 (got $rc)" [ $rc -eq 2 ]
snap "$u" >"$tmp/after"
check "2: its files are untouched" cmp -s "$tmp/before" "$tmp/after"
"$bin" run "$small" --steps 1 --save-state "$u/st2" >/dev/null 2>"$tmp/err"
rc=$?
check "2: --save-state st2 works (got $rc: $(cat "$tmp/err"))" [ $rc -eq 0 ] && [ -s "$u/st2/0.weight.npy" ]
check "2: st2.tmp/ and st2.old/ untouched" [ "$(cat "$u/st2.tmp/x.npy" "$u/st2.old/x.npy")" = "mine
mine" ]

# ---- 3. links are never followed when cleaning ----------------------------------------------
rm -rf "$u"
mkdir -p "$u/victim" "$u/real"
echo precious >"$u/victim/a"
ln -s "$u/victim" "$u/state.tmp"
ln -s "$u/victim" "$u/.state.tmp.abcdef"
"$bin" run "$small" --steps 1 --save-state "$u/state" >/dev/null 2>"$tmp/err"
rc=$?
check "3: run --save-state beside planted links works (got $rc: $(cat "$tmp/err"))" [ $rc -eq 0 ]
check "3: the victim's files are intact" [ "$(cat "$u/victim/a")" = precious ] && [ "$(ls -A "$u/victim")" = a ]
check "3: the links are still links" [ -L "$u/state.tmp" ] && [ -L "$u/.state.tmp.abcdef" ]
ln -s "$u/victim" "$u/linked"
"$bin" run "$small" --steps 1 --save-state "$u/linked" >/dev/null 2>"$tmp/err"
rc=$?
check "3: --save-state on a link exits 2 (got $rc)" [ $rc -eq 2 ]
check "3: ... saying so: $(cat "$tmp/err")" grep -q "linked: is a symbolic link" "$tmp/err"
check "3: the victim is intact" [ "$(ls -A "$u/victim")" = a ]

# ---- 4. devices, FIFOs and links as output files ------------------------------------------
rm -rf "$u"
mkdir -p "$u"
if [ "$(id -u)" -eq 0 ] && mknod "$u/myfull" c 1 7 2>/dev/null; then
    "$bin" check "$small" --json "$u/myfull" >/dev/null 2>"$tmp/err"
    rc=$?
    check "4: --json to a full device exits 2 (got $rc)" [ $rc -eq 2 ]
    check "4: ... with a write error: $(cat "$tmp/err")" grep -q "myfull: write error: No space left on device" "$tmp/err"
    check "4: the device node stays a device" [ -c "$u/myfull" ]
    mknod "$u/mynull" c 1 3
    "$bin" check "$small" --json "$u/mynull" >/dev/null 2>&1
    check "4: --json to a null device works and keeps it a device" [ $? -eq 0 ] && [ -c "$u/mynull" ]
fi
"$bin" check "$small" --json /dev/full >/dev/null 2>"$tmp/err"
check "4: --json /dev/full exits 2" [ $? -eq 2 ]
mkfifo "$u/fifo"
cat "$u/fifo" >"$u/from-fifo" &
"$bin" check "$small" --json "$u/fifo" >/dev/null 2>"$tmp/err"
rc=$?
wait
check "4: --json into a FIFO works (got $rc: $(cat "$tmp/err"))" [ $rc -eq 0 ] && [ -p "$u/fifo" ]
check "4: the reader got the report" grep -q '"pipescope"' "$u/from-fifo"
echo old >"$u/target.json"
ln -s target.json "$u/link.json"
"$bin" check "$small" --json "$u/link.json" >/dev/null 2>&1
check "4: --json through a link replaces the target, keeps the link" [ -L "$u/link.json" ] && grep -q '"pipescope"' "$u/target.json"
ln -s nowhere.json "$u/dangling.json"
"$bin" check "$small" --json "$u/dangling.json" >/dev/null 2>"$tmp/err"
check "4: a dangling link is refused" [ $? -eq 2 ] && [ -L "$u/dangling.json" ] && [ ! -e "$u/nowhere.json" ]

# ---- 5. signals and concurrent runs ----------------------------------------------------------
rm -rf "$u"
mkdir -p "$u/sweep"
echo "pipescope" >"$u/sweep/.pipescope-output"
echo old >"$u/sweep/sweep.json"
snap "$u" >"$tmp/before"
unet="$root/examples/unet-timeline.json" # runs for many seconds: interrupted in the middle
for sig in INT TERM HUP; do
    # the state folder's twin and its missing parents exist while it computes; the shell would
    # start a background job with SIGINT ignored, env gives it the default back
    env --default-signal=INT,TERM,HUP "$bin" run "$unet" --steps 2 --json "$u/r.json" \
        --trace "$u/t.json" --save-state "$u/new/deeper/state" >/dev/null 2>&1 &
    pid=$!
    sleep 1
    kill -$sig $pid
    wait $pid
    rc=$?
    check "5: SIG$sig ends run (status $rc)" [ $rc -gt 128 ]
    snap "$u" >"$tmp/after"
    check "5: SIG$sig leaves nothing behind: $(diff "$tmp/before" "$tmp/after" | head -3 | tr '\n' ' ')" cmp -s "$tmp/before" "$tmp/after"
done
env --default-signal=INT "$bin" diagnose "$unet" -o "$u/sweep" >/dev/null 2>&1 &
pid=$!
sleep 1
kill -INT $pid
wait $pid
snap "$u" >"$tmp/after"
check "5: SIGINT during diagnose -o leaves the old folder as it was" cmp -s "$tmp/before" "$tmp/after"
"$bin" sweep "$small" --chunks 1,2,4 -o "$u/sweep" >/dev/null 2>"$tmp/e1" &
p1=$!
"$bin" sweep "$small" --chunks 1,2,4 -o "$u/sweep" >/dev/null 2>"$tmp/e2" &
p2=$!
wait $p1
r1=$?
wait $p2
r2=$?
check "5: two runs on one -o both succeed ($r1 $(cat "$tmp/e1"), $r2 $(cat "$tmp/e2"))" [ $r1 -eq 0 ] && [ $r2 -eq 0 ]
check "5: ... and leave one folder" [ "$(ls -A "$u")" = sweep ] && grep -q '"sweep"' "$u/sweep/sweep.json"

# ---- 6. trailing slash, long names, a full stdout ----------------------------------------
rm -rf "$u"
mkdir -p "$u"
"$bin" sweep "$small" --chunks 1,2 -o "$u/slash/" >/dev/null 2>"$tmp/err"
check "6: -o DIR/ works ($(cat "$tmp/err"))" [ -s "$u/slash/sweep.json" ]
"$bin" diagnose "$small" --no-drift --steps 1 -q -o "$u/dslash/" >/dev/null 2>"$tmp/err"
check "6: diagnose -o DIR/ works ($(cat "$tmp/err"))" [ -s "$u/dslash/index.html" ]
long=$(printf 'n%.0s' $(seq 250))
"$bin" check "$small" --json "$u/$long.json" >/dev/null 2>"$tmp/err"
check "6: a 255-character file name works ($(cat "$tmp/err"))" [ -s "$u/$long.json" ]
"$bin" sweep "$small" --chunks 1,2 -o "$u/${long}xxxxx" >/dev/null 2>"$tmp/err"
check "6: a 255-character folder name works ($(cat "$tmp/err"))" [ -s "$u/${long}xxxxx/sweep.json" ]
"$bin" check "$small" >/dev/full 2>"$tmp/err"
rc=$?
check "6: check > /dev/full exits 2 (got $rc)" [ $rc -eq 2 ]
check "6: ... saying so: $(cat "$tmp/err")" grep -q "^pipescope: stdout: write error: No space left on device" "$tmp/err"
"$bin" check "$small" --json - >/dev/full 2>"$tmp/err"
check "6: --json - > /dev/full exits 2" [ $? -eq 2 ]
# ---- 11. a full disk names the file; [first-hour] 1: outputs are checked before computing --
"$bin" simulate "$small" -q --trace /dev/full >/dev/null 2>"$tmp/err"
check "11: --trace to a full disk exits 2" [ $? -eq 2 ]
check "11: ... naming the file: $(cat "$tmp/err")" grep -q "^pipescope: /dev/full: write error: No space left on device" "$tmp/err"
"$bin" diagnose "$root/examples/unet-timeline.json" -o /proc/pipescope-x >"$tmp/out" 2>"$tmp/err"
rc=$?
check "12.1: diagnose into an impossible folder exits 2 (got $rc)" [ $rc -eq 2 ]
check "12.1: ... before any computation: one error line, no progress: $(head -c 300 "$tmp/err")" \
    [ "$(wc -l <"$tmp/err")" -eq 1 ] && [ ! -s "$tmp/out" ] && grep -q "^pipescope: /proc/pipescope-x: cannot create the folder" "$tmp/err"

# ---- 8. a saved state always loads again (num_batches_tracked at INT64_MAX saturates) ------------
rm -rf "$u"
cp -r "$root/tests/corpus/exec/y_weights_nbt_max" "$u"
"$bin" run "$u/spec.json" --save-state "$u/saved" >/dev/null 2>"$tmp/err"
check "8: a run from num_batches_tracked INT64_MAX works ($(cat "$tmp/err"))" [ $? -eq 0 ]
rm -rf "$u/weights" && mv "$u/saved" "$u/weights"
"$bin" run "$u/spec.json" >/dev/null 2>"$tmp/err"
check "8: ... and its saved state loads again ($(cat "$tmp/err"))" [ $? -eq 0 ]
left=$(find "$tmp" -name '.*.tmp.*')
check "no temporary file or folder anywhere: $left" [ -z "$left" ]
echo "atomic outputs: $total cases, $bad failures"
[ $bad -eq 0 ]
