//! The paged KV-cache allocator, with a prefix cache.
//!
//! The cache is `total` fixed-size pages of `page_tokens` tokens each. A
//! sequence's pages are a [`PageSet`]: admission reserves pages for its
//! prompt plus an over-estimate of its output, decode extends it in small
//! units, and dropping it (completion, cancel, preemption) releases every
//! page. Nothing frees pages by hand.
//!
//! **Prefix cache.** Once a sequence's prompt is prefilled, each of its
//! full prompt pages is *named* ([`PageSet::commit`]): content-addressed by
//! the chained hash of its block ([`crate::prefix::blocks`]: a block's
//! hash covers its predecessor's, so one hash names a whole prefix). A new
//! sequence looks its prompt's blocks up and *shares* the longest named
//! prefix instead of computing it: each page has a reference count, and a
//! hash match is verified against the block's exact content and against
//! its predecessor page before reuse, so a hash collision costs a cache
//! miss, never a wrong answer. Named pages no sequence holds stay in an LRU
//! pool: they count as free for the watermarks, and the least recently used
//! is evicted (its name dropped) when an allocation finds the free list
//! empty; a page in use is never evicted. Every naming and eviction is
//! logged as a [`KvEvent`] with a sequence number, for gateways that route
//! by where prefixes live.
//!
//! Watermarks give admission hysteresis: when admitting a sequence would
//! leave fewer than `low` free (or evictable) pages, the engine stops
//! admitting and refuses with [`KvRefusal::LowWatermark`]; it admits again
//! once frees bring that count back to `high`. Running sequences may still
//! extend below the low watermark: finishing admitted work comes first.
//!
//! Page memory itself (the engine's `cpu` backend arenas) is owned
//! by the backend and indexed by [`PageId`]; this module owns only which
//! page belongs to whom and what it holds.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::prefix::Block;

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
    /// Keep finished prompts' pages for reuse (the prefix cache).
    pub prefix_cache: bool,
}

impl Default for KvConfig {
    fn default() -> Self {
        Self {
            total_pages: 16384,
            page_tokens: 16,
            low_watermark: 0.05,
            high_watermark: 0.15,
            prefix_cache: true,
        }
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

/// One change to the set of named pages: blocks stored (named after a
/// prefill) or evicted, by hash, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEvent {
    /// 1, 2, 3, ... per engine process; a gap means events were missed.
    pub seq: u64,
    pub stored: Vec<u64>,
    pub evicted: Vec<u64>,
}

/// Events since a sequence number, or the whole state when those are gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEventsSince {
    Events {
        events: Vec<KvEvent>,
        last_seq: u64,
        more: bool,
    },
    /// The events asked for are no longer kept (or never existed): every
    /// named block now, as of `last_seq`.
    Snapshot {
        hashes: Vec<u64>,
        last_seq: u64,
    },
}

/// Events kept for readers, counted in hashes.
const EVENT_LOG_HASHES: usize = 1 << 16;

/// A named page: the block it holds and the page before it in its prompt
/// (with that page's generation then), so a match is verified link by link.
#[derive(Debug)]
struct Named {
    block: Block,
    parent: Option<(PageId, u32)>,
}

#[derive(Debug)]
struct Inner {
    /// Pages with no content and no holder.
    free: Vec<PageId>,
    /// Holders of each page (sequences sharing it).
    refs: Vec<u32>,
    /// The block each named page holds.
    named: Vec<Option<Named>>,
    /// Bumped when a page loses its name, so a stale parent link fails.
    generation: Vec<u32>,
    by_hash: HashMap<u64, PageId>,
    /// Named pages without holders, by last release (oldest first).
    lru: BTreeMap<u64, PageId>,
    /// Each page's key in `lru` (0: not there).
    lru_key: Vec<u64>,
    tick: u64,
    events: VecDeque<KvEvent>,
    event_hashes: usize,
    last_seq: u64,
    /// Prompt tokens looked up, and found cached.
    looked_up_tokens: u64,
    hit_tokens: u64,
    admitting: bool,
    /// (time in seconds, pages in use) at the last slope sample.
    last_sample: Option<(f64, u32)>,
    /// Pages consumed per second (negative when freeing), smoothed.
    slope: f64,
}

