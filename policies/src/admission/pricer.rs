//! Pricing one request on the engines of one class: a free slot (joining
//! the batch after the engine's prefill backlog), a preempting start, or
//! the wait at the gate ([`gate_wait_ms`]).

use super::{Ask, Candidate, Fit};
use crate::estimate::{EstimatorConfig, ServiceModel, ServiceTime};

/// Prices one request (`ask` with `out` output tokens) on the engines of
/// one class.
pub(super) struct Pricer<'a> {
    model: &'a ServiceModel,
    ask: &'a Ask<'a>,
    out: u32,
    /// Decode cost factor of temperature sampling (1 for greedy).
    sample: f64,
    est: &'a EstimatorConfig,
    /// Predictions depend on an engine only through its batch size:
    /// computed once per size, not once per engine.
    memo: std::cell::RefCell<Vec<Option<ServiceTime>>>,
}

impl<'a> Pricer<'a> {
    pub(super) fn new(
        model: &'a ServiceModel,
        ask: &'a Ask<'a>,
        out: u32,
        sample: f64,
        est: &'a EstimatorConfig,
    ) -> Self {
        Self { model, ask, out, sample, est, memo: Default::default() }
    }

    #[inline]
    pub(super) fn predict(&self, e: &Candidate) -> ServiceTime {
        let (ask, out) = (self.ask, self.out);
        let b = (e.active + 1).min(e.slots.max(1));
        if e.cached_tokens > 0 {
            // A cached prefix: prefill of the rest only (not memoised: it
            // is this engine's own).
            return self.model.predict_cached(
                ask.tier,
                ask.n_in,
                e.cached_tokens,
                out,
                f64::from(b),
                self.est,
            );
        }
        let mut c = self.memo.borrow_mut();
        if c.len() <= b as usize {
            c.resize(b as usize + 1, None);
        }
        *c[b as usize]
            .get_or_insert_with(|| self.model.predict(ask.tier, ask.n_in, out, f64::from(b), self.est))
    }

    /// The fit on `e` after `wait` raw (profile) milliseconds; the TTFT
    /// calibration covers what the raw wait misses.
    #[inline]
    pub(super) fn finish(&self, e: &Candidate, s: &ServiceTime, wait: f64) -> Fit {
        let ttft = s.ttft_ms(wait);
        let decode = s.decode_ms * self.sample;
        Fit {
            engine: (e.active < e.slots).then_some(e.idx),
            ttft_ms: ttft,
            e2e_ms: ttft + decode,
            wait_ms: (ttft - s.prefill_ms * s.guard).max(0.0),
            nominal_ttft_ms: s.nominal_ttft_ms(wait),
            per_token_ms: decode / f64::from(self.out.max(1)),
            cached: e.cached_tokens,
            preempts: false,
        }
    }

    /// The best engine to start on by pausing a lower tier's sequence:
    /// every slot taken, fewer requests started over its slots than it has
    /// lower-tier sequences to pause; the request joins at the next token
    /// boundary, after the prefill backlog.
    pub(super) fn best_preempting(&self, of_class: &[&Candidate]) -> Option<Fit> {
        of_class
            .iter()
            .filter(|e| e.active >= e.slots && e.active - e.slots < e.preemptible)
            .map(|e| Fit { engine: Some(e.idx), preempts: true, ..self.joining(e) })
            .min_by(|a, b| a.ttft_ms.total_cmp(&b.ttft_ms).then(a.e2e_ms.total_cmp(&b.e2e_ms)))
    }

    /// The best of the engines with a free slot now (their prefill backlog,
    /// then a step to join the batch), keeping a long prompt to the long
    /// lane when `lane_only`. Those meeting the budgets first, then the
    /// most cached prefix (prefill the fleet does not repeat), then the
    /// earliest finish; without credited caches, the earliest finish.
    #[inline]
    pub(super) fn best_free(&self, of_class: &[&Candidate], lane_only: bool) -> Option<Fit> {
        let ask = self.ask;
        // Once per call, not per engine: the lane can sit anywhere in the
        // (rotated) list, and a scan per engine made this quadratic.
        let keep_to_lane = lane_only && ask.long && of_class.iter().any(|c| c.long_lane);
        // A long prompt mostly cached on an engine is no long prefill there.
        let short_there = |e: &Candidate| u64::from(e.cached_tokens) * 2 >= u64::from(ask.n_in);
        let lane_ok = |e: &&&Candidate| !keep_to_lane || e.long_lane || short_there(e);
        let feasible = |f: &Fit| f.ttft_ms <= ask.ttft_budget_ms && f.e2e_ms <= ask.e2e_budget_ms;
        let better = |a: &Fit, b: &Fit| {
            (!feasible(a), std::cmp::Reverse(a.cached))
                .cmp(&(!feasible(b), std::cmp::Reverse(b.cached)))
                .then(a.e2e_ms.total_cmp(&b.e2e_ms))
        };
        of_class.iter().filter(|e| e.active < e.slots).filter(lane_ok).map(|e| self.joining(e)).min_by(better)
    }

    /// The fit on `e` joining its batch at the next token boundary after
    /// the prefill backlog dispatched there.
    #[inline]
    fn joining(&self, e: &Candidate) -> Fit {
        let s = self.predict(e);
        let backlog = if e.prefill_backlog_tokens > 0 {
            self.model.backlog_raw_ms(e.prefill_backlog_tokens.min(u64::from(u32::MAX)) as u32)
        } else {
            0.0
        };
        self.finish(e, &s, backlog + s.step_raw_ms)
    }
}

/// The raw wait at the gateway for a slot of the class `of_class`: the
/// output tokens served before it (`ahead`) plus half a mean running output
/// (the residual to the first slot release), over the class's decode
/// throughput Σ slots / step(slots).
pub(super) fn gate_wait_ms(model: &ServiceModel, of_class: &[&Candidate], ahead: f64, n_in: u32) -> f64 {
    let mut full_step: Vec<(u32, f64)> = Vec::new(); // by slot count
    let mu: f64 = of_class
        .iter()
        .map(|e| {
            let slots = e.slots.max(1);
            let step = match full_step.iter().find(|(s, _)| *s == slots) {
                Some(&(_, step)) => step,
                None => {
                    let step = model.step_raw_ms(f64::from(slots), f64::from(n_in));
                    full_step.push((slots, step));
                    step
                }
            };
            f64::from(slots) / step.max(1e-3)
        })
        .sum();
    let (active, out_tokens) =
        of_class.iter().fold((0u64, 0u64), |(a, o), e| (a + u64::from(e.active), o + e.active_out_tokens));
    let mean_out = if active > 0 { out_tokens as f64 / active as f64 } else { 0.0 };
    (ahead + mean_out / 2.0) / mu
}
