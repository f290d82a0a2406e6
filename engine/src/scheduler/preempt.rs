//! Making room in the KV cache for the running batch's next tokens:
//! token-boundary preemption of the worst-keyed sequence past its quantum
//! (its pages return; it is recomputed later), or ending a sequence when
//! none may be preempted.

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
