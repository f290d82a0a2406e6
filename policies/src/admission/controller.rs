//! The admission controller as a deterministic state machine.
//!
//! It holds everything admission learns and remembers: the per-class
//! service models, output-length histories per (tenant, model), the
//! brownout signal windows and level, tenants' open requests, and the gate
//! (one deficit round-robin queue per engine class of requests admitted
//! while every slot was busy). It is driven by events that carry `now`
//! (seconds on the caller's clock, real or virtual) and never reads a
//! clock or does I/O:
//!
//! - [`Controller::request`] -> [`Outcome`]: start on an engine now, wait
//!   at the gate, or a typed [`Refusal`].
//! - [`Controller::pump`] (a slot freed, or any time): hands free slots to
//!   waiters in DRR order, re-checking each (late binding) -> [`Grant`]s.
//! - [`Controller::first_token`], [`Controller::finished`],
//!   [`Controller::release`]: learning and the tenant's open count.
//! - [`Controller::tick`]: one brownout step; expires waiters past their
//!   deadline.
//!
//! Per request, in order: tenant concurrency -> brownout caps (context
//! ceiling and output cap of the current level) -> expected output ->
//! [`super::decide`] over the engines the caller sees -> start now or wait.
//! The engines are the caller's snapshot ([`Candidate`]s); the gateway
//! builds them from its engine pool, the simulator from its engines.

use std::collections::HashMap;

use super::{decide, retry_after, Ask, Candidate, Decision, RejectReason, Rejection};
use crate::brownout::{Brownout, Window};
use crate::estimate::{OutputHistory, ServiceModel};
use crate::fairness::Drr;
use crate::routing::{QueueOrder, RoutePolicy};
use crate::{LatencyProfile, PolicyDocument};

mod gate;
use gate::timeout;

pub use super::outcome::{Admit, Grant, Nominal, Outcome, Reason, Refusal, Request, Step, WaiterId, Work};

/// One request waiting at the gate.
#[derive(Debug, Clone)]
struct Waiter {
    id: WaiterId,
    work: Work,
    n_in: u32,
    arrived: f64,
    deadline: f64,
    /// Its TTFT budget times `recheck_factor`.
    recheck_ms: f64,
    ttft_budget_ms: f64,
    level: usize,
    tier: String,
}

impl Waiter {
    /// Its wait at the gate by `at` over its TTFT budget.
    fn waited_ratio(&self, at: f64) -> f64 {
        (at - self.arrived).max(0.0) * 1e3 / self.ttft_budget_ms.max(1.0)
    }
}

/// The admission state machine; one per gateway (or simulated gateway).
#[derive(Debug, Default)]
pub struct Controller {
    models: Vec<ServiceModel>,
    /// Output histories by tenant, then model.
    outputs: HashMap<String, HashMap<String, OutputHistory>>,
    /// Brownout's evidence, one sample per request: its observed TTFT over
    /// its budget, or [`REFUSED`] for a capacity refusal.
    trouble: Window,
    /// Observed waits at the gate over the TTFT budget, one sample per
    /// admitted request (0 when it started at once; refused after waiting:
    /// what it waited): queue latency for the autoscaler. Predictions never
    /// enter it.
    gate_waits: Window,
    brownout: Brownout,
    open: HashMap<String, u32>,
    /// Gate queues by engine class.
    gates: HashMap<usize, Drr<Waiter>>,
    /// Decisions so far: the round-robin route's turn, and where every
    /// other route (and admission's choice) starts taking tied engines.
    rr_turn: u64,
    next_waiter: WaiterId,
    /// OServe's type-aware routes (the control plane's current assignment);
    /// `None`: the primary class takes every request.
    routes: Option<crate::oserve::route::Routes>,
    /// Each routed class's index in `models` (`None`: not registered yet),
    /// kept with `routes` and `models` so a decision looks nothing up.
    route_models: Vec<Option<usize>>,
}

/// The brownout step a [`Controller::tick`] took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TickReport {
    pub level: usize,
    /// The level changed at this tick.
    pub changed: bool,
    /// The signal: the window's trouble share (0-1; see [`crate::brownout`]).
    pub signal: Option<f64>,
    pub waiting: usize,
}