impl Inner {
    /// Pages an allocation may take: free ones and unheld named ones.
    fn available(&self) -> u32 {
        (self.free.len() + self.lru.len()) as u32
    }

    /// Takes `n` pages (the caller checked [`Inner::available`]): free ones
    /// first, then the least recently used named ones, evicted.
    fn take(&mut self, n: usize, into: &mut Vec<PageId>) {
        let mut evicted = Vec::new();
        for _ in 0..n {
            let p = match self.free.pop() {
                Some(p) => p,
                None => {
                    let Some((_, p)) = self.lru.pop_first() else { break };
                    self.lru_key[p as usize] = 0;
                    evicted.extend(self.unname(p));
                    p
                }
            };
            self.refs[p as usize] = 1;
            into.push(p);
        }
        if !evicted.is_empty() {
            self.log(Vec::new(), evicted);
        }
    }

    /// Drops page `p`'s name; returns the hash it had.
    fn unname(&mut self, p: PageId) -> Option<u64> {
        let named = self.named[p as usize].take()?;
        self.generation[p as usize] = self.generation[p as usize].wrapping_add(1);
        if self.by_hash.get(&named.block.hash) == Some(&p) {
            self.by_hash.remove(&named.block.hash);
        }
        Some(named.block.hash)
    }

    /// One more holder of named page `p` (out of the LRU pool if it was there).
    fn hold(&mut self, p: PageId) {
        let i = p as usize;
        self.refs[i] += 1;
        if self.lru_key[i] != 0 {
            self.lru.remove(&self.lru_key[i]);
            self.lru_key[i] = 0;
        }
    }

    /// One holder fewer; an unheld page goes to the LRU pool if named,
    /// else to the free list.
    fn release(&mut self, p: PageId) {
        let i = p as usize;
        debug_assert!(self.refs[i] > 0, "page {p} released more often than held");
        self.refs[i] = self.refs[i].saturating_sub(1);
        if self.refs[i] > 0 {
            return;
        }
        if self.named[i].is_some() {
            self.tick += 1;
            self.lru.insert(self.tick, p);
            self.lru_key[i] = self.tick;
        } else {
            self.free.push(p);
        }
    }

    /// The pages holding the longest named prefix of `blocks`, each
    /// verified against its content and its predecessor.
    fn lookup(&self, blocks: &[Block]) -> Vec<PageId> {
        let mut found = Vec::new();
        let mut parent: Option<(PageId, u32)> = None;
        for b in blocks {
            let Some(&p) = self.by_hash.get(&b.hash) else { break };
            let Some(named) = &self.named[p as usize] else { break };
            if named.block.content != b.content || named.parent != parent {
                break; // a hash collision, or another chain's page: a miss
            }
            found.push(p);
            parent = Some((p, self.generation[p as usize]));
        }
        found
    }

    fn log(&mut self, stored: Vec<u64>, evicted: Vec<u64>) {
        self.last_seq += 1;
        self.event_hashes += stored.len() + evicted.len();
        self.events.push_back(KvEvent { seq: self.last_seq, stored, evicted });
        while self.event_hashes > EVENT_LOG_HASHES && self.events.len() > 1 {
            if let Some(old) = self.events.pop_front() {
                self.event_hashes -= old.stored.len() + old.evicted.len();
            }
        }
    }
}

/// The allocator; share it as `Arc<KvAllocator>`.
#[derive(Debug)]
pub struct KvAllocator {
    inner: Mutex<Inner>,
    total: u32,
    page_tokens: u32,
    low: u32,
    high: u32,
    prefix_cache: bool,
}

