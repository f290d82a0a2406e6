//! The summary of a run, computed from its records: latency percentiles per
//! tier and overall, goodput, deadline misses, rejections, degradations and
//! failures by reason, offered vs achieved rate, and the harness's own
//! scheduling error. Pure functions of the records, so they are tested on
//! hand-made records.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::record::{Outcome, Record};
use crate::stats::Summary;

/// A tier's latency targets, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    pub ttft_ms: f64,
    pub e2e_ms: f64,
}

/// Figures for one tier, or for all requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub requests: u64,
    pub ok: u64,
    pub rejected: u64,
    pub failed: u64,
    pub degraded: u64,
    /// Finished normally within the tier's TTFT and end-to-end budgets.
    pub met_slo: u64,
    /// Of the requests the server accepted (HTTP 200), the share that did
    /// not meet the SLO: late first token, late last token, or cut short.
    pub deadline_miss_rate: Option<f64>,
    pub ttft_ms: Option<Summary>,
    pub tbt_ms: Option<Summary>,
    pub tlet_ms: Option<Summary>,
    pub tokens_in: u64,
    pub tokens_out: u64,
    /// Output tokens of the requests that met the SLO.
    pub goodput_tokens: u64,
    pub rejections: BTreeMap<String, u64>,
    pub degradations: BTreeMap<String, u64>,
    pub failures: BTreeMap<String, u64>,
}

/// The run-level summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// Length of the arrival schedule, seconds.
    pub duration_s: f64,
    /// Scheduled requests per second.
    pub offered_rps: f64,
    /// Requests actually sent per second.
    pub sent_rps: f64,
    /// Requests that finished normally per second.
    pub achieved_rps: f64,
    /// Requests that met their SLO per second.
    pub goodput_rps: f64,
    /// Output tokens of SLO-meeting requests per second.
    pub goodput_tokens_per_s: f64,
    /// Actual minus scheduled send time.
    pub schedule_error_ms: Option<Summary>,
    pub overall: Group,
    pub tiers: BTreeMap<String, Group>,
    /// The admission predictor's calibration (requests with a prediction).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calibration: Vec<crate::calibration::Calibration>,
}

/// Whether `r` finished normally within `slo`.
pub fn met(r: &Record, slo: Option<&Slo>) -> bool {
    let Some(slo) = slo else { return r.outcome == Outcome::Ok };
    r.outcome == Outcome::Ok
        && r.ttft_ms.is_some_and(|t| t <= slo.ttft_ms)
        && r.tlet_ms.or(r.done_ms).is_some_and(|t| t <= slo.e2e_ms)
}

/// Summarises `records` of a schedule `duration_s` long with `planned`
/// requests; tiers without an SLO in `slos` count every OK request as met.
pub fn summarise(
    records: &[Record],
    planned: usize,
    duration_s: f64,
    slos: &BTreeMap<String, Slo>,
) -> RunSummary {
    let mut tiers: BTreeMap<String, Vec<&Record>> = BTreeMap::new();
    for r in records {
        tiers.entry(r.tier.clone()).or_default().push(r);
    }
    let all: Vec<&Record> = records.iter().collect();
    let overall = group(&all, slos);
    let per_s = |n: u64| if duration_s > 0.0 { n as f64 / duration_s } else { 0.0 };
    let sent = records.iter().filter(|r| r.sent_at_ms.is_finite()).count() as u64;
    let errors: Vec<f64> = records.iter().map(Record::schedule_error_ms).filter(|e| e.is_finite()).collect();
    RunSummary {
        duration_s,
        offered_rps: per_s(planned as u64),
        sent_rps: per_s(sent),
        achieved_rps: per_s(overall.ok),
        goodput_rps: per_s(overall.met_slo),
        goodput_tokens_per_s: per_s(overall.goodput_tokens),
        schedule_error_ms: Summary::of(&errors),
        tiers: tiers.iter().map(|(t, rs)| (t.clone(), group(rs, slos))).collect(),
        overall,
        calibration: crate::calibration::of(records),
    }
}

