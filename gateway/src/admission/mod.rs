//! Admission as the gateway runs it: the state the pure decisions in
//! `policies` read (estimator models, output histories, brownout windows,
//! tenant counts, the gate queues), and the permits requests hold.
//!
//! Per request, in order: tenant concurrency (429) -> brownout caps
//! (context ceiling and output cap of the current level) -> estimate ->
//! `policies::admission::decide` over the ready engines -> a [`Ticket`]
//! (concurrency lease, learning hooks) and where to start: an engine lease
//! now, or a place in the gate's deficit round-robin queue of the class.
//! The gate hands out engine slots as they free ([`Admission::pump`]); a
//! waiter is re-checked when its turn comes (late binding: it is bound to
//! whichever engine frees first, so it is never stuck behind an engine that
//! got slower) and refused if it can no longer meet its TTFT budget.
//! Waits have deadlines; refusals are fast and typed.
//!
//! Time in every decision is `now` since this controller's origin,
//! passed to the pure functions. The gate and the control loop (brownout
//! ticks, policy reloads) are in `gate.rs`, the permit in `ticket.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use policies::admission::{self as adm, Ask, Candidate, Decision, RejectReason};
use policies::brownout::{Brownout, Window};
use policies::estimate::{OutputHistory, ServiceModel};
use policies::fairness::Drr;
use policies::routing::{QueueOrder, RoutePolicy};
use policies::{PolicyDocument, Tenant, Tier};
use tokio::sync::oneshot;

use crate::engines::{EngineLease, EnginePool, Work};
use gate::{Place, Waiter};
pub use ticket::Ticket;

mod gate;
mod ticket;
use crate::error::ApiError;
use crate::metrics as m;

/// What the response headers say about the decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// `admitted`, `degraded` or `rejected`.
    pub decision: &'static str,
    /// Why: `slo_feasible`, the degradation steps joined by `+`, or the
    /// rejection's label.
    pub reason: String,
    pub predicted_ttft_ms: Option<f64>,
    pub brownout_level: usize,
}

impl Verdict {
    fn new(
        decision: &'static str,
        reason: String,
        predicted_ttft_ms: Option<f64>,
        brownout_level: usize,
    ) -> Self {
        Self { decision, reason, predicted_ttft_ms, brownout_level }
    }
}

/// A refusal: the error to answer with and the verdict for its headers.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub error: ApiError,
    pub verdict: Verdict,
}

/// What admission needs to know about one request.
#[derive(Debug, Clone)]
pub struct AdmitRequest<'a> {
    pub tenant: &'a Tenant,
    pub tier: &'a Tier,
    pub model: &'a str,
    pub prompt_tokens: u32,
    /// After the tier's output cap.
    pub max_tokens: u32,
    pub sampling: bool,
    /// `x-slo-ttft-ms` / `x-slo-e2e-ms`, already clamped to the tier.
    pub ttft_hint: Option<Duration>,
    pub e2e_hint: Option<Duration>,
}

/// Where an admitted request starts.
#[derive(Debug)]
pub enum Start {
    /// On this engine, now.
    Now(EngineLease),
    /// When the gate hands it a slot, or refuses it at its deadline.
    Wait(oneshot::Receiver<Result<EngineLease, Refused>>, tokio::time::Instant, Verdict),
    /// Anywhere (admission off and no routing choice possible yet).
    Anywhere,
}

/// An admitted request.
#[derive(Debug)]
pub struct Admitted {
    pub verdict: Verdict,
    pub max_tokens: u32,
    pub sampling: bool,
    /// Ordering key for the engine queue (lower first).
    pub key: f64,
    pub ttft_budget: Duration,
    pub e2e_budget: Duration,
    pub work: Work,
    pub start: Start,
    pub ticket: Ticket,
}

#[derive(Debug, Default)]
struct State {
    models: Vec<ServiceModel>,
    outputs: HashMap<(String, String), OutputHistory>,
    queue_signal: Window,
    ttft_signal: Window,
    brownout: Brownout,
    open: HashMap<String, u32>,
    /// Gate queues by engine class.
    gates: HashMap<usize, Drr<Waiter>>,
    rr_turn: u64,
}

impl State {
    /// The class index of `profile`'s engine class, registering its model.
    fn class_of(&mut self, profile: &policies::LatencyProfile) -> usize {
        match self.models.iter().position(|m| m.class == profile.engine_class) {
            Some(i) => i,
            None => {
                self.models.push(ServiceModel::from_profile(profile));
                self.models.len() - 1
            }
        }
    }
}

/// The gateway's admission controller; one per process.
#[derive(Debug)]
pub struct Admission {
    state: Mutex<State>,
    origin: Instant,
    pool: Arc<EnginePool>,
}

