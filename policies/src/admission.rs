//! Admission: admit, degrade or reject one request against its tier's SLO.
//!
//! The prediction for a request on an engine class:
//! - **wait**: on an engine with a free decode slot, the prefill backlog
//!   already dispatched there plus one decode step (the batch-fill time: a
//!   new sequence joins the running batch at the next token boundary). When
//!   every slot is busy the request waits at the gateway, and its wait is
//!   the output work served before it (its deficit round-robin position, see
//!   [`crate::fairness`]) plus half a mean output (the residual time to the
//!   first slot release), over the class's decode throughput
//!   `μ = Σ slots / step(slots)`.
//! - **TTFT** = wait + prefill(n_in); **E2E** = TTFT + decode(n_out), with
//!   the estimator's high-quantile × γ predictions ([`crate::estimate`]).
//!
//! A request is feasible when TTFT ≤ D_TTFT and E2E ≤ D_E2E. If not, the
//! tier's degradation ladder is walked in its configured order, each step
//! applied only when it helps: `reduce_output` lowers `max_tokens` to what
//! fits D_E2E, never below the tier's floor; `greedy` switches sampling off
//! (it saves the sampling pass); `faster_class` moves the request to the
//! tier's overflow engine class. When nothing works it is rejected with the
//! reason and a Retry-After equal to the predicted time for the excess wait
//! to drain. Every decision carries its prediction and reason.
//!
//! **Priority preemption** (`[admission] preempt_lower_tiers`): when
//! neither a free slot nor the wait at the gate meets a request's budgets,
//! it may start on an engine whose slots are all taken if a sequence of a
//! strictly lower tier runs there: the engine pauses that sequence at the
//! next token boundary (its KV kept; [`crate::preempt`] picks which,
//! bounded per sequence and never past the victim's own end-to-end
//! budget). Predicted as a free slot after one decode step; reason
//! `preempts_lower_tier`.

use serde::Deserialize;

use crate::estimate::{EstimatorConfig, ServiceModel};

mod pricer;
use pricer::{gate_wait_ms, Pricer};

/// `[admission] mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdmissionMode {
    /// Predict, degrade, reject (the product).
    Slo,
    /// Admit everything at once (the FCFS baselines of the benchmark).
    Off,
}

/// `[admission]` in the policy document.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    pub mode: AdmissionMode,
    /// Retry-After bounds, seconds.
    pub retry_after_min_s: u32,
    pub retry_after_max_s: u32,
    /// Decode cost factor of temperature sampling over greedy decoding.
    pub sampling_cost: f64,
    /// Smallest accepted `x-slo-*-ms` hint.
    pub min_hint_ms: u32,
    /// A request waiting at the gateway is re-checked when a slot frees; it
    /// is refused instead of started when its predicted TTFT by then exceeds
    /// its budget times this factor.
    pub recheck_factor: f64,
    /// Priority preemption at token boundaries: a request whose TTFT no
    /// free slot and no wait at the gate can meet is started on an engine
    /// whose slots are taken, if a running sequence of a strictly lower
    /// tier (lower `priority_weight`) there can be paused for it (native
    /// engines only; `policies::preempt` on the engine picks which).
    pub preempt_lower_tiers: bool,
    /// Times one sequence may be paused for a higher tier (1..=8).
    pub max_pauses: u32,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            mode: AdmissionMode::Slo,
            retry_after_min_s: 1,
            retry_after_max_s: 30,
            sampling_cost: 1.05,
            min_hint_ms: 50,
            recheck_factor: 1.0,
            preempt_lower_tiers: false,
            max_pauses: 2,
        }
    }
}

impl AdmissionConfig {
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.retry_after_min_s == 0 || self.retry_after_max_s < self.retry_after_min_s {
            return Err((
                "admission.retry_after_max_s",
                "need 1 <= retry_after_min_s <= retry_after_max_s".into(),
            ));
        }
        if !(self.sampling_cost.is_finite() && (1.0..=4.0).contains(&self.sampling_cost)) {
            return Err(("admission.sampling_cost", "must be in [1, 4]".into()));
        }
        if !(self.recheck_factor.is_finite() && self.recheck_factor >= 1.0) {
            return Err(("admission.recheck_factor", "must be >= 1".into()));
        }
        if !(1..=8).contains(&self.max_pauses) {
            return Err(("admission.max_pauses", "must be in [1, 8]".into()));
        }
        Ok(())
    }
}