fn group(records: &[&Record], slos: &BTreeMap<String, Slo>) -> Group {
    let mut g = Group { requests: records.len() as u64, ..Group::default() };
    let (mut ttft, mut tbt, mut tlet) = (Vec::new(), Vec::new(), Vec::new());
    let mut accepted = 0u64;
    for r in records {
        let label = || r.reason.clone().unwrap_or_else(|| "unknown".into());
        match r.outcome {
            Outcome::Ok => g.ok += 1,
            Outcome::Rejected => {
                g.rejected += 1;
                *g.rejections.entry(label()).or_default() += 1;
            }
            Outcome::Failed => {
                g.failed += 1;
                *g.failures.entry(label()).or_default() += 1;
            }
        }
        if r.degraded() {
            g.degraded += 1;
            let why = r.admission.reason.clone().unwrap_or_else(|| "unknown".into());
            *g.degradations.entry(why).or_default() += 1;
        }
        accepted += u64::from(r.status == 200);
        g.tokens_in += u64::from(r.tokens_in);
        g.tokens_out += u64::from(r.tokens_out);
        if met(r, slos.get(&r.tier)) {
            g.met_slo += 1;
            g.goodput_tokens += u64::from(r.tokens_out);
        }
        if r.outcome == Outcome::Ok {
            ttft.extend(r.ttft_ms);
            tlet.extend(r.tlet_ms);
            tbt.extend_from_slice(&r.tbt_ms);
        }
    }
    // Requests that met the SLO were all accepted, so this never goes negative.
    g.deadline_miss_rate = (accepted > 0).then(|| (accepted - g.met_slo) as f64 / accepted as f64);
    g.ttft_ms = Summary::of(&ttft);
    g.tbt_ms = Summary::of(&tbt);
    g.tlet_ms = Summary::of(&tlet);
    g
}

/// Per-bin series over the run, for the report's plots.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimeSeries {
    /// Bin width, seconds; bin i covers [i·w, (i+1)·w).
    pub bin_s: f64,
    /// Scheduled requests per second, by scheduled time.
    pub offered_rps: Vec<f64>,
    /// Requests sent per second, by send time.
    pub sent_rps: Vec<f64>,
    /// Requests finished normally per second, by finish time.
    pub achieved_rps: Vec<f64>,
    /// Rejections per second, by scheduled time.
    pub rejected_rps: Vec<f64>,
    /// Failures per second, by scheduled time.
    pub failed_rps: Vec<f64>,
    /// TTFT p95 of the OK requests scheduled in each bin (null if none).
    pub ttft_p95_ms: Vec<Option<f64>>,
    /// The same per tier.
    #[serde(default)]
    pub ttft_p95_ms_by_tier: BTreeMap<String, Vec<Option<f64>>>,
}

/// Bins `records` over `duration_s` (bins of 1 s, wider for runs over 5
/// minutes so there are at most 300). Finishes after the end land in the
/// last bin.
pub fn time_series(records: &[Record], duration_s: f64) -> TimeSeries {
    let bin_s = (duration_s / 300.0).ceil().max(1.0);
    let n = ((duration_s / bin_s).ceil() as usize).max(1);
    let bin = |ms: f64| ((ms / 1e3 / bin_s).floor().max(0.0) as usize).min(n - 1);
    let mut s = TimeSeries {
        bin_s,
        offered_rps: vec![0.0; n],
        sent_rps: vec![0.0; n],
        achieved_rps: vec![0.0; n],
        rejected_rps: vec![0.0; n],
        failed_rps: vec![0.0; n],
        ttft_p95_ms: vec![None; n],
        ttft_p95_ms_by_tier: BTreeMap::new(),
    };
    let mut ttfts = vec![Vec::new(); n];
    let mut by_tier: BTreeMap<&str, Vec<Vec<f64>>> = BTreeMap::new();
    let w = 1.0 / bin_s;
    for r in records {
        let b = bin(r.scheduled_at_ms);
        s.offered_rps[b] += w;
        if r.sent_at_ms.is_finite() {
            s.sent_rps[bin(r.sent_at_ms)] += w;
        }
        match r.outcome {
            Outcome::Ok => {
                s.achieved_rps[bin(r.scheduled_at_ms + r.done_ms.unwrap_or(0.0))] += w;
                ttfts[b].extend(r.ttft_ms);
                by_tier.entry(&r.tier).or_insert_with(|| vec![Vec::new(); n])[b].extend(r.ttft_ms);
            }
            Outcome::Rejected => s.rejected_rps[b] += w,
            Outcome::Failed => s.failed_rps[b] += w,
        }
    }
    let p95 = |bins: &[Vec<f64>]| bins.iter().map(|v| crate::stats::percentile(v, 95.0)).collect();
    s.ttft_p95_ms = p95(&ttfts);
    s.ttft_p95_ms_by_tier = by_tier.into_iter().map(|(t, bins)| (t.to_string(), p95(&bins))).collect();
    s
}

