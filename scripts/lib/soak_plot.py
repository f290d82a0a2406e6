"""The soak's samples (scripts/bench-soak): a Markdown summary and an SVG
plot of the gateway's resident memory, file descriptors, threads and the
Redis keys over time.

    python3 scripts/lib/soak_plot.py OUT   # reads OUT/samples.csv, writes OUT/soak.svg
"""

import csv
import sys
from pathlib import Path


def main(out: Path) -> None:
    rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(open(out / "samples.csv"))]
    if len(rows) < 2:
        print("fewer than two samples")
        return
    t_end = rows[-1]["t_s"]
    warm = [r for r in rows if r["t_s"] >= min(600.0, t_end / 2)]
    first, last = warm[0], warm[-1]
    span_min = max((last["t_s"] - first["t_s"]) / 60.0, 1e-9)
    per10 = (last["rss_kib"] - first["rss_kib"]) / 1024.0 / span_min * 10.0
    print(f"{len(rows)} samples over {t_end:.0f} s; 'warm' from {first['t_s']:.0f} s\n")
    print("| measure | start | warm start | end | max | change after warm-up |")
    print("|---|---:|---:|---:|---:|---:|")
    for key, unit, scale in [("rss_kib", "MiB", 1 / 1024), ("fds", "", 1), ("threads", "", 1),
                             ("connections_open", "", 1), ("inflight", "", 1), ("redis_keys", "", 1)]:
        vals = [r[key] * scale for r in rows]
        change = (last[key] - first[key]) * scale
        print(f"| {key} {unit} | {vals[0]:.1f} | {first[key] * scale:.1f} | {vals[-1]:.1f} | {max(vals):.1f} | {change:+.1f} |")
    print(f"\nresident memory after warm-up: {per10:+.2f} MiB per 10 minutes")
    plot(out / "soak.svg", rows)
    print(f"\nplot: {out / 'soak.svg'}")


def plot(path: Path, rows) -> None:
    w, h, pad = 720, 260, 50
    series = [("rss_kib", "RSS (MiB)", 1 / 1024, "#1f77b4"), ("fds", "fds", 1, "#ff7f0e"),
              ("threads", "threads", 1, "#2ca02c"), ("redis_keys", "Redis keys", 1, "#d62728")]
    t_max = max(r["t_s"] for r in rows) or 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h * len(series)}" font-family="sans-serif" font-size="11">']
    for i, (key, label, scale, color) in enumerate(series):
        y0 = i * h
        vals = [r[key] * scale for r in rows]
        top = max(max(vals), 1.0) * 1.1
        pts = " ".join(
            f"{pad + (r['t_s'] / t_max) * (w - 2 * pad):.1f},{y0 + h - pad - (v / top) * (h - 2 * pad):.1f}"
            for r, v in zip(rows, vals))
        parts.append(f'<text x="{pad}" y="{y0 + 20}">{label} (max {max(vals):.1f})</text>')
        parts.append(f'<line x1="{pad}" y1="{y0 + h - pad}" x2="{w - pad}" y2="{y0 + h - pad}" stroke="#888"/>')
        parts.append(f'<line x1="{pad}" y1="{y0 + pad}" x2="{pad}" y2="{y0 + h - pad}" stroke="#888"/>')
        parts.append(f'<text x="{pad - 5}" y="{y0 + pad}" text-anchor="end">{top:.0f}</text>')
        parts.append(f'<text x="{w - pad}" y="{y0 + h - pad + 15}" text-anchor="end">{t_max:.0f} s</text>')
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{pts}"/>')
    parts.append("</svg>")
    path.write_text("\n".join(parts))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