/// One rung of the degradation ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Degradation {
    /// Lower `max_tokens` to what fits the end-to-end budget (not below the
    /// tier's floor).
    ReduceOutput,
    /// Switch temperature sampling off.
    Greedy,
    /// Move to the tier's overflow engine class.
    FasterClass,
}

impl Degradation {
    pub fn label(self) -> &'static str {
        match self {
            Degradation::ReduceOutput => "reduce_output",
            Degradation::Greedy => "greedy",
            Degradation::FasterClass => "faster_class",
        }
    }
}

/// A tier's answer to a request whose SLO no engine could meet even idle:
/// serve it anyway, saying so (`x-admission: degraded`, reason
/// `slo_unattainable`), or refuse it with a 4xx that names the prediction
/// and the budget (no Retry-After: retrying never helps). `overload`
/// answers it as an overload (503 and a Retry-After), as before this
/// distinction existed: the default of a tier that does not choose; the
/// shipped policy chooses for every tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unattainable {
    BestEffort,
    Refuse,
    #[default]
    Overload,
}

/// One engine as admission sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Index of the engine in the caller's list.
    pub idx: usize,
    /// Index of its class in the `models` slice.
    pub class: usize,
    /// Decode slots (its maximum batch).
    pub slots: u32,
    /// Sequences the gateway has running or prefilling there.
    pub active: u32,
    /// Expected output tokens of those sequences, summed.
    pub active_out_tokens: u64,
    /// Prompt tokens dispatched there that have not produced a first token.
    pub prefill_backlog_tokens: u64,
    /// KV capacity left above its low watermark, in tokens.
    pub kv_headroom_tokens: u64,
    /// Part of the long-prompt lane.
    pub long_lane: bool,
    /// Leading prompt tokens this engine is credited with holding in its
    /// prefix cache ([`credit_prefix`]): its prefill is predicted without
    /// them. 0 when unknown or when affinity yields to load.
    pub cached_tokens: u32,
    /// Sequences of strictly lower tiers than the request's running or
    /// prefilling there, which a preempting start may pause (0 when the
    /// engine cannot pause sequences, or preemption is off).
    pub preemptible: u32,
}

/// Credits the engines of one decision with what they hold of a prompt
/// of `blocks` full blocks and `n_in` tokens, `matched[idx]` leading blocks
/// per engine index (the prefix index's answer; shorter or empty: none).
///
/// - Admission on, `cands`: each candidate's `cached_tokens`, as
///   [`crate::prefix::credited`] allows (none for an engine whose in-flight
///   work — prefill backlog plus expected output — is far above the least
///   loaded's, none at all when no match is long enough), so load decides
///   there. A prompt's last token is always computed: at most `n_in - 1`.
/// - Admission off, `views`: each view's `cached_blocks`, which the
///   `cache_aware` route weighs itself.
pub fn credit_prefix(
    cands: &mut [Candidate],
    views: &mut [crate::routing::EngineView],
    matched: &[u32],
    (blocks, n_in): (u32, u32),
    cfg: &crate::prefix::AffinityConfig,
) {
    let at = |idx: usize| matched.get(idx).copied().unwrap_or(0);
    for (i, v) in views.iter_mut().enumerate() {
        v.cached_blocks = at(i);
    }
    if matched.is_empty() || cands.is_empty() {
        return; // nothing cached anywhere: no credit to weigh (and no allocation)
    }
    let choices: Vec<crate::prefix::Choice> = cands
        .iter()
        .map(|c| crate::prefix::Choice {
            idx: c.idx,
            matched_blocks: at(c.idx),
            load: c.prefill_backlog_tokens + c.active_out_tokens,
        })
        .collect();
    let credit = crate::prefix::credited(&choices, blocks, cfg);
    for (c, m) in cands.iter_mut().zip(credit) {
        c.cached_tokens = (m * cfg.block_tokens).min(n_in.saturating_sub(1));
    }
}

