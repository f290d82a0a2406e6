//! The paged KV-cache allocator.
//!
//! The cache is `total` fixed-size pages of `page_tokens` tokens each. Free
//! pages sit on a stack (the free list), so allocating and freeing a page
//! are constant time. A sequence's pages are a [`PageSet`]: admission
//! reserves pages for its prompt plus an over-estimate of its output, decode
//! extends it in small units, and dropping it (completion, cancel,
//! preemption) returns every page. Nothing frees pages by hand.
//!
//! Watermarks give admission hysteresis: when admitting a sequence would
//! leave fewer than `low` free pages, the engine stops admitting and refuses
//! with [`KvRefusal::LowWatermark`]; it admits again once frees bring the
//! free count back to `high`. Running sequences may still extend below the
//! low watermark: finishing admitted work comes first.
//!
//! Page memory itself (the arenas the `cpu` backend reads K/V from) is owned
//! by the backend and indexed by [`PageId`]; this module owns only which
//! page belongs to whom.

use std::sync::{Arc, Mutex, MutexGuard};

/// Index of one page in the cache.
pub type PageId = u32;

/// Allocator sizing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvConfig {
    pub total_pages: u32,
    pub page_tokens: u32,
    /// Stop admitting when fewer than this fraction of pages would stay free.
    pub low_watermark: f64,
    /// Admit again once this fraction of pages is free.
    pub high_watermark: f64,
}

impl Default for KvConfig {
    fn default() -> Self {
        Self { total_pages: 16384, page_tokens: 16, low_watermark: 0.05, high_watermark: 0.15 }
    }
}

/// Why a sequence was not admitted; the engine returns `code()` to the gateway.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvRefusal {
    #[error("KV cache below its low watermark: {free} pages free, {need} needed, keeping {low} in reserve")]
    LowWatermark { need: u32, free: u32, low: u32 },
    #[error("request needs {need} KV pages, more than the cache's {total}")]
    TooLarge { need: u32, total: u32 },
}

impl KvRefusal {
    /// Stable machine label.
    pub fn code(&self) -> &'static str {
        match self {
            KvRefusal::LowWatermark { .. } => "kv_low_watermark",
            KvRefusal::TooLarge { .. } => "kv_request_too_large",
        }
    }
}

/// Extending a running sequence found no free page (preemption territory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("KV cache exhausted: no free page to extend a running sequence")]
pub struct KvExhausted;

#[derive(Debug)]
struct Inner {
    free: Vec<PageId>,
    admitting: bool,
    /// (time in seconds, pages in use) at the last slope sample.
    last_sample: Option<(f64, u32)>,
    /// Pages consumed per second (negative when freeing), smoothed.
    slope: f64,
}

/// The allocator; share it as `Arc<KvAllocator>`.
#[derive(Debug)]
pub struct KvAllocator {
    inner: Mutex<Inner>,
    total: u32,
    page_tokens: u32,
    low: u32,
    high: u32,
}

/// A consistent view of the allocator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvSnapshot {
    pub free: u32,
    pub total: u32,
    pub admitting: bool,
    /// Pages per second consumed (smoothed; negative while freeing).
    pub slope: f64,
    pub page_tokens: u32,
    /// The low watermark, in pages.
    pub low_pages: u32,
}