/// The summary of the requests scheduled in `[from_s, to_s)` (a burst, or
/// a steady run after its warm-up): `--window` of `run` and `sim`.
pub fn window(
    records: &[crate::record::Record],
    (from_s, to_s): (f64, f64),
    slos: &std::collections::BTreeMap<String, Slo>,
) -> crate::results::Window {
    let inside: Vec<_> =
        records.iter().filter(|r| (from_s * 1e3..to_s * 1e3).contains(&r.scheduled_at_ms)).cloned().collect();
    let summary = summarise(&inside, inside.len(), to_s - from_s, slos);
    crate::results::Window { from_s, to_s, summary }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: u64, tier: &str, outcome: Outcome, ttft: Option<f64>, tlet: Option<f64>) -> Record {
        let status = match outcome {
            Outcome::Ok => 200,
            Outcome::Rejected => 503,
            Outcome::Failed => 200,
        };
        let mut r = Record::planned(id, tier, 0, id as f64 * 100.0, 10, 3);
        r.sent_at_ms += 0.5;
        r.outcome = outcome;
        r.status = status;
        r.reason = (outcome != Outcome::Ok).then(|| "capacity".into());
        r.ttft_ms = ttft;
        r.tbt_ms = if ttft.is_some() { vec![10.0, 20.0] } else { vec![] };
        r.tlet_ms = tlet;
        r.done_ms = tlet.map(|t| t + 1.0);
        r.tokens_out = if ttft.is_some() { 3 } else { 0 };
        r
    }

    #[test]
    fn summary_math_on_hand_made_records() {
        let slos: BTreeMap<_, _> = [("gold".to_string(), Slo { ttft_ms: 100.0, e2e_ms: 1000.0 })].into();
        let mut degraded = rec(4, "gold", Outcome::Ok, Some(50.0), Some(900.0));
        degraded.admission.decision = Some("degraded".into());
        degraded.admission.reason = Some("max_tokens_lowered".into());
        let records = vec![
            rec(0, "gold", Outcome::Ok, Some(50.0), Some(500.0)), // met
            rec(1, "gold", Outcome::Ok, Some(150.0), Some(500.0)), // late first token
            rec(2, "gold", Outcome::Ok, Some(50.0), Some(1500.0)), // late last token
            rec(3, "gold", Outcome::Rejected, None, None),
            degraded,                                                  // met
            rec(5, "bronze", Outcome::Ok, Some(5000.0), Some(9000.0)), // no SLO known: met
            rec(6, "bronze", Outcome::Failed, Some(10.0), None),       // cut short: a miss
        ];
        let s = summarise(&records, 8, 2.0, &slos);
        let gold = &s.tiers["gold"];
        assert_eq!((gold.requests, gold.ok, gold.rejected, gold.failed, gold.degraded), (5, 4, 1, 0, 1));
        assert_eq!(gold.met_slo, 2);
        assert_eq!(gold.deadline_miss_rate, Some(0.5));
        assert_eq!(gold.rejections, [("capacity".to_string(), 1)].into());
        assert_eq!(gold.degradations, [("max_tokens_lowered".to_string(), 1)].into());
        let ttft = gold.ttft_ms.unwrap();
        assert_eq!((ttft.count, ttft.p50, ttft.max), (4, 50.0, 150.0));
        assert_eq!(gold.tbt_ms.unwrap().count, 8);
        assert_eq!(gold.goodput_tokens, 6);
        let bronze = &s.tiers["bronze"];
        assert_eq!((bronze.met_slo, bronze.deadline_miss_rate), (1, Some(0.5)));
        assert_eq!(bronze.failures, [("capacity".to_string(), 1)].into());
        assert_eq!(s.overall.requests, 7);
        assert_eq!(s.overall.met_slo, 3);
        assert_eq!((s.offered_rps, s.sent_rps, s.achieved_rps, s.goodput_rps), (4.0, 3.5, 2.5, 1.5));
        assert_eq!(s.goodput_tokens_per_s, 4.5);
        let e = s.schedule_error_ms.unwrap();
        assert_eq!((e.p50, e.max), (0.5, 0.5));
    }

    #[test]
    fn time_series_bins_by_the_right_clock() {
        let records = vec![
            rec(0, "gold", Outcome::Ok, Some(40.0), Some(1200.0)), // scheduled 0 s, done 1.201 s
            rec(5, "gold", Outcome::Ok, Some(80.0), Some(100.0)),  // scheduled 0.5 s
            rec(12, "gold", Outcome::Rejected, None, None),        // scheduled 1.2 s
        ];
        let ts = time_series(&records, 3.0);
        assert_eq!(ts.bin_s, 1.0);
        assert_eq!(ts.offered_rps, vec![2.0, 1.0, 0.0]);
        assert_eq!(ts.achieved_rps, vec![1.0, 1.0, 0.0]);
        assert_eq!(ts.rejected_rps, vec![0.0, 1.0, 0.0]);
        assert_eq!(ts.ttft_p95_ms, vec![Some(80.0), None, None]);
        assert_eq!(ts.ttft_p95_ms_by_tier["gold"], vec![Some(80.0), None, None]);
        assert_eq!(time_series(&records, 900.0).bin_s, 3.0);
    }
}
