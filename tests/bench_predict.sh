#!/bin/sh
# Benchmark (meson benchmark 'predict'): does the simulator predict runs it has not seen?
# For seed1 (batch 64, balance [7, 9]) and conv32 (examples/conv32.json: four 3x3 convolutions
# on 32x32 inputs, batch 64, balance [5, 8]: tasks of 1-10 ms) -- and digits-bn (balance [3, 4],
# tasks of 10-50 us) with DIGITS=1 -- each on 2 devices (one worker thread each, `run` without
# --serial), records `run --trace` at chunks {2, 4, 8, 16} x checkpoint {never, except_last},
# REPS (21) runs of each, the configurations interleaved (round r runs every configuration once,
# so a burst of other load spreads over configurations instead of spoiling one), calibrates one
# cost model per model on two of the configurations (chunks 2 never and chunks 16 except_last:
# the largest and smallest micro-batch, both checkpoint modes) and prints `calibrate`'s held-out
# table for the six others: predicted vs measured makespan (the minimum of the REPS runs with
# --fit robust --measured min, where the fit reads the least disturbed quarter of each fitted
# configuration's runs; their median with --fit mean --measured median, every run fitted; and
# their range: the machine's own noise), bubble and per-device busy time; CORES (auto) is
# calibrate's --cores. This machine's speed drifts by 10-20% over seconds (other tenants of the
# host): with 7 runs a configuration's minimum sometimes misses the fast phases, so 21 (a 2-core
# run takes about 25 s). Figures only: nothing here
# asserts a time. The machine is shared (see uptime's load average, printed first); every run is
# pinned to cores 0,1 when taskset exists, and runs under `flock $BENCH_LOCK` when BENCH_LOCK
# names a lock file (engineers sharing a machine time one thing at a time), with BENCH_PRIO
# before it (e.g. "chrt -f 10": real-time priority, so other users' builds on the same cores
# do not preempt the workers; the kernel still leaves them 5% of each second).
# PREDICT_DIR keeps the specs, traces and costs (default: a temporary folder, removed); with
# REUSE=1 the traces already there are fitted again without running anything. RUN_ARGS go to
# every `run` (tests/gpu/run.sh: "--backend cuda --virtual-devices", the same procedure on a
# GPU, where each partition gets a stream set of its own).
ROOT=${PS_SOURCE_ROOT:-$(dirname "$0")/..}
PIPESCOPE=${PIPESCOPE:-pipescope}
STEPS=${STEPS:-3}
REPS=${REPS:-21}
CORES=${CORES:-auto}
PY=python3
DIR=${PREDICT_DIR:-}
if [ -z "$DIR" ]; then
    DIR=$(mktemp -d) || exit 1
    trap 'rm -rf "$DIR"' EXIT
fi
mkdir -p "$DIR" || exit 1
PIN=""; command -v taskset >/dev/null && PIN="taskset -c 0,1"
LOCK=""; [ -n "${BENCH_LOCK:-}" ] && LOCK="flock $BENCH_LOCK"
PRIO=${BENCH_PRIO:-}
echo "bench_predict: $(uptime)"
DIGITS_CSV=/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
MODELS="seed1:$ROOT/examples/seed1-convergence.json:7,9:64 conv32:$ROOT/examples/conv32.json:5,8:64"
[ "${DIGITS:-0}" = 1 ] && [ -r "$DIGITS_CSV" ] && MODELS="$MODELS digits:$ROOT/examples/digits-bn.json:3,4:64"
status=0
for m in $MODELS; do
    name=${m%%:*}; rest=${m#*:}; spec=${rest%%:*}; rest=${rest#*:}; bal=${rest%%:*}; batch=${rest#*:}
    for ck in 2 4 8 16; do
        for cp in never except_last; do
            out="$DIR/$name-c$ck-$cp.json"
            $PY - "$spec" "$out" "$bal" "$ck" "$cp" "$batch" <<'PYEOF' || exit 1
import json, sys
src, out, bal, ck, cp, batch = sys.argv[1:]
s = json.load(open(src))
p = s["pipeline"]
p["balance"] = [int(x) for x in bal.split(",")]
p.pop("devices", None)  # default cuda:j: one device (and worker thread) per partition
p["chunks"] = int(ck)
p["checkpoint"] = cp
s["batch"] = int(batch)
s["name"] = "%s-c%s-%s" % (s["name"], ck, cp)
json.dump(s, open(out, "w"), indent=1)
PYEOF
        done
    done
    r=1
    while [ $r -le "$REPS" ]; do
        for ck in 2 4 8 16; do
            for cp in never except_last; do
                out="$DIR/$name-c$ck-$cp.json"
                [ "${REUSE:-0}" = 1 ] && [ -s "${out%.json}.r$r.trace.json" ] && continue
                # shellcheck disable=SC2086 # RUN_ARGS is a list of words
                $LOCK $PRIO $PIN "$PIPESCOPE" run "$out" --steps "$STEPS" ${RUN_ARGS:-} \
                    --trace "${out%.json}.r$r.trace.json" -q >/dev/null ||
                    { echo "bench_predict: run $out failed"; status=1; }
            done
        done
        r=$((r + 1))
    done
    set --
    for ck in 2 4 8 16; do
        for cp in never except_last; do
            s="$DIR/$name-c$ck-$cp.json"
            r=1
            while [ $r -le "$REPS" ]; do
                case "$ck-$cp" in
                2-never | 16-except_last) set -- "$@" --run "$s" "${s%.json}.r$r.trace.json" ;;
                *) set -- "$@" --holdout "$s" "${s%.json}.r$r.trace.json" ;;
                esac
                r=$((r + 1))
            done
        done
    done
    # two readings of the same traces: typical task times against the least disturbed run, and
    # mean task times (a steady load's delays in them) against the median run
    for how in "robust min" "mean median"; do
        fit=${how% *}; meas=${how#* }
        echo "== $name: calibrated on chunks 2 never + chunks 16 except_last ($REPS runs each of $STEPS steps, the last traced; --fit $fit --measured $meas --cores $CORES)"
        "$PIPESCOPE" calibrate "$@" --fit "$fit" --measured "$meas" --cores "$CORES" \
            -o "$DIR/$name-$fit-costs.json" || status=1
    done
done
exit $status
