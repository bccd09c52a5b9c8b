#!/bin/sh
# PyTorch bridge: export_pytorch.py -> pipescope run --save-state -> load_state.py --compare,
# for the demo models and every BN policy; each must match PyTorch's own run (torchgpipe-style
# micro-batching) within 1e-4. Exit 77 (skip) when /usr/bin/python3 cannot import torch and the
# Debian package python3-torch is not installed; installed but not importable fails.
set -eu
PY=/usr/bin/python3
ROOT=${PS_SOURCE_ROOT:-$(dirname "$0")/..}
PIPESCOPE=${PIPESCOPE:-pipescope}
if ! [ -x "$PY" ] || ! err=$("$PY" -c 'import torch, numpy' 2>&1); then
    # skipping is for a machine without the package; installed but broken is a failure
    if dpkg-query -W -f='${Status}' python3-torch 2>/dev/null | grep -q "install ok installed"; then
        echo "FAIL: python3-torch is installed but $PY cannot import torch and numpy:"
        echo "$err" | tail -3
        exit 1
    fi
    echo "skip: $PY cannot import torch and numpy (Debian: apt-get install python3-torch)"
    exit 77
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
for case in "mlp 3,4 4 except_last plain" "mlp 3,4 4 always grad-only" \
            "mlp 3,4 2 never deferred" "conv 4,5 4 except_last plain" \
            "conv 4,5 4 always deferred" "conv 4,5 2 except_last grad-only"; do
    set -- $case
    d="$TMP/$1-$3-$4-$5"
    "$PY" "$ROOT/examples/export_pytorch.py" "$1" "$d" --balance "$2" --chunks "$3" \
        --checkpoint "$4" --batchnorm "$5" >/dev/null
    "$PIPESCOPE" run "$d/spec.json" --save-state "$d/state" -q
    if out=$("$PY" "$ROOT/examples/load_state.py" "$d" "$d/state" --compare --tol 1e-4); then
        echo "ok   $case: $(echo "$out" | tail -1)"
    else
        echo "FAIL $case:"; echo "$out"; fail=1
    fi
done
exit $fail
