#!/bin/sh
# Absurd specs under an address-space limit (ulimit -v): every command refuses them with a clear
# error before allocating (exit 2, a line naming the limit), none is killed, crashes or runs
# out the clock; a small spec still runs under the same limit (src/memlimit.h, graph.h).
set -u
bin=${PIPESCOPE:?PIPESCOPE not set}
root=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
total=0
bad=0
fail() { echo "FAIL $1"; bad=$((bad + 1)); }
unset PIPESCOPE_MEM_LIMIT
# ASan reserves terabytes of address space, so ulimit -v cannot apply to an ASan build (skip)
if nm "$bin" 2>/dev/null | grep -q __asan_init; then echo "skipped: ASan build"; exit 77; fi
vmem=1500000 # KiB
spec() { # NAME JSON
    printf '%s\n' "$2" >"$tmp/$1.json"
}
relu() { python3 -c "import json,sys; print(json.dumps([{'op': 'relu'}] * int(sys.argv[1])))" "$1"; }
ones() { python3 -c "import json,sys; print(json.dumps([1] * int(sys.argv[1])))" "$1"; }
cpus() { python3 -c "import json,sys; print(json.dumps(['cpu'] * int(sys.argv[1])))" "$1"; }

spec activations '{"pipescope": 1, "batch": 1048576, "model": {"input": [16777216],
  "layers": [{"op": "relu"}], "loss": "sum"}, "pipeline": {"balance": [1], "chunks": 1},
  "train": {"steps": 1}}'
spec steps '{"pipescope": 1, "batch": 1048576, "model": {"input": [1024],
  "layers": [{"op": "relu"}], "loss": "sum"}, "pipeline": {"balance": [1], "chunks": 1},
  "train": {"steps": 1048576}}'
spec params '{"pipescope": 1, "batch": 1, "model": {"input": [1048576],
  "layers": [{"op": "linear", "out": 524288}], "loss": "sum"},
  "pipeline": {"balance": [1], "chunks": 1}}'
spec conv '{"pipescope": 1, "batch": 64, "model": {"input": [64, 4096, 4096],
  "layers": [{"op": "conv2d", "out": 64, "kernel": 3, "padding": 1}, {"op": "batchnorm"}],
  "loss": "sum"}, "pipeline": {"balance": [1, 1], "chunks": 64, "devices": ["cpu", "cpu"]}}'
spec nodes "{\"pipescope\": 1, \"batch\": 65536, \"model\": {\"input\": [4], \"layers\": $(relu 48),
  \"loss\": \"sum\"}, \"pipeline\": {\"balance\": $(ones 48), \"devices\": $(cpus 48),
  \"chunks\": 65536}}"
spec graph_bytes "{\"pipescope\": 1, \"batch\": 65536, \"model\": {\"input\": [4], \"layers\": $(relu 16),
  \"loss\": \"sum\"}, \"pipeline\": {\"balance\": $(ones 16), \"devices\": $(cpus 16),
  \"chunks\": 65536}}"

case_() { # NAME PATTERN CMD...: exit 2 with PATTERN on stderr, under the limit
    name=$1
    pat=$2
    shift 2
    total=$((total + 1))
    (ulimit -v $vmem && exec timeout 120 "$@") >/dev/null 2>"$tmp/err"
    rc=$?
    line=$(grep '^pipescope: ' "$tmp/err" | grep -v '^pipescope: warning' | head -n 1)
    [ $rc -eq 2 ] || { fail "$name: exit $rc, expected 2 ($line)"; return; }
    echo "$line" | grep -q "$pat" || fail "$name: '$line' does not match '$pat'"
}
need='would need .* of memory; the limit is'
case_ "run: activations" "$need" "$bin" run "$tmp/activations.json"
case_ "run: synthetic samples" "$need" "$bin" run "$tmp/steps.json"
case_ "drift: synthetic samples" "$need" "$bin" drift "$tmp/steps.json" --chunks 1 --steps 1048576
case_ "run: parameters" "$need" "$bin" run "$tmp/params.json"
case_ "run: conv activations" "$need" "$bin" run "$tmp/conv.json"
for cmd in check graph simulate; do
    case_ "$cmd: node limit" "graph nodes; the limit is 50000000" "$bin" $cmd "$tmp/nodes.json"
    case_ "$cmd: graph memory" "$need" "$bin" $cmd "$tmp/graph_bytes.json"
done
case_ "run: graph memory" "$need" "$bin" run "$tmp/graph_bytes.json"
case_ "sweep --chunks 65536 (every configuration refused)" "$need" "$bin" sweep "$tmp/graph_bytes.json" --chunks 65536 --json "$tmp/s.json"
case_ "diagnose: graph memory" "$need" "$bin" diagnose "$tmp/graph_bytes.json" -o "$tmp/d"
case_ "PIPESCOPE_MEM_LIMIT above ulimit -v" "$need" env PIPESCOPE_MEM_LIMIT=1T "$bin" run "$tmp/conv.json"
# issue [data-safety] 7: a gzip csv holding one 1 GiB line (16 gzip members of 64 MiB of '1')
# under a 256 MiB limit: refused at the limit with the line, not read until malloc fails
cp -r "$root/tests/corpus/exec/y_csv_gz" "$tmp/bigline"
python3 -c "
import gzip, sys
m = gzip.compress(b'1' * (64 << 20), compresslevel=1, mtime=0)
with open(sys.argv[1], 'wb') as f:
    for _ in range(16): f.write(m)
" "$tmp/bigline/d.csv.gz"
case_ "run: gzip csv with one 1 GiB line" "d.csv.gz:1:[0-9]*: reading this file would need more than 256 MiB of memory; the limit is 256 MiB" \
    env PIPESCOPE_MEM_LIMIT=256M "$bin" run "$tmp/bigline/spec.json"
# a small spec still runs under the same limit
total=$((total + 1))
(ulimit -v $vmem && exec timeout 120 "$bin" run "$root/examples/small-3x3.json") >/dev/null 2>"$tmp/err" ||
    fail "small spec under ulimit -v: $(head -n 1 "$tmp/err")"
echo "limits: $total cases, $bad failures"
[ $bad -eq 0 ]
