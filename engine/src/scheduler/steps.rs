//! The two kinds of token boundary: a prefill batch (the sequences batch
//! formation picks, preempted ones getting pages again first) and one
//! decode step over the running batch.

use policies::batching::{form_prefill, Queued};
use tokio::sync::mpsc;

use super::{compute, m, smooth, Backend, Command, Core, Phase, Seq};

impl<B: Backend> Core<B> {
    /// Runs a prefill batch if batch formation picks one; `false` if not.
    pub(super) async fn prefill_step(&mut self, rx: &mut mpsc::UnboundedReceiver<Command>) -> bool {
        let mut batch = self.take_planned();
        if batch.is_empty() {
            return false;
        }
        let started = self.now();
        // Wall time only for the spans of traced sequences.
        let started_wall = batch.iter().any(|s| s.trace.is_some()).then(crate::clock::wall);
        ::metrics::histogram!(m::PREFILL_BATCH_SIZE).record(batch.len() as f64);
        for s in batch.iter_mut().filter(|s| s.generated == 0) {
            s.queue_ms = (started - s.enqueued_at).as_secs_f64() * 1e3;
            s.cached_tokens = s.cached();
            self.stats.prompt_tokens += u64::from(s.prompt_tokens);
            self.stats.cached_tokens += u64::from(s.cached_tokens);
            ::metrics::histogram!(m::FORMATION).record(s.queue_ms / 1e3);
            ::metrics::counter!(m::PREFIX_LOOKUP_TOKENS).increment(u64::from(s.prompt_tokens));
            ::metrics::counter!(m::PREFIX_HIT_TOKENS).increment(u64::from(s.cached_tokens));
        }
        let (outs, device) = compute(&mut self.backend, &mut batch, Phase::Prefill);
        self.stats.prefilling = (batch.len() as u32, batch.iter().map(Seq::tokens).sum());
        self.wait(device, rx).await;
        self.stats.prefilling = (0, 0);
        let prefill_ms = (self.now() - started).as_secs_f64() * 1e3;
        ::metrics::histogram!(m::PREFILL).record(prefill_ms / 1e3);
        if self.running.is_empty() {
            // The batch starts the running set: its first tokens are the
            // newest the running sequences have.
            self.tokens_at = self.now();
        }
        let outs_len = batch.len();
        for (mut seq, out) in batch.into_iter().zip(outs) {
            // The prompt's pages hold its K/V now: later prompts may share them.
            if let Some(pages) = seq.pages.as_mut() {
                pages.commit(&seq.blocks);
            }
            if seq.generated == 0 {
                seq.prefill_ms = prefill_ms;
            }
            let (size, cached) = (outs_len, seq.cached_tokens);
            if let (Some(t), Some(at)) = (&mut seq.trace, started_wall) {
                t.prefilled(at, size, cached);
            }
            if !seq.apply(out) {
                self.running.push(seq);
            }
        }
        true
    }

    /// Takes the sequences batch formation picks out of the queue. A
    /// preempted one gets pages again first; it stays queued while the cache
    /// is full, and ends if it has outgrown the whole cache.
    fn take_planned(&mut self) -> Vec<Seq<B::Seq>> {
        let views: Vec<Queued> = self
            .queue
            .iter()
            .map(|s| Queued {
                id: s.id,
                // What the prefill will compute: the cached prefix is free.
                prompt_tokens: s.context() - s.cached(),
                cached_tokens: s.cached(),
                key: s.key,
                enqueued_at: s.enqueued_at,
                ttft_budget: s.ttft_budget,
            })
            .collect();
        let plan =
            form_prefill(&views, self.running.len() as u32, &self.cfg.limits, &self.cfg.profile, self.now());
        let mut batch = Vec::with_capacity(plan.admit.len());
        for id in &plan.admit {
            let i = self.queue.iter().position(|s| s.id == *id).expect("planned ids come from the queue");
            let mut seq = self.queue.remove(i);
            if seq.pages.is_none() {
                // A preempted sequence returns: it was admitted already, so
                // only real exhaustion keeps it waiting. It needs room for
                // its context and its next token.
                let tokens = u64::from(seq.context()) + 1;
                match self.kv.admit_running(tokens, seq.reuse()) {
                    Ok(p) => seq.pages = Some(p),
                    Err(_) if self.kv.pages_for(tokens) > self.kv.total_pages() => {
                        seq.fail("kv_exhausted", "the sequence has outgrown the whole KV cache");
                        continue;
                    }
                    Err(_) => {
                        self.queue.push(seq);
                        continue;
                    }
                }
            }
            batch.push(seq);
        }
        batch
    }

    /// One decode step over every running sequence; `false` if none runs.
    pub(super) async fn decode_step(&mut self, rx: &mut mpsc::UnboundedReceiver<Command>) -> bool {
        self.make_room();
        if self.running.is_empty() {
            return false;
        }
        let started = crate::clock::now();
        let (outs, device) = compute(&mut self.backend, &mut self.running, Phase::Decode);
        let batch = outs.len();
        self.wait(device, rx).await;
        self.tokens_at = self.now();
        self.stats.decode_step_ms =
            smooth(self.stats.decode_step_ms, crate::clock::since(started).as_secs_f64() * 1e3);
        self.stats.batch_achieved = smooth(self.stats.batch_achieved, batch as f64);
        ::metrics::histogram!(m::DECODE_STEP).record(crate::clock::since(started).as_secs_f64());
        ::metrics::histogram!(m::BATCH_SIZE).record(batch as f64);
        let mut done = vec![false; batch];
        for (i, out) in outs.into_iter().enumerate() {
            if let Some(t) = &mut self.running[i].trace {
                t.decoded(batch);
            }
            done[i] = self.running[i].apply(out);
        }
        let mut i = 0;
        self.running.retain(|_| {
            i += 1;
            !done[i - 1]
        });
        true
    }
}
