#!/usr/bin/env python3
"""The text autoscaler's volatility table, profiled by replay
(scripts/sim-text-levels; docs/benchmarks/fleet.md "Text volatility levels").

    python3 scripts/lib/text_levels.py traces OUT RATE DURATION
        writes OUT/v<k>.csv: arrivals whose rate switches between a low and a
        high phase (exponential phase lengths, mean 30 s) around RATE on
        average, for swings 1 (Poisson), 1.5, 2, 3 (high / mean), with
        token counts drawn like a chat workload (Azure trace layout)
    python3 scripts/lib/text_levels.py table OUT
        reads OUT/v<k>/rho<r>/results.json and prints, per trace, the
        autoscaler's measured sigma (median over the run), and per target
        utilization the share of requests within SLO and GPU-hours; the
        profiled row is the highest (cheapest) target whose share within SLO
        is no more than half a point below the trace's best and whose TTFT
        p99 is within 25% of the trace's lowest.
"""
import json
import math
import pathlib
import random
import statistics
import sys

SWINGS = [1.0, 1.5, 2.0, 3.0]


def traces(out, rate, duration):
    out.mkdir(parents=True, exist_ok=True)
    for k, swing in enumerate(SWINGS):
        rng = random.Random(1000 + k)
        # High phases at swing x mean, low phases at the rate that keeps the
        # mean (equal expected lengths): low = 2 - swing, floored at 0.2.
        hi, lo = swing, max(0.2, 2.0 - swing)
        rows, t, high = [], 0.0, False
        while t < duration:
            phase = rng.expovariate(1 / 30.0) if swing > 1.0 else duration
            end = min(duration, t + phase)
            r = rate * (hi if high else lo) if swing > 1.0 else rate
            while True:
                t += rng.expovariate(r)
                if t >= end:
                    t = end
                    break
                inp = max(16, int(rng.lognormvariate(math.log(600), 0.8)))
                outp = max(8, int(rng.lognormvariate(math.log(180), 0.6)))
                rows.append(f"{t:.4f},{inp},{outp}")
            high = not high
        (out / f"v{k}.csv").write_text("timestamp,input_tokens,output_tokens\n" + "\n".join(rows) + "\n")
        print(f"v{k}: swing {swing}, {len(rows)} requests over {duration:.0f} s", file=sys.stderr)


def table(out):
    print("| trace | swing (high / mean) | sigma measured (median) | target utilization | within SLO | TTFT p99 ms | GPU-hours |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    picked = []
    for k, swing in enumerate(SWINGS):
        runs = []
        sigmas = []
        for f in sorted(out.glob(f"v{k}/rho*/results.json")):
            r = json.loads(f.read_text())
            rho = float(f.parent.name[3:])
            tiers = r["summary"]["tiers"].values()
            req = sum(t["requests"] for t in tiers)
            met = sum(t["met_slo"] for t in tiers) / req if req else 0.0
            fleet = r.get("fleet") or {}
            vol = [v for v in fleet.get("volatility", []) if v > 0]
            sigma = statistics.median(vol) if vol else 0.0
            sigmas.append(sigma)
            hours = fleet.get("gpu_seconds", 0.0) / 3600
            p99 = (r["summary"]["overall"].get("ttft_ms") or {}).get("p99", float("inf"))
            print(f"| v{k} | {swing} | {sigma:.2f} | {rho:.2f} | {met * 100:.1f}% | {p99:.0f} | {hours:.2f} |")
            runs.append((rho, met, p99, hours))
        top = max((m for _, m, _, _ in runs), default=0.0)
        low = min((p for _, _, p, _ in runs), default=0.0)
        ok = [(rho, hours) for rho, m, p, hours in runs if m >= top - 0.005 and p <= 1.25 * low]
        best = max(ok) if ok else None
        picked.append((k, swing, statistics.median(sigmas) if sigmas else 0.0, best))
    print()
    print("| trace | sigma | profiled target utilization (highest within 0.5 points of the best share within SLO and 25% of the lowest TTFT p99) |")
    print("| --- | --- | --- |")
    for k, swing, sigma, best in picked:
        print(f"| v{k} (swing {swing}) | {sigma:.2f} | {best[0] if best else 'none met'} |")
    # Rows: each trace's sigma band starts half-way from the previous one.
    print("\nlevels (above = midpoint between adjacent traces' sigma):")
    prev = None
    for k, swing, sigma, best in picked:
        above = 0.0 if prev is None else round((prev + sigma) / 2, 2)
        print(f"  above = {above}, target_utilization = {best[0] if best else 'n/a'}")
        prev = sigma


if __name__ == "__main__":
    if sys.argv[1] == "traces":
        traces(pathlib.Path(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))
    else:
        table(pathlib.Path(sys.argv[2]))
