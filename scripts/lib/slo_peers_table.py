#!/usr/bin/env python3
"""The SLO-goodput comparison over seeds (scripts/bench-peers MODE=slo): per arm, goodput per seed
and its median, the ratio to the best peer, met-SLO shares, the worst miss among answered
requests and gold TTFT p99, from each seed's table.md.

    python3 scripts/lib/slo_peers_table.py bench-out/peers/slo-collapse/seed-*/table.md
"""
import sys, re, statistics
from collections import defaultdict
def parse(path):
    rows={}; head=None
    for line in open(path):
        c=[x.strip() for x in line.strip().strip('|').split('|')]
        if c and c[0]=='tier': head=c; continue
        if head and len(c)==len(head) and c[0] in ('gold','silver','bronze'):
            d=dict(zip(head,c))
            rows[(c[0],c[1])]=dict(met=float(d['met SLO'].rstrip('%')),miss=float(d['miss (accepted)'].rstrip('%')),p99=float(d['TTFT p99']),good=float(d['goodput tok/s']))
    return rows
files=sys.argv[1:]
per=[parse(f) for f in files]
arms=list(dict.fromkeys(a for r in per for (_,a) in r))
print('| arm | goodput tok/s per seed | median | vs best peer | met SLO gold / silver / bronze (median) | worst miss among answered | TTFT p99 gold (median ms) |')
print('|---|---|---:|---:|---|---:|---:|')
med={}
for a in arms:
    g=[sum(r[(t,a)]['good'] for t in ('gold','silver','bronze')) for r in per if ('gold',a) in r]
    med[a]=statistics.median(g)
best=max(v for a,v in med.items() if a!='ours')
for a in arms:
    g=[sum(r[(t,a)]['good'] for t in ('gold','silver','bronze')) for r in per if ('gold',a) in r]
    met=[statistics.median(r[(t,a)]['met'] for r in per if (t,a) in r) for t in ('gold','silver','bronze')]
    miss=max(r[(t,a)]['miss'] for r in per for t in ('gold','silver','bronze') if (t,a) in r)
    p99=statistics.median(r[('gold',a)]['p99'] for r in per if ('gold',a) in r)
    print(f"| {a} | {' / '.join(f'{x:,.0f}' for x in g)} | {med[a]:,.0f} | {med[a]/best:.2f}x | {met[0]:.1f} / {met[1]:.1f} / {met[2]:.1f}% | {miss:.1f}% | {p99:,.0f} |")
