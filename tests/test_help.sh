#!/bin/sh
# Help for every command: `pipescope CMD --help`, `pipescope CMD -h` and `pipescope help CMD`
# print the same text and exit 0; the text has a purpose line, an options section naming every
# option the command's source accepts (read from src/cli/cmd_CMD.c, so an option added there
# without help fails here), a default for each option line, and an example whose command line
# is the command itself. `help NOSUCH` exits 2. `CMD SPEC --json -` prints only the report on
# stdout (it parses as JSON).
set -u
bin=${PIPESCOPE:?PIPESCOPE not set}
root=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cmds=$("$bin" --help | sed -n 's/^  \([a-z]*\)  .*/\1/p')
[ "$(echo "$cmds" | wc -w)" -ge 10 ] || fail "pipescope --help lists fewer than 10 commands: $cmds"
for c in $cmds; do
    "$bin" "$c" --help >"$tmp/a" 2>"$tmp/ae" || fail "pipescope $c --help exited $?"
    "$bin" help "$c" >"$tmp/b" 2>/dev/null || fail "pipescope help $c exited $?"
    "$bin" "$c" -h >"$tmp/c" 2>/dev/null || fail "pipescope $c -h exited $?"
    [ ! -s "$tmp/ae" ] || fail "pipescope $c --help wrote to stderr: $(cat "$tmp/ae")"
    cmp -s "$tmp/a" "$tmp/b" || fail "pipescope $c --help and pipescope help $c differ"
    cmp -s "$tmp/a" "$tmp/c" || fail "pipescope $c --help and -h differ"
    head -1 "$tmp/a" | grep -q "^usage: pipescope $c" || fail "$c: first line is not its usage"
    grep -q '^options:$' "$tmp/a" || fail "$c: no options section"
    grep -q "^  pipescope $c " "$tmp/a" || fail "$c: no example running pipescope $c"
    # every option line ("  --x ..." in the options section) states a default or that it is required
    sed -n '/^options:$/,/^$/p' "$tmp/a" | awk '
        /^  -/ { if (opt != "" && !ok) { print opt; bad = 1 } opt = $0; ok = 0 }
        /default|required/ { ok = 1 }
        END { if (opt != "" && !ok) { print opt; bad = 1 } exit bad }' >"$tmp/nodef" ||
        fail "$c: option without a default: $(cat "$tmp/nodef")"
    src="$root/src/cli/cmd_$c.c"
    [ "$c" = version ] && src="$root/src/cli/main.c"
    [ -f "$src" ] || fail "no source $src for command $c"
    opts=$(grep -o 'ps_cli_\(arg\|flag\)(cli, &\?k, "[^"]*"' "$src" | sed 's/.*"\(.*\)"/\1/' | sort -u)
    [ "$c" = version ] && opts=--build-options
    [ -n "$opts" ] || [ "$c" = check ] || fail "found no options in $src"
    for o in $opts; do
        grep -q -- "$o\([ ,|=]\|$\)" "$tmp/a" || fail "pipescope $c --help does not describe $o"
    done
done
"$bin" help nosuch >/dev/null 2>"$tmp/e"
[ $? -eq 2 ] || fail "pipescope help nosuch did not exit 2"
grep -q "unknown command 'nosuch'" "$tmp/e" || fail "help nosuch: $(cat "$tmp/e")"
# --json - gives stdout to the report alone: it parses as JSON for every command that has it
# (the human text went to stdout too in check, run and drift)
"$bin" run "$root/examples/small-3x3.json" --trace "$tmp/m.json" -q || fail "run --trace exited $?"
for c in $cmds; do
    "$bin" "$c" --help | grep -q -- "--json FILE" || continue
    extra=""
    [ "$c" = compare ] && extra="--measured $tmp/m.json"
    # shellcheck disable=SC2086
    "$bin" "$c" "$root/examples/small-3x3.json" --json - $extra >"$tmp/j" 2>/dev/null
    python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$tmp/j" 2>/dev/null ||
        fail "pipescope $c --json -: stdout is not JSON: $(head -c 200 "$tmp/j")"
done
echo "help: $(echo "$cmds" | wc -w) commands, each with its options, defaults and an example; --json - is JSON"