/// The request, as admission sees it (tier limits and brownout caps
/// already applied by the caller).
#[derive(Debug, Clone, PartialEq)]
pub struct Ask<'a> {
    /// The request's tier (TTFT calibration is per tier).
    pub tier: &'a str,
    pub n_in: u32,
    pub max_tokens: u32,
    /// Expected output ([`crate::estimate::OutputHistory::expected`]).
    pub expected_out: u32,
    /// `reduce_output` never goes below this.
    pub output_floor: u32,
    pub ttft_budget_ms: f64,
    pub e2e_budget_ms: f64,
    /// Temperature sampling requested.
    pub sampling: bool,
    pub degradations: &'a [Degradation],
    /// Primary class and the overflow class (`faster_class`).
    pub class: usize,
    pub overflow_class: Option<usize>,
    /// A long prompt (long lane).
    pub long: bool,
    /// Output tokens of the requests waiting at the gateway that would be
    /// served before this one (0 when nothing waits).
    pub queue_ahead_out_tokens: f64,
    /// The caller's decision count: equally fit engines are taken in turn
    /// from this position, so an idle fleet's requests (and the new
    /// prefixes among them) spread over its engines instead of piling onto
    /// the first.
    pub turn: u64,
    /// The tier's answer when even an idle engine cannot meet the SLO.
    pub unattainable: Unattainable,
    /// It may start on an engine whose slots are taken by pausing a lower
    /// tier's sequence there ([`AdmissionConfig::preempt_lower_tiers`]).
    pub preempt: bool,
}

/// Where and how an admitted request runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The engine to start on now; `None`: wait at the gateway for a slot
    /// of `class`.
    pub engine: Option<usize>,
    pub class: usize,
    pub max_tokens: u32,
    pub sampling: bool,
    pub ttft_ms: f64,
    pub e2e_ms: f64,
    /// The part of `ttft_ms` spent waiting (for a slot, or behind the
    /// engine's prefill backlog and batch fill), not prefilling.
    pub wait_ms: f64,
    /// The TTFT by raw profile times (no margin): what the observed TTFT is
    /// compared with to calibrate ([`crate::estimate::Calibration`]).
    pub nominal_ttft_ms: f64,
    /// The ladder steps taken, in order (empty: admitted as asked).
    pub steps: Vec<Degradation>,
    /// Served best-effort: no engine, even idle, meets the SLO.
    pub unattainable: bool,
    /// Starts by pausing a lower tier's sequence on `engine`.
    pub preempts: bool,
}

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// The first token cannot arrive within D_TTFT.
    TtftInfeasible,
    /// The last token cannot arrive within D_E2E, even degraded.
    E2eInfeasible,
    /// Every engine would drop below its KV low watermark.
    KvHeadroom,
    /// No ready engine of the class.
    NoEngine,
    /// Even an idle engine of every class it may use misses the SLO: not
    /// an overload (the tier's `unattainable = "refuse"`).
    Unattainable,
}

impl RejectReason {
    pub fn label(self) -> &'static str {
        match self {
            RejectReason::TtftInfeasible => "ttft_infeasible",
            RejectReason::E2eInfeasible => "e2e_infeasible",
            RejectReason::KvHeadroom => "kv_headroom",
            RejectReason::NoEngine => "no_ready_engine",
            RejectReason::Unattainable => "slo_unattainable",
        }
    }
}

/// A refusal with its prediction and when to come back.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub reason: RejectReason,
    pub retry_after_s: u32,
    pub predicted_ttft_ms: f64,
    /// The predicted wait part of it.
    pub predicted_wait_ms: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Admitted, degraded when `plan.steps` is not empty.
    Admit(Plan),
    Reject(Rejection),
}

/// Prediction of one request on one class with its current options.
#[derive(Debug, Clone, PartialEq)]
struct Fit {
    engine: Option<usize>,
    ttft_ms: f64,
    e2e_ms: f64,
    wait_ms: f64,
    nominal_ttft_ms: f64,
    /// Decode time per output token, for `reduce_output`.
    per_token_ms: f64,
    /// Prompt tokens the engine is credited with caching.
    cached: u32,
    /// Starts by pausing a lower tier's sequence on `engine`.
    preempts: bool,
}

/// What every prediction of one decision reads.
#[derive(Clone, Copy)]
struct Cx<'a> {
    engines: &'a [Candidate],
    models: &'a [ServiceModel],
    est: &'a EstimatorConfig,
    cfg: &'a AdmissionConfig,
}

