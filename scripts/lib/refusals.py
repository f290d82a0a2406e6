"""How each arm of scripts/bench-peers (MODE=slo) told its clients no: per
run (results.json files given), the requests refused or failed, by HTTP
status (0: no answer at all, e.g. a timeout or a reset), the share of
refusals that carried a Retry-After, and how long a refusal took (median)."""
import collections
import json
import statistics
import sys

print("| arm | requests | refused or failed | by status | with Retry-After | refusal took (p50 ms) |")
print("|---|---:|---:|---|---:|---:|")
for path in sys.argv[1:]:
    r = json.load(open(path))
    label = r["run"].get("label") or path
    recs = r["records"]
    bad = [x for x in recs if x["outcome"] != "ok"]
    by_status = collections.Counter(x["status"] for x in bad)
    told = [x for x in bad if x["status"] in (429, 503)]
    with_ra = sum(1 for x in told if x["admission"]["retry_after_s"] is not None)
    took = [x["done_ms"] for x in bad if x["done_ms"] is not None]
    status = ", ".join(f"{s}: {n}" for s, n in sorted(by_status.items())) or "-"
    ra = f"{with_ra}/{len(told)}" if told else "-"
    p50 = f"{statistics.median(took):.0f}" if took else "-"
    print(f"| {label} | {len(recs)} | {len(bad)} ({len(bad) / max(len(recs), 1):.1%}) | {status} | {ra} | {p50} |")
