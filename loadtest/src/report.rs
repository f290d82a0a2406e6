//! The HTML report: one self-contained file (inline SVG, inline CSS, no
//! scripts) with the summary tables and the plots a load tester reads first:
//! latency CDFs per tier, offered vs achieved rate over time, TTFT p95 over
//! time against the tier budgets, and rejections and failures over time.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::record::{Outcome, Record};
use crate::results::Results;
use crate::stats::Summary;
use crate::summary::Group;
use crate::svg::{cdf, esc, Chart, Reference, Series};

/// Renders `r` as an HTML page.
pub fn html(r: &Results) -> String {
    let s = &r.summary;
    let title = format!("loadtest: {} — {}", r.run.label, r.run.workload);
    let mut out = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{}</title><style>{CSS}</style></head><body><h1>{}</h1>",
        esc(&title),
        esc(&title)
    );
    let _ = write!(
        out,
        "<p>Target <code>{}</code> ({} over {}, {} connection(s)); schedule: {}; seed {}; {} requests planned; harness {}.</p>",
        esc(&r.run.target),
        esc(&r.run.api),
        esc(&r.run.proto),
        r.run.connections,
        esc(&r.run.schedule),
        r.run.seed,
        r.run.planned,
        esc(&r.run.harness_version)
    );
    let sched = s
        .schedule_error_ms
        .map_or("-".into(), |e| format!("p50 {:.3} / p99 {:.3} / max {:.3} ms", e.p50, e.p99, e.max));
    let _ = write!(
        out,
        "<table><tr><th>offered</th><th>sent</th><th>achieved</th><th>goodput</th><th>goodput tokens</th><th>harness scheduling error</th></tr>\
         <tr><td>{:.1} req/s</td><td>{:.1} req/s</td><td>{:.1} req/s</td><td>{:.1} req/s</td><td>{:.0} tok/s</td><td>{sched}</td></tr></table>",
        s.offered_rps, s.sent_rps, s.achieved_rps, s.goodput_rps, s.goodput_tokens_per_s
    );
    out.push_str(&tier_table(r));
    out.push_str(&reasons_table(r));
    out.push_str(&calibration_table(r));
    out.push_str("<h2>Latency distributions</h2><div class=\"grid\">");
    for (what, pick) in METRICS {
        out.push_str(&cdf_chart(r, what, *pick).render());
    }
    out.push_str("</div><h2>Over time</h2><div class=\"grid\">");
    out.push_str(&rate_chart(r).render());
    out.push_str(&ttft_chart(r).render());
    out.push_str(&rejection_chart(r).render());
    if let Some(f) = &r.fleet {
        out.push_str(&fleet_chart(f).render());
    }
    out.push_str("</div>");
    if let Some(f) = &r.fleet {
        out.push_str(&fleet_table(f));
    }
    out.push_str("</body></html>\n");
    out
}

const CSS: &str = "body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:12px 0}\
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f4f4f4}td:first-child{text-align:left}\
.grid{display:flex;flex-wrap:wrap;gap:12px}code{background:#f4f4f4;padding:1px 4px}";

type Pick = fn(&Record) -> Vec<f64>;

const METRICS: &[(&str, Pick)] = &[
    ("TTFT", |r| r.ttft_ms.into_iter().collect()),
    ("TLET (time to last token)", |r| r.tlet_ms.into_iter().collect()),
    ("time between tokens", |r| r.tbt_ms.clone()),
];

fn fmt_summary(s: Option<Summary>) -> String {
    s.map_or("<td>-</td><td>-</td><td>-</td>".into(), |s| {
        format!("<td>{:.1}</td><td>{:.1}</td><td>{:.1}</td>", s.p50, s.p95, s.p99)
    })
}

