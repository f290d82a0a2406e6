//! Making room in the KV cache for the running batch's next tokens:
//! token-boundary preemption of the worst-keyed sequence past its quantum
//! (its pages return; it is recomputed later), or ending a sequence when
//! none may be preempted. And priority preemption: pausing a lower class's
//! sequence (pages kept) for a higher class that would miss its TTFT
//! waiting for a slot, and resuming it (`policies::preempt`).

use std::time::Duration;

use policies::preempt::{resumes, victim, Running, Waiting};

use super::{m, Backend, Core};

impl<B: Backend> Core<B> {
    /// Gives every running sequence a page for its next token, preempting
    /// (or, failing that, ending) sequences when the cache is exhausted.
    pub(super) fn make_room(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            let need = u64::from(self.running[i].context()) + 1;
            let unit = self.cfg.extend_pages;
            let ok = self.running[i].pages.as_mut().is_some_and(|p| p.ensure(need, unit).is_ok());
            if ok {
                i += 1;
                continue;
            }
            match self.victim() {
                Some(v) => {
                    let mut seq = self.running.remove(v);
                    seq.pages = None; // pages back to the free list
                    seq.preemptions += 1;
                    seq.since_start = 0;
                    if let Some(t) = &mut seq.trace {
                        t.preempted();
                    }
                    self.stats.preemptions += 1;
                    ::metrics::counter!(m::PREEMPTIONS).increment(1);
                    tracing::debug!(event = "preempted", seq = seq.id, generated = seq.generated);
                    self.queue.push(seq);
                    if v < i {
                        i -= 1;
                    }
                }
                None => {
                    let mut seq = self.running.remove(i);
                    seq.fail("kv_exhausted", "KV cache exhausted and no sequence may be preempted");
                }
            }
        }
    }

    /// At a token boundary: paused sequences take free slots back (unless
    /// a higher class waits for them), then, with every slot taken, a
    /// lower class's sequence is paused if the most important waiting
    /// sequence would otherwise miss its TTFT budget. Nothing to do (and no
    /// allocation) while no queued sequence takes part in preemption.
    pub(super) fn reprioritize(&mut self) {
        self.resume_paused();
        let max_batch = self.cfg.limits.max_batch as usize;
        if self.running.len() >= max_batch && self.queue.iter().any(|s| s.priority.is_some()) {
            self.pause_for_priority();
        }
    }

    /// Paused sequences back into free slots, the most important first,
    /// unless a higher class waits for the slot.
    fn resume_paused(&mut self) {
        let max_batch = self.cfg.limits.max_batch as usize;
        while self.running.len() < max_batch && !self.paused.is_empty() {
            let paused: Vec<_> = self.paused.iter().map(|s| (s.id, class(s))).collect();
            let waiting: Vec<_> = self.queue.iter().map(|s| (s.id, class(s))).collect();
            let Some(id) = resumes(&paused, &waiting) else { break };
            let i = self.paused.iter().position(|s| s.id == id).expect("ids come from the paused list");
            let mut seq = self.paused.remove(i);
            seq.since_start = 0;
            tracing::debug!(event = "resumed", seq = seq.id, generated = seq.generated);
            self.running.push(seq);
        }
    }

    /// Pauses the running sequence `policies::preempt::victim` names, if any.
    fn pause_for_priority(&mut self) {
        let now = self.now();
        let waiting: Vec<Waiting> = self
            .queue
            .iter()
            .filter(|s| s.generated == 0)
            .map(|s| Waiting {
                id: s.id,
                class: class(s),
                prefill_tokens: s.context() - s.cached(),
                ttft_deadline: s.enqueued_at + s.ttft_budget,
            })
            .collect();
        let running: Vec<Running> = self
            .running
            .iter()
            .map(|s| Running {
                id: s.id,
                class: class(s),
                remaining_tokens: s.max_tokens.saturating_sub(s.generated),
                pauses: s.pauses,
                max_pauses: s.priority.map_or(0, |p| p.max_pauses),
                e2e_deadline: s
                    .priority
                    .map(|p| s.enqueued_at + Duration::from_millis(u64::from(p.e2e_budget_ms))),
            })
            .collect();
        let max_batch = self.cfg.limits.max_batch;
        let Some(id) = victim(&waiting, &running, max_batch, &self.cfg.profile, now) else { return };
        let i = self.running.iter().position(|s| s.id == id).expect("ids come from the running batch");
        let mut seq = self.running.remove(i);
        seq.pauses += 1;
        if let Some(t) = &mut seq.trace {
            t.paused();
        }
        self.stats.pauses += 1;
        ::metrics::counter!(m::PRIORITY_PAUSES).increment(1);
        tracing::debug!(event = "paused", seq = seq.id, generated = seq.generated, pauses = seq.pauses);
        self.paused.push(seq);
    }

    /// The running sequence to preempt: worst key among those past their
    /// quantum and under the preemption cap.
    fn victim(&self) -> Option<usize> {
        self.running
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.since_start >= self.cfg.min_quantum_tokens && s.preemptions < self.cfg.max_preemptions
            })
            .max_by(|(_, a), (_, b)| a.key.total_cmp(&b.key).then(a.enqueued_at.cmp(&b.enqueued_at)))
            .map(|(i, _)| i)
    }
}

fn class<S>(s: &super::Seq<S>) -> Option<u32> {
    s.priority.map(|p| p.class)
}
