#!/usr/bin/env python3
"""The prefix-caching benchmark's table (scripts/bench-prefix).

For each workload under OUT and each routing arm: medians over seeds of
TTFT p50 / p99, goodput, prefill tokens computed and the prefix-cache hit
rate, and TTFT p50 as a ratio of least-loaded's with the cache off
(`ll-off`) and on (`ll`). Hits come from the simulator's fleet summary, or
in live runs from the engines' load reports the gateway's /readyz showed
after the run; live runs also show the busiest engine's share of the
prompt tokens (1/engines when balanced; near 1 when one engine took the
load).

    python3 scripts/lib/prefix_table.py bench-out/prefix-sim
"""
import json
import statistics
import sys
from pathlib import Path

ARMS = ["ll-off", "ll", "rr", "ca", "ours"]


def hits(run: Path, results: dict):
    """(prompt tokens looked up, found cached, busiest engine's share or None)."""
    fleet = results.get("fleet") or {}
    if fleet.get("prefix_lookup_tokens"):
        return fleet["prefix_lookup_tokens"], fleet["prefix_hit_tokens"], None
    ready = run / "readyz.json"
    if ready.exists():
        doc = json.loads(ready.read_text())
        engines = (doc.get("detail") or doc).get("engines", [])
        looked = [(e.get("load") or {}).get("prefix_lookup_tokens", 0) for e in engines]
        total = sum(looked)
        return (total, sum((e.get("load") or {}).get("prefix_hit_tokens", 0) for e in engines),
                max(looked) / total if total else None)
    return 0, 0, None


def row(runs):
    vals = {}
    for run in runs:
        r = json.loads((run / "results.json").read_text())
        s, o = r["summary"], r["summary"]["overall"]
        ttft = o.get("ttft_ms") or {}
        looked, hit, top = hits(run, r)
        if top is not None:
            vals.setdefault("top", []).append(top)
        for k, v in {
            "p50": ttft.get("p50", float("nan")),
            "p99": ttft.get("p99", float("nan")),
            "tok_s": s["goodput_tokens_per_s"],
            "ok": o["ok"] / max(o["requests"], 1),
            "computed": looked - hit,
            "hit": hit / looked if looked else 0.0,
        }.items():
            vals.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in vals.items()}


def main(out: str):
    root = Path(out)
    for wdir in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "certs"):
        rows = {}
        for arm in ARMS:
            runs = sorted(wdir.glob(f"{arm}-s*"))
            runs = [r for r in runs if (r / "results.json").exists()]
            if runs:
                rows[arm] = (row(runs), len(runs))
        if not rows:
            continue
        print(f"\n### {wdir.name}\n")
        live = any("top" in m for m, _ in rows.values())
        print("| arm | TTFT p50 ms | vs ll-off | vs ll | TTFT p99 ms | goodput tok/s | served | prefill tokens computed | hit rate |"
              + (" busiest engine |" if live else "") + " seeds |")
        print("| --- " * (10 + live) + "|")
        base_off = rows.get("ll-off", ({}, 0))[0].get("p50")
        base_on = rows.get("ll", ({}, 0))[0].get("p50")
        for arm, (m, n) in rows.items():
            vs = lambda b: f"{m['p50'] / b:.2f}x" if b else "-"
            print(f"| {arm} | {m['p50']:.1f} | {vs(base_off)} | {vs(base_on)} | {m['p99']:.1f} | "
                  f"{m['tok_s']:.1f} | {100 * m['ok']:.1f}% | {m['computed']:,.0f} | {100 * m['hit']:.1f}% | "
                  + (f"{100 * m['top']:.0f}% | " if "top" in m else "- | " if live else "") + f"{n} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench-out/prefix-sim")
