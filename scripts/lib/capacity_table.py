#!/usr/bin/env python3
"""Capacity per arm from a load sweep (scripts/sim-capacity, scripts/bench-capacity).

    capacity_table.py OUT

OUT/<arm>/rate-<R>/seed-<S>/results.json, one steady run each. A request is
within SLO when it completed inside its tier's TTFT and end-to-end targets
(`met_slo`); requests refused `context_length_exceeded` (bad input for the
tier's context ceiling, refused alike by every arm) are left out of the
denominator. An arm's capacity is the highest rate at which the median share
over seeds is >= 95%, every lower rate passing too. Prints one Markdown
table (throughput, goodput, cost per 1M output tokens and TTFT at capacity;
live runs have no fleet cost, so OUT/fleet.json gives the fixed fleet's
engines and price per engine-hour)
and writes OUT/capacity.svg: the within-SLO share against the rate, per arm.
"""
import json
import pathlib
import statistics
import sys

TARGET = 0.95
ORDER = ["b0", "b1", "ours"]
COLORS = {"b0": "#d62728", "b1": "#ff7f0e", "ours": "#1f77b4"}


def summary(d):
    w = d.get("window") or {}
    return w.get("summary") or d["summary"]


def share(d):
    o = summary(d)["overall"]
    bad_input = (o.get("rejections") or {}).get("context_length_exceeded", 0)
    n = o["requests"] - bad_input
    return o["met_slo"] / n if n else 0.0


def load(out):
    runs = {}
    for f in sorted(out.glob("*/rate-*/seed-*/results.json")):
        arm = f.parts[-4]
        rate = float(f.parts[-3].removeprefix("rate-"))
        runs.setdefault(arm, {}).setdefault(rate, []).append(json.loads(f.read_text()))
    return runs


def med(ds, fn):
    vals = [v for v in (fn(d) for d in ds) if v is not None]
    return statistics.median(vals) if vals else None


FIXED = {}  # OUT/fleet.json of a live run: {"engines": N, "engine_hour_usd": P}


def cost(d, o, dur):
    c = (d.get("fleet") or {}).get("cost_per_1m_output_tokens")
    if c is None and FIXED and o["tokens_out"]:
        c = FIXED["engines"] * FIXED["engine_hour_usd"] * dur / 3600 / o["tokens_out"] * 1e6
    return c


def at(ds):
    s = lambda d: summary(d)
    o = lambda d: s(d)["overall"]
    dur = lambda d: s(d).get("duration_s") or d["run"]["duration_s"]
    return {
        "share": med(ds, share),
        "tokens_s": med(ds, lambda d: o(d)["tokens_out"] / dur(d)),
        "goodput_s": med(ds, lambda d: s(d).get("goodput_tokens_per_s")),
        "cost": med(ds, lambda d: cost(d, o(d), dur(d))),
        "p95": med(ds, lambda d: o(d)["ttft_ms"]["p95"]),
        "p99": med(ds, lambda d: o(d)["ttft_ms"]["p99"]),
        "refused": med(ds, lambda d: o(d)["rejected"] / max(o(d)["requests"], 1)),
        "seeds": len(ds),
    }


def capacity(rates):
    best = None
    for r in sorted(rates):
        if at(rates[r])["share"] >= TARGET:
            best = r
        else:
            break
    return best


def svg(runs, path):
    all_rates = [r for rates in runs.values() for r in rates]
    if not all_rates:
        return
    r_min, r_max = min(all_rates), max(all_rates)
    w, h, pad = 640, 320, 48
    x = lambda r: pad + (w - 2 * pad) * (r - r_min) / ((r_max - r_min) or 1)
    y = lambda s: h - pad - (h - 2 * pad) * s
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
           f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
           f'<line x1="{pad}" y1="{y(TARGET):.1f}" x2="{w - pad}" y2="{y(TARGET):.1f}" stroke="#888" stroke-dasharray="4 3"/>',
           f'<text x="{w / 2}" y="{h - 10}" text-anchor="middle">offered load, req/s</text>',
           f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">share within SLO</text>',
           f'<text x="{pad - 6}" y="{y(TARGET) + 4:.1f}" text-anchor="end">95%</text>',
           f'<text x="{pad - 6}" y="{y(0) + 4:.1f}" text-anchor="end">0</text>',
           f'<text x="{pad - 6}" y="{y(1) + 4:.1f}" text-anchor="end">1</text>',
           f'<text x="{pad}" y="{h - pad + 14}" text-anchor="middle">{r_min:g}</text>',
           f'<text x="{w - pad}" y="{h - pad + 14}" text-anchor="middle">{r_max:g}</text>']
    arms = sorted(runs, key=lambda a: ORDER.index(a) if a in ORDER else 9)
    for i, arm in enumerate(arms):
        pts = " ".join(f"{x(r):.1f},{y(at(runs[arm][r])['share']):.1f}" for r in sorted(runs[arm]))
        c = COLORS.get(arm, "#2ca02c")
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{pts}"/>')
        out.append(f'<text x="{w - pad - 60}" y="{pad + 14 * i}" fill="{c}">{arm}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def main():
    out = pathlib.Path(sys.argv[1])
    if (out / "fleet.json").exists():
        FIXED.update(json.loads((out / "fleet.json").read_text()))
    runs = load(out)
    fmt = lambda v, f="{:.0f}": "-" if v is None else f.format(v)
    print("| arm | capacity (req/s, >= 95% within SLO) | output tokens/s there | goodput tokens/s | cost per 1M output tokens | TTFT p95 / p99 ms | refused | share at the next rate |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    caps = {}
    for arm in sorted(runs, key=lambda a: ORDER.index(a) if a in ORDER else 9):
        rates = runs[arm]
        cap = capacity(rates)
        caps[arm] = cap
        above = [r for r in sorted(rates) if cap is None or r > cap]
        nxt = f"{at(rates[above[0]])['share']:.1%} at {above[0]:g}" if above else "-"
        if cap is None:
            print(f"| {arm} | below {min(rates):g} | - | - | - | - | - | {nxt} |")
            continue
        a = at(rates[cap])
        print(f"| {arm} | {cap:g} | {fmt(a['tokens_s'])} | {fmt(a['goodput_s'])} | {fmt(a['cost'], '${:.3f}')} "
              f"| {fmt(a['p95'])} / {fmt(a['p99'])} | {fmt(a['refused'], '{:.1%}')} | {nxt} |")
    if caps.get("ours") and caps.get("b1"):
        ours, b1 = at(runs["ours"][caps["ours"]]), at(runs["b1"][caps["b1"]])
        print(f"\nours / b1: capacity {caps['ours'] / caps['b1']:.2f}x, output tokens/s at capacity "
              f"{ours['tokens_s'] / b1['tokens_s']:.2f}x" + (
                  f", cost per 1M tokens {ours['cost'] / b1['cost'] - 1:+.1%}" if ours["cost"] and b1["cost"] else ""))
    print("\nshare within SLO per rate (median over seeds):\n")
    rates_all = sorted({r for rs in runs.values() for r in rs})
    print("| arm | " + " | ".join(f"{r:g}" for r in rates_all) + " |")
    print("|---|" + "---:|" * len(rates_all))
    for arm in sorted(runs, key=lambda a: ORDER.index(a) if a in ORDER else 9):
        cells = [f"{at(runs[arm][r])['share']:.1%}" if r in runs[arm] else "" for r in rates_all]
        print(f"| {arm} | " + " | ".join(cells) + " |")
    svg(runs, out / "capacity.svg")


if __name__ == "__main__":
    main()
