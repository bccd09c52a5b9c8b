#!/bin/sh
# The README's first command on a fresh clone (issue [first-hour] 1): read from README.md itself,
# so the README cannot drift from what is tested. Its pipescope part (after the last "&&" of the
# first line of the first sh block) runs in an empty folder that has only build/pipescope and
# examples/, so out/ does not exist: it must exit 0 and write out/.../index.html.
set -u
bin=${PIPESCOPE:?PIPESCOPE not set}
root=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
first=$(awk '/^```sh/ {on = 1; next} on {print; exit}' "$root/README.md")
cmd=$(printf '%s\n' "$first" | sed 's/.*&& *//')
case "$cmd" in
build/pipescope\ *) ;;
*) echo "FAIL the README's first line does not end in a build/pipescope command: '$first'"; exit 1 ;;
esac
out=$(printf '%s\n' "$cmd" | sed -n 's/.* -o \([^ ]*\).*/\1/p')
[ -n "$out" ] || { echo "FAIL no -o DIR in '$cmd'"; exit 1; }
mkdir -p "$tmp/clone/build"
ln -s "$bin" "$tmp/clone/build/pipescope"
ln -s "$root/examples" "$tmp/clone/examples"
cd "$tmp/clone" || exit 1
echo "running: $cmd"
sh -c "$cmd" >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
[ $rc -eq 0 ] || { echo "FAIL exit $rc: $(grep -v warning "$tmp/stderr" | head -n 3)"; exit 1; }
[ -s "$out/index.html" ] || { echo "FAIL $out/index.html was not written"; exit 1; }
[ -s "$out/report.json" ] || { echo "FAIL $out/report.json was not written"; exit 1; }
echo "README's first command: ok ($out/index.html, $(ls "$out" | wc -l) files)"
