//! Plain-text output: the summary `loadtest run` prints, `loadtest
//! compare`'s side-by-side table with ratios, and `loadtest table`'s
//! per-tier Markdown table over several runs (the admission benchmark).

use std::fmt::Write;

use crate::results::Results;
use crate::stats::Summary;

/// The summary table of one run.
pub fn summary(r: &Results) -> String {
    let s = &r.summary;
    let mut out = format!(
        "{} — {}: offered {:.1} req/s, sent {:.1}, achieved {:.1}, goodput {:.1} req/s ({:.0} tok/s)\n",
        r.run.label,
        r.run.schedule,
        s.offered_rps,
        s.sent_rps,
        s.achieved_rps,
        s.goodput_rps,
        s.goodput_tokens_per_s
    );
    if let Some(e) = s.schedule_error_ms {
        let _ = writeln!(
            out,
            "harness scheduling error: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            e.p50, e.p99, e.max
        );
    }
    let _ = writeln!(
        out,
        "{:<8} {:>7} {:>7} {:>6} {:>6} {:>6} {:>6} {:>9} {:>9} {:>9} {:>8} {:>9}",
        "tier",
        "reqs",
        "ok",
        "rej",
        "fail",
        "degr",
        "miss%",
        "ttft p50",
        "ttft p99",
        "tlet p99",
        "tbt p99",
        "met SLO"
    );
    let rows = s.tiers.iter().map(|(t, g)| (t.as_str(), g)).chain([("all", &s.overall)]);
    for (tier, g) in rows {
        let p =
            |x: Option<Summary>, f: fn(&Summary) -> f64| x.map_or("-".into(), |x| format!("{:.1}", f(&x)));
        let _ = writeln!(
            out,
            "{tier:<8} {:>7} {:>7} {:>6} {:>6} {:>6} {:>6} {:>9} {:>9} {:>9} {:>8} {:>9}",
            g.requests,
            g.ok,
            g.rejected,
            g.failed,
            g.degraded,
            g.deadline_miss_rate.map_or("-".into(), |m| format!("{:.1}", m * 100.0)),
            p(g.ttft_ms, |x| x.p50),
            p(g.ttft_ms, |x| x.p99),
            p(g.tlet_ms, |x| x.p99),
            p(g.tbt_ms, |x| x.p99),
            g.met_slo
        );
    }
    for (kind, map) in [
        ("rejected", &s.overall.rejections),
        ("degraded", &s.overall.degradations),
        ("failed", &s.overall.failures),
    ] {
        if !map.is_empty() {
            let list: Vec<String> = map.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let _ = writeln!(out, "{kind}: {}", list.join(", "));
        }
    }
    out
}

/// The figures `compare` shows, in order, with how to read each.
fn figures(r: &Results) -> Vec<(&'static str, Option<f64>)> {
    let s = &r.summary;
    let o = &s.overall;
    let q = |x: Option<Summary>, f: fn(&Summary) -> f64| x.map(|x| f(&x));
    vec![
        ("offered req/s", Some(s.offered_rps)),
        ("achieved req/s", Some(s.achieved_rps)),
        ("goodput req/s", Some(s.goodput_rps)),
        ("goodput tokens/s", Some(s.goodput_tokens_per_s)),
        ("met SLO share", (o.requests > 0).then(|| o.met_slo as f64 / o.requests as f64)),
        ("deadline-miss rate", o.deadline_miss_rate),
        ("rejected", Some(o.rejected as f64)),
        ("failed", Some(o.failed as f64)),
        ("TTFT p50 ms", q(o.ttft_ms, |x| x.p50)),
        ("TTFT p95 ms", q(o.ttft_ms, |x| x.p95)),
        ("TTFT p99 ms", q(o.ttft_ms, |x| x.p99)),
        ("TBT p50 ms", q(o.tbt_ms, |x| x.p50)),
        ("TBT p99 ms", q(o.tbt_ms, |x| x.p99)),
        ("TLET p50 ms", q(o.tlet_ms, |x| x.p50)),
        ("TLET p99 ms", q(o.tlet_ms, |x| x.p99)),
        ("sched error p99 ms", q(s.schedule_error_ms, |x| x.p99)),
    ]
}