impl Controller {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn brownout_level(&self) -> usize {
        self.brownout.level()
    }

    /// Requests waiting at the gate.
    pub fn waiting(&self) -> usize {
        self.gates.values().map(Drr::len).sum()
    }

    /// The p95 of observed waits at the gate (before prefill) over the TTFT
    /// budget, over the last `autoscale.queue_window_s`: the autoscaler's
    /// queue signal. `None` with fewer than `brownout.min_samples`.
    pub fn queue_ratio_p95(&mut self, now: f64, policy: &PolicyDocument) -> Option<f64> {
        self.gate_waits.p95(now, policy.autoscale.queue_window_s, policy.brownout.min_samples)
    }

    /// Requests `tenant` has open (admitted, not released).
    pub fn open(&self, tenant: &str) -> u32 {
        self.open.get(tenant).copied().unwrap_or(0)
    }

    /// The class index of `profile`'s engine class, registering its model
    /// (the estimator's prior) the first time.
    pub fn class_of(&mut self, profile: &LatencyProfile) -> usize {
        match self.models.iter().position(|m| m.class == profile.engine_class) {
            Some(i) => i,
            None => {
                self.models.push(ServiceModel::from_profile(profile));
                self.map_routes();
                self.models.len() - 1
            }
        }
    }

    /// Sets (or clears) OServe's type-aware routes: from now on a request
    /// whose `[oserve]` type has shares goes to a class by them.
    pub fn set_routes(&mut self, routes: Option<crate::oserve::route::Routes>) {
        self.routes = routes;
        self.map_routes();
    }

    fn map_routes(&mut self) {
        let models = &self.models;
        self.route_models = self.routes.as_ref().map_or_else(Vec::new, |r| {
            r.classes.iter().map(|c| models.iter().position(|m| &m.class == c)).collect()
        });
    }

    pub fn routes(&self) -> Option<&crate::oserve::route::Routes> {
        self.routes.as_ref()
    }

    /// The class a request of workload type `j` goes to by OServe's routes,
    /// among the classes of `engines` (ready ones): `None` without routes
    /// or when its type has no share on a ready class.
    fn routed_class(&mut self, j: usize, engines: &[Candidate]) -> Option<usize> {
        let routes = self.routes.as_mut()?;
        let ready = &self.route_models;
        let c = routes.pick(j, |c| ready[c].is_some_and(|m| engines.iter().any(|e| e.class == m)))?;
        ready[c]
    }

    /// The service model of class `class`, as learned so far.
    pub fn model(&self, class: usize) -> Option<&ServiceModel> {
        self.models.get(class)
    }

