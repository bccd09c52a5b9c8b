#!/bin/sh
# Bad input through the real binary: every tests/corpus/spec/n_*.json must make `pipescope
# check` and `pipescope graph` exit 2 with exactly one stderr line, "pipescope: " + the
# expected error of n_*.err, and write no output file (the --json/--dot/--svg targets must not
# exist afterwards). Every tests/corpus/cli/n_*.args (command-line arguments, one per line,
# @SPEC standing for a valid spec, @ROOT/ for the source tree, @TMP/ for a scratch folder, and
# "@ENV NAME=VALUE" lines setting the environment) must exit 2 with the line in n_*.err.
set -u
export PIPESCOPE_MEM_LIMIT=16G # error lines that quote the memory limit do not depend on the machine
bin=${PIPESCOPE:?PIPESCOPE not set}
root=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
total=0
bad=0
fail() { echo "FAIL $1"; bad=$((bad + 1)); }

cd "$root/tests/corpus/spec" || exit 1
for f in n_*.json; do
    want="pipescope: $(cat "${f%.json}.err")"
    for cmd in check graph; do
        total=$((total + 1))
        out="$tmp/out"
        rm -rf "$out"; mkdir -p "$out"
        if [ "$cmd" = check ]; then
            "$bin" check "$f" --json "$out/r.json" >/dev/null 2>"$tmp/err"
        else
            "$bin" graph "$f" --dot "$out/g.dot" --svg "$out/g.svg" --json "$out/r.json" >/dev/null 2>"$tmp/err"
        fi
        rc=$?
        [ $rc -eq 2 ] || { fail "$cmd $f: exit $rc, expected 2"; continue; }
        got=$(grep -v '^pipescope: warning:' "$tmp/err")
        [ "$got" = "$want" ] || { fail "$cmd $f: got '$got', want '$want'"; continue; }
        [ -z "$(ls -A "$out")" ] || fail "$cmd $f: left output files: $(ls -A "$out")"
    done
done

cd "$root/tests/corpus/cli" || exit 1
for f in n_*.args; do
    total=$((total + 1))
    want=$(sed "s|@SPEC|$root/examples/small-3x3.json|g; s|@ROOT|$root|g; s|@TMP|$tmp|g" "${f%.args}.err")
    set --
    envs=""
    while IFS= read -r a; do
        case "$a" in
        @SPEC) a="$root/examples/small-3x3.json" ;;
        @TMP/*) a="$tmp/${a#@TMP/}" ;;
        @ROOT/*) a="$root/${a#@ROOT/}" ;;
        "@ENV "*) envs="$envs ${a#@ENV }"; continue ;;
        esac
        set -- "$@" "$a"
    done <"$f"
    # shellcheck disable=SC2086
    env $envs "$bin" "$@" >/dev/null 2>"$tmp/err"
    rc=$?
    got=$(head -n 1 "$tmp/err")
    [ $rc -eq 2 ] || { fail "$f: exit $rc, expected 2 ($got)"; continue; }
    [ "$got" = "$want" ] || fail "$f: got '$got', want '$want'"
done
echo "cli bad-input corpus: $total cases, $bad failures"
[ $bad -eq 0 ]
