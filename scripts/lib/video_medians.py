#!/usr/bin/env python3
"""Medians over seeds of scripts/bench-video runs, one row per arm.

    python3 scripts/lib/video_medians.py OUT [OUT...]

OUT is a bench-video output directory (OUT/<workload>/seed<N>/<arm>/
results.json). CPR is the paper's per-stream mean over the streams the
gateway admitted; "CPR, refused as 0" also counts every refused stream as a
stream that played nothing (CPR x admitted / planned), so that arms that
admit more are not penalised for it.
"""
import json
import pathlib
import statistics
import sys


def rows(out):
    runs = {}
    for f in sorted(pathlib.Path(out).glob("*/seed*/*/results.json")):
        arm, seed, workload = f.parent.name, f.parent.parent.name, f.parent.parent.parent.name
        runs.setdefault((workload, arm), []).append((seed, json.loads(f.read_text())))
    return runs


def main():
    order = ["fifo-static", "ts", "ts-chunk", "lsf-static", "credit-static", "credit-bmpr",
             "rehoming", "full", "full-levels", "full-sync"]
    print("| source | workload | arm | seeds | CPR per-stream mean (per seed) | median | CPR, refused as 0 (median) "
          "| refused of planned (median) | TTFC p50 s (median) | mean quality | moves (total) |")
    print("| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for out in sys.argv[1:]:
        runs = rows(out)
        for (workload, arm) in sorted(runs, key=lambda k: (k[0], order.index(k[1]) if k[1] in order else 99)):
            rs = sorted(runs[(workload, arm)], key=lambda r: r[0])
            cpr = [r["summary"]["cpr_stream_mean"] for _, r in rs]
            counted = [s["cpr_stream_mean"] * s["created"] / max(s["planned"], 1) for s in (r["summary"] for _, r in rs)]
            refused = [r["summary"]["rejected"] for _, r in rs]
            planned = rs[0][1]["summary"]["planned"]
            ttfc = []
            for _, r in rs:
                firsts = [s.get("ttfc_ms") for s in r.get("streams", []) if s.get("ttfc_ms") is not None]
                if firsts:
                    ttfc.append(statistics.median(firsts) / 1e3)
            quality = statistics.median(r["summary"]["mean_quality"] for _, r in rs)
            moves = sum(r["summary"]["rehomes"] for _, r in rs)
            ttfc_s = f"{statistics.median(ttfc):.1f}" if ttfc else "—"
            print(f"| {pathlib.Path(out).name} | {workload} | {arm} | {len(rs)} | "
                  f"{' / '.join(f'{c:.3f}' for c in cpr)} | {statistics.median(cpr):.3f} | "
                  f"{statistics.median(counted):.3f} | {statistics.median(refused):.0f} of {planned} | "
                  f"{ttfc_s} | {quality:.4f} | {moves} |")


if __name__ == "__main__":
    main()