/// Key figures of `a` and `b` side by side, with b/a.
pub fn compare(a: &Results, b: &Results) -> String {
    let mut out =
        format!("{:<22} {:>14} {:>14} {:>8}\n", "", trunc(&a.run.label), trunc(&b.run.label), "B/A");
    for ((name, x), (_, y)) in figures(a).into_iter().zip(figures(b)) {
        let show = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.3}"));
        let ratio = match (x, y) {
            (Some(x), Some(y)) if x != 0.0 => format!("{:.3}", y / x),
            _ => "-".into(),
        };
        let _ = writeln!(out, "{name:<22} {:>14} {:>14} {ratio:>8}", show(x), show(y));
    }
    out
}

/// The simulator's calibration against live runs of the same scenario
/// (Markdown): per tier and overall, TTFT p50 and p95, goodput tokens per
/// second and the deadline-miss rate of accepted requests, live and
/// simulated, with the simulator's error. With several runs (seeds) each
/// figure is the median over the runs of each side. Latencies and goodput
/// agree when within `tolerance` (relative); a rate agrees when within
/// `tolerance` relative or one percentage point absolute (a miss rate of
/// 0.2% against 0.1% is not a 100% error). Returns the table and whether
/// all agree.
pub fn calibration(live: &[Results], sim: &[Results], tolerance: f64) -> (String, bool) {
    let runs = if live.len() > 1 { format!(" (median of {} runs)", live.len()) } else { String::new() };
    let mut out = format!(
        "| tier | figure | live{runs} | simulated{runs} | sim / live | agrees |\n|---|---|---:|---:|---:|:---:|\n"
    );
    let mut all = true;
    let mut tiers: Vec<String> = live.iter().flat_map(|r| r.summary.tiers.keys().cloned()).collect();
    tiers.sort();
    tiers.dedup();
    tiers.push("all".into());
    type Pick = fn(&Results, &str) -> Option<f64>;
    fn group<'a>(r: &'a Results, tier: &str) -> Option<&'a crate::summary::Group> {
        if tier == "all" {
            Some(&r.summary.overall)
        } else {
            r.summary.tiers.get(tier)
        }
    }
    let figures: [(&str, Pick, bool); 4] = [
        ("TTFT p50 ms", |r, t| group(r, t)?.ttft_ms.map(|x| x.p50), false),
        ("TTFT p95 ms", |r, t| group(r, t)?.ttft_ms.map(|x| x.p95), false),
        (
            "goodput tok/s",
            |r, t| group(r, t).map(|g| g.goodput_tokens as f64 / r.summary.duration_s.max(1e-9)),
            false,
        ),
        ("deadline-miss rate", |r, t| group(r, t)?.deadline_miss_rate, true),
    ];
    let median = |runs: &[Results], tier: &str, pick: Pick| -> Option<f64> {
        let mut v: Vec<f64> = runs.iter().filter_map(|r| pick(r, tier)).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
    };
    for tier in &tiers {
        for (name, pick, rate) in figures {
            let (Some(a), Some(b)) = (median(live, tier, pick), median(sim, tier, pick)) else { continue };
            let rel = if a != 0.0 {
                b / a - 1.0
            } else if b == 0.0 {
                0.0
            } else {
                f64::INFINITY
            };
            let ok = rel.abs() <= tolerance || (rate && (a - b).abs() <= 0.01);
            all &= ok;
            let (sa, sb) = if rate {
                (format!("{:.2}%", a * 100.0), format!("{:.2}%", b * 100.0))
            } else {
                (format!("{a:.1}"), format!("{b:.1}"))
            };
            let ratio = if a != 0.0 { format!("{:.3}", b / a) } else { "-".into() };
            let _ = writeln!(
                out,
                "| {tier} | {name} | {sa} | {sb} | {ratio} | {} |",
                if ok { "yes" } else { "**no**" }
            );
        }
    }
    (out, all)
}

