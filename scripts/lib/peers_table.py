"""The tables of scripts/bench-peers: medians over its runs (run-N/sweep.json
under the directory given), as Markdown.

Per arm: TTFT added over `direct` at each rate (p50 and p99; `-` where the
arm ran no such step or failed it), the highest sustainable rate, and CPU
per request of the arm's processes during its steps at the lowest rate and
at 1,000 req/s (its background work during the step included)."""
import glob
import json
import os
import statistics
import sys

out = sys.argv[1]
runs = sorted(glob.glob(os.path.join(out, "run-*", "sweep.json")))
if not runs:
    sys.exit(f"no run-*/sweep.json under {out}")
LLM_GATEWAYS = ("litellm", "smg", "vllm-router")


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


by_arm = {}  # arm -> rate -> [(p50, p99, sustainable)]
capacity = {}  # arm -> [max sustainable]
cpu = {}  # arm -> rate -> [µs per request]
order = []
for i, path in enumerate(runs):
    sweep = json.load(open(path))
    base = {s["rate"]: s for s in sweep["arms"][0]["steps"]}
    for a in sweep["arms"]:
        label = a["arm"]["label"]
        if label not in order:
            order.append(label)
        capacity.setdefault(label, []).append(a["max_sustainable_rps"] or 0)
        for s in a["steps"]:
            cpu.setdefault(label, {}).setdefault(s["rate"], []).append(s.get("cpu_us_per_request"))
            b = base.get(s["rate"])
            ok = s["sustainable"] and s["ttft_ms"] and b and b["ttft_ms"]
            added = (s["ttft_ms"]["p50"] - b["ttft_ms"]["p50"], s["ttft_ms"]["p99"] - b["ttft_ms"]["p99"]) if ok else (None, None)
            by_arm.setdefault(label, {}).setdefault(s["rate"], []).append(added)

rates = sorted({r for arm in by_arm.values() for r in arm})
shown = [r for r in rates if r in (200, 1000, 4000)] or rates[:3]
cpu_at = [r for r in rates if r in (rates[0], 1000)]
head = ["arm"] + [f"+TTFT p50/p99 @{r:.0f} (ms)" for r in shown] + ["max sustainable (req/s)"]
head += [f"CPU/request @{r:.0f} (µs)" for r in cpu_at]
print(f"{len(runs)} run(s); medians.\n")
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
fmt = lambda v, f="{:+.2f}": "-" if v is None else f.format(v)
for label in order:
    row = [label]
    for r in shown:
        cells = by_arm.get(label, {}).get(r, [])
        if label == order[0]:
            row.append("baseline")
        else:
            row.append(f"{fmt(med([c[0] for c in cells]))} / {fmt(med([c[1] for c in cells]))}")
    row.append(fmt(med(capacity.get(label, [])), "{:.0f}"))
    for r in cpu_at:
        row.append(fmt(med(cpu.get(label, {}).get(r, [])), "{:.0f}"))
    print("| " + " | ".join(row) + " |")
