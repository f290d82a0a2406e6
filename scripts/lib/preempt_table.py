#!/usr/bin/env python3
"""Priority preemption's benchmark (docs/benchmarks/admission.md, issue 50): per seed
and arm, each tier's met-SLO share, gold's TTFT p99 and refusals, total
goodput (from each seed's table.md), and the requests started by pausing
a lower tier (`x-admission-reason: preempts_lower_tier`, from the records).

    python3 scripts/lib/preempt_table.py bench-out/preempt-collapse
"""
import json, os, statistics, sys

def table(path):
    rows = {}
    head = None
    for line in open(path):
        c = [x.strip() for x in line.strip().strip('|').split('|')]
        if c and c[0] == 'tier':
            head = c
            continue
        if head and len(c) == len(head) and c[0] in ('gold', 'silver', 'bronze'):
            d = dict(zip(head, c))
            rows[(c[0], c[1])] = d
    return rows

def pct(s):
    return float(s.split('%')[0].split('(')[-1]) if '(' in s else float(s.rstrip('%'))

root = sys.argv[1]
seeds = sorted(d for d in os.listdir(root) if d.startswith('seed-') and os.path.exists(os.path.join(root, d, 'table.md')))
print('| seed | arm | met SLO gold / silver / bronze | gold TTFT p99 ms | gold refused | goodput tok/s | started by pausing a lower tier (TTFT p99 ms, met TTFT) |')
print('|---|---|---|---:|---:|---:|---|')
agg = {}
for s in seeds:
    t = table(os.path.join(root, s, 'table.md'))
    for arm in ('ours', 'ours-preempt'):
        if ('gold', arm) not in t:
            continue
        met = [float(t[(tier, arm)]['met SLO'].rstrip('%')) for tier in ('gold', 'silver', 'bronze')]
        good = sum(float(t[(tier, arm)]['goodput tok/s']) for tier in ('gold', 'silver', 'bronze'))
        g = t[('gold', arm)]
        recs = json.load(open(os.path.join(root, s, arm, 'results.json')))['records']
        pre = [r for r in recs if (r.get('admission') or {}).get('reason', '') and 'preempts_lower_tier' in r['admission']['reason']]
        budget = {'gold': 500, 'silver': 1000, 'bronze': 3000}
        ttfts = sorted(r['ttft_ms'] for r in pre if r.get('ttft_ms') is not None)
        p99 = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else 0
        ok = sum(1 for r in pre if r.get('ttft_ms') is not None and r['ttft_ms'] <= budget[r['tier']])
        what = f"{len(pre)} ({p99:,.0f}, {ok}/{len(pre)})" if pre else '0'
        print(f"| {s[5:]} | {arm} | {met[0]:.1f} / {met[1]:.1f} / {met[2]:.1f}% | {float(g['TTFT p99']):,.0f} | {g['rejected']} | {good:,.0f} | {what} |")
        agg.setdefault(arm, []).append((met, float(g['TTFT p99']), good))
print()
print('| arm | met SLO gold / silver / bronze (median) | gold TTFT p99 (median ms) | goodput (median tok/s) |')
print('|---|---|---:|---:|')
for arm, xs in agg.items():
    m = [statistics.median(x[0][i] for x in xs) for i in range(3)]
    print(f"| {arm} | {m[0]:.1f} / {m[1]:.1f} / {m[2]:.1f}% | {statistics.median(x[1] for x in xs):,.0f} | {statistics.median(x[2] for x in xs):,.0f} |")
