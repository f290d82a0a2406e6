//! The gate: admitted requests waiting for an engine slot of their class,
//! in deficit round-robin order over tenants, each until its deadline; the
//! pump that hands freed slots to them (re-checking each one's TTFT when
//! its turn comes), and their removal when their client goes.

use super::*;

impl Controller {
    /// Every slot of `class` busy: the admitted request waits at its gate
    /// for one, at most the TTFT budget and `routing.max_queue_ms`, in its
    /// tenant's DRR queue (`weight`, `n_hat` tokens of work).
    pub(super) fn wait_at_gate(
        &mut self,
        now: f64,
        policy: &PolicyDocument,
        r: &Request,
        class: usize,
        (weight, n_hat): (u32, u64),
        admit: Admit,
    ) -> Outcome {
        let id = self.next_waiter;
        self.next_waiter += 1;
        let ttft_budget_ms = admit.ttft_budget_ms;
        let wait_ms = ttft_budget_ms.min(f64::from(policy.routing.max_queue_ms)).max(0.0);
        let deadline = now + wait_ms / 1e3;
        let w = Waiter {
            id,
            work: admit.work,
            n_in: r.prompt_tokens,
            arrived: now,
            deadline,
            recheck_ms: ttft_budget_ms * policy.admission.recheck_factor,
            ttft_budget_ms,
            level: admit.brownout_level,
            tier: r.tier.name.clone(),
        };
        let quantum = policy.routing.drr_quantum_tokens;
        let gate = self.gates.entry(class).or_insert_with(|| Drr::new(quantum));
        gate.push(r.tenant, weight, n_hat, admit.key, w);
        Outcome::Wait { id, deadline, admit }
    }

    /// Hands free engine slots to waiters, in deficit round-robin order per
    /// class; re-checks each waiter's TTFT prediction when its turn comes.
    /// `engines`: the ready engines now; a grant counts against its engine
    /// for the rest of this call. `alive`: whether a waiter still waits
    /// (its client may have gone); the others are dropped first.
    pub fn pump(
        &mut self,
        now: f64,
        policy: &PolicyDocument,
        engines: &[Candidate],
        mut alive: impl FnMut(WaiterId) -> bool,
    ) -> Vec<Grant> {
        let mut grants = Vec::new();
        if self.gates.values().all(Drr::is_empty) {
            return grants;
        }
        let mut engines = engines.to_vec();
        for (class, gate) in self.gates.iter_mut() {
            // A waiter whose caller went away is skipped when its turn
            // comes (and purged by [`Self::purge`]): scanning the whole
            // gate on every freed slot made an overloaded gate quadratic.
            let Some(model) = self.models.get(*class) else { continue };
            while !gate.is_empty() {
                // The free engine with the least prefill backlog.
                let free = engines
                    .iter_mut()
                    .filter(|e| e.class == *class && e.active < e.slots)
                    .min_by_key(|e| e.prefill_backlog_tokens);
                let Some(e) = free else { break };
                let Some((_, w)) = gate.pop() else { break };
                if !alive(w.id) {
                    continue;
                }
                if now > w.deadline {
                    self.trouble.push(now, REFUSED);
                    self.gate_waits.push(now, w.waited_ratio(w.deadline));
                    grants.push(Grant { id: w.id, work: w.work, result: Err(timeout(&w, policy)) });
                    continue;
                }
                let waited_ms = (now - w.arrived) * 1e3;
                self.gate_waits.push(now, w.waited_ratio(now));
                let prefill = model.predict(&w.tier, w.n_in, 1, 1.0, &policy.estimator).ttft_ms(0.0);
                if waited_ms + prefill > w.recheck_ms {
                    let mut refusal = Refusal::new(
                        Reason::DeadlineUnreachable,
                        retry_after(waited_ms + prefill - w.recheck_ms, &policy.admission),
                        w.level,
                    );
                    refusal.waited_ms = waited_ms;
                    refusal.prefill_ms = prefill;
                    refusal.ttft_budget_ms = w.recheck_ms;
                    self.trouble.push(now, REFUSED);
                    grants.push(Grant { id: w.id, work: w.work, result: Err(refusal) });
                    continue;
                }
                e.active += 1;
                e.prefill_backlog_tokens += w.work.prompt_tokens;
                e.active_out_tokens += w.work.out_tokens;
                grants.push(Grant { id: w.id, work: w.work, result: Ok(e.idx) });
            }
        }
        grants
    }

    /// Drops every waiter `alive` says is gone (the caller runs it on its
    /// tick: one scan of the gate, not one per freed slot).
    pub fn purge(&mut self, alive: impl Fn(WaiterId) -> bool) {
        for gate in self.gates.values_mut() {
            gate.retain(|w| alive(w.id));
        }
    }

    /// A waiter's client went away, or the caller timed it out: it leaves
    /// the gate (its tenant's open count is released by [`Self::release`]).
    pub fn cancel(&mut self, id: WaiterId) {
        for gate in self.gates.values_mut() {
            gate.retain(|w| w.id != id);
        }
    }
}

/// A waiter whose deadline passed: `queue_timeout`, with how long it
/// waited.
pub(super) fn timeout(w: &Waiter, policy: &PolicyDocument) -> Refusal {
    let mut refusal = Refusal::new(Reason::QueueTimeout, policy.admission.retry_after_min_s, w.level);
    refusal.ttft_budget_ms = w.ttft_budget_ms;
    refusal.waited_ms = (w.deadline - w.arrived) * 1e3;
    refusal
}
