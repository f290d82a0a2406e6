//! Admission as the gateway runs it: an adapter around the pure state
//! machine [`policies::admission::Controller`], which decides; this module
//! only supplies what the machine cannot know by itself and carries out
//! what it decides.
//!
//! - **Clock:** `now` is seconds since this adapter started, passed to every
//!   event.
//! - **Engines:** each decision gets a snapshot of the ready engines from the
//!   [`EnginePool`] (the gateway's own exact counts plus the engines' last
//!   load reports) as [`Candidate`]s.
//! - **I/O:** a request that must wait at the gate gets a oneshot channel;
//!   the [`Grant`]s of [`Admission::pump`] and of the tick are sent there as
//!   engine leases or typed refusals.
//! - **Errors and metrics:** a [`Refusal`] becomes an OpenAI-style
//!   [`ApiError`] and decision headers; every decision is counted.
//!
//! The gate loop and brownout ticks are in `gate.rs`, the request's permit
//! in `ticket.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use policies::admission::controller::{Admit, Grant, Outcome, Reason, Refusal, Request, WaiterId};
use policies::admission::{Candidate, Controller};
use policies::routing::EngineView;
use policies::{PolicyDocument, Tenant, Tier};
use tokio::sync::oneshot;

use crate::engines::{EngineLease, EnginePool, Work};
pub use ticket::Ticket;

mod gate;
mod ticket;
use crate::error::{ApiError, Overload};
use crate::metrics as m;

/// Admission's decision on one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Admitted,
    Degraded,
    Rejected,
}

impl Decision {
    /// The `x-admission` header value and the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Admitted => "admitted",
            Decision::Degraded => "degraded",
            Decision::Rejected => "rejected",
        }
    }
}

/// What the response headers say about the decision. It travels with the
/// response as an extension (set where admission decided, read where the
/// headers are written).
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub decision: Decision,
    /// Why: `slo_feasible`, the degradation steps joined by `+`, or the
    /// rejection's label.
    pub reason: String,
    pub predicted_ttft_ms: Option<f64>,
    pub predicted_e2e_ms: Option<f64>,
    pub brownout_level: usize,
}

impl Verdict {
    fn admitted(a: &Admit) -> Self {
        Self {
            decision: if a.steps.is_empty() { Decision::Admitted } else { Decision::Degraded },
            reason: a.reason(),
            predicted_ttft_ms: a.predicted_ttft_ms,
            predicted_e2e_ms: a.predicted_e2e_ms,
            brownout_level: a.brownout_level,
        }
    }

    /// This verdict turned into a rejection for `reason` (a new value: the
    /// prediction and brownout level it was made at stay).
    pub fn rejected(&self, reason: &'static str) -> Self {
        Self { decision: Decision::Rejected, reason: reason.into(), ..self.clone() }
    }