impl Admission {
    pub fn new(pool: Arc<EnginePool>) -> Arc<Self> {
        Arc::new(Self { state: Mutex::new(State::default()), origin: Instant::now(), pool })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Seconds since this controller started: the `now` of every decision.
    pub fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }

    pub fn brownout_level(&self) -> usize {
        self.lock().brownout.level()
    }

    /// Requests waiting at the gate.
    pub fn waiting(&self) -> usize {
        self.lock().gates.values().map(Drr::len).sum()
    }

    /// Candidates for admission: ready engines whose profile is known.
    fn candidates(&self, st: &mut State, policy: &PolicyDocument) -> Vec<Candidate> {
        let mut out = Vec::new();
        let mut per_class: HashMap<usize, u32> = HashMap::new();
        for idx in 0..self.pool.len() {
            let slot = self.pool.slot(idx);
            let Some(profile) = slot.profile() else { continue };
            let class = st.class_of(&profile);
            if !slot.is_ready() {
                continue;
            }
            let report = slot.report().unwrap_or_default();
            let backlog = slot.prefill_backlog_tokens();
            // Free KV above the low watermark per the last report, less
            // what this gateway sent since (not in the report yet).
            let headroom = if report.kv_page_tokens == 0 {
                u64::MAX
            } else {
                let pages = u64::from(report.kv_pages_free.saturating_sub(report.kv_low_watermark_pages));
                (pages * u64::from(report.kv_page_tokens)).saturating_sub(slot.leased_since_report())
            };
            let nth = per_class.entry(class).or_default();
            *nth += 1;
            out.push(Candidate {
                idx,
                class,
                slots: report.batch_target.max(1),
                active: slot.active(),
                active_out_tokens: slot.active_out_tokens(),
                prefill_backlog_tokens: backlog,
                kv_headroom_tokens: headroom,
                long_lane: *nth <= policy.routing.long_lane_engines,
            });
        }
        // A lane exists only in a class with more engines than the lane.
        for c in &mut out {
            if per_class[&c.class] <= policy.routing.long_lane_engines {
                c.long_lane = false;
            }
        }
        out
    }

    /// Decides admit / degrade / reject for one request, in the order of
    /// the module docs.
    pub fn admit(self: &Arc<Self>, policy: &PolicyDocument, r: &AdmitRequest) -> Result<Admitted, Refused> {
        let now = self.now();
        let tier = r.tier;
        let mut st = self.lock();
        let level = st.brownout.level();
        if policy.admission.mode == adm::AdmissionMode::Off {
            let v = Verdict::new("admitted", "admission_off".into(), None, level);
            return Ok(self.admit_off(&mut st, policy, r, v));
        }
        self.tenant_limit(&st, r, level)?; // 429 beyond max_concurrency
        let (max_tokens, mut steps) = self.brownout_caps(policy, r, level)?; // this level's caps
        let ttft_budget = r.ttft_hint.unwrap_or(tier.ttft);
        let e2e_budget = r.e2e_hint.unwrap_or(tier.e2e).max(ttft_budget);
        let hist_key = (r.tenant.name.clone(), r.model.to_string());
        let expected =
            st.outputs.get(&hist_key).map_or(max_tokens, |h| h.expected(max_tokens, &policy.estimator));
        let engines = self.candidates(&mut st, policy);
        let overflow =
            tier.overflow_class.as_ref().and_then(|name| st.models.iter().position(|m| &m.class == name));
        // The primary class: the first ready engine's outside the overflow class.
        let class =
            engines.iter().find(|e| Some(e.class) != overflow).or(engines.first()).map_or(0, |e| e.class);
        let weight = tier.priority_weight.get();
        let n_hat = u64::from(r.prompt_tokens) + u64::from(expected);
        let key = self.key(policy, r, now, expected, &st);
        let ahead_tokens = st
            .gates
            .get(&class)
            .filter(|g| !g.is_empty())
            .map_or(0, |g| g.tokens_ahead(&r.tenant.name, weight, n_hat, key));
        let ask = Ask {
            n_in: r.prompt_tokens,
            max_tokens,
            expected_out: expected,
            output_floor: tier.output_floor_tokens.min(max_tokens),
            ttft_budget_ms: ms(ttft_budget),
            e2e_budget_ms: ms(e2e_budget),
            sampling: r.sampling,
            degradations: &tier.degradations,
            class,
            overflow_class: overflow,
            long: r.prompt_tokens >= policy.routing.long_prompt_tokens,
            // The gate counts prompt + expected output; the wait is decode
            // work, the output part in the same proportion.
            queue_ahead_out_tokens: ahead_tokens as f64 * f64::from(expected) / n_hat.max(1) as f64,
        };
        let plan = match adm::decide(&ask, &engines, &st.models, &policy.estimator, &policy.admission) {
            Decision::Reject(rej) => return Err(self.reject(&mut st, now, r, level, &rej, &ask)),
            Decision::Admit(plan) => plan,
        };
        steps.extend(plan.steps.iter().map(|d| d.label()));
        let (decision, reason) = if steps.is_empty() {
            ("admitted", "slo_feasible".to_string())
        } else {
            ("degraded", steps.join("+"))
        };
        let v = Verdict::new(decision, reason, Some(plan.ttft_ms), level);
        st.queue_signal.push(now, plan.ttft_ms / ask.ttft_budget_ms);
        let work = Work {
            tokens: u64::from(r.prompt_tokens) + u64::from(plan.max_tokens),
            prompt_tokens: u64::from(r.prompt_tokens),
            out_tokens: u64::from(expected.min(plan.max_tokens)),
        };
        *st.open.entry(r.tenant.name.clone()).or_default() += 1;
        let start = match plan.engine {
            Some(idx) => Start::Now(self.pool.lease(idx, work)),
            None => {
                let place =
                    Place { class: plan.class, weight, cost: n_hat, key, ttft_budget_ms: ask.ttft_budget_ms };
                let (rx, deadline) = gate::enqueue(&mut st, policy, r, now, work, place, v.clone());
                Start::Wait(rx, deadline, v.clone())
            }
        };
        ::metrics::counter!(m::ADMISSION, "tier" => tier.name.clone(), "decision" => decision, "reason" => v.reason.clone())
            .increment(1);
        let ticket = Ticket::new(self, &r.tenant.name, hist_key, r.prompt_tokens, ask.ttft_budget_ms);
        drop(st);
        if matches!(start, Start::Wait(..)) {
            self.pump(policy); // a slot may be free already
        }
        Ok(Admitted {
            verdict: v,
            max_tokens: plan.max_tokens,
            sampling: plan.sampling,
            key,
            ttft_budget,
            e2e_budget,
            work,
            start,
            ticket,
        })
    }