/// The fleet experiment table (Markdown), one row per run: throughput
/// (output tokens/s of requests that finished) and goodput (of those within
/// their SLO), TTFT p95/p99, the deadline-miss rate of accepted requests,
/// the share of each tier's requests that met its SLO and Jain's fairness
/// index over those shares, GPU-hours, cost per 1M output tokens and cold
/// starts. With a window in the results (`loadtest sim --window`), the
/// latency and miss figures are also given inside it.
pub fn fleet_table(runs: &[Results]) -> String {
    let mut tiers: Vec<String> = runs.iter().flat_map(|r| r.summary.tiers.keys().cloned()).collect();
    tiers.sort();
    tiers.dedup();
    let mut out = String::from(
        "| run | throughput tok/s | goodput tok/s | TTFT p95 ms | TTFT p99 ms | miss (accepted) |",
    );
    for t in &tiers {
        let _ = write!(out, " {t} met SLO |");
    }
    out.push_str(" fairness (Jain) | window: TTFT p95 / p99 ms | window: miss | GPU-hours | $ / 1M tokens | cold starts |\n|---|");
    out.push_str(&"---:|".repeat(5 + tiers.len() + 6));
    out.push('\n');
    let pct = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.1}%", v * 100.0));
    for r in runs {
        let s = &r.summary;
        let d = s.duration_s.max(1e-9);
        let (p95, p99) = s.overall.ttft_ms.map_or((f64::NAN, f64::NAN), |t| (t.p95, t.p99));
        let _ = write!(
            out,
            "| {} | {:.0} | {:.0} | {p95:.0} | {p99:.0} | {} |",
            r.run.label,
            s.overall.tokens_out as f64 / d,
            s.goodput_tokens_per_s,
            pct(s.overall.deadline_miss_rate)
        );
        let mut shares = Vec::new();
        for t in &tiers {
            let share =
                s.tiers.get(t).filter(|g| g.requests > 0).map(|g| g.met_slo as f64 / g.requests as f64);
            shares.extend(share);
            let _ = write!(out, " {} |", pct(share));
        }
        let sum: f64 = shares.iter().sum();
        let sq: f64 = shares.iter().map(|x| x * x).sum();
        let jain = (sq > 0.0).then(|| sum * sum / (shares.len() as f64 * sq));
        let (wl, wm) = r.window.as_ref().map_or(("-".to_string(), "-".to_string()), |w| {
            let l = w.summary.overall.ttft_ms.map_or("-".into(), |t| format!("{:.0} / {:.0}", t.p95, t.p99));
            (l, pct(w.summary.overall.deadline_miss_rate))
        });
        let (hours, per_m, cold) = r.fleet.as_ref().map_or(("-".into(), "-".into(), "-".into()), |f| {
            (
                format!("{:.1}", f.gpu_seconds / 3600.0),
                f.cost_per_1m_output_tokens.map_or("-".into(), |c| format!("{c:.2}")),
                f.cold_starts.to_string(),
            )
        });
        let _ = writeln!(
            out,
            " {} | {wl} | {wm} | {hours} | {per_m} | {cold} |",
            jain.map_or("-".into(), |j| format!("{j:.3}"))
        );
    }
    out
}

/// Per tier, one row per run (Markdown): requests, share that met the SLO,
/// deadline-miss rate of accepted requests, TTFT p95/p99 (and p99 inside
/// `window`, seconds from the start, when given), TLET p95, goodput tokens
/// per second, rejections, degradations, and the tier's share of the work
/// served (prompt + output tokens of requests that finished, inside the
/// window when given): what deficit round-robin apportions; and the p99 of
/// how long refusals took (scheduled send to the end of the error body).
pub fn tiers_table(runs: &[Results], window: Option<(f64, f64)>) -> String {
    let mut out = String::from(
        "| tier | run | reqs | met SLO | miss (accepted) | TTFT p95 | TTFT p99 | TTFT p99 in window | TLET p95 | goodput tok/s | rejected | refusal p99 | degraded | work share |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut tiers: Vec<&String> = runs.iter().flat_map(|r| r.summary.tiers.keys()).collect();
    tiers.sort();
    tiers.dedup();
    let ms = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.0}"));
    for tier in tiers {
        for r in runs {
            let Some(g) = r.summary.tiers.get(tier) else { continue };
            let in_window = window.and_then(|(from, to)| {
                let v: Vec<f64> = r
                    .records
                    .iter()
                    .filter(|x| &x.tier == tier && (from * 1e3..to * 1e3).contains(&x.scheduled_at_ms))
                    .filter_map(|x| x.ttft_ms)
                    .collect();
                Summary::of(&v).map(|s| s.p99)
            });
            let share = |n: u64| if g.requests > 0 { n as f64 / g.requests as f64 * 100.0 } else { 0.0 };
            let inside = |x: &crate::record::Record| {
                x.outcome == crate::record::Outcome::Ok
                    && window.is_none_or(|(from, to)| (from * 1e3..to * 1e3).contains(&x.scheduled_at_ms))
            };
            let work = |only: Option<&str>| -> u64 {
                r.records
                    .iter()
                    .filter(|x| inside(x) && only.is_none_or(|t| x.tier == t))
                    .map(|x| u64::from(x.tokens_in) + u64::from(x.tokens_out))
                    .sum()
            };
            let work_share = work(Some(tier)) as f64 / work(None).max(1) as f64 * 100.0;
            let refusals: Vec<f64> = r
                .records
                .iter()
                .filter(|x| &x.tier == tier && x.outcome == crate::record::Outcome::Rejected)
                .filter_map(|x| x.done_ms)
                .collect();
            let refusal_p99 = Summary::of(&refusals).map(|s| s.p99);
            let _ = writeln!(
                out,
                "| {tier} | {} | {} | {:.1}% | {} | {} | {} | {} | {} | {:.0} | {} ({:.1}%) | {} | {} | {:.1}% |",
                r.run.label,
                g.requests,
                share(g.met_slo),
                g.deadline_miss_rate.map_or("-".into(), |m| format!("{:.1}%", m * 100.0)),
                ms(g.ttft_ms.map(|s| s.p95)),
                ms(g.ttft_ms.map(|s| s.p99)),
                ms(in_window),
                ms(g.tlet_ms.map(|s| s.p95)),
                g.goodput_tokens as f64 / r.run.duration_s.max(1e-9),
                g.rejected,
                share(g.rejected),
                refusal_p99.map_or("-".to_string(), |v| format!("{v:.1} ms")),
                g.degraded,
                work_share,
            );
        }
    }
    out
}

