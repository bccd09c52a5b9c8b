#!/bin/sh
# BN adaptation (issue [bn-adaptation]) through the real binary, on the seed-2 example (one
# conv + BN, batch 2, chunks 1, checkpoint always, grad-only: fairscale's checkpoint_wrapper with
# patch_batchnorm). Both halves of the user report, with the counts worked out by hand from
# SEMANTICS.md section 7:
#   forward only       grad-only + checkpointed: 0 updates, statistics left at 0/1 and differ
#                      from plain BN's; grad-only unchecked and plain: 1 update, equal to the
#                      reference (plain, chunks 1)
#   forward + backward grad-only + checkpointed: 1 update, in the recompute ("0r"), and equal to
#                      the reference; plain + checkpointed: 2 (forward and recompute), off it
# and diagnose's "BN adaptation" finding warns for the seed-2 spec and not for a plain copy.
set -u
bin=${PIPESCOPE:?PIPESCOPE not set}
root=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
total=0
bad=0
fail() { echo "FAIL $1"; bad=$((bad + 1)); }
has() { # NAME FILE TEXT: FILE contains the line fragment TEXT
    total=$((total + 1))
    grep -qF -- "$3" "$2" || { fail "$1: no '$3' in:"; sed 's/^/    /' "$2" | head -40; }
}
has_re() { # NAME FILE REGEX (grep -E)
    total=$((total + 1))
    grep -qE -- "$3" "$2" || fail "$1: nothing matches '$3'"
}
hasnt() {
    total=$((total + 1))
    ! grep -qF -- "$3" "$2" || fail "$1: unexpected '$3'"
}
seed2="$root/examples/seed2-checkpoint-bn.json"

"$bin" run "$seed2" --forward-only >"$tmp/run_f" 2>&1 || fail "run --forward-only: exit $?"
has run_f "$tmp/run_f" "1 forward-only pass (train mode, no backward, no SGD step)"
has run_f "$tmp/run_f" "layer 1: 0 updates in 1 pass, 0 in the last:"
has run_f "$tmp/run_f" "running_var   1 1 1 1"
has run_f "$tmp/run_f" "num_batches_tracked 0"
has run_f "$tmp/run_f" "BN adaptation: grad-only, checkpoint always: does NOT adapt: 0 updates per pass"
has run_f "$tmp/run_f" "fix: plain BN for the adaptation passes, or run them with checkpointing disabled and grad enabled"

"$bin" run "$seed2" >"$tmp/run_b" 2>&1 || fail "run: exit $?"
has run_b "$tmp/run_b" "layer 1: 1 update in 1 step, 1 in the last: 0r"
has run_b "$tmp/run_b" "num_batches_tracked 1"
hasnt run_b "$tmp/run_b" "BN adaptation"

# forward only: which settings adapt (drift rows: chunks m policy checkpoint layer U/exp ord
# a_eff mean_max mean_avg var_max ...)
"$bin" drift "$seed2" --forward-only --policy plain,grad-only --checkpoint always,never \
    --json "$tmp/drift_f.json" >"$tmp/drift_f" 2>/dev/null || fail "drift --forward-only: exit $?"
has drift_f "$tmp/drift_f" "1 forward-only pass per setting"
has drift_f "$tmp/drift_f" "chunks 1, grad-only, checkpoint always: 0 updates in the last pass"
has drift_f "$tmp/drift_f" "chunks 1, grad-only, checkpoint never: 1 update in the last pass, running_var 0 off the reference -- adapts"
has drift_f "$tmp/drift_f" "chunks 1, plain, checkpoint always: 1 update in the last pass, running_var 0 off the reference -- adapts"
total=$((total + 1))
awk '$3 == "grad-only" && $4 == "always" { found = 1; if ($6 != "0/0" || $11 < 0.01) bad = 1 }
     END { exit !(found && !bad) }' "$tmp/drift_f" ||
    fail "drift_f: grad-only always should have 0/0 updates and var_max >= 0.01"
has_re drift_f.json "$tmp/drift_f.json" '"forward_only":[[:space:]]*true'
has_re drift_f.json "$tmp/drift_f.json" '"adapts":[[:space:]]*false'
has_re drift_f.json "$tmp/drift_f.json" '"adapts":[[:space:]]*true'

# forward + backward: grad-only + checkpoint matches the reference, plain + checkpoint does not
"$bin" drift "$seed2" --policy plain,grad-only --checkpoint always >"$tmp/drift_b" 2>/dev/null ||
    fail "drift: exit $?"
total=$((total + 1))
awk '$3 == "grad-only" && $4 == "always" { g = ($6 == "1/1" && $11 == 0) }
     $3 == "plain" && $4 == "always" { p = ($6 == "2/2" && $11 > 0.01) }
     END { exit !(g && p) }' "$tmp/drift_b" ||
    { fail "drift_b: want grad-only always 1/1 with var_max 0, plain always 2/2 off"; cat "$tmp/drift_b"; }
hasnt drift_b "$tmp/drift_b" "BN adaptation"

"$bin" diagnose "$seed2" -o "$tmp/diag" --no-drift >"$tmp/diag_out" 2>/dev/null || fail "diagnose: exit $?"
has diagnose "$tmp/diag_out" "BN adaptation WARNING: one forward-only train-mode pass (no backward) updated layer 1's running statistics 0 times"
has diagnose.json "$tmp/diag/report.json" "BN adaptation WARNING"
sed 's/"grad-only"/"plain"/' "$seed2" >"$tmp/plain.json"
"$bin" diagnose "$tmp/plain.json" -o "$tmp/diag2" --no-drift >"$tmp/diag2_out" 2>/dev/null ||
    fail "diagnose plain: exit $?"
has diagnose_plain "$tmp/diag2_out" "BN adaptation: one forward-only train-mode pass (no backward) updated layer 1's running statistics 1 time"
hasnt diagnose_plain "$tmp/diag2_out" "WARNING"

echo "bn adaptation: $total checks, $bad failures"
[ $bad -eq 0 ]
