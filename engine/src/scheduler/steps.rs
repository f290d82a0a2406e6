//! Running the step `policies::turn` picked: a prefill batch, or one
//! decode step over the running batch, on the backend and in device time.

use tokio::sync::mpsc;

use super::{compute, m, seq, smooth, Backend, Command, Core, Phase, Seq};

impl<B: Backend> Core<B> {
    /// Runs a prefill batch and hands its first tokens back.
    pub(super) async fn prefill_step(
        &mut self,
        mut batch: Vec<Seq<B::Seq>>,
        rx: &mut mpsc::UnboundedReceiver<Command>,
    ) {
        let started = self.now();
        // Wall time only for the spans of traced sequences.
        let started_wall = batch.iter().any(|s| s.payload.trace.is_some()).then(crate::clock::wall);
        ::metrics::histogram!(m::PREFILL_BATCH_SIZE).record(batch.len() as f64);
        for s in batch.iter_mut().filter(|s| s.generated == 0) {
            s.payload.queue_ms = (started - s.enqueued_at).as_secs_f64() * 1e3;
            ::metrics::histogram!(m::FORMATION).record(s.payload.queue_ms / 1e3);
            ::metrics::counter!(m::PREFIX_LOOKUP_TOKENS).increment(u64::from(s.prompt_tokens));
            ::metrics::counter!(m::PREFIX_HIT_TOKENS).increment(u64::from(s.cached_tokens));
        }
        let (outs, device) = compute(&mut self.backend, &mut batch, Phase::Prefill);
        self.stats.prefilling = (batch.len() as u32, batch.iter().map(Seq::tokens).sum());
        self.wait(device, rx).await;
        self.stats.prefilling = (0, 0);
        let prefill_ms = (self.now() - started).as_secs_f64() * 1e3;
        ::metrics::histogram!(m::PREFILL).record(prefill_ms / 1e3);
        let size = batch.len();
        let mut outs = outs.into_iter();
        self.turns.prefilled(self.now(), batch, |s| {
            if s.generated == 0 {
                s.payload.prefill_ms = prefill_ms;
            }
            let cached = s.cached_tokens;
            if let (Some(t), Some(at)) = (&mut s.payload.trace, started_wall) {
                t.prefilled(at, size, cached);
            }
            seq::apply(s, outs.next().unwrap_or(crate::backend::Token::End))
        });
    }

    /// One decode step over every running sequence.
    pub(super) async fn decode_step(&mut self, rx: &mut mpsc::UnboundedReceiver<Command>) {
        let started = crate::clock::now();
        let (outs, device) = compute(&mut self.backend, self.turns.running_mut(), Phase::Decode);
        let batch = outs.len();
        self.wait(device, rx).await;
        self.stats.decode_step_ms =
            smooth(self.stats.decode_step_ms, crate::clock::since(started).as_secs_f64() * 1e3);
        self.stats.batch_achieved = smooth(self.stats.batch_achieved, batch as f64);
        ::metrics::histogram!(m::DECODE_STEP).record(crate::clock::since(started).as_secs_f64());
        ::metrics::histogram!(m::BATCH_SIZE).record(batch as f64);
        let mut outs = outs.into_iter();
        self.turns.decoded(self.now(), |s| {
            if let Some(t) = &mut s.payload.trace {
                t.decoded(batch);
            }
            seq::apply(s, outs.next().unwrap_or(crate::backend::Token::End))
        });
    }
}