    /// Decides admit / degrade / reject for one request, in the order of
    /// the module docs. `engines`: the ready engines (the caller's snapshot);
    /// `loads`: every engine's routing view, for admission `off`.
    pub fn request(
        &mut self,
        now: f64,
        policy: &PolicyDocument,
        r: &Request,
        engines: &[Candidate],
        loads: &[crate::routing::EngineView],
    ) -> Outcome {
        let tier = r.tier;
        let level = self.brownout.level();
        if policy.admission.mode == super::AdmissionMode::Off {
            return self.admit_off(now, policy, r, loads, level);
        }
        // 429 beyond the tier's max_concurrency.
        if let Some(limit) = tier.max_concurrency.filter(|l| self.open(r.tenant) >= l.get()) {
            let mut refusal =
                Refusal::new(Reason::TenantConcurrency, policy.admission.retry_after_min_s, level);
            refusal.limit = limit.get();
            return Outcome::Refuse(refusal);
        }
        // This level's caps: a prompt over the shrunken context ceiling is
        // refused; max_tokens over the shrunken output cap is lowered (not
        // below the tier's floor).
        let caps = policy.brownout.caps(level, &tier.name);
        let ceiling = (f64::from(tier.max_context_tokens.get()) * caps.context_scale).floor() as u32;
        if r.prompt_tokens > ceiling.max(1) {
            let mut refusal =
                Refusal::new(Reason::BrownoutContext, policy.brownout.down_dwell_s.ceil() as u32, level);
            refusal.limit = ceiling;
            return Outcome::Refuse(refusal);
        }
        let cap = ((f64::from(tier.max_output_tokens.get()) * caps.output_scale).floor() as u32)
            .max(tier.output_floor_tokens);
        let mut steps = Vec::new();
        let max_tokens = if r.max_tokens > cap {
            steps.push(Step::BrownoutOutputCap);
            cap
        } else {
            r.max_tokens
        };
        let ttft_budget_ms = r.ttft_hint_ms.unwrap_or(ms(tier.ttft));
        let e2e_budget_ms = r.e2e_hint_ms.unwrap_or(ms(tier.e2e)).max(ttft_budget_ms);
        // Queues hold many requests: their work is counted at the mean
        // output, one request's own time at the high quantile (`expected`).
        // Before a tenant has history, both are `max_tokens`.
        let history = self.outputs.get(r.tenant).and_then(|m| m.get(r.model));
        let est = &policy.estimator;
        let expected = history.map_or(max_tokens, |h| h.expected(max_tokens, est));
        let mean_out = history.map_or(max_tokens, |h| h.mean(max_tokens, est));
        let overflow =
            tier.overflow_class.as_ref().and_then(|name| self.models.iter().position(|m| &m.class == name));
        // OServe's class for the request's type, else the primary class:
        // the first ready engine's outside the overflow class.
        let work_type = work_type(policy, r.prompt_tokens, mean_out.min(max_tokens));
        let routed = work_type.and_then(|j| self.routed_class(j, engines));
        let class = routed.unwrap_or_else(|| {
            engines.iter().find(|e| Some(e.class) != overflow).or(engines.first()).map_or(0, |e| e.class)
        });
        let weight = tier.priority_weight.get();
        let n_hat = u64::from(r.prompt_tokens) + u64::from(mean_out);
        let key = self.key(policy, r, now, expected);
        let ahead_tokens = self
            .gates
            .get(&class)
            .filter(|g| !g.is_empty())
            .map_or(0, |g| g.tokens_ahead(r.tenant, weight, n_hat, key));
        let ask = Ask {
            tier: &tier.name,
            n_in: r.prompt_tokens,
            max_tokens,
            expected_out: expected,
            output_floor: tier.output_floor_tokens.min(max_tokens),
            ttft_budget_ms,
            e2e_budget_ms,
            sampling: r.sampling,
            degradations: &tier.degradations,
            class,
            overflow_class: overflow,
            long: r.prompt_tokens >= policy.routing.long_prompt_tokens,
            // The gate counts prompt + mean output; the wait is decode
            // work, the output part in the same proportion.
            queue_ahead_out_tokens: ahead_tokens as f64 * f64::from(mean_out) / n_hat.max(1) as f64,
            turn: self.rr_turn,
            unattainable: tier.unattainable,
            preempt: policy.admission.preempt_lower_tiers,
        };
        self.rr_turn += 1;
        let plan = match decide(&ask, engines, &self.models, &policy.estimator, &policy.admission) {
            Decision::Reject(rej) => return self.refuse(now, &ask, &rej, level),
            Decision::Admit(plan) => plan,
        };
        steps.extend(plan.steps.iter().map(|d| Step::Ladder(*d)));
        if plan.unattainable {
            steps.push(Step::SloUnattainable);
        }
        let work = Work {
            tokens: u64::from(r.prompt_tokens) + u64::from(plan.max_tokens),
            prompt_tokens: u64::from(r.prompt_tokens),
            out_tokens: u64::from(mean_out.min(plan.max_tokens)),
        };
        self.hold(r.tenant);
        let admit = Admit {
            steps,
            unchecked: false,
            predicted_ttft_ms: Some(plan.ttft_ms),
            predicted_e2e_ms: Some(plan.e2e_ms),
            nominal: Some(Nominal { class: plan.class, ttft_ms: plan.nominal_ttft_ms }),
            brownout_level: level,
            max_tokens: plan.max_tokens,
            sampling: plan.sampling,
            key,
            ttft_budget_ms,
            e2e_budget_ms,
            work,
            work_type,
            preempts: plan.preempts,
        };
        match plan.engine {
            Some(engine) => {
                self.gate_waits.push(now, 0.0);
                Outcome::Start { engine, admit }
            }
            None => self.wait_at_gate(now, policy, r, plan.class, (weight, n_hat), admit),
        }
    }