impl KvAllocator {
    pub fn new(cfg: KvConfig) -> Arc<Self> {
        let total = cfg.total_pages;
        let frac = |f: f64| ((f.clamp(0.0, 1.0) * f64::from(total)).ceil() as u32).min(total);
        let low = frac(cfg.low_watermark);
        let high = frac(cfg.high_watermark).max(low);
        // Reversed so page 0 is handed out first: easier to read in dumps.
        let free = (0..total).rev().collect();
        Arc::new(Self {
            inner: Mutex::new(Inner { free, admitting: true, last_sample: None, slope: 0.0 }),
            total,
            page_tokens: cfg.page_tokens.max(1),
            low,
            high,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every critical section leaves the free list consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pages in the cache.
    pub fn total_pages(&self) -> u32 {
        self.total
    }

    /// Pages needed to hold `tokens` tokens.
    pub fn pages_for(&self, tokens: u64) -> u32 {
        u32::try_from(tokens.div_ceil(u64::from(self.page_tokens))).unwrap_or(u32::MAX)
    }

    /// Admits a sequence expected to need `tokens` tokens of cache, or
    /// refuses it with a typed reason.
    pub fn admit(self: &Arc<Self>, tokens: u64) -> Result<PageSet, KvRefusal> {
        let need = self.pages_for(tokens);
        if need > self.total {
            return Err(KvRefusal::TooLarge { need, total: self.total });
        }
        let mut inner = self.lock();
        let free = inner.free.len() as u32;
        if free >= self.high {
            inner.admitting = true;
        }
        if !inner.admitting || free < need + self.low {
            // Close admission only when the cache is genuinely running low,
            // not because one request is too big for the headroom.
            if free < self.high {
                inner.admitting = false;
            }
            return Err(KvRefusal::LowWatermark { need, free, low: self.low });
        }
        let at = inner.free.len() - need as usize;
        let pages = inner.free.split_off(at);
        drop(inner);
        Ok(PageSet { alloc: Arc::clone(self), pages })
    }

    /// Pages for already-admitted work returning after preemption: ignores
    /// the watermarks, fails only when the cache cannot hold `tokens`.
    pub fn admit_running(self: &Arc<Self>, tokens: u64) -> Result<PageSet, KvExhausted> {
        let need = self.pages_for(tokens) as usize;
        let mut inner = self.lock();
        if need > inner.free.len() {
            return Err(KvExhausted);
        }
        let at = inner.free.len() - need;
        let pages = inner.free.split_off(at);
        drop(inner);
        Ok(PageSet { alloc: Arc::clone(self), pages })
    }

    fn release(&self, pages: &mut Vec<PageId>) {
        let mut inner = self.lock();
        inner.free.append(pages);
        if !inner.admitting && inner.free.len() as u32 >= self.high {
            inner.admitting = true;
        }
    }

    /// Records the pages in use at `now_secs` (any monotonic clock, in
    /// seconds) and updates the consumption slope. Time is a parameter.
    pub fn sample(&self, now_secs: f64) {
        let mut inner = self.lock();
        let used = self.total - inner.free.len() as u32;
        if let Some((t, u)) = inner.last_sample {
            let dt = now_secs - t;
            if dt <= 0.0 {
                return;
            }
            let rate = (f64::from(used) - f64::from(u)) / dt;
            inner.slope = 0.7 * inner.slope + 0.3 * rate;
        }
        inner.last_sample = Some((now_secs, used));
    }

    pub fn snapshot(&self) -> KvSnapshot {
        let inner = self.lock();
        KvSnapshot {
            free: inner.free.len() as u32,
            total: self.total,
            admitting: inner.admitting,
            slope: inner.slope,
            page_tokens: self.page_tokens,
            low_pages: self.low,
        }
    }
}

/// The pages one sequence owns; all of them return to the free list on drop.
#[derive(Debug)]
pub struct PageSet {
    alloc: Arc<KvAllocator>,
    pages: Vec<PageId>,
}

impl PageSet {
    pub fn pages(&self) -> &[PageId] {
        &self.pages
    }

    /// Tokens the set can hold.
    pub fn capacity_tokens(&self) -> u64 {
        self.pages.len() as u64 * u64::from(self.alloc.page_tokens)
    }

    /// Grows the set until it holds `tokens` tokens, `unit` pages at a time
    /// (at least one). Ignores the watermarks; fails only when no page is free.
    pub fn ensure(&mut self, tokens: u64, unit: u32) -> Result<(), KvExhausted> {
        while self.capacity_tokens() < tokens {
            let mut inner = self.alloc.lock();
            let n = (unit.max(1) as usize).min(inner.free.len());
            if n == 0 {
                return Err(KvExhausted);
            }
            let at = inner.free.len() - n;
            self.pages.extend(inner.free.drain(at..));
        }
        Ok(())
    }
}

impl Drop for PageSet {
    fn drop(&mut self) {
        self.alloc.release(&mut self.pages);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(total: u32, low: f64, high: f64) -> Arc<KvAllocator> {
        KvAllocator::new(KvConfig {
            total_pages: total,
            page_tokens: 16,
            low_watermark: low,
            high_watermark: high,
        })
    }

    #[test]
    fn admission_reserves_pages_and_drop_returns_them() {
        let a = alloc(10, 0.0, 0.0);
        let mut s = a.admit(40).unwrap(); // 3 pages
        assert_eq!(s.pages(), &[2, 1, 0]);
        assert_eq!(a.snapshot().free, 7);
        s.ensure(16 * 5, 1).unwrap();
        assert_eq!(s.pages().len(), 5);
        drop(s);
        assert_eq!(a.snapshot().free, 10);
    }

    #[test]
    fn low_watermark_refuses_with_a_typed_reason_and_high_reopens() {
        let a = alloc(100, 0.10, 0.30); // low 10 pages, high 30 pages
        let big = a.admit(16 * 85).unwrap(); // 15 free left
        let err = a.admit(16 * 6).unwrap_err(); // would leave 9 < 10
        assert_eq!(err, KvRefusal::LowWatermark { need: 6, free: 15, low: 10 });
        assert_eq!(err.code(), "kv_low_watermark");
        assert!(!a.snapshot().admitting);
        // Hysteresis: even a request that would fit waits for the high watermark.
        assert!(a.admit(16).is_err());
        drop(big);
        assert!(a.snapshot().admitting);
        assert!(a.admit(16).is_ok());
        assert_eq!(a.admit(16 * 101).unwrap_err().code(), "kv_request_too_large");
        // One request too big for the headroom does not close admission.
        let b = alloc(100, 0.10, 0.30);
        assert!(b.admit(16 * 95).is_err());
        assert!(b.snapshot().admitting);
        assert!(b.admit(16).is_ok());
    }

    #[test]
    fn running_sequences_may_extend_below_the_low_watermark_until_exhausted() {
        let a = alloc(10, 0.5, 0.5);
        let mut s = a.admit(16 * 5).unwrap(); // leaves 5 = low
        s.ensure(16 * 10, 2).unwrap();
        assert_eq!(a.snapshot().free, 0);
        assert_eq!(s.ensure(16 * 11, 1), Err(KvExhausted));
    }

    #[test]
    fn slope_follows_consumption_over_time_given_as_a_parameter() {
        let a = alloc(1000, 0.0, 0.0);
        a.sample(0.0);
        let _s = a.admit(16 * 100).unwrap();
        a.sample(1.0);
        assert!((a.snapshot().slope - 30.0).abs() < 1e-9, "{}", a.snapshot().slope);
    }

    /// xorshift64: deterministic randomness without a dependency.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n.max(1)
        }
    }

    /// Property: under random interleavings of admit, extend, cancel and
    /// preempt, every page is owned by exactly one sequence or the free
    /// list, and everything returns when all sequences end.
    #[test]
    fn random_interleavings_never_double_free_or_leak() {
        for seed in 1..=200u64 {
            let total = 64;
            let a = alloc(total, 0.1, 0.25);
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut live: Vec<PageSet> = Vec::new();
            for _ in 0..300 {
                match rng.below(4) {
                    0 => {
                        if let Ok(s) = a.admit(rng.below(16 * 12) + 1) {
                            live.push(s);
                        }
                    }
                    1 if !live.is_empty() => {
                        let i = rng.below(live.len() as u64) as usize;
                        let want = live[i].capacity_tokens() + rng.below(64);
                        let _ = live[i].ensure(want, rng.below(3) as u32 + 1);
                    }
                    // 2: cancel or complete; 3: preempt (same release path, from the middle)
                    2 | 3 if !live.is_empty() => {
                        let i = rng.below(live.len() as u64) as usize;
                        drop(live.swap_remove(i));
                    }
                    _ => {}
                }
                let mut seen = vec![0u8; total as usize];
                for p in a.lock().free.iter().chain(live.iter().flat_map(|s| s.pages())) {
                    seen[*p as usize] += 1;
                }
                assert!(seen.iter().all(|&c| c == 1), "seed {seed}: a page is lost or owned twice");
            }
            live.clear();
            let snap = a.snapshot();
            assert_eq!(snap.free, total, "seed {seed}: pages leaked");
            assert!(snap.admitting, "seed {seed}: admission reopens once everything is free");
        }
    }
}
