#!/bin/sh
# Bounded race, signal and concurrency loops over the output machinery (viz/out.c), for the
# counts in issue 29's closing note; not part of the default suite (about a minute):
#   PIPESCOPE=build/pipescope PS_SOURCE_ROOT=. sh tests/race_loops.sh [TRIES]
# Each class prints "CLASS: tried N, held M". A try holds when no temporary is left, no
# user file is lost and the old output is either kept whole or replaced whole.
set -u
bin=${PIPESCOPE:?PIPESCOPE not set}
root=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}
n=${1:-40}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
small="$root/examples/small-3x3.json"
unet="$root/examples/unet-timeline.json"
bad_total=0
report() { echo "$1: tried $2, held $(($2 - $3))"; bad_total=$((bad_total + $3)); }
no_temp() { [ -z "$(find "$1" -name '.*.tmp.*' | head -n 1)" ]; }

# signals at random early moments (0..0.2 s): INT, TERM, HUP during run with every output kind
bad=0
for i in $(seq 1 "$n"); do
    w="$tmp/sig" && rm -rf "$w" && mkdir -p "$w/state" && echo pipescope >"$w/state/.pipescope-output"
    echo old >"$w/r.json" && echo weights >"$w/state/w"
    sig=INT; [ $((i % 3)) -eq 1 ] && sig=TERM; [ $((i % 3)) -eq 2 ] && sig=HUP
    env --default-signal=INT,TERM,HUP "$bin" run "$unet" --steps 1 -q --json "$w/r.json" \
        --trace "$w/t.json" --save-state "$w/state" >/dev/null 2>&1 &
    pid=$!
    sleep "0.0$((i % 10))$((i % 7))"
    kill -$sig $pid 2>/dev/null
    wait $pid
    rc=$?
    ok=1
    no_temp "$w" || ok=0
    if [ $rc -gt 128 ]; then # killed: everything as it was
        [ "$(cat "$w/r.json")" = old ] && [ "$(cat "$w/state/w" 2>/dev/null)" = weights ] && [ ! -e "$w/t.json" ] || ok=0
    fi
    [ $ok -eq 1 ] || { bad=$((bad + 1)); echo "signals try $i: SIG$sig exit $rc: $(cd "$w" && find . | sort | tr '\n' ' ')"; }
done
report "signals (INT/TERM/HUP at 0-0.2 s)" "$n" $bad

# concurrent runs on one -o folder and one --json file
bad=0
for i in $(seq 1 "$((n / 4))"); do
    w="$tmp/conc" && rm -rf "$w" && mkdir -p "$w"
    for k in 1 2 3 4; do
        "$bin" sweep "$small" --chunks 1,2 -q -o "$w/out" --json "$w/s.json" >/dev/null 2>"$w/e$k" &
    done
    wait
    ok=1
    no_temp "$w" || ok=0
    [ "$(ls -A "$w" | grep -cv '^e[1-4]$')" -eq 2 ] || ok=0
    [ -f "$w/out/sweep.json" ] && [ -f "$w/out/.pipescope-output" ] && grep -q '"sweep"' "$w/s.json" || ok=0
    [ $ok -eq 1 ] || bad=$((bad + 1))
done
report "concurrency (4 sweeps on one -o and --json, x4 per try)" "$((n / 4 * 4))" $bad

# TOCTOU: the -o folder swapped with a folder of the user's (and back) while runs write it
bad=0
w="$tmp/toc" && rm -rf "$w" && mkdir -p "$w/user"
echo precious >"$w/user/p"
(
    i=0
    while [ $i -lt 4000 ] && [ ! -e "$w/stop" ]; do
        mv -T "$w/user" "$w/out" 2>/dev/null && mv -T "$w/out" "$w/user" 2>/dev/null
        i=$((i + 1))
    done
) &
swapper=$!
for i in $(seq 1 "$n"); do
    "$bin" sweep "$small" --chunks 1 -q -o "$w/out" >/dev/null 2>&1
    rc=$?
    [ $rc -eq 0 ] || [ $rc -eq 2 ] || bad=$((bad + 1))
done
touch "$w/stop"
wait $swapper
# the user's file is still there (in user/ or out/, by the swapper's timing; looked for once
# the swapper stopped, as a search while it renames could miss it)
[ "$(find "$w" -name p -exec cat {} + 2>/dev/null | head -n 1)" = precious ] || bad=$((bad + 1))
no_temp "$w" || bad=$((bad + 1))
report "TOCTOU (user folder swapped in and out of -o)" "$n" $bad

# a user's file written into the empty -o folder at any moment of a run
bad=0
for i in $(seq 1 "$n"); do
    w="$tmp/empty" && rm -rf "$w" && mkdir -p "$w/R"
    "$bin" sweep "$small" --chunks 1,2 -q -o "$w/R" >/dev/null 2>&1 &
    pid=$!
    sleep "0.00$((i % 10))"
    # a write that fails (R absent for the instant between rmdir and rename) is told to the
    # user and loses nothing; one that succeeded must survive
    wrote=0
    echo "user $i" 2>/dev/null >"$w/R/u" && wrote=1
    wait $pid
    [ $wrote -eq 0 ] || [ "$(cat "$w/R/u" 2>/dev/null)" = "user $i" ] || bad=$((bad + 1))
    no_temp "$w" || bad=$((bad + 1))
done
report "user file in the empty -o folder during the run" "$n" $bad

echo "race loops: $bad_total failed tries"
[ $bad_total -eq 0 ]
