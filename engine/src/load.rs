//! What the engine is carrying right now: sequences, tokens, KV pages.
//!
//! Every admitted sequence holds a [`SequenceGuard`]; dropping it (on
//! completion, error, or when the gateway cancels the stream) returns the
//! sequence's tokens and, through its [`PageSet`], its KV pages. Release
//! happens only through `Drop`, never by bookkeeping at call sites, so a
//! cancelled or panicked task cannot leak capacity.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::kv::{KvAllocator, KvConfig, KvExhausted, KvRefusal, KvSnapshot, PageSet};

/// How sequences reserve KV pages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReservePolicy {
    /// Output tokens reserved at admission, on top of the prompt (capped by
    /// the request's `max_tokens`): the over-estimate of its output.
    pub output_reserve_tokens: u32,
    /// Pages added at a time when decode outgrows the reservation.
    pub extend_pages: u32,
}

impl Default for ReservePolicy {
    fn default() -> Self {
        Self { output_reserve_tokens: 64, extend_pages: 2 }
    }
}

/// Shared load counters of one engine.
#[derive(Debug)]
pub struct Load {
    counters: Mutex<Counters>,
    kv: Arc<KvAllocator>,
    reserve: ReservePolicy,
}

#[derive(Debug, Default)]
struct Counters {
    inflight_sequences: u32,
    inflight_tokens: u64,
    decode_step_ms: f64,
}

/// A snapshot of the counters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Snapshot {
    pub inflight_sequences: u32,
    pub inflight_tokens: u64,
    pub kv: KvSnapshot,
    pub decode_step_ms: f64,
}

impl Load {
    pub fn new(kv: KvConfig, reserve: ReservePolicy) -> Self {
        Self { counters: Mutex::default(), kv: KvAllocator::new(kv), reserve }
    }

    fn lock(&self) -> MutexGuard<'_, Counters> {
        // Counters stay consistent even if a holder panicked: every update
        // is a single arithmetic step.
        self.counters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a sequence of `prompt_tokens` that may generate up to
    /// `max_tokens`, reserving KV pages for the prompt plus the output
    /// over-estimate.
    pub fn admit(self: &Arc<Self>, prompt_tokens: u32, max_tokens: u32) -> Result<SequenceGuard, KvRefusal> {
        let reserve = self.reserve.output_reserve_tokens.min(max_tokens);
        let pages = self.kv.admit(u64::from(prompt_tokens) + u64::from(reserve))?;
        let tokens = u64::from(prompt_tokens) + u64::from(max_tokens);
        let mut c = self.lock();
        c.inflight_sequences += 1;
        c.inflight_tokens += tokens;
        Ok(SequenceGuard { load: Arc::clone(self), tokens, pages })
    }

    /// Sequences currently running: the emulated decode batch size.
    pub fn batch_size(&self) -> u32 {
        self.lock().inflight_sequences
    }

    /// Records one decode step's duration (exponentially weighted mean).
    pub fn record_decode_step(&self, ms: f64) {
        let mut c = self.lock();
        c.decode_step_ms = if c.decode_step_ms == 0.0 { ms } else { 0.9 * c.decode_step_ms + 0.1 * ms };
    }

    /// Samples KV consumption at `now_secs` (for the slope in load reports).
    pub fn sample_kv(&self, now_secs: f64) {
        self.kv.sample(now_secs);
    }

    pub fn snapshot(&self) -> Snapshot {
        let c = self.lock();
        Snapshot {
            inflight_sequences: c.inflight_sequences,
            inflight_tokens: c.inflight_tokens,
            kv: self.kv.snapshot(),
            decode_step_ms: c.decode_step_ms,
        }
    }
}

/// Ownership of one admitted sequence's share of the engine.
#[derive(Debug)]
pub struct SequenceGuard {
    load: Arc<Load>,
    tokens: u64,
    pages: PageSet,
}

impl SequenceGuard {
    /// Makes room for `tokens` tokens of context, extending the page set in
    /// the configured units.
    pub fn ensure_tokens(&mut self, tokens: u64) -> Result<(), KvExhausted> {
        self.pages.ensure(tokens, self.load.reserve.extend_pages)
    }

    pub fn pages(&self) -> &PageSet {
        &self.pages
    }
}

impl Drop for SequenceGuard {
    fn drop(&mut self) {
        let mut c = self.load.lock();
        c.inflight_sequences -= 1;
        c.inflight_tokens -= self.tokens;
        // `pages` drops right after this, returning the KV pages.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(pages: u32) -> Arc<Load> {
        let kv = KvConfig { total_pages: pages, page_tokens: 16, low_watermark: 0.0, high_watermark: 0.0 };
        Arc::new(Load::new(kv, ReservePolicy { output_reserve_tokens: 16, extend_pages: 1 }))
    }

    #[test]
    fn admission_reserves_prompt_plus_output_estimate_and_drop_returns_all() {
        let load = load(10);
        let mut a = load.admit(24, 100).unwrap(); // 24 + 16 tokens -> 3 pages
        let s = load.snapshot();
        assert_eq!((s.inflight_sequences, s.inflight_tokens, s.kv.free), (1, 124, 7));
        a.ensure_tokens(24 + 40).unwrap(); // 64 tokens -> 4 pages
        assert_eq!(load.snapshot().kv.free, 6);
        let _b = load.admit(1, 1).unwrap(); // 2 tokens -> 1 page
        drop(a);
        let s = load.snapshot();
        assert_eq!((s.inflight_sequences, s.inflight_tokens, s.kv.free), (1, 2, 9));
    }

    #[test]
    fn a_refusal_holds_nothing() {
        let load = load(4);
        let _a = load.admit(40, 8).unwrap(); // 48 tokens -> 3 pages
        assert_eq!(load.admit(20, 0).unwrap_err().code(), "kv_low_watermark");
        assert_eq!(load.snapshot().inflight_sequences, 1);
    }
}