/// A consistent view of the allocator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvSnapshot {
    /// Pages an allocation may take: free plus cached ones no sequence holds.
    pub free: u32,
    pub total: u32,
    pub admitting: bool,
    /// Pages per second consumed (smoothed; negative while freeing).
    pub slope: f64,
    pub page_tokens: u32,
    /// The low watermark, in pages.
    pub low_pages: u32,
    /// Named pages (the prefix cache), held or not.
    pub cached_pages: u32,
    /// Of those, pages no sequence holds (evictable; counted in `free`).
    pub cached_free_pages: u32,
    /// Prompt tokens looked up in the cache so far, and found there.
    pub looked_up_tokens: u64,
    pub hit_tokens: u64,
}

impl KvAllocator {
    pub fn new(cfg: KvConfig) -> Arc<Self> {
        let total = cfg.total_pages;
        let frac = |f: f64| ((f.clamp(0.0, 1.0) * f64::from(total)).ceil() as u32).min(total);
        let low = frac(cfg.low_watermark);
        let high = frac(cfg.high_watermark).max(low);
        let n = total as usize;
        // Reversed so page 0 is handed out first: easier to read in dumps.
        let free = (0..total).rev().collect();
        Arc::new(Self {
            inner: Mutex::new(Inner {
                free,
                refs: vec![0; n],
                named: (0..n).map(|_| None).collect(),
                generation: vec![0; n],
                by_hash: HashMap::new(),
                lru: BTreeMap::new(),
                lru_key: vec![0; n],
                tick: 0,
                events: VecDeque::new(),
                event_hashes: 0,
                last_seq: 0,
                looked_up_tokens: 0,
                hit_tokens: 0,
                admitting: true,
                last_sample: None,
                slope: 0.0,
            }),
            total,
            page_tokens: cfg.page_tokens.max(1),
            low,
            high,
            prefix_cache: cfg.prefix_cache,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every critical section leaves the pages consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pages in the cache.
    pub fn total_pages(&self) -> u32 {
        self.total
    }

    /// Tokens per page.
    pub fn page_tokens(&self) -> u32 {
        self.page_tokens
    }

    /// Whether finished prompts' pages are kept for reuse.
    pub fn prefix_cache(&self) -> bool {
        self.prefix_cache
    }

    /// Pages needed to hold `tokens` tokens.
    pub fn pages_for(&self, tokens: u64) -> u32 {
        u32::try_from(tokens.div_ceil(u64::from(self.page_tokens))).unwrap_or(u32::MAX)
    }

    /// Admits a sequence expected to need `tokens` tokens of cache, sharing
    /// the longest cached prefix of `reuse` (the prompt's blocks that may
    /// be reused), or refuses it with a typed reason.
    pub fn admit(self: &Arc<Self>, tokens: u64, reuse: &[Block]) -> Result<PageSet, KvRefusal> {
        let need = self.pages_for(tokens);
        if need > self.total {
            return Err(KvRefusal::TooLarge { need, total: self.total });
        }
        let mut inner = self.lock();
        let available = inner.available();
        let (shared, fresh, free) = self.lookup(&mut inner, reuse, need);
        if available >= self.high {
            inner.admitting = true;
        }
        if !inner.admitting || free < fresh + self.low {
            // Close admission only when the cache is genuinely running low,
            // not because one request is too big for the headroom.
            if available < self.high {
                inner.admitting = false;
            }
            return Err(KvRefusal::LowWatermark { need: fresh, free, low: self.low });
        }
        Ok(self.grant(&mut inner, shared, fresh))
    }

    /// Pages for already-admitted work returning after preemption: ignores
    /// the watermarks, fails only when the cache cannot hold `tokens`.
    pub fn admit_running(self: &Arc<Self>, tokens: u64, reuse: &[Block]) -> Result<PageSet, KvExhausted> {
        let need = self.pages_for(tokens);
        let mut inner = self.lock();
        let (shared, fresh, free) = self.lookup(&mut inner, reuse, need);
        if fresh > free {
            return Err(KvExhausted);
        }
        Ok(self.grant(&mut inner, shared, fresh))
    }

    /// For a sequence of `need` pages: the pages holding the cached prefix
    /// of `reuse` (at most `need`, counted in the hit rate), the fresh pages
    /// it needs besides, and the pages free for those once the shared ones
    /// (some perhaps in the LRU pool) are held.
    fn lookup(&self, inner: &mut Inner, reuse: &[Block], need: u32) -> (Vec<PageId>, u32, u32) {
        let mut shared = Vec::new();
        if self.prefix_cache && !reuse.is_empty() {
            shared = inner.lookup(reuse);
            shared.truncate(need as usize);
            let tokens = |n: usize| n as u64 * u64::from(self.page_tokens);
            inner.looked_up_tokens += tokens(reuse.len());
            inner.hit_tokens += tokens(shared.len());
        }
        let in_pool = shared.iter().filter(|p| inner.lru_key[**p as usize] != 0).count() as u32;
        let fresh = need - shared.len() as u32;
        (shared, fresh, inner.available() - in_pool)
    }

    fn grant(self: &Arc<Self>, inner: &mut Inner, shared: Vec<PageId>, fresh: u32) -> PageSet {
        let cached = shared.len() as u32;
        let mut pages = shared;
        for &p in &pages {
            inner.hold(p);
        }
        inner.take(fresh as usize, &mut pages);
        PageSet { alloc: Arc::clone(self), pages, cached, committed: 0 }
    }

    /// Records the pages in use at `now_secs` (any monotonic clock, in
    /// seconds) and updates the consumption slope. Time is a parameter.
    pub fn sample(&self, now_secs: f64) {
        let mut inner = self.lock();
        let used = self.total - inner.available();
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

    /// Pages an allocation may take now ([`KvSnapshot::free`] alone).
    pub fn free_pages(&self) -> u32 {
        self.lock().available()
    }

    /// The low watermark, in pages.
    pub fn low_pages(&self) -> u32 {
        self.low
    }

    /// The sequence number of the last event logged (0: none yet).
    pub fn last_seq(&self) -> u64 {
        self.lock().last_seq
    }

    /// The hashes evicted by the events after `after` still kept, appended
    /// to `out` (a reader that follows only evictions: the simulator's
    /// engines); returns the last event's sequence number.
    pub fn evicted_since(&self, after: u64, out: &mut Vec<u64>) -> u64 {
        let inner = self.lock();
        let first = inner.events.front().map_or(inner.last_seq + 1, |e| e.seq);
        let skip = after.saturating_add(1).saturating_sub(first) as usize;
        for e in inner.events.range(skip.min(inner.events.len())..) {
            out.extend_from_slice(&e.evicted);
        }
        inner.last_seq
    }

    pub fn snapshot(&self) -> KvSnapshot {
        let inner = self.lock();
        KvSnapshot {
            free: inner.available(),
            total: self.total,
            admitting: inner.admitting,
            slope: inner.slope,
            page_tokens: self.page_tokens,
            low_pages: self.low,
            cached_pages: inner.by_hash.len() as u32,
            cached_free_pages: inner.lru.len() as u32,
            looked_up_tokens: inner.looked_up_tokens,
            hit_tokens: inner.hit_tokens,
        }
    }

    /// The events after `after` (at most `max` of them), or a snapshot of
    /// every named block for a new reader (`after` 0) or one out of step
    /// (some of those events are no longer kept, or `after` is ahead).
    pub fn events_since(&self, after: u64, max: usize) -> KvEventsSince {
        let inner = self.lock();
        let first = inner.events.front().map_or(inner.last_seq + 1, |e| e.seq);
        if after == 0 || after > inner.last_seq || after + 1 < first {
            let mut hashes: Vec<u64> = inner.by_hash.keys().copied().collect();
            hashes.sort_unstable();
            return KvEventsSince::Snapshot { hashes, last_seq: inner.last_seq };
        }
        let skip = (after + 1 - first) as usize;
        let events: Vec<KvEvent> = inner.events.range(skip..).take(max.max(1)).cloned().collect();
        let last_seq = events.last().map_or(after, |e| e.seq);
        KvEventsSince::Events { more: last_seq < inner.last_seq, events, last_seq }
    }
}

/// The pages one sequence holds; dropping it releases every one.
pub struct PageSet {
    alloc: Arc<KvAllocator>,
    pages: Vec<PageId>,
    /// Leading pages found in the prefix cache at admission.
    cached: u32,
    /// Leading blocks [`PageSet::commit`] has walked.
    committed: usize,
}

impl std::fmt::Debug for PageSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageSet").field("pages", &self.pages).field("cached", &self.cached).finish()
    }
}

impl PageSet {
    /// Tokens per page.
    pub fn page_tokens(&self) -> u32 {
        self.alloc.page_tokens
    }

    pub fn pages(&self) -> &[PageId] {
        &self.pages
    }

    /// Tokens the set can hold.
    pub fn capacity_tokens(&self) -> u64 {
        self.pages.len() as u64 * u64::from(self.alloc.page_tokens)
    }

    /// Leading tokens whose K/V came from the prefix cache: prefill starts
    /// after them.
    pub fn cached_tokens(&self) -> u32 {
        self.cached * self.alloc.page_tokens
    }

    /// Names the pages holding `blocks` (the context's full blocks, every
    /// position computed) so later prompts can share them: the prompt's
    /// once it is prefilled, then prompt and output together when the
    /// sequence ends. A block already named on another page, or whose hash
    /// names different content, stays private; the chain continues from
    /// the page that holds the name, and stops at a collision. Walking the
    /// same leading blocks again changes nothing, so a call with no more
    /// blocks than the last returns at once.
    pub fn commit(&mut self, blocks: &[Block]) {
        if !self.alloc.prefix_cache || blocks.len() <= self.committed {
            return;
        }
        self.committed = blocks.len();
        let mut inner = self.alloc.lock();
        let mut parent: Option<(PageId, u32)> = None;
        let mut stored = Vec::new();
        for (i, (b, &mine)) in blocks.iter().zip(&self.pages).enumerate() {
            let holder = if i < self.cached as usize {
                mine // shared at admission: named already
            } else {
                match inner.by_hash.get(&b.hash) {
                    Some(&p) => {
                        let same = inner.named[p as usize]
                            .as_ref()
                            .is_some_and(|n| n.block.content == b.content && n.parent == parent);
                        if !same {
                            break; // a collision or another chain: the rest stays private
                        }
                        p
                    }
                    None => {
                        inner.named[mine as usize] = Some(Named { block: b.clone(), parent });
                        inner.by_hash.insert(b.hash, mine);
                        stored.push(b.hash);
                        mine
                    }
                }
            };
            parent = Some((holder, inner.generation[holder as usize]));
        }
        if !stored.is_empty() {
            inner.log(stored, Vec::new());
        }
    }

    /// Grows the set until it holds `tokens` tokens, `unit` pages at a time
    /// (at least one). Ignores the watermarks; fails only when no page is
    /// free or evictable.
    pub fn ensure(&mut self, tokens: u64, unit: u32) -> Result<(), KvExhausted> {
        while self.capacity_tokens() < tokens {
            let mut inner = self.alloc.lock();
            let n = (unit.max(1) as usize).min(inner.available() as usize);
            if n == 0 {
                return Err(KvExhausted);
            }
            inner.take(n, &mut self.pages);
        }
        Ok(())
    }
}

impl Drop for PageSet {
    fn drop(&mut self) {
        let mut inner = self.alloc.lock();
        for &p in &self.pages {
            inner.release(p);
        }
        if !inner.admitting && inner.available() >= self.alloc.high {
            inner.admitting = true;
        }
    }
}

#[cfg(test)]
mod tests;