/// Predicts `ask` with `max_tokens`/`sampling` on `class`; `None` when the
/// class has no candidate with KV headroom for it.
fn fit(cx: &Cx, ask: &Ask, out: u32, sampling: bool, class: usize) -> Option<Fit> {
    let model = cx.models.get(class)?;
    // Requests waiting at the gateway wait for the primary class.
    let ahead = if class == ask.class { ask.queue_ahead_out_tokens } else { 0.0 };
    let need = u64::from(ask.n_in) + u64::from(out);
    let mut of_class: Vec<&Candidate> =
        cx.engines.iter().filter(|e| e.class == class && e.kv_headroom_tokens >= need).collect();
    if of_class.is_empty() {
        return None;
    }
    // Ties go to the first in this order (`min_by` keeps the first).
    let start = (ask.turn % of_class.len() as u64) as usize;
    of_class.rotate_left(start);
    let sample = if sampling { cx.cfg.sampling_cost } else { 1.0 };
    let pricer = Pricer::new(model, ask, out, sample, cx.est);
    // A long prompt keeps to the long lane, unless the lane cannot give it
    // its first token in time and another free engine can: the lane spares
    // short prompts a long prefill ahead of them, it must not turn away a
    // long prompt the fleet can serve.
    let mut free = pricer.best_free(&of_class, true);
    if ask.long && free.as_ref().is_none_or(|f| f.ttft_ms > ask.ttft_budget_ms) {
        let anywhere = pricer.best_free(&of_class, false);
        if anywhere.as_ref().is_some_and(|a| free.as_ref().is_none_or(|f| a.ttft_ms < f.ttft_ms)) {
            free = anywhere;
        }
    }
    let meets = |f: &Fit| f.ttft_ms <= ask.ttft_budget_ms && f.e2e_ms <= ask.e2e_budget_ms;
    if let Some(f) = free.as_ref().filter(|f| ahead <= 0.0 && (!ask.preempt || meets(f))) {
        return Some(f.clone());
    }
    // Every slot busy (or others already waiting): wait at the gateway.
    let wait = gate_wait_ms(model, &of_class, ahead, ask.n_in);
    let e = of_class.iter().min_by_key(|e| e.active).expect("non-empty");
    let s = pricer.predict(e);
    let mut gate = pricer.finish(e, &s, wait + s.step_raw_ms);
    gate.engine = None;
    if ask.preempt && !meets(&gate) {
        // Neither a free slot nor the gate meets the budget: pause a lower
        // tier's sequence, if that does.
        if let Some(p) = pricer.best_preempting(&of_class).filter(meets) {
            return Some(p);
        }
    }
    match free {
        Some(f) if ahead <= 0.0 => Some(f),
        _ => Some(gate),
    }
}

/// Decides admit / degrade / reject for `ask` over `engines` (ready ones).
pub fn decide(
    ask: &Ask,
    engines: &[Candidate],
    models: &[ServiceModel],
    est: &EstimatorConfig,
    cfg: &AdmissionConfig,
) -> Decision {
    let cx = Cx { engines, models, est, cfg };
    let mut out = ask.expected_out.min(ask.max_tokens).max(1);
    let mut max_tokens = ask.max_tokens;
    let mut sampling = ask.sampling;
    let mut class = ask.class;
    let mut steps = Vec::new();
    let fits = |f: &Fit| f.ttft_ms <= ask.ttft_budget_ms && f.e2e_ms <= ask.e2e_budget_ms;
    let first = fit(&cx, ask, out, sampling, class);
    let Some(mut best) = first else {
        let any = engines.iter().any(|e| e.class == class);
        let reason = if any { RejectReason::KvHeadroom } else { RejectReason::NoEngine };
        return Decision::Reject(Rejection {
            reason,
            retry_after_s: cfg.retry_after_min_s,
            predicted_ttft_ms: f64::INFINITY,
            predicted_wait_ms: f64::INFINITY,
        });
    };
    for step in ask.degradations {
        if fits(&best) {
            break;
        }
        let better = match step {
            Degradation::ReduceOutput if best.ttft_ms <= ask.ttft_budget_ms => {
                let room = (ask.e2e_budget_ms - best.ttft_ms) / best.per_token_ms.max(1e-6);
                let n = (room.floor().max(0.0) as u32).max(ask.output_floor).min(max_tokens);
                if n < max_tokens {
                    max_tokens = n;
                    out = out.min(n).max(1);
                    fit(&cx, ask, out, sampling, class)
                } else {
                    None
                }
            }
            Degradation::Greedy if sampling => {
                sampling = false;
                fit(&cx, ask, out, sampling, class)
            }
            Degradation::FasterClass => ask
                .overflow_class
                .filter(|c| *c != class)
                .and_then(|c| fit(&cx, ask, out, sampling, c).map(|f| (c, f)))
                .filter(|(_, f)| f.e2e_ms < best.e2e_ms)
                .map(|(c, f)| {
                    class = c;
                    f
                }),
            _ => None,
        };
        if let Some(f) = better {
            best = f;
            steps.push(*step);
        }
    }
    let admit = |best: &Fit, steps: Vec<Degradation>, unattainable: bool| {
        Decision::Admit(Plan {
            engine: best.engine,
            class,
            max_tokens,
            sampling,
            ttft_ms: best.ttft_ms,
            e2e_ms: best.e2e_ms,
            wait_ms: best.wait_ms,
            nominal_ttft_ms: best.nominal_ttft_ms,
            steps,
            unattainable,
            preempts: best.preempts,
        })
    };
    if fits(&best) {
        return admit(&best, steps, false);
    }
    // Would an idle engine meet it (at the output floor, greedy: the most
    // the ladder could do)? If not, this is no overload.
    let least = out.min(ask.output_floor.max(1));
    let unattainable = || idle_best(&cx, ask, least, false, class).filter(|f| !fits(f));
    match ask.unattainable {
        Unattainable::Overload => {}
        Unattainable::BestEffort if unattainable().is_some() => return admit(&best, steps, true),
        Unattainable::Refuse => {
            if let Some(idle) = unattainable() {
                return Decision::Reject(Rejection {
                    reason: RejectReason::Unattainable,
                    retry_after_s: 0,
                    predicted_ttft_ms: if idle.ttft_ms > ask.ttft_budget_ms {
                        idle.ttft_ms
                    } else {
                        idle.e2e_ms
                    },
                    predicted_wait_ms: 0.0,
                });
            }
        }
        Unattainable::BestEffort => {}
    }
    let (reason, excess) = if best.ttft_ms > ask.ttft_budget_ms {
        (RejectReason::TtftInfeasible, best.ttft_ms - ask.ttft_budget_ms)
    } else {
        (RejectReason::E2eInfeasible, best.e2e_ms - ask.e2e_budget_ms)
    };
    Decision::Reject(Rejection {
        reason,
        retry_after_s: retry_after(excess, cfg),
        predicted_ttft_ms: best.ttft_ms,
        predicted_wait_ms: best.wait_ms,
    })
}

