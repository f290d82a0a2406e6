//! The admission predictor's calibration, from a run's records: for every
//! engine class and tier, the observed TTFT and end-to-end latency of the
//! requests admission predicted (the `x-predicted-ttft-ms` and
//! `x-predicted-e2e-ms` headers, the simulator's same values) against those
//! predictions: quantiles of both, the share of requests that came in at or
//! under their prediction (coverage), and the median observed / predicted.
//! A predictor that over-predicts shows a coverage near 100% and a median
//! ratio well under 1; one that under-predicts, a coverage under the
//! quantile it claims.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::record::{Outcome, Record};
use crate::stats::{sorted_percentile, Summary};

/// One quantity (TTFT or E2E) of one class and tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub class: String,
    /// A tier, or `all`.
    pub tier: String,
    /// `ttft` or `e2e`.
    pub what: String,
    pub observed_ms: Summary,
    pub predicted_ms: Summary,
    /// Share of requests with observed <= predicted.
    pub coverage: f64,
    /// Median of observed / predicted.
    pub ratio_p50: f64,
}

/// (class, tier, measure): a row.
type Key = (String, String, &'static str);

/// The calibration rows of `records` (finished requests with a prediction),
/// by class, then tier (`all` last), TTFT before E2E.
pub fn of(records: &[Record]) -> Vec<Calibration> {
    let mut pairs: BTreeMap<Key, Vec<(f64, f64)>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.outcome == Outcome::Ok) {
        let class = r.admission.engine_class.clone().unwrap_or_else(|| "-".into());
        let measures = [
            ("ttft", r.ttft_ms, r.admission.predicted_ttft_ms),
            ("e2e", r.tlet_ms, r.admission.predicted_e2e_ms),
        ];
        for (what, observed, predicted) in measures {
            let (Some(o), Some(p)) = (observed, predicted.filter(|p| *p > 0.0)) else { continue };
            for tier in [r.tier.clone(), "~all".into()] {
                pairs.entry((class.clone(), tier, what)).or_default().push((o, p));
            }
        }
    }
    pairs
        .into_iter()
        .filter_map(|((class, tier, what), v)| {
            let observed: Vec<f64> = v.iter().map(|p| p.0).collect();
            let predicted: Vec<f64> = v.iter().map(|p| p.1).collect();
            let mut ratios: Vec<f64> = v.iter().map(|(o, p)| o / p).collect();
            ratios.sort_by(f64::total_cmp);
            let covered = v.iter().filter(|(o, p)| o <= p).count();
            Some(Calibration {
                class,
                tier: tier.trim_start_matches('~').to_string(),
                what: what.to_string(),
                observed_ms: Summary::of(&observed)?,
                predicted_ms: Summary::of(&predicted)?,
                coverage: covered as f64 / v.len() as f64,
                ratio_p50: sorted_percentile(&ratios, 50.0)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Admission;

    fn rec(tier: &str, ttft: f64, predicted: f64) -> Record {
        let mut r = Record::planned(0, tier, 0, 0.0, 10, 10);
        r.outcome = Outcome::Ok;
        r.ttft_ms = Some(ttft);
        r.tlet_ms = Some(ttft * 10.0);
        r.admission = Admission {
            predicted_ttft_ms: Some(predicted),
            predicted_e2e_ms: Some(predicted * 20.0),
            engine_class: Some("a100".into()),
            ..Admission::default()
        };
        r
    }

    #[test]
    fn coverage_and_ratio_per_tier_and_overall() {
        // gold: 3 of 4 within their prediction; bronze: all 2 at half.
        let rs = vec![
            rec("gold", 100.0, 200.0),
            rec("gold", 150.0, 200.0),
            rec("gold", 200.0, 200.0),
            rec("gold", 300.0, 200.0),
            rec("bronze", 50.0, 100.0),
            rec("bronze", 50.0, 100.0),
        ];
        let rows = of(&rs);
        let get = |tier: &str, what: &str| rows.iter().find(|c| c.tier == tier && c.what == what).unwrap();
        let gold = get("gold", "ttft");
        assert_eq!(gold.coverage, 0.75);
        assert_eq!(gold.observed_ms.count, 4);
        assert_eq!(get("bronze", "ttft").ratio_p50, 0.5);
        assert_eq!(get("all", "ttft").observed_ms.count, 6);
        assert_eq!(get("gold", "e2e").coverage, 1.0, "e2e predicted at 20x, observed at 10x");
        assert_eq!(rows.last().unwrap().tier, "all", "all after the tiers");
    }
}
