//! Room and priority at a token boundary: growing the running batch's KV
//! pages and preempting (or ending) a sequence when the cache is full;
//! pausing a lower class for a higher one that would miss its TTFT, and
//! resuming it (`crate::preempt`).

use std::time::Duration;

use super::{Payload, Seq, Turns};
use crate::preempt::{resumes, victim, Running, Waiting};

impl<S: Payload> Turns<S> {
    /// At a token boundary: paused sequences take free slots back (unless
    /// a higher class waits for them), then, with every slot taken, a
    /// lower class's sequence is paused if the most important waiting
    /// sequence would otherwise miss its TTFT budget. Nothing to do (and
    /// no allocation) while no queued sequence takes part in preemption.
    pub(super) fn reprioritize(&mut self, now: Duration) {
        self.resume_paused();
        let max_batch = self.cfg.limits.max_batch as usize;
        if self.running.len() >= max_batch && self.queue.iter().any(|s| s.priority.is_some()) {
            self.pause_for_priority(now);
        }
    }

    fn resume_paused(&mut self) {
        let max_batch = self.cfg.limits.max_batch as usize;
        while self.running.len() < max_batch && !self.paused.is_empty() {
            let paused: Vec<_> = self.paused.iter().map(|s| (s.id, class(s))).collect();
            let waiting: Vec<_> = self.queue.iter().map(|s| (s.id, class(s))).collect();
            let Some(id) = resumes(&paused, &waiting) else { break };
            let Some(i) = self.paused.iter().position(|s| s.id == id) else { break };
            let mut seq = self.paused.remove(i);
            seq.since_start = 0;
            S::resumed(&mut seq);
            self.running.push(seq);
        }
    }

    fn pause_for_priority(&mut self, now: Duration) {
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
        let Some(i) = self.running.iter().position(|s| s.id == id) else { return };
        let mut seq = self.running.remove(i);
        seq.pauses += 1;
        self.stats.pauses += 1;
        S::paused(&mut seq);
        self.paused.push(seq);
    }

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
                    self.stats.preemptions += 1;
                    S::preempted(&mut seq);
                    self.queue.push(seq);
                    if v < i {
                        i -= 1;
                    }
                }
                None => {
                    let mut seq = self.running.remove(i);
                    S::failed(
                        &mut seq,
                        "kv_exhausted",
                        "KV cache exhausted and no sequence may be preempted",
                    );
                }
            }
        }
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

fn class<S>(s: &Seq<S>) -> Option<u32> {
    s.priority.map(|p| p.class)
}
