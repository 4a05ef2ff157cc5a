#!/usr/bin/env python3
"""Paired comparison of interleaved nplbbench runs.

usage: stats.py DIR OLD NEW   (files DIR/<name>.<rep>.md, rep 1..n)
Per scenario and hook: the median over repetitions of each build's
median ns/packet, the harness-subtracted value, and the paired ratio
new/old (median of the per-repetition ratios, 95 % bootstrap interval).
"""
import glob, random, re, statistics, sys

def parse(path):
    rows = {}
    for line in open(path):
        m = re.match(r"\| (\w+) \| (\d+) \([^)]*\) \| (\d+) \(", line)
        if m:
            rows[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    return rows

def boot(xs, n=4000):
    rnd = random.Random(1)
    meds = sorted(statistics.median(rnd.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]

d, old, new = sys.argv[1:4]
reps = sorted({int(p.rsplit(".", 2)[-2]) for p in glob.glob(f"{d}/{old}.*.md")})
O = {r: parse(f"{d}/{old}.{r}.md") for r in reps}
N = {r: parse(f"{d}/{new}.{r}.md") for r in reps}
print(f"{new} vs {old}, {len(reps)} paired runs")
print("| scenario | hook | old ns | new ns | old − harness | new − harness | new/old (95 % interval) |")
print("|---|---|---:|---:|---:|---:|---:|")
for sc in O[reps[0]]:
    if sc == "empty_program":
        continue
    for h, name in ((0, "tc"), (1, "XDP")):
        o = [O[r][sc][h] for r in reps]
        n = [N[r][sc][h] for r in reps]
        eo = statistics.median(O[r]["empty_program"][h] for r in reps)
        en = statistics.median(N[r]["empty_program"][h] for r in reps)
        ratios = [b / a for a, b in zip(o, n)]
        lo, hi = boot(ratios)
        mo, mn = statistics.median(o), statistics.median(n)
        print(f"| {sc} | {name} | {mo:.0f} | {mn:.0f} | {mo-eo:.0f} | {mn-en:.0f} | {statistics.median(ratios):.2f} ({lo:.2f}–{hi:.2f}) |")