    /// 429 when the tenant already has its tier's `max_concurrency` open.
    fn tenant_limit(&self, st: &State, r: &AdmitRequest, level: usize) -> Result<(), Refused> {
        let open = st.open.get(&r.tenant.name).copied().unwrap_or(0);
        match r.tier.max_concurrency.filter(|l| open >= l.get()) {
            Some(limit) => {
                let v = Verdict::new("rejected", "tenant_concurrency".into(), None, level);
                Err(self.refuse(r.tier, v, ApiError::TenantConcurrency { limit: limit.get() }))
            }
            None => Ok(()),
        }
    }

    /// The current level's caps: a prompt over the shrunken context ceiling
    /// is refused; `max_tokens` over the shrunken output cap is lowered (not
    /// below the tier's floor). Returns `max_tokens` and the steps taken.
    fn brownout_caps(
        &self,
        policy: &PolicyDocument,
        r: &AdmitRequest,
        level: usize,
    ) -> Result<(u32, Vec<&'static str>), Refused> {
        let tier = r.tier;
        let caps = policy.brownout.caps(level, &tier.name);
        let ceiling = (f64::from(tier.max_context_tokens.get()) * caps.context_scale).floor() as u32;
        if r.prompt_tokens > ceiling.max(1) {
            let v = Verdict::new("rejected", "brownout_context".into(), None, level);
            let err = ApiError::Overloaded {
                reason: "brownout_context",
                message: format!(
                    "the system is in brownout level {level}: prompts of tier {} are limited to {ceiling} tokens for now (this one has {})",
                    tier.name, r.prompt_tokens
                ),
                retry_after_s: policy.brownout.down_dwell_s.ceil() as u32,
            };
            return Err(self.refuse(tier, v, err));
        }
        let cap = ((f64::from(tier.max_output_tokens.get()) * caps.output_scale).floor() as u32)
            .max(tier.output_floor_tokens);
        if r.max_tokens > cap {
            Ok((cap, vec!["brownout_output_cap"]))
        } else {
            Ok((r.max_tokens, Vec::new()))
        }
    }

