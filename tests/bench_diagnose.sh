#!/bin/sh
# Benchmark (figures, never a pass/fail on time): `pipescope diagnose` on the examples with the
# default time budget, wall time and peak RSS each (GNU time). Target for unet-timeline: within
# 2 minutes and 2 GiB on the project's 2-core machine.
set -u
bin=${PIPESCOPE:?PIPESCOPE not set}
root=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}
[ -x /usr/bin/time ] || { echo "SKIP: /usr/bin/time (Debian package time) is missing"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ex in unet-timeline seed1-convergence digits-bn; do
    /usr/bin/time -f "%e %M" -o "$tmp/t" "$bin" diagnose "$root/examples/$ex.json" -o "$tmp/$ex" -q
    rc=$?
    read -r s kb <"$tmp/t"
    echo "diagnose $ex (budget 60 s): exit $rc, $s s, peak RSS $((kb / 1024)) MiB"
done