fn trunc(s: &str) -> String {
    s.chars().take(14).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::results::{RunInfo, SCHEMA};
    use crate::summary::{Group, RunSummary, TimeSeries};

    fn results(label: &str, achieved: f64, ttft_p99: f64) -> Results {
        let q = |v: f64| Summary { count: 10, p50: v / 2.0, p90: v, p95: v, p99: v, max: v };
        let overall =
            Group { requests: 10, ok: 10, met_slo: 5, ttft_ms: Some(q(ttft_p99)), ..Group::default() };
        Results {
            schema: SCHEMA.into(),
            run: RunInfo {
                label: label.into(),
                target: "t".into(),
                api: "openai".into(),
                proto: "h2".into(),
                connections: 1,
                workload: "chat".into(),
                schedule: "s".into(),
                duration_s: 1.0,
                seed: 1,
                planned: 10,
                started_unix_s: 0.0,
                harness_version: "0".into(),
            },
            slos: BTreeMap::new(),
            summary: RunSummary {
                duration_s: 1.0,
                offered_rps: 10.0,
                sent_rps: 10.0,
                achieved_rps: achieved,
                goodput_rps: 5.0,
                goodput_tokens_per_s: 0.0,
                schedule_error_ms: None,
                overall,
                tiers: BTreeMap::new(),
                calibration: Vec::new(),
            },
            timeseries: TimeSeries {
                bin_s: 1.0,
                offered_rps: vec![],
                sent_rps: vec![],
                achieved_rps: vec![],
                rejected_rps: vec![],
                failed_rps: vec![],
                ttft_p95_ms: vec![],
                ttft_p95_ms_by_tier: BTreeMap::new(),
            },
            records: vec![],
            fleet: None,
            window: None,
        }
    }

    #[test]
    fn compare_shows_both_values_and_b_over_a() {
        let out = compare(&results("before", 8.0, 100.0), &results("after", 10.0, 250.0));
        let line = |name: &str| {
            out.lines()
                .find(|l| l.starts_with(name))
                .unwrap()
                .split_whitespace()
                .rev()
                .take(3)
                .collect::<Vec<_>>()
        };
        assert!(out.lines().next().unwrap().contains("before") && out.contains("after"));
        assert_eq!(line("achieved req/s"), ["1.250", "10.000", "8.000"]);
        assert_eq!(line("TTFT p99 ms"), ["2.500", "250.000", "100.000"]);
        // No ratio where the baseline is zero or missing.
        assert_eq!(line("rejected"), ["-", "0.000", "0.000"]);
        assert_eq!(line("sched error p99 ms"), ["-", "-", "-"]);
    }
}
