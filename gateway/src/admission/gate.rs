//! The gate: requests admitted while every engine of their class is busy
//! wait here, one deficit round-robin queue per engine class, and get the
//! next slot that frees (late binding). Also the control loop that runs it
//! with brownout's ticks under the active policy version.

use std::sync::Arc;
use std::time::Duration;

use policies::admission as adm;
use policies::fairness::Drr;
use policies::PolicyDocument;
use tokio::sync::{oneshot, watch};

use super::{Admission, AdmitRequest, Refused, State, Verdict};
use crate::engines::{EngineLease, Work};
use crate::error::ApiError;
use crate::metrics as m;

/// One request waiting at the gate.
#[derive(Debug)]
pub(super) struct Waiter {
    tx: oneshot::Sender<Result<EngineLease, Refused>>,
    work: Work,
    n_in: u32,
    arrived: f64,
    ttft_budget_ms: f64,
    verdict: Verdict,
}

/// Where a request waits: its class's queue, with its DRR weight and cost
/// (prompt + expected output tokens), ordering key and TTFT budget.
#[derive(Debug, Clone, Copy)]
pub(super) struct Place {
    pub class: usize,
    pub weight: u32,
    pub cost: u64,
    pub key: f64,
    pub ttft_budget_ms: f64,
}

/// Queues `r` at the gate; returns where its slot (or refusal) arrives and
/// how long it may wait (its TTFT budget, at most `routing.max_queue_ms`).
pub(super) fn enqueue(
    st: &mut State,
    policy: &PolicyDocument,
    r: &AdmitRequest,
    now: f64,
    work: Work,
    place: Place,
    verdict: Verdict,
) -> (oneshot::Receiver<Result<EngineLease, Refused>>, tokio::time::Instant) {
    let (tx, rx) = oneshot::channel();
    let w = Waiter {
        tx,
        work,
        n_in: r.prompt_tokens,
        arrived: now,
        ttft_budget_ms: place.ttft_budget_ms * policy.admission.recheck_factor,
        verdict,
    };
    let quantum = policy.routing.drr_quantum_tokens;
    let gate = st.gates.entry(place.class).or_insert_with(|| Drr::new(quantum));
    gate.push(&r.tenant.name, place.weight, place.cost, place.key, w);
    let budget = Duration::try_from_secs_f64(place.ttft_budget_ms / 1e3).unwrap_or(Duration::ZERO);
    let wait = budget.min(Duration::from_millis(policy.routing.max_queue_ms.into()));
    (rx, tokio::time::Instant::now() + wait)
}

impl Admission {
    /// Hands free engine slots to waiters, in deficit round-robin order per
    /// class; re-checks each waiter's TTFT prediction when its turn comes.
    pub fn pump(&self, policy: &PolicyDocument) {
        let now = self.now();
        let mut st = self.lock();
        if st.gates.values().all(Drr::is_empty) {
            return;
        }
        let engines = self.candidates(&mut st, policy);
        let st = &mut *st;
        for (class, gate) in st.gates.iter_mut() {
            gate.retain(|w| !w.tx.is_closed());
            let Some(model) = st.models.get(*class) else { continue };
            loop {
                if gate.is_empty() {
                    break;
                }
                // The free engine with the least prefill backlog.
                let free = engines
                    .iter()
                    .filter(|e| e.class == *class && self.pool.slot(e.idx).active() < e.slots)
                    .min_by_key(|e| self.pool.slot(e.idx).prefill_backlog_tokens());
                let Some(e) = free else { break };
                let Some((_, w)) = gate.pop() else { break };
                let waited_ms = (now - w.arrived) * 1e3;
                let prefill = model.predict(w.n_in, 1, 1.0, &policy.estimator).prefill_ms;
                if waited_ms + prefill > w.ttft_budget_ms {
                    let mut v = w.verdict.clone();
                    v.decision = "rejected";
                    v.reason = "deadline_unreachable".into();
                    let err = ApiError::Overloaded {
                        reason: "deadline_unreachable",
                        message: format!(
                            "waited {waited_ms:.0} ms for an engine slot; with {prefill:.0} ms of prefill the first token would miss its {:.0} ms budget",
                            w.ttft_budget_ms
                        ),
                        retry_after_s: adm::retry_after(waited_ms + prefill - w.ttft_budget_ms, &policy.admission),
                    };
                    let _ = w.tx.send(Err(Refused { error: err, verdict: v }));
                    continue;
                }
                let lease = self.pool.lease(e.idx, w.work);
                let _ = w.tx.send(Ok(lease)); // a waiter gone drops the lease: slot freed again
            }
        }
    }

    /// Runs the gate and brownout under the active policy version: wakes
    /// on freed slots, every tick, and when a reload swaps the version.
    pub async fn run(self: Arc<Self>, mut versions: watch::Receiver<Arc<PolicyDocument>>) {
        const TICK: Duration = Duration::from_millis(250);
        let mut next_tick = tokio::time::Instant::now() + TICK;
        let mut policy = versions.borrow_and_update().clone();
        loop {
            tokio::select! {
                () = self.pool.slot_freed.notified() => {}
                () = tokio::time::sleep_until(next_tick) => {
                    next_tick += TICK;
                    self.tick(&policy);
                }
                changed = versions.changed() => {
                    if changed.is_err() {
                        return; // the store is gone: the gateway is stopping
                    }
                    policy = versions.borrow_and_update().clone();
                    self.reconfigure(&policy);
                }
            }
            self.pump(&policy);
        }
    }

    /// A new policy version: gates take its DRR quantum; brownout follows
    /// its levels at the next tick. Waiters keep the budgets they were
    /// admitted with.
    fn reconfigure(&self, policy: &PolicyDocument) {
        let mut st = self.lock();
        for gate in st.gates.values_mut() {
            gate.set_quantum(policy.routing.drr_quantum_tokens);
        }
    }

    /// One brownout step and the gauges.
    pub fn tick(&self, policy: &PolicyDocument) {
        let now = self.now();
        let cfg = &policy.brownout;
        let mut st = self.lock();
        let q = st.queue_signal.p95(now, cfg.window_s, cfg.min_samples);
        let t = st.ttft_signal.p95(now, cfg.window_s, cfg.min_samples);
        let signal = match (q, t) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        if let Some(level) = st.brownout.update(now, signal, cfg) {
            tracing::warn!(event = "brownout_level", level, signal = signal.unwrap_or(0.0));
        }
        ::metrics::gauge!(m::BROWNOUT_LEVEL).set(st.brownout.level() as f64);
        ::metrics::gauge!(m::BROWNOUT_SIGNAL).set(signal.unwrap_or(0.0));
        ::metrics::gauge!(m::QUEUE_WAITING).set(st.gates.values().map(Drr::len).sum::<usize>() as f64);
    }
}
