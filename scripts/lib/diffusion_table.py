"""Median SAR per scheduler over seeds from `scripts/bench-diffusion`
MODE=live results (DIR/<mode>-s<seed>/results.json), as Markdown.

"within ε": the share done by their deadline plus the harness's timing
tolerance (`loadtest diffusion --tolerance-ms`, 2 ms unless told): at σ = 1
a deadline is the solo time itself, so a request served as if alone lands
within the testbed's timing noise of it, on either side. SAR is strict."""
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


def tolerant(r):
    if "sar_within_tolerance" in r:
        return r["sar_within_tolerance"]
    ok = [x for x in r["records"] if x.get("latency_ms") is not None and x["latency_ms"] <= x["deadline_ms"] + 2.0]
    return 100.0 * len(ok) / max(r["requests"], 1)


eps = {r.get("tolerance_ms", 2.0) for rs in runs.values() for r in rs}
eps = "/".join(f"{e:g}" for e in sorted(eps))
print(f"| scheduler | runs | SAR [per run] | image SAR | video SAR | SAR within {eps} ms [per run] | failed |")
print("|---|---:|---|---:|---:|---|---:|")
for mode in [m for m in order if m in runs]:
    rs = runs[mode]
    med = lambda f: statistics.median(f(r) for r in rs)
    each = lambda f: " ".join(f"{f(r):.0f}" for r in rs)
    sar = lambda r: r["sar"]
    print(
        f"| {mode} | {len(rs)} | {med(sar):.0f}% [{each(sar)}] | {med(lambda r: r['image_sar']):.0f}% "
        f"| {med(lambda r: r['video_sar']):.0f}% | {med(tolerant):.0f}% [{each(tolerant)}] "
        f"| {sum(r['failed'] for r in rs)} |"
    )