    fn refused(r: &Refusal) -> Self {
        Self {
            decision: Decision::Rejected,
            reason: r.reason.label().into(),
            predicted_ttft_ms: r.predicted_ttft_ms,
            predicted_e2e_ms: None,
            brownout_level: r.brownout_level,
        }
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
    /// Only third-party engines may serve it (a passthrough parameter).
    pub upstream_only: bool,
    /// The prompt's block hashes (`policies::prefix`; empty when prefix
    /// affinity is off): engines holding a prefix are credited with it.
    pub prefix: &'a [u64],
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

type Reply = oneshot::Sender<Result<EngineLease, Refused>>;

#[derive(Debug, Default)]
struct State {
    ctl: Controller,
    /// Where each gate waiter's grant goes, with its tier (for the error).
    /// Each waiter's reply, tier name and, with priority preemption on,
    /// its tier class (priority weight) to lease under.
    waiters: HashMap<WaiterId, (Reply, String, Option<u32>)>,
    /// The engines of the last decision (kept: no allocation per request).
    candidates: Vec<Candidate>,
}

/// The gateway's admission controller; one per process.
#[derive(Debug)]
pub struct Admission {
    state: Mutex<State>,
    origin: Instant,
    pool: Arc<EnginePool>,
    /// Requests that reached admission (the autoscaler's volatility).
    arrivals: std::sync::atomic::AtomicU64,
    /// Admitted requests per `[oserve]` type index (the planner's
    /// forecast input).
    pub(crate) type_arrivals: [std::sync::atomic::AtomicU64; policies::oserve::MAX_TYPES],
}

impl Admission {
    pub fn new(pool: Arc<EnginePool>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::default()),
            origin: crate::clock::now(),
            pool,
            arrivals: std::sync::atomic::AtomicU64::new(0),
            type_arrivals: Default::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Seconds since this controller started: the `now` of every decision.
    pub fn now(&self) -> f64 {
        crate::clock::since(self.origin).as_secs_f64()
    }

    pub fn brownout_level(&self) -> usize {
        self.lock().ctl.brownout_level()
    }

    /// Admitted requests of each `[oserve]` type so far.
    pub fn type_arrivals(&self) -> Vec<u64> {
        self.type_arrivals.iter().map(|a| a.load(std::sync::atomic::Ordering::Relaxed)).collect()
    }

    /// OServe's type-aware routes from now on (`None`: the primary class).
    pub fn set_routes(&self, routes: Option<policies::oserve::route::Routes>) {
        self.lock().ctl.set_routes(routes);
    }

    /// Each type's shares over classes in force (class names, shares).
    pub fn routes(&self) -> Option<(Vec<String>, Vec<Vec<f64>>)> {
        self.lock().ctl.routes().map(|r| (r.classes.clone(), r.shares.clone()))
    }

    /// Requests waiting at the gate.
    pub fn waiting(&self) -> usize {
        self.lock().ctl.waiting()
    }

    /// Requests that reached admission so far.
    pub fn arrivals(&self) -> u64 {
        self.arrivals.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The p95 of predicted queue latency over the TTFT budget (the
    /// autoscaler's queue signal).
    pub fn queue_ratio_p95(&self, policy: &PolicyDocument) -> Option<f64> {
        let now = self.now();
        self.lock().ctl.queue_ratio_p95(now, policy)
    }

    /// Candidates for admission into `out`: ready engines whose profile is
    /// known (and, given a request's model and whether only third-party
    /// engines may serve it, that serve it). Reads the registry's snapshot;
    /// copies nothing but numbers.
    fn candidates(
        &self,
        ctl: &mut Controller,
        policy: &PolicyDocument,
        out: &mut Vec<Candidate>,
        wants: Option<(&str, bool)>,
        preempting: Option<u32>,
    ) {
        out.clear();
        for (idx, slot) in self.pool.snapshot().iter().enumerate() {
            if wants.is_some_and(|(model, upstream_only)| !slot.serves(model, upstream_only)) {
                continue;
            }
            let Some(view) = slot.admission_view() else { continue };
            let class = match view.class {
                Some(c) => c,
                None => {
                    let Some(profile) = slot.profile() else { continue };
                    let c = ctl.class_of(&profile);
                    slot.set_admission_class(c);
                    c
                }
            };
            if !slot.routable() {
                continue;
            }
            let (page_tokens, free, low, batch) =
                (view.kv_page_tokens, view.kv_pages_free, view.kv_low_watermark_pages, view.batch_target);
            // Free KV above the low watermark per the last report, less
            // what this gateway sent since (not in the report yet).
            let headroom = if page_tokens == 0 {
                u64::MAX
            } else {
                let pages = u64::from(free.saturating_sub(low));
                (pages * u64::from(page_tokens)).saturating_sub(slot.leased_since_report())
            };
            out.push(Candidate {
                idx,
                class,
                slots: batch.max(1),
                active: slot.active(),
                active_out_tokens: slot.active_out_tokens(),
                prefill_backlog_tokens: slot.prefill_backlog_tokens(),
                kv_headroom_tokens: headroom,
                long_lane: false,
                cached_tokens: 0,
                preemptible: preempting.map_or(0, |c| slot.active_below(c)),
            });
        }
        policies::admission::assign_long_lanes(out, policy.routing.long_lane_engines);
    }

    /// The engines of one decision, credited with what they hold of the
    /// request's prompt: admission's candidates (into `st.candidates`), or
    /// with admission off the plain views, returned.
    fn engines_for(&self, st: &mut State, policy: &PolicyDocument, r: &AdmitRequest) -> Vec<EngineView> {
        let affinity = &policy.routing.prefix;
        self.pool.prefix.configure(affinity);
        let matched = self.pool.prefix.matched(r.prefix, self.pool.len());
        let mut loads = Vec::new();
        if policy.admission.mode == policies::admission::AdmissionMode::Off {
            st.candidates.clear();
            loads = self.pool.views();
        } else {
            let class = preemption_class(policy, r.tier);
            self.candidates(&mut st.ctl, policy, &mut st.candidates, Some((r.model, r.upstream_only)), class);
        }
        let sizes = (r.prefix.len() as u32, r.prompt_tokens);
        policies::admission::credit_prefix(&mut st.candidates, &mut loads, &matched, sizes, affinity);
        loads
    }

    /// Decides admit / degrade / reject for one request
    /// ([`Controller::request`]) and carries the decision out.
    pub fn admit(
        self: &Arc<Self>,
        policy: &PolicyDocument,
        r: &AdmitRequest,
    ) -> Result<Admitted, Box<Refused>> {
        self.arrivals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now = self.now();
        let tier = r.tier;
        let req = Request {
            tenant: &r.tenant.name,
            tier,
            model: r.model,
            prompt_tokens: r.prompt_tokens,
            max_tokens: r.max_tokens,
            sampling: r.sampling,
            ttft_hint_ms: r.ttft_hint.map(ms),
            e2e_hint_ms: r.e2e_hint.map(ms),
            prefix_blocks: r.prefix.len() as u32,
        };
        let mut guard = self.lock();
        let st = &mut *guard;
        let loads = self.engines_for(st, policy, r);
        let outcome = st.ctl.request(now, policy, &req, &st.candidates, &loads);
        let (admit, start) = match outcome {
            Outcome::Refuse(refusal) => return Err(Box::new(refuse(tier, &refusal))),
            Outcome::Start { engine, admit } => {
                let lease = self.pool.lease_as(engine, admit.work, preemption_class(policy, tier));
                (admit, Start::Now(lease))
            }
            Outcome::Anywhere { admit } => (admit, Start::Anywhere),
            Outcome::Wait { id, deadline, admit } => {
                // Freed slots wake the gate from now on; the pump below
                // catches one freed before this.
                self.pool.gate_waiting.store(true, std::sync::atomic::Ordering::Release);
                let (tx, rx) = oneshot::channel();
                st.waiters.insert(id, (tx, tier.name.clone(), preemption_class(policy, tier)));
                let wait = Duration::try_from_secs_f64((deadline - now).max(0.0)).unwrap_or(Duration::ZERO);
                let v = Verdict::admitted(&admit);
                (admit, Start::Wait(rx, tokio::time::Instant::now() + wait, v))
            }
        };
        drop(guard);
        let verdict = Verdict::admitted(&admit);
        m::admission(&tier.name, verdict.decision.as_str(), &verdict.reason).increment(1);
        if let Some((j, t)) = admit.work_type.and_then(|j| policy.oserve.types.get(j).map(|t| (j, t))) {
            ::metrics::counter!(m::WORKLOAD_TYPE, "type" => t.name.clone()).increment(1);
            self.type_arrivals[j].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let ticket = Ticket::new(
            self,
            &r.tenant.name,
            &tier.name,
            r.model,
            r.prompt_tokens,
            admit.ttft_budget_ms,
            admit.nominal,
        );
        if matches!(start, Start::Wait(..)) {
            self.pump(policy); // a slot may be free already
        }
        Ok(Admitted {
            verdict,
            max_tokens: admit.max_tokens,
            sampling: admit.sampling,
            key: admit.key,
            ttft_budget: duration_ms(admit.ttft_budget_ms),
            e2e_budget: duration_ms(admit.e2e_budget_ms),
            work: admit.work,
            start,
            ticket,
        })
    }

    /// The verdict of a request refused for its tenant's concurrency (the
    /// tenant-limits layer counts it; admission decides nothing more),
    /// counted as an admission decision.
    pub fn tenant_concurrency(&self, tier: &Tier) -> Verdict {
        let reason = Reason::TenantConcurrency.label();
        ::metrics::counter!(m::ADMISSION, "tier" => tier.name.clone(), "decision" => "rejected", "reason" => reason)
            .increment(1);
        Verdict {
            decision: Decision::Rejected,
            reason: reason.into(),
            predicted_ttft_ms: None,
            predicted_e2e_ms: None,
            brownout_level: self.brownout_level(),
        }
    }

    /// Carries out gate grants: leases to waiters, or their refusals.
    /// A waiter gone by now drops its lease, which frees the slot again.
    fn deliver(&self, st: &mut State, grants: Vec<Grant>) {
        for g in grants {
            let Some((tx, tier, class)) = st.waiters.remove(&g.id) else { continue };
            let sent = match g.result {
                Ok(engine) => Ok(self.pool.lease_as(engine, g.work, class)),
                Err(refusal) => {
                    ::metrics::counter!(m::ADMISSION, "tier" => tier.clone(), "decision" => "rejected", "reason" => refusal.reason.label())
                        .increment(1);
                    Err(Refused { error: api_error(&tier, &refusal), verdict: Verdict::refused(&refusal) })
                }
            };
            let _ = tx.send(sent);
        }
    }
}

/// The class a request of `tier` is counted and preempts under: its
/// priority weight, while priority preemption is on.
fn preemption_class(policy: &PolicyDocument, tier: &Tier) -> Option<u32> {
    policy.admission.preempt_lower_tiers.then_some(tier.priority_weight.get())
}

fn refuse(tier: &Tier, refusal: &Refusal) -> Refused {
    ::metrics::counter!(m::ADMISSION, "tier" => tier.name.clone(), "decision" => "rejected", "reason" => refusal.reason.label())
        .increment(1);
    Refused { error: api_error(&tier.name, refusal), verdict: Verdict::refused(refusal) }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn duration_ms(v: f64) -> Duration {
    Duration::try_from_secs_f64(v.max(0.0) / 1e3).unwrap_or(Duration::ZERO)
}

/// The OpenAI-style error for a refusal.
fn api_error(tier: &str, r: &Refusal) -> ApiError {
    let retry_after_s = r.retry_after_s;
    let message = match r.reason {
        Reason::TenantConcurrency => return ApiError::TenantConcurrency { limit: r.limit },
        Reason::NoEngine => return ApiError::NoReadyEngine,
        Reason::BrownoutContext => format!(
            "the system is in brownout level {}: prompts of tier {tier} are limited to {} tokens for now",
            r.brownout_level, r.limit
        ),
        Reason::TtftInfeasible => format!(
            "the system is overloaded: the first token is predicted in {:.0} ms, over tier {tier}'s {:.0} ms budget; retry after {retry_after_s} s",
            r.predicted_ttft_ms.unwrap_or(f64::INFINITY), r.ttft_budget_ms
        ),
        Reason::E2eInfeasible => format!(
            "the system is overloaded: the answer cannot finish within tier {tier}'s {:.0} ms end-to-end budget even at {} output tokens; retry after {retry_after_s} s",
            r.e2e_budget_ms, r.limit
        ),
        Reason::KvHeadroom => "every engine's KV cache is at its low watermark; retry shortly".to_string(),
        Reason::DeadlineUnreachable => format!(
            "waited {:.0} ms for an engine slot; with {:.0} ms of prefill the first token would miss its {:.0} ms budget",
            r.waited_ms, r.prefill_ms, r.ttft_budget_ms
        ),
        Reason::QueueTimeout => format!(
            "no engine slot freed within the {:.0} ms TTFT budget; retry shortly",
            r.ttft_budget_ms
        ),
        Reason::SloUnattainable => {
            return ApiError::SloUnattainable {
                message: format!(
                    "this request cannot meet tier {tier}'s targets even on an idle engine: predicted {:.0} ms \
                     against a {:.0} ms TTFT and {:.0} ms end-to-end budget; shorten the prompt or the output, \
                     or use a tier with longer targets (retrying will not help)",
                    r.predicted_ttft_ms.unwrap_or(f64::INFINITY),
                    r.ttft_budget_ms,
                    r.e2e_budget_ms
                ),
            }
        }
    };
    ApiError::Overloaded { reason: Overload::Admission(r.reason), message, retry_after_s }
}

#[cfg(test)]
mod tests;
