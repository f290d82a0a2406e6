//! What the engine is carrying right now, and the KV pages it holds.
//!
//! Every admitted sequence holds a [`SequenceGuard`]; dropping it (on
//! completion, error, or when the gateway cancels the stream) returns the
//! sequence's tokens and KV pages. Release happens only through `Drop`, never
//! by bookkeeping at call sites, so a cancelled or panicked task cannot leak
//! capacity. The single-owner scheduler of a later issue keeps this contract.

use std::sync::{Arc, Mutex, MutexGuard};

/// Shared load counters of one engine.
#[derive(Debug)]
pub struct Load {
    state: Mutex<State>,
    kv_pages_total: u32,
    page_tokens: u32,
}

#[derive(Debug, Default)]
struct State {
    inflight_sequences: u32,
    inflight_tokens: u64,
    kv_pages_used: u32,
    decode_step_ms: f64,
}

/// Why a sequence was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    #[error("not enough free KV pages: need {need}, free {free}")]
    KvExhausted { need: u32, free: u32 },
}

/// A snapshot of the counters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Snapshot {
    pub inflight_sequences: u32,
    pub inflight_tokens: u64,
    pub kv_pages_free: u32,
    pub kv_pages_total: u32,
    pub decode_step_ms: f64,
}

impl Load {
    pub fn new(kv_pages_total: u32, page_tokens: u32) -> Self {
        Self { state: Mutex::default(), kv_pages_total, page_tokens: page_tokens.max(1) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Counters stay consistent even if a holder panicked: every update
        // is a single arithmetic step.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a sequence of `tokens` (prompt + output budget), reserving KV
    /// pages for all of them.
    pub fn admit(self: &Arc<Self>, tokens: u64) -> Result<SequenceGuard, AdmitError> {
        let pages = u32::try_from(tokens.div_ceil(u64::from(self.page_tokens))).unwrap_or(u32::MAX);
        let mut s = self.lock();
        let free = self.kv_pages_total - s.kv_pages_used;
        if pages > free {
            return Err(AdmitError::KvExhausted { need: pages, free });
        }
        s.kv_pages_used += pages;
        s.inflight_sequences += 1;
        s.inflight_tokens += tokens;
        Ok(SequenceGuard { load: Arc::clone(self), tokens, pages })
    }

    /// Sequences currently running: the emulated decode batch size.
    pub fn batch_size(&self) -> u32 {
        self.lock().inflight_sequences
    }

    /// Records one decode step's duration (exponentially weighted mean).
    pub fn record_decode_step(&self, ms: f64) {
        let mut s = self.lock();
        s.decode_step_ms = if s.decode_step_ms == 0.0 { ms } else { 0.9 * s.decode_step_ms + 0.1 * ms };
    }

    pub fn snapshot(&self) -> Snapshot {
        let s = self.lock();
        Snapshot {
            inflight_sequences: s.inflight_sequences,
            inflight_tokens: s.inflight_tokens,
            kv_pages_free: self.kv_pages_total - s.kv_pages_used,
            kv_pages_total: self.kv_pages_total,
            decode_step_ms: s.decode_step_ms,
        }
    }
}

/// Ownership of one admitted sequence's share of the engine.
#[derive(Debug)]
pub struct SequenceGuard {
    load: Arc<Load>,
    tokens: u64,
    pages: u32,
}

impl Drop for SequenceGuard {
    fn drop(&mut self) {
        let mut s = self.load.lock();
        s.inflight_sequences -= 1;
        s.inflight_tokens -= self.tokens;
        s.kv_pages_used -= self.pages;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_return_pages_and_tokens_on_drop() {
        let load = Arc::new(Load::new(10, 16));
        let a = load.admit(40).unwrap(); // 3 pages
        let b = load.admit(16).unwrap(); // 1 page
        let s = load.snapshot();
        assert_eq!((s.inflight_sequences, s.inflight_tokens, s.kv_pages_free), (2, 56, 6));
        drop(a);
        let s = load.snapshot();
        assert_eq!((s.inflight_sequences, s.inflight_tokens, s.kv_pages_free), (1, 16, 9));
        drop(b);
        assert_eq!(load.snapshot().kv_pages_free, 10);
    }

    #[test]
    fn refuses_when_pages_run_out() {
        let load = Arc::new(Load::new(4, 16));
        let _a = load.admit(48).unwrap();
        assert_eq!(load.admit(32).unwrap_err(), AdmitError::KvExhausted { need: 2, free: 1 });
        assert_eq!(load.snapshot().inflight_sequences, 1, "a refusal holds nothing");
    }
}