    /// A capacity refusal (or no engine): its signals for brownout, and
    /// the typed refusal with what admission predicted.
    fn refuse(&mut self, now: f64, ask: &Ask, rej: &Rejection, level: usize) -> Outcome {
        // A capacity refusal is trouble brownout can relieve; no engine at
        // all is not, nor a request no engine could serve in time.
        if !matches!(rej.reason, RejectReason::NoEngine | RejectReason::Unattainable) {
            self.trouble.push(now, REFUSED);
        }
        let mut refusal = Refusal::new(rej.reason.into(), rej.retry_after_s, level);
        refusal.predicted_ttft_ms = Some(rej.predicted_ttft_ms).filter(|x| x.is_finite());
        refusal.ttft_budget_ms = ask.ttft_budget_ms;
        refusal.e2e_budget_ms = ask.e2e_budget_ms;
        refusal.limit = ask.output_floor;
        Outcome::Refuse(refusal)
    }

    /// Admission off (the FCFS baselines): route by the configured simple
    /// policy, admit everything.
    fn admit_off(
        &mut self,
        now: f64,
        policy: &PolicyDocument,
        r: &Request,
        loads: &[crate::routing::EngineView],
        level: usize,
    ) -> Outcome {
        let work = Work {
            tokens: u64::from(r.prompt_tokens) + u64::from(r.max_tokens),
            prompt_tokens: u64::from(r.prompt_tokens),
            out_tokens: u64::from(r.max_tokens),
        };
        let turn = self.rr_turn;
        self.rr_turn += 1;
        let pick = match policy.routing.policy {
            RoutePolicy::RoundRobin => crate::routing::round_robin(loads, &[], turn),
            RoutePolicy::LeastLoaded => crate::routing::least_inflight_requests(loads, &[], turn),
            RoutePolicy::PredictedFinish => crate::routing::least_inflight_tokens(loads, &[]),
            RoutePolicy::CacheAware => {
                crate::routing::cache_aware(loads, &[], r.prefix_blocks, &policy.routing.prefix, turn)
            }
        };
        let key = self.key(policy, r, now, r.max_tokens);
        self.hold(r.tenant);
        let admit = Admit {
            steps: Vec::new(),
            unchecked: true,
            predicted_ttft_ms: None,
            predicted_e2e_ms: None,
            nominal: None,
            brownout_level: level,
            max_tokens: r.max_tokens,
            sampling: r.sampling,
            key,
            ttft_budget_ms: r.ttft_hint_ms.unwrap_or(ms(r.tier.ttft)),
            e2e_budget_ms: r.e2e_hint_ms.unwrap_or(ms(r.tier.e2e)),
            work,
            work_type: work_type(policy, r.prompt_tokens, r.max_tokens),
            preempts: false,
        };
        match pick {
            Some(engine) => Outcome::Start { engine, admit },
            None => Outcome::Anywhere { admit },
        }
    }

    /// The engine-queue ordering key: milliseconds on this controller's
    /// clock, so deadlines (EDF) and virtual finish times (WSRPT) compare.
    fn key(&self, policy: &PolicyDocument, r: &Request, now: f64, expected: u32) -> f64 {
        let arrival = now * 1e3;
        match policy.routing.order {
            QueueOrder::Fcfs => arrival,
            QueueOrder::Wsrpt => match r.ttft_hint_ms {
                Some(d) => arrival + d,
                None => {
                    let service = self.models.first().map_or(f64::from(expected), |m| {
                        m.prefill_raw_ms(r.prompt_tokens) + m.decode_raw_ms(r.prompt_tokens, expected, 1.0)
                    });
                    arrival + service / f64::from(r.tier.priority_weight.get())
                }
            },
        }
    }

