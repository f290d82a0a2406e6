"""Median SAR per scheduler over seeds from `scripts/bench-diffusion`
MODE=live results (DIR/<mode>-s<seed>/results.json), as Markdown.

"late < 1%": requests that missed their deadline by less than 1% of it
(at σ = 1 a deadline is the solo time, so a request that ran as if alone
meets or misses it by sub-millisecond jitter); a diagnostic, not SAR."""
import json
import pathlib
import statistics
import sys

out = pathlib.Path(sys.argv[1])
order = ["fcfs", "preempt", "dp", "genserve"]
runs = {}
for f in sorted(out.glob("*-s*/results.json")):
    mode = f.parent.name.rsplit("-s", 1)[0]
    runs.setdefault(mode, []).append(json.loads(f.read_text()))
def near(r):
    late = [x for x in r["records"] if x.get("latency_ms") is not None and not x["met"]]
    return 100.0 * sum(x["latency_ms"] <= 1.01 * x["deadline_ms"] for x in late) / max(r["requests"], 1)


print("| scheduler | runs | SAR | image SAR | video SAR | late < 1% | failed |")
print("|---|---:|---:|---:|---:|---:|---:|")
for mode in [m for m in order if m in runs]:
    rs = runs[mode]
    med = lambda k: statistics.median(r[k] for r in rs)
    print(f"| {mode} | {len(rs)} | {med('sar'):.0f}% | {med('image_sar'):.0f}% | {med('video_sar'):.0f}% | {statistics.median(near(r) for r in rs):.0f}% | {sum(r['failed'] for r in rs)} |")
