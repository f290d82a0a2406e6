"""Median SAR per scheduler over seeds from `scripts/bench-diffusion`
MODE=live results (DIR/<mode>-s<seed>/results.json), as Markdown."""
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
print("| scheduler | runs | SAR | image SAR | video SAR | failed |")
print("|---|---:|---:|---:|---:|---:|")
for mode in [m for m in order if m in runs]:
    rs = runs[mode]
    med = lambda k: statistics.median(r[k] for r in rs)
    print(f"| {mode} | {len(rs)} | {med('sar'):.0f}% | {med('image_sar'):.0f}% | {med('video_sar'):.0f}% | {sum(r['failed'] for r in rs)} |")
