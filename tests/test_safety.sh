#!/bin/sh
# The output promise in the cases issue [data-safety] (29) found broken, through the real
# binary: an output never replaces an input (by device and inode: also through a link or a hard
# link), /dev/stdout and /dev/fd/N are the shell's descriptor (`>> log` appends), a failed
# command replaces nothing (folder refused at the end: the --json file stays), an option given
# twice is refused, a user's file in an empty -o folder is never deleted, removing an old folder
# never crosses into another file system and has no depth limit, two outputs on one name and a
# file inside the -o folder are refused, a closed stdout pipe leaves no temporary twin; then
# control characters in error lines, SIGXFSZ, a NUL in a plan CSV, a dangling link in a trace
# folder, ulimit -n 12 and a 4097th argument. RACE_TRIES (default 20) bounds the race loop;
# tests/race_loops.sh has the longer signal, concurrency and TOCTOU loops.
set -u
bin=${PIPESCOPE:?PIPESCOPE not set}
root=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}
export PIPESCOPE_MEM_LIMIT=16G
tmp=$(mktemp -d)
cleanup() {
    [ -n "${mounted:-}" ] && umount "$mounted" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
total=0
bad=0
fail() { echo "FAIL $1"; bad=$((bad + 1)); }
small="$root/examples/small-3x3.json"
t="$tmp/w"

fresh() { rm -rf "$t" && mkdir -p "$t" && cp "$small" "$t/S.json" && cp "$t/S.json" "$t/S.orig"; }
# NAME RC: the last command exited RC (in $rc) and S.json is as it was
spec_kept() {
    total=$((total + 1))
    [ "$rc" -eq "$2" ] || { fail "$1: exit $rc, expected $2 ($(head -n 1 "$tmp/err"))"; return; }
    cmp -s "$t/S.json" "$t/S.orig" || fail "$1: the spec was replaced"
    leftovers=$(find "$t" -name '.*.tmp.*' | head -n 1)
    [ -z "$leftovers" ] || fail "$1: temporary left: $leftovers"
}

# 1. an output that names an input
fresh
"$bin" simulate "$t/S.json" -q --json "$t/S.json" 2>"$tmp/err"; rc=$?
spec_kept "simulate S --json S" 2
grep -q "input file is the same as output file" "$tmp/err" || fail "simulate S --json S: message: $(cat "$tmp/err")"
# refused before the command computes or prints anything (no partial output)
fresh
"$bin" simulate "$t/S.json" --json "$t/S.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
spec_kept "simulate S --json S (not quiet)" 2
[ ! -s "$tmp/out" ] || fail "simulate S --json S printed its report before refusing: $(head -n 1 "$tmp/out")"
fresh
ln -s S.json "$t/L.json"
"$bin" simulate "$t/S.json" -q --svg "$t/L.json" 2>"$tmp/err"; rc=$?
spec_kept "simulate S --svg LINK-to-S" 2
fresh
ln "$t/S.json" "$t/H.json"
"$bin" run "$t/S.json" -q --steps 1 --trace "$t/H.json" 2>"$tmp/err"; rc=$?
spec_kept "run S --trace HARDLINK-of-S" 2
fresh
"$bin" run "$t/S.json" -q --steps 1 --trace "$t/S.json" 2>"$tmp/err"; rc=$?
spec_kept "run S --trace S" 2
fresh
"$bin" run "$t/S.json" -q --steps 1 --trace "$t/M.json" 2>"$tmp/err" || fail "run --trace M: $(cat "$tmp/err")"
cp "$t/M.json" "$t/M.orig"
"$bin" calibrate -q --run "$t/S.json" "$t/M.json" -o "$t/M.json" 2>"$tmp/err"; rc=$?
spec_kept "calibrate --run S M -o M" 2
cmp -s "$t/M.json" "$t/M.orig" || fail "calibrate --run S M -o M: the trace was replaced"
"$bin" compare "$t/S.json" -q --measured "$t/M.json" --svg "$t/M.json" 2>"$tmp/err"; rc=$?
spec_kept "compare S --measured M --svg M" 2
cmp -s "$t/M.json" "$t/M.orig" || fail "compare --measured M --svg M: the trace was replaced"
# an input inside the -o folder (pipescope's own, so otherwise replaceable)
fresh
mkdir "$t/D" && echo pipescope >"$t/D/.pipescope-output" && cp "$small" "$t/D/in.json"
"$bin" sweep "$t/D/in.json" -q -o "$t/D" 2>"$tmp/err"; rc=$?
spec_kept "sweep D/in.json -o D" 2
cmp -s "$t/D/in.json" "$small" || fail "sweep D/in.json -o D: the input was removed"

# 2. /dev/stdout, /dev/fd/N, /proc/self/fd/N are the descriptor: `>> log` appends
for name in /dev/stdout /proc/self/fd/1 /dev/fd/3; do
    fresh
    echo "earlier line" >"$t/log"
    if [ "$name" = /dev/fd/3 ]; then
        "$bin" simulate "$t/S.json" -q --json "$name" 3>>"$t/log" 2>"$tmp/err"; rc=$?
    else
        "$bin" simulate "$t/S.json" -q --json "$name" >>"$t/log" 2>"$tmp/err"; rc=$?
    fi
    spec_kept "simulate --json $name >> log" 0
    [ "$(head -n 1 "$t/log")" = "earlier line" ] || fail "--json $name >> log: the log was replaced"
    grep -q makespan "$t/log" || fail "--json $name >> log: no report appended"
    [ -L /dev/stdout ] || break
done

# 3. a failed command replaces nothing: the folder is refused at the end (a file appeared in
# the empty -o folder while the spec was read from a FIFO), so F.json stays as it was
fresh
mkfifo "$t/fifo" && mkdir "$t/E" && echo "old report" >"$t/F.json"
"$bin" sweep "$t/fifo" -q -o "$t/E" --json "$t/F.json" 2>"$tmp/err" &
pid=$!
exec 3>"$t/fifo" # opens once pipescope reads it: its outputs were checked
echo "the user's" >"$t/E/user.txt"
cat "$small" >&3
exec 3>&-
wait $pid; rc=$?
spec_kept "sweep -o E --json F, E filled meanwhile" 2
[ "$(cat "$t/F.json")" = "old report" ] || fail "failed sweep: F.json was replaced"
[ "$(cat "$t/E/user.txt" 2>/dev/null)" = "the user's" ] || fail "failed sweep: the user's file is gone"

# 4. an option given twice
fresh
mkdir "$t/A" && echo pipescope >"$t/A/.pipescope-output" && echo weights >"$t/A/0.weight.npy"
"$bin" run "$t/S.json" -q --steps 1 --save-state "$t/A" --save-state "$t/B" 2>"$tmp/err"; rc=$?
spec_kept "run --save-state A --save-state B" 2
[ "$(cat "$t/A/0.weight.npy" 2>/dev/null)" = weights ] || fail "--save-state A --save-state B: A emptied"
[ ! -e "$t/B" ] || fail "--save-state A --save-state B: B written"
for opts in "--json $t/X --json $t/Y" "-o $t/O1 -o $t/O2" "--chunks=1 --chunks 2"; do
    fresh
    # shellcheck disable=SC2086
    "$bin" sweep "$t/S.json" -q $opts 2>"$tmp/err"; rc=$?
    spec_kept "sweep $opts" 2
    [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "sweep $opts: not one error line: $(cat "$tmp/err")"
    [ ! -e "$t/X" ] && [ ! -e "$t/Y" ] && [ ! -e "$t/O1" ] && [ ! -e "$t/O2" ] || fail "sweep $opts: wrote"
done

# several outputs on one name, a file inside the -o folder
fresh
"$bin" simulate "$t/S.json" -q --json "$t/X" --trace "$t/X" 2>"$tmp/err"; rc=$?
spec_kept "simulate --json X --trace X" 2
[ ! -e "$t/X" ] || fail "simulate --json X --trace X: X written"
fresh
"$bin" sweep "$t/S.json" -q -o "$t/D" --json "$t/D/x.json" 2>"$tmp/err"; rc=$?
spec_kept "sweep -o D --json D/x.json" 2
[ ! -e "$t/D" ] || fail "sweep -o D --json D/x.json: D written"

# 6. the old folder is removed at any depth, never across a mount point
fresh
mkdir "$t/D" && echo pipescope >"$t/D/.pipescope-output"
deep="$t/D"
for i in $(seq 1 40); do deep="$deep/d"; done
mkdir -p "$deep" && echo x >"$deep/f"
"$bin" sweep "$t/S.json" -q -o "$t/D" 2>"$tmp/err"; rc=$?
spec_kept "sweep -o D, old D 40 deep" 0
[ ! -e "$t/D/d" ] || fail "sweep -o D: the old deep folder is still in D"
fresh
mkdir -p "$t/D/sub" "$t/keep" && echo pipescope >"$t/D/.pipescope-output" && echo precious >"$t/keep/p"
if mount --bind "$t/keep" "$t/D/sub" 2>/dev/null; then
    mounted="$t/D/sub"
    "$bin" sweep "$t/S.json" -q -o "$t/D" 2>"$tmp/err"; rc=$?
    total=$((total + 1))
    [ "$(cat "$t/keep/p" 2>/dev/null)" = precious ] || fail "sweep -o D: a bind mount in the old D was emptied"
    umount "$mounted" 2>/dev/null || umount "$(find "$t" -path '*tmp*/sub' | head -n 1)" 2>/dev/null
    mounted=
else
    echo "skip bind mount (mount --bind not allowed here)"
fi

# SIGPIPE: a closed stdout is a write error that removes the temporary twin
fresh
"$bin" sweep "$t/S.json" -o "$t/P" 2>"$tmp/err" | true
total=$((total + 1))
leftovers=$(find "$t" -name '.P.tmp.*' | head -n 1)
[ -z "$leftovers" ] || fail "sweep -o P | true: temporary twin left: $leftovers"

# raw ESC, CR and newlines from a spec value or a file name never reach an error line
fresh
esc=$(printf '\033')
sed "s/\"gpipe\"/\"\\\\u001b[2K\\\\rgpipe\\\\npipescope: check passed\"/" "$small" >"$t/esc.json"
for arg in "$t/esc.json" "$t/$(printf 'a\033[31m\rb\nc.json')"; do
    "$bin" check "$arg" 2>"$tmp/err" >/dev/null; rc=$?
    total=$((total + 1))
    [ $rc -eq 2 ] || fail "check with control characters: exit $rc"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "check with control characters: $(wc -l <"$tmp/err") lines: $(cat -v "$tmp/err")"
    ! grep -q "$esc" "$tmp/err" || fail "check with control characters: raw ESC in: $(cat -v "$tmp/err")"
    ! tr -d '\n' <"$tmp/err" | grep -q "$(printf '\r')" || fail "check with control characters: raw CR"
done
grep -q 'x1b\[2K' "$tmp/err" || grep -q 'x1b' "$tmp/err" || fail "escaped ESC not shown as \\x1b: $(cat -v "$tmp/err")"

# SIGXFSZ: a file size limit is a write error naming DIR's file, not the twin, leaving no twin
fresh
(ulimit -f 1; "$bin" sweep "$t/S.json" --chunks 1,2 -q -o "$t/Z" 2>"$tmp/err"); rc=$?
spec_kept "sweep -o Z under ulimit -f 1" 2
grep -q "^pipescope: $t/Z/[a-z]*\.[a-z]*: cannot write the file: File too large" "$tmp/err" ||
    fail "ulimit -f: the error does not name Z's file: $(cat "$tmp/err")"
[ ! -e "$t/Z" ] || fail "ulimit -f: Z written"

# a NUL in a plan CSV row is an error, not the end of the row (here: of the file)
fresh
"$bin" schedule "$t/S.json" --schedule 1f1b -q --csv "$t/p.csv" 2>"$tmp/err" || fail "schedule --csv: $(cat "$tmp/err")"
printf '\0,2F9' >>"$t/p.csv"
"$bin" simulate "$t/S.json" -q --actions "$t/p.csv" 2>"$tmp/err"; rc=$?
spec_kept "simulate --actions CSV-with-NUL" 2
grep -q "p.csv:4: a NUL byte in the line" "$tmp/err" || fail "NUL in CSV: $(cat "$tmp/err")"

# a dangling link in a trace folder is an error, not a trace silently skipped
fresh
mkdir "$t/traces"
"$bin" run "$t/S.json" -q --steps 1 --trace "$t/traces/a.json" 2>"$tmp/err" || fail "run --trace: $(cat "$tmp/err")"
ln -s gone.json "$t/traces/b.json"
"$bin" compare "$t/S.json" -q --measured "$t/traces" 2>"$tmp/err" >/dev/null; rc=$?
spec_kept "compare --measured FOLDER-with-dangling-link" 2
grep -q "traces/b.json: cannot read the trace: No such file" "$tmp/err" || fail "dangling link: $(cat "$tmp/err")"

# too few open files: one clear line, not a missing Graphviz plugin
fresh
(ulimit -n 12; "$bin" graph "$t/S.json" -q --svg "$t/g.svg" 2>"$tmp/err"); rc=$?
spec_kept "graph --svg under ulimit -n 12" 2
grep -q "open files allowed (ulimit -n)" "$tmp/err" && [ "$(wc -l <"$tmp/err")" -eq 1 ] ||
    fail "ulimit -n 12: $(cat "$tmp/err")"

# an argument past the 4096th is refused, not dropped (here an unknown option main never saw)
fresh
# shellcheck disable=SC2046
"$bin" simulate "$t/S.json" -q $(yes -- --no-phony | head -n 4096) --bogus >/dev/null 2>"$tmp/err"; rc=$?
spec_kept "simulate with 4097 arguments" 2
grep -q "more than 4096 arguments" "$tmp/err" || fail "4097 arguments: $(head -c 200 "$tmp/err")"

# 5. a file written into a user's empty -o folder while pipescope swaps it in is never lost
tries=${RACE_TRIES:-20}
lost=0
unwritten=0
fresh
for i in $(seq 1 "$tries"); do
    rm -rf "$t/R" && mkdir "$t/R"
    "$bin" sweep "$t/S.json" -q -o "$t/R" 2>/dev/null &
    pid=$!
    n=0
    while [ $n -lt 200 ] && ! echo "user $i" >"$t/R/u" 2>/dev/null; do n=$((n + 1)); done
    wait $pid
    # lost = the write succeeded and the file is gone; a write that failed the whole time (R
    # absent for the instant between rmdir and rename, the writer retrying too fast) lost nothing
    if [ $n -lt 200 ]; then
        [ -f "$t/R/u" ] || lost=$((lost + 1))
    else
        unwritten=$((unwritten + 1))
    fi
done
total=$((total + 1))
[ $lost -eq 0 ] || fail "race: a user's file written into the empty -o folder was lost in $lost of $tries"
echo "race: $tries tries, $lost lost, ${unwritten} never written"

# a spec file name with control characters and invalid UTF-8 (no "name" in the spec): the
# report's name and file are escaped, report.json stays UTF-8 JSON and graph.svg XML
rm -rf "$t" && mkdir -p "$t"
odd="$t/$(printf 'sp\033[31m\377ec')"
sed '/"name"/d' "$small" >"$odd.json"
total=$((total + 1))
if "$bin" diagnose "$odd.json" -q -o "$t/rep" >/dev/null 2>"$tmp/err"; then
    python3 -c "import json,sys; j=json.load(open(sys.argv[1], encoding='utf-8')); \
assert '\x1b' not in j['spec']['name'] + j['spec']['file']" "$t/rep/report.json" 2>"$tmp/py" ||
        fail "odd file name: report.json is not clean UTF-8 JSON ($(tail -n 1 "$tmp/py"))"
    python3 -c "import sys, xml.dom.minidom as m; m.parse(sys.argv[1])" "$t/rep/graph.svg" \
        2>"$tmp/py" || fail "odd file name: graph.svg is not XML ($(tail -n 1 "$tmp/py"))"
else
    fail "odd file name: diagnose failed ($(head -n 1 "$tmp/err"))"
fi

# data that run refuses is refused by diagnose too: exit 2, one line, no report folder
fresh
sed 's|"data": *{[^}]*}|"data": {"source": "csv", "path": "/dev/urandom", "target_column": -1}|' \
    "$small" >"$t/U.json"
grep -q urandom "$t/U.json" || python3 - "$small" "$t/U.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["data"] = {"source": "csv", "path": "/dev/urandom", "target_column": -1}
json.dump(s, open(sys.argv[2], "w"))
PY
"$bin" diagnose "$t/U.json" -q -o "$t/urep" >/dev/null 2>"$tmp/err"; rc=$?
total=$((total + 1))
[ $rc -eq 2 ] || fail "diagnose on unreadable data: exit $rc, expected 2"
[ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "diagnose on unreadable data: $(wc -l <"$tmp/err") error lines"
[ ! -e "$t/urep" ] || fail "diagnose on unreadable data wrote its folder"

echo "$total checked, $bad failed"
[ $bad -eq 0 ]
