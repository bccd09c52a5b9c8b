#!/bin/sh
# Every option is either acted on or refused: a shared output option a command does not take
# exits 2 with one line and writes nothing; --version/-V and `help --help` exit 0; `schedule`
# on the default gpipe prints each device's program (the engine's order) instead of failing;
# sweep's progress into a file or pipe carries no carriage return.
set -u
bin=${PIPESCOPE:?PIPESCOPE not set}
root=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}
spec=$root/examples/small-3x3.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

refused() { # CMD OPT: exit 2, one stderr line, nothing written
    cmd=$1 opt=$2 out=$tmp/out-$1$2
    "$bin" "$cmd" "$spec" "$opt" "$out" >"$tmp/o" 2>"$tmp/e"
    rc=$?
    [ $rc -eq 2 ] || bad "$cmd $opt: exit $rc, expected 2 (accepted and ignored?)"
    [ "$(wc -l <"$tmp/e")" -eq 1 ] || bad "$cmd $opt: expected one error line, got: $(cat "$tmp/e")"
    grep -q -- "$opt is not an option of $cmd" "$tmp/e" || bad "$cmd $opt: error does not name it"
    [ -e "$out" ] && bad "$cmd $opt: wrote $out"
    [ -s "$tmp/o" ] && bad "$cmd $opt: printed on stdout"
}
refused check -o
refused check --svg
refused check --trace
refused balance -o
refused balance --svg
refused graph -o
refused schedule -o
refused schedule --json
refused simulate -o
refused diagnose --json
# a shared option a command takes still works
"$bin" check "$spec" --json "$tmp/c.json" >/dev/null 2>&1 || bad "check --json failed"
[ -s "$tmp/c.json" ] || bad "check --json wrote nothing"

for v in --version -V; do
    o=$("$bin" $v 2>&1); rc=$?
    [ $rc -eq 0 ] || bad "$v: exit $rc"
    case $o in "pipescope "[0-9]*) ;; *) bad "$v printed '$o'" ;; esac
done
"$bin" help --help >"$tmp/h" 2>&1 || bad "help --help: exit $?"
grep -q '^commands:' "$tmp/h" || bad "help --help: no command list"

# gpipe: the engine's order per device (small-3x3: one device, 3 micro-batches x 3 partitions)
"$bin" schedule "$spec" >"$tmp/s" 2>&1 || bad "schedule on gpipe: exit $? ($(cat "$tmp/s"))"
grep -q '^  F(0,0) F(1,0) F(0,1) ' "$tmp/s" || bad "schedule on gpipe: no program: $(cat "$tmp/s")"
n=$(grep -o '[FRB]([0-9],[0-9])' "$tmp/s" | wc -l)
[ "$n" -eq "$("$bin" graph "$spec" --order | grep -c '^[FRB](')" ] ||
    bad "schedule on gpipe: $n tasks, not graph --order's"

# sweep: stderr into a file gets whole lines only
"$bin" sweep "$spec" >/dev/null 2>"$tmp/sw" || bad "sweep: exit $?"
if tr -d '\n' <"$tmp/sw" | grep -q "$(printf '\r')"; then bad "sweep wrote \\r into a file"; fi
grep -q 'configurations done' "$tmp/sw" || bad "sweep: no final line"

[ $fail -eq 0 ] && echo "options: all refused or acted on"
exit $fail