/// The best fit of `ask` on an idle engine (nothing running, nothing
/// waiting) of its class or its overflow class: whether its SLO is
/// attainable at all.
fn idle_best(cx: &Cx, ask: &Ask, out: u32, sampling: bool, class: usize) -> Option<Fit> {
    let idle: Vec<Candidate> = cx
        .engines
        .iter()
        .map(|e| Candidate { active: 0, active_out_tokens: 0, prefill_backlog_tokens: 0, ..e.clone() })
        .collect();
    let calm = Ask { queue_ahead_out_tokens: 0.0, ..ask.clone() };
    let cx = Cx { engines: &idle, ..*cx };
    [Some(class), ask.overflow_class]
        .into_iter()
        .flatten()
        .filter_map(|c| fit(&cx, &calm, out, sampling, c))
        .min_by(|a, b| a.e2e_ms.total_cmp(&b.e2e_ms).then(a.ttft_ms.total_cmp(&b.ttft_ms)))
}

/// Marks the long-prompt lane: the first `lane_engines` candidates of each
/// class, in order, when the class has more engines than the lane (a lane
/// that would be the whole class is no lane).
pub fn assign_long_lanes(engines: &mut [Candidate], lane_engines: u32) {
    // Classes are small indices into the models list.
    let mut per_class: Vec<u32> = Vec::new();
    for e in engines.iter_mut() {
        if per_class.len() <= e.class {
            per_class.resize(e.class + 1, 0);
        }
        per_class[e.class] += 1;
        e.long_lane = per_class[e.class] <= lane_engines;
    }
    for e in engines.iter_mut() {
        if per_class[e.class] <= lane_engines {
            e.long_lane = false;
        }
    }
}

/// Queued work drains at one millisecond of wait per millisecond when no
/// new work arrives, so the excess wait is the time to come back.
pub fn retry_after(excess_ms: f64, cfg: &AdmissionConfig) -> u32 {
    let s = (excess_ms.max(0.0) / 1000.0).ceil();
    (s.min(f64::from(cfg.retry_after_max_s)) as u32).clamp(cfg.retry_after_min_s, cfg.retry_after_max_s)
}

pub mod controller;
pub mod outcome;
pub use controller::Controller;

#[cfg(test)]
mod brownout_tests;
#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;
