#!/usr/bin/env python3
"""Medians over seeds of scripts/bench-video-scale runs, one row per arm,
and OUT/engines.svg: serving engines over time (first seed), every arm.

    python3 scripts/lib/video_scale_table.py OUT
"""
import json
import pathlib
import statistics
import sys

ORDER = ["fixed-base", "fixed-peak", "autoscaled"]
COLORS = {"fixed-base": "#888888", "fixed-peak": "#1f77b4", "autoscaled": "#d62728"}


def quantile(values, q):
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def load(out):
    runs = {}
    for f in sorted(pathlib.Path(out).glob("seed*/*/results.json")):
        runs.setdefault(f.parent.name, []).append((f.parent.parent.name, json.loads(f.read_text())))
    return runs


def row(arm, runs):
    med = lambda xs: statistics.median(xs) if xs else 0.0
    worst, p99, cpr, gpu, peak, mean_eng, created, refused = [], [], [], [], [], [], [], []
    for _, r in runs:
        chunks = [ms for s in r["streams"] for ms in s.get("chunk_ms", [])]
        worst.append(max(chunks) if chunks else 0.0)
        p99.append(quantile(chunks, 0.99))
        cpr.append(r["summary"]["cpr_stream_mean"])
        created.append(r["summary"]["created"])
        refused.append(r["summary"]["rejected"])
        fleet = r.get("fleet") or {}
        gpu.append(fleet.get("gpu_seconds", 0.0))
        serving = fleet.get("serving") or [0]
        peak.append(max(serving))
        mean_eng.append(sum(serving) / len(serving))
    return (f"| {arm} | {len(runs)} | {med(created):.0f} | {med(refused):.0f} | {med(worst):.0f} | {med(p99):.0f} "
            f"| {med(cpr):.3f} | {med(gpu):.0f} | {med(mean_eng):.2f} | {med(peak):.0f} |")


def svg(runs, path):
    series = {}
    for arm, rs in runs.items():
        fleet = rs[0][1].get("fleet") or {}
        series[arm] = (fleet.get("bin_s", 1.0), fleet.get("serving") or [])
    t_max = max((b * len(s) for b, s in series.values()), default=1.0) or 1.0
    e_max = max((max(s) for _, s in series.values() if s), default=1.0) or 1.0
    w, h, pad = 640, 300, 40
    x = lambda t: pad + (w - 2 * pad) * t / t_max
    y = lambda e: h - pad - (h - 2 * pad) * e / (e_max + 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
           f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
           f'<text x="{w / 2}" y="{h - 8}" text-anchor="middle">seconds</text>',
           f'<text x="12" y="{h / 2}" transform="rotate(-90 12 {h / 2})" text-anchor="middle">serving engines</text>']
    for e in range(int(e_max) + 1):
        out.append(f'<text x="{pad - 6}" y="{y(e) + 4}" text-anchor="end">{e}</text>')
    for i, (arm, (b, s)) in enumerate(sorted(series.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else 9)):
        pts = " ".join(f"{x(k * b):.1f},{y(v):.1f}" for k, v in enumerate(s))
        color = COLORS.get(arm, "#2ca02c")
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}"/>')
        out.append(f'<text x="{w - pad - 90}" y="{pad + 14 * i}" fill="{color}">{arm}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def main():
    out = pathlib.Path(sys.argv[1])
    runs = load(out)
    print("| arm | seeds | streams admitted | refused | worst chunk ms | p99 chunk ms | CPR per-stream mean "
          "| GPU-seconds | mean serving engines | peak serving engines |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for arm in sorted(runs, key=lambda a: ORDER.index(a) if a in ORDER else 9):
        print(row(arm, runs[arm]))
    svg(runs, out / "engines.svg")
    print(f"\n(medians over seeds; engines over time: {out / 'engines.svg'})")


if __name__ == "__main__":
    main()