    /// A capacity refusal; it also feeds brownout with the wait it predicted.
    fn reject(
        &self,
        st: &mut State,
        now: f64,
        r: &AdmitRequest,
        level: usize,
        rej: &adm::Rejection,
        ask: &Ask,
    ) -> Refused {
        let ratio = rej.predicted_ttft_ms / ask.ttft_budget_ms;
        st.queue_signal.push(now, if ratio.is_finite() { ratio } else { 10.0 });
        let predicted = Some(rej.predicted_ttft_ms).filter(|x| x.is_finite());
        let v = Verdict::new("rejected", rej.reason.label().into(), predicted, level);
        let err = match rej.reason {
            RejectReason::NoEngine => ApiError::NoReadyEngine,
            reason => ApiError::Overloaded {
                reason: reason.label(),
                message: reject_message(reason, &r.tier.name, rej, ask),
                retry_after_s: rej.retry_after_s,
            },
        };
        self.refuse(r.tier, v, err)
    }

    /// Admission off (the FCFS baselines): route by the configured simple
    /// policy, admit everything.
    fn admit_off(
        self: &Arc<Self>,
        st: &mut State,
        policy: &PolicyDocument,
        r: &AdmitRequest,
        v: Verdict,
    ) -> Admitted {
        let now = self.now();
        let work = Work {
            tokens: u64::from(r.prompt_tokens) + u64::from(r.max_tokens),
            prompt_tokens: u64::from(r.prompt_tokens),
            out_tokens: u64::from(r.max_tokens),
        };
        let views = self.pool.views();
        let pick = match policy.routing.policy {
            RoutePolicy::RoundRobin => {
                st.rr_turn += 1;
                policies::routing::round_robin(&views, &[], st.rr_turn - 1)
            }
            RoutePolicy::LeastLoaded => policies::routing::least_inflight_requests(&views, &[]),
            RoutePolicy::PredictedFinish => policies::routing::least_inflight_tokens(&views, &[]),
        };
        let start = pick.map_or(Start::Anywhere, |idx| Start::Now(self.pool.lease(idx, work)));
        let expected = u32::try_from(work.out_tokens).unwrap_or(u32::MAX);
        let key = self.key(policy, r, now, expected, st);
        ::metrics::counter!(m::ADMISSION, "tier" => r.tier.name.clone(), "decision" => "admitted", "reason" => "admission_off")
            .increment(1);
        *st.open.entry(r.tenant.name.clone()).or_default() += 1;
        let hist_key = (r.tenant.name.clone(), r.model.to_string());
        let ticket = Ticket::new(self, &r.tenant.name, hist_key, r.prompt_tokens, ms(r.tier.ttft));
        Admitted {
            verdict: v,
            max_tokens: r.max_tokens,
            sampling: r.sampling,
            key,
            ttft_budget: r.ttft_hint.unwrap_or(r.tier.ttft),
            e2e_budget: r.e2e_hint.unwrap_or(r.tier.e2e),
            work,
            start,
            ticket,
        }
    }

    /// The engine-queue ordering key: milliseconds on this controller's
    /// clock, so deadlines (EDF) and virtual finish times (WSRPT) compare.
    fn key(&self, policy: &PolicyDocument, r: &AdmitRequest, now: f64, expected: u32, st: &State) -> f64 {
        let arrival = now * 1e3;
        match policy.routing.order {
            QueueOrder::Fcfs => arrival,
            QueueOrder::Wsrpt => match r.ttft_hint {
                Some(d) => arrival + ms(d),
                None => {
                    let service = st.models.first().map_or(f64::from(expected), |m| {
                        m.prefill_raw_ms(r.prompt_tokens) + m.decode_raw_ms(r.prompt_tokens, expected, 1.0)
                    });
                    arrival + service / f64::from(r.tier.priority_weight.get())
                }
            },
        }
    }

    fn refuse(&self, tier: &Tier, verdict: Verdict, error: ApiError) -> Refused {
        ::metrics::counter!(m::ADMISSION, "tier" => tier.name.clone(), "decision" => "rejected", "reason" => verdict.reason.clone())
            .increment(1);
        Refused { error, verdict }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn reject_message(reason: RejectReason, tier: &str, rej: &adm::Rejection, ask: &Ask) -> String {
    match reason {
        RejectReason::TtftInfeasible => format!(
            "the system is overloaded: the first token is predicted in {:.0} ms, over tier {tier}'s {:.0} ms budget; retry after {} s",
            rej.predicted_ttft_ms, ask.ttft_budget_ms, rej.retry_after_s
        ),
        RejectReason::E2eInfeasible => format!(
            "the system is overloaded: the answer cannot finish within tier {tier}'s {:.0} ms end-to-end budget even at {} output tokens; retry after {} s",
            ask.e2e_budget_ms, ask.output_floor, rej.retry_after_s
        ),
        RejectReason::KvHeadroom => {
            "every engine's KV cache is at its low watermark; retry shortly".to_string()
        }
        RejectReason::NoEngine => "no engine is ready to serve this request".to_string(),
    }
}