    /// The first token reached the caller `ttft_ms` after arrival; with
    /// `nominal` (admission predicted it) the TTFT calibration learns.
    pub fn first_token(
        &mut self,
        now: f64,
        policy: &PolicyDocument,
        tier: &str,
        ttft_ms: f64,
        ttft_budget_ms: f64,
        nominal: Option<Nominal>,
    ) {
        self.trouble.push(now, ttft_ms / ttft_budget_ms.max(1.0));
        if let Some(n) = nominal {
            if let Some(m) = self.models.get_mut(n.class) {
                m.observe_ttft(now, tier, ttft_ms, n.ttft_ms, &policy.estimator);
            }
        }
    }

    /// A request of `tenant` on `model` finished on an engine of `class`
    /// (none: not known) with `completion_tokens`, after `prefill_ms` of
    /// prefill (of its prompt but the `cached_tokens` the engine's prefix
    /// cache held) and `decode_ms` from its first token to its last, at a
    /// batch of `batch`: the estimator learns its output length and timings.
    #[allow(clippy::too_many_arguments)]
    pub fn finished(
        &mut self,
        policy: &PolicyDocument,
        tenant: &str,
        model: &str,
        class: Option<usize>,
        (prompt_tokens, cached_tokens): (u32, u32),
        completion_tokens: u32,
        prefill_ms: f64,
        decode_ms: Option<f64>,
        batch: f64,
    ) {
        let models = self.outputs.entry(tenant.to_string()).or_default();
        match models.get_mut(model) {
            Some(h) => h.observe(completion_tokens, &policy.estimator),
            None => {
                models.entry(model.to_string()).or_default().observe(completion_tokens, &policy.estimator)
            }
        }
        if let (Some(c), Some(decode_ms)) = (class, decode_ms) {
            if let Some(m) = self.models.get_mut(c) {
                let (n_in, cached) = (prompt_tokens, cached_tokens);
                m.observe(n_in, cached, prefill_ms, completion_tokens, decode_ms, batch, &policy.estimator);
            }
        }
    }

    fn hold(&mut self, tenant: &str) {
        match self.open.get_mut(tenant) {
            Some(n) => *n += 1,
            None => {
                self.open.insert(tenant.to_string(), 1);
            }
        }
    }

    /// An admitted request of `tenant` ended (its response stream ended).
    pub fn release(&mut self, tenant: &str) {
        if let Some(n) = self.open.get_mut(tenant) {
            *n = n.saturating_sub(1);
        }
    }

    /// A new policy version: gates take its DRR quantum; brownout follows
    /// its levels at the next tick. Waiters keep the budgets they were
    /// admitted with.
    pub fn reconfigure(&mut self, policy: &PolicyDocument) {
        for gate in self.gates.values_mut() {
            gate.set_quantum(policy.routing.drr_quantum_tokens);
        }
    }

    /// One brownout step; waiters past their deadline leave the gate with
    /// a `queue_timeout` refusal.
    pub fn tick(&mut self, now: f64, policy: &PolicyDocument) -> (TickReport, Vec<Grant>) {
        for m in &mut self.models {
            m.expire(now, &policy.estimator);
        }
        let cfg = &policy.brownout;
        let signal = self.trouble.share(now, cfg.window_s, cfg.min_samples, cfg.trouble_ttft_fraction);
        let changed = self.brownout.update(now, signal, cfg).is_some();
        let mut expired = Vec::new();
        let (trouble, waits) = (&mut self.trouble, &mut self.gate_waits);
        for gate in self.gates.values_mut() {
            gate.retain(|w| {
                if now > w.deadline {
                    trouble.push(now, REFUSED);
                    waits.push(now, w.waited_ratio(w.deadline));
                    expired.push(Grant { id: w.id, work: w.work, result: Err(timeout(w, policy)) });
                    false
                } else {
                    true
                }
            });
        }
        let report = TickReport { level: self.brownout.level(), changed, signal, waiting: self.waiting() };
        (report, expired)
    }
}

/// A capacity refusal's sample in the trouble window: past any
/// `trouble_ttft_fraction`.
const REFUSED: f64 = 10.0;

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The `[oserve]` type of a request of `prompt` tokens expected to produce
/// `out` (`None` without types).
fn work_type(policy: &PolicyDocument, prompt: u32, out: u32) -> Option<usize> {
    policy.oserve.classify(f64::from(prompt), f64::from(out)).map(|(j, _)| j)
}

#[cfg(test)]
mod tests;
