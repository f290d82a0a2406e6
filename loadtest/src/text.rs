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

/// The simulator's calibration against a live run of the same scenario
/// (Markdown): per tier and overall, TTFT p50 and p95, goodput tokens per
/// second and the deadline-miss rate of accepted requests, live and
/// simulated, with the simulator's error. Latencies and goodput agree when
/// within `tolerance` (relative); a rate agrees when within `tolerance`
/// relative or one percentage point absolute (a miss rate of 0.2% against
/// 0.1% is not a 100% error). Returns the table and whether all agree.
pub fn calibration(live: &Results, sim: &Results, tolerance: f64) -> (String, bool) {
    let mut out = String::from(
        "| tier | figure | live | simulated | sim / live | agrees |\n|---|---|---:|---:|---:|:---:|\n",
    );
    let mut all = true;
    let mut groups: Vec<(&str, &crate::summary::Group, &crate::summary::Group, f64, f64)> = Vec::new();
    for (tier, g) in &live.summary.tiers {
        if let Some(s) = sim.summary.tiers.get(tier) {
            let d = live.summary.duration_s.max(1e-9);
            groups.push((tier, g, s, g.goodput_tokens as f64 / d, s.goodput_tokens as f64 / d));
        }
    }
    groups.push((
        "all",
        &live.summary.overall,
        &sim.summary.overall,
        live.summary.goodput_tokens_per_s,
        sim.summary.goodput_tokens_per_s,
    ));
    for (tier, l, s, gl, gs) in groups {
        let rows: [(&str, Option<f64>, Option<f64>, bool); 4] = [
            ("TTFT p50 ms", l.ttft_ms.map(|x| x.p50), s.ttft_ms.map(|x| x.p50), false),
            ("TTFT p95 ms", l.ttft_ms.map(|x| x.p95), s.ttft_ms.map(|x| x.p95), false),
            ("goodput tok/s", Some(gl), Some(gs), false),
            ("deadline-miss rate", l.deadline_miss_rate, s.deadline_miss_rate, true),
        ];
        for (name, a, b, rate) in rows {
            let (Some(a), Some(b)) = (a, b) else { continue };
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