fn calibration_table(r: &Results) -> String {
    let rows = &r.summary.calibration;
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<h2>Predictor calibration</h2><table><tr><th>engine class</th><th>tier</th><th>measure</th><th>requests</th>\
         <th>observed p50</th><th>p95</th><th>p99</th><th>predicted p50</th><th>p95</th><th>p99</th>\
         <th>observed &le; predicted</th><th>observed / predicted p50</th></tr>",
    );
    for c in rows {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{:.1}%</td><td>{:.2}</td></tr>",
            esc(&c.class),
            esc(&c.tier),
            esc(&c.what),
            c.observed_ms.count,
            c.observed_ms.p50,
            c.observed_ms.p95,
            c.observed_ms.p99,
            c.predicted_ms.p50,
            c.predicted_ms.p95,
            c.predicted_ms.p99,
            c.coverage * 100.0,
            c.ratio_p50
        );
    }
    out.push_str(
        "</table><p>Admitted requests that finished, against the TTFT and end-to-end latency admission predicted for them \
         (the quantile it is set to, times the guard factor γ; milliseconds). Coverage near 100% with a ratio well under 1 \
         means the predictor over-predicts and refuses work it could serve.</p>",
    );
    out
}

fn tier_table(r: &Results) -> String {
    let mut out = String::from(
        "<h2>Per tier</h2><table><tr><th>tier</th><th>requests</th><th>ok</th><th>rejected</th><th>failed</th><th>degraded</th>\
         <th>met SLO</th><th>deadline-miss rate</th><th>TTFT p50</th><th>p95</th><th>p99</th><th>TBT p50</th><th>p95</th><th>p99</th>\
         <th>TLET p50</th><th>p95</th><th>p99</th><th>SLO (TTFT / E2E ms)</th></tr>",
    );
    let rows = r.summary.tiers.iter().map(|(t, g)| (t.as_str(), g)).chain([("all", &r.summary.overall)]);
    for (tier, g) in rows {
        let slo = r.slos.get(tier).map_or("-".into(), |s| format!("{:.0} / {:.0}", s.ttft_ms, s.e2e_ms));
        let miss = g.deadline_miss_rate.map_or("-".into(), |m| format!("{:.1}%", m * 100.0));
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{miss}</td>{}{}{}<td>{slo}</td></tr>",
            esc(tier),
            g.requests,
            g.ok,
            g.rejected,
            g.failed,
            g.degraded,
            g.met_slo,
            fmt_summary(g.ttft_ms),
            fmt_summary(g.tbt_ms),
            fmt_summary(g.tlet_ms)
        );
    }
    out.push_str("</table><p>Latencies in milliseconds from each request's scheduled send time.</p>");
    out
}

fn reasons_table(r: &Results) -> String {
    let g: &Group = &r.summary.overall;
    let mut out = String::from("<h2>Rejections, degradations and failures by reason</h2><table><tr><th>kind</th><th>reason</th><th>count</th></tr>");
    let kinds: [(&str, &BTreeMap<String, u64>); 3] =
        [("rejected", &g.rejections), ("degraded", &g.degradations), ("failed", &g.failures)];
    let mut any = false;
    for (kind, map) in kinds {
        for (reason, n) in map {
            any = true;
            let _ = write!(out, "<tr><td>{kind}</td><td>{}</td><td>{n}</td></tr>", esc(reason));
        }
    }
    if !any {
        out.push_str("<tr><td colspan=\"3\">none</td></tr>");
    }
    out.push_str("</table>");
    out
}

fn cdf_chart(r: &Results, what: &str, pick: Pick) -> Chart {
    let mut by_tier: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for rec in r.records.iter().filter(|x| x.outcome == Outcome::Ok) {
        by_tier.entry(&rec.tier).or_default().extend(pick(rec));
    }
    Chart {
        title: format!("{what} CDF per tier"),
        x_label: "milliseconds (log scale)".into(),
        y_label: "fraction of requests".into(),
        log_x: true,
        series: by_tier
            .into_iter()
            .map(|(t, v)| Series { name: t.to_string(), points: cdf(&v, 400) })
            .collect(),
        references: Vec::new(),
    }
}

fn over_time(bin_s: f64, v: &[f64]) -> Vec<(f64, Option<f64>)> {
    v.iter().enumerate().map(|(i, &y)| ((i as f64 + 0.5) * bin_s, Some(y))).collect()
}

