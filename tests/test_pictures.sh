#!/bin/sh
# Pictures that show something: runs `pipescope diagnose` on two examples (seed1: launch-bound on
# the default cost model, measured on the CPU 100x slower than simulated; small-3x3) and
# `simulate --svg`, then reads every timeline SVG the way a user looks at it:
#   - every panel (one <g id="traceK"> per trace) is not empty: its bars cover at least 10% of
#     its time axis (union over lanes), and every lane in it has at least one bar;
#   - a CPU run's lanes are labelled "cpu (...)", never as if a GPU ran them.
set -u
bin=${PIPESCOPE:?PIPESCOPE not set}
root=${PS_SOURCE_ROOT:?PS_SOURCE_ROOT not set}
py=$(command -v python3 || true)
[ -n "$py" ] || { echo "SKIP: python3 is not installed"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

for ex in seed1-convergence small-3x3; do
    "$bin" diagnose "$root/examples/$ex.json" -o "$tmp/$ex" -q --no-drift || fail "diagnose $ex exited $?"
done
"$bin" simulate "$root/examples/unet-timeline.json" --svg "$tmp/unet.svg" -q || fail "simulate unet exited $?"

"$py" - "$tmp"/seed1-convergence/timeline.svg "$tmp"/seed1-convergence/timeline-simulated.svg \
    "$tmp"/small-3x3/timeline.svg "$tmp"/small-3x3/timeline-simulated.svg "$tmp/unet.svg" <<'PY' || exit 1
import re, sys
import xml.etree.ElementTree as ET
NS = '{http://www.w3.org/2000/svg}'
bad = []
for path in sys.argv[1:]:
    root = ET.parse(path).getroot()
    panels = [g for g in root.iter(NS + 'g') if re.fullmatch(r'trace\d', g.get('id', ''))]
    if not panels:
        bad.append(f'{path}: no timeline panel')
    for g in panels:
        x0, x1 = float(g.get('data-x0')), float(g.get('data-x1'))
        lanes, labels, bars = {}, {}, []
        for el in g:
            if el.tag == NS + 'rect' and el.find(NS + 'title') is None:
                lanes[float(el.get('y'))] = 0          # a lane's background
            elif el.tag == NS + 'text' and el.get('text-anchor') == 'end':
                labels[round(float(el.get('y')) - 14)] = el.text
            elif el.tag == NS + 'rect':
                y, x, w = float(el.get('y')), float(el.get('x')), float(el.get('width'))
                bars.append((x, x + w))
                if y in lanes:
                    lanes[y] += 1
        empty = [labels.get(round(y), y) for y, n in lanes.items() if n == 0]
        if empty:
            bad.append(f'{path} {g.get("id")}: empty lanes {empty}')
        bars.sort()
        covered, end = 0.0, x0
        for a, b in bars:
            a, b = max(a, end), min(b, x1)
            if b > a:
                covered += b - a
                end = b
        share = covered / (x1 - x0)
        print(f'{path.split("/")[-2]}/{path.split("/")[-1]} {g.get("id")}: {len(lanes)} lanes, bars cover {100 * share:.1f}% of the axis')
        if share < 0.10:
            bad.append(f'{path} {g.get("id")}: bars cover only {100 * share:.2f}% of its time axis')
        texts = ' '.join(t.text or '' for t in g.iter(NS + 'text'))
        if 'measured on cpu' in texts and re.search(r'(^|\s)cuda:\d+ (compute|copies)', ' '.join(labels.values())):
            bad.append(f'{path} {g.get("id")}: a CPU run drawn on cuda lanes')
for b in bad:
    print('FAIL:', b)
sys.exit(1 if bad else 0)
PY
grep -q 'cpu (cuda:0 tasks) compute' "$tmp/seed1-convergence/timeline.svg" || fail "seed1 timeline.svg: the CPU run's lanes are not labelled cpu"
# the tasks-only graph keeps data edges solid: the gradient of micro-batch i flows from B(i,j) to
# B(i,j-1) through the copy, for checkpointed micro-batches too (their R(i,j-1) also follows
# B(i,j), over a phony edge, which must not hide the data edge)
"$bin" graph "$root/examples/small-3x3.json" --tasks --dot "$tmp/tasks.dot" -q || fail "graph --tasks exited $?"
for i in 0 1 2; do
    for j in 1 2; do
        grep -q "\"B($i,$j)\" -> \"B($i,$((j - 1)))\";" "$tmp/tasks.dot" ||
            fail "graph --tasks: no solid data edge B($i,$j) -> B($i,$((j - 1)))"
    done
done
echo "pictures: ok"
