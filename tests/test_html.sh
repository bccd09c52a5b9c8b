#!/bin/sh
# The diagnose report in a real browser: runs `pipescope diagnose` on a small example, loads
# index.html in headless Chromium, and checks that the page is not blank: the DOM has the
# section headings and its images, and the screenshot has many distinct colours (a blank or
# broken page has one or two). Exit 77 (skip) when chromium is not installed; a package that is
# installed but does not run fails.
set -u
bin=${PIPESCOPE:?PIPESCOPE not set}
root=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}
chromium=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
if [ -z "$chromium" ]; then
    if dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q "install ok installed"; then
        echo "FAIL: the Debian package chromium is installed but no chromium command is on PATH"
        exit 1
    fi
    echo "SKIP: chromium is not installed (Debian package 'chromium')"
    exit 77
fi
py=$(command -v python3 || true)
[ -n "$py" ] || { echo "SKIP: python3 is not installed"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$bin" diagnose "$root/examples/small-3x3.json" -o "$tmp/report" -q || fail "diagnose exited $?"
[ -f "$tmp/report/index.html" ] || fail "no index.html"
[ ! -e "$tmp/report.tmp" ] || fail "report.tmp left behind"
if grep -qi '<script' "$tmp/report/index.html"; then fail "the page has JavaScript"; fi

flags="--headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
 --disable-background-networking --disable-component-update --disable-sync \
 --disable-dev-shm-usage --hide-scrollbars"
url="file://$tmp/report/index.html"
# shellcheck disable=SC2086
timeout 120 "$chromium" $flags --user-data-dir="$(mktemp -d -p "$tmp")" --dump-dom "$url" \
    >"$tmp/dom.html" 2>"$tmp/chromium-dom.log" || { cat "$tmp/chromium-dom.log"; fail "chromium --dump-dom"; }
for h in "Main findings" "Checks" "Task graph" "Memory" "Simulation" "Measured vs simulated" \
         "BatchNorm statistics"; do
    grep -q "<h2[^>]*>$h</h2>" "$tmp/dom.html" || fail "the page has no section '$h'"
done
n_img=$(grep -o '<img ' "$tmp/dom.html" | wc -l)
[ "$n_img" -ge 3 ] || fail "expected at least 3 images, found $n_img"
for f in graph.svg timeline.svg timeline-simulated.svg; do
    grep -q "src=\"$f\"" "$tmp/dom.html" || fail "no <img> for $f"
    [ -s "$tmp/report/$f" ] || fail "$f is missing or empty"
done
grep -q '<table' "$tmp/dom.html" || fail "no table"

# shellcheck disable=SC2086
timeout 120 "$chromium" $flags --user-data-dir="$(mktemp -d -p "$tmp")" --window-size=1280,2000 \
    --screenshot="$tmp/shot.png" "$url" >"$tmp/chromium-shot.log" 2>&1 || { cat "$tmp/chromium-shot.log"; fail "chromium --screenshot"; }
[ -s "$tmp/shot.png" ] || fail "no screenshot"
[ -n "${PS_HTML_SCREENSHOT:-}" ] && cp "$tmp/shot.png" "$PS_HTML_SCREENSHOT"
# distinct colours of the PNG, decoded with zlib (8-bit RGB/RGBA, non-interlaced, as Chromium writes)
colours=$("$py" - "$tmp/shot.png" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG'
pos, idat, w = 8, b'', 0
while pos < len(data):
    n, typ = struct.unpack('>I4s', data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if typ == b'IHDR':
        w, h, depth, ctype, _, _, lace = struct.unpack('>IIBBBBB', body)
        assert depth == 8 and ctype in (2, 6) and lace == 0, 'unsupported PNG layout'
        bpp = 3 if ctype == 2 else 4
    elif typ == b'IDAT':
        idat += body
    pos += 12 + n
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytearray(stride)
seen = set()
for y in range(h):
    f = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    if y % 4 == 0:
        for x in range(0, stride, bpp * 2):
            seen.add(bytes(line[x:x + 3]))
    prev = line
print(len(seen))
PY
) || fail "cannot decode the screenshot"
[ "$colours" -ge 50 ] || fail "the screenshot looks blank: $colours distinct colours"
echo "ok: sections, $n_img images, screenshot with $colours distinct colours"