fn rate_chart(r: &Results) -> Chart {
    let ts = &r.timeseries;
    let s = |name: &str, v: &[f64]| Series { name: name.into(), points: over_time(ts.bin_s, v) };
    Chart {
        title: "offered vs achieved rate".into(),
        x_label: "seconds".into(),
        y_label: "requests per second".into(),
        series: vec![
            s("offered", &ts.offered_rps),
            s("sent", &ts.sent_rps),
            s("achieved (ok)", &ts.achieved_rps),
        ],
        ..Chart::default()
    }
}

fn ttft_chart(r: &Results) -> Chart {
    let ts = &r.timeseries;
    let line =
        |v: &[Option<f64>]| v.iter().enumerate().map(|(i, &y)| ((i as f64 + 0.5) * ts.bin_s, y)).collect();
    let tiers: Vec<(&String, &Vec<Option<f64>>)> = ts.ttft_p95_ms_by_tier.iter().collect();
    // Each tier's budget is drawn dashed in the tier's colour.
    let references = tiers
        .iter()
        .enumerate()
        .filter_map(|(i, (t, _))| {
            let slo = r.slos.get(*t)?;
            Some(Reference { name: format!("{t} budget"), y: slo.ttft_ms, like_series: Some(i) })
        })
        .collect();
    Chart {
        title: "TTFT p95 over time".into(),
        x_label: "seconds (scheduled send time)".into(),
        y_label: "milliseconds".into(),
        series: tiers.iter().map(|(t, v)| Series { name: t.to_string(), points: line(v) }).collect(),
        references,
        ..Chart::default()
    }
}

/// Engines over time: serving, warm, starting, draining, the autoscaler's
/// serving target and the brownout level.
fn fleet_chart(f: &crate::results::Fleet) -> Chart {
    let line = |v: &[f64]| v.iter().enumerate().map(|(i, &y)| (i as f64 * f.bin_s, Some(y))).collect();
    let mut series = vec![
        Series { name: "serving".into(), points: line(&f.serving) },
        Series { name: "warm".into(), points: line(&f.warm) },
        Series { name: "starting".into(), points: line(&f.starting) },
        Series { name: "draining".into(), points: line(&f.draining) },
        Series { name: "target (serving)".into(), points: line(&f.desired) },
    ];
    if f.brownout.iter().any(|&b| b > 0.0) {
        series.push(Series { name: "brownout level".into(), points: line(&f.brownout) });
    }
    Chart {
        title: format!("engines over time ({})", f.backend),
        x_label: "seconds".into(),
        y_label: "engines".into(),
        series,
        ..Chart::default()
    }
}

fn fleet_table(f: &crate::results::Fleet) -> String {
    let mut out = format!(
        "<h2>Fleet</h2><table><tr><th>GPU-seconds</th><th>cost</th><th>output tokens</th><th>$ / 1M output tokens</th><th>device utilization</th><th>cold starts</th></tr>\
         <tr><td>{:.0}</td><td>${:.2}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr></table>",
        f.gpu_seconds,
        f.cost_usd,
        f.output_tokens,
        f.cost_per_1m_output_tokens.map_or("-".into(), |c| format!("${c:.3}")),
        f.device_utilization.map_or("-".into(), |u| format!("{:.1}%", u * 100.0)),
        f.cold_starts
    );
    if !f.decisions.is_empty() {
        out.push_str("<h3>Autoscaling decisions</h3><table><tr><th>at s</th><th>serving</th><th>warm</th><th>why</th></tr>");
        for d in f.decisions.iter().take(200) {
            out.push_str(&format!(
                "<tr><td>{:.0}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                d.at_s,
                d.serving,
                d.warm,
                esc(&d.why)
            ));
        }
        out.push_str("</table>");
    }
    out
}

fn rejection_chart(r: &Results) -> Chart {
    let ts = &r.timeseries;
    Chart {
        title: "rejections and failures over time".into(),
        x_label: "seconds (scheduled send time)".into(),
        y_label: "per second".into(),
        series: vec![
            Series { name: "rejected".into(), points: over_time(ts.bin_s, &ts.rejected_rps) },
            Series { name: "failed".into(), points: over_time(ts.bin_s, &ts.failed_rps) },
        ],
        ..Chart::default()
    }
}
