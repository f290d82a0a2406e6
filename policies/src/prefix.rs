//! Prefix affinity, the pure part (issue 23): block hashes of a prompt, the
//! gateway's approximate index of which engine was sent which prefix, and
//! the scorer that weighs a cached prefix against load.
//!
//! A prompt is cut into blocks of `block_tokens` tokens (the gateway's
//! token rule, [`crate::tokens`]); each block's hash covers its tokens and
//! its predecessor's hash, so two prompts share their first `k` hashes
//! exactly when they share their first `k` blocks, and one hash names a
//! whole prefix. The index remembers, per block hash, the engines a prompt
//! holding that prefix was sent to, within a bound on its entries (least
//! recently used go first). It is approximate by design: it knows what the
//! gateway routed, not what the engine kept (an engine may have evicted the
//! pages) — the precise source is the engine's KV events, which feed the
//! same index. The scorer prefers the engine holding the longest prefix
//! unless the fleet is imbalanced past a threshold, when load decides (so
//! affinity never piles one engine up), as SGLang's router and llm-d's
//! scorers do.
//!
//! The gateway ([`crate::admission`] credits a candidate with its cached
//! tokens when [`applies`] says affinity may decide) and the simulator run
//! this module unchanged; the engines' caches (`crate::kv`) name their
//! pages with [`blocks`], so their events and this index speak of the
//! same hashes.

use std::collections::{HashMap, VecDeque};

/// Hashes of a prompt's full blocks, each chained on its predecessor. A
/// trailing partial block has no hash (it cannot be shared as a page).
/// (The gateway's hot path: [`blocks`] without the content.)
pub fn block_hashes(text: &str, block_tokens: u32) -> Vec<u64> {
    let block = block_tokens.max(1) as usize;
    let mut hashes = Vec::new();
    let (mut h, mut n) = (FNV_OFFSET, 0);
    for piece in pieces(text) {
        h = fnv(h, piece.as_bytes());
        h = fnv(h, &[0xff]); // a piece boundary, as in [`Chain::push`]
        n += 1;
        if n == block {
            hashes.push(h);
            h = fnv(FNV_OFFSET, &h.to_le_bytes());
            n = 0;
        }
    }
    hashes
}

/// One full block of a prompt as an engine's cache keeps it: the chained
/// hash, and the exact content a hash match is verified against before a
/// page is reused (its token pieces, each followed by a unit separator).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub hash: u64,
    pub content: Box<str>,
}

/// The full blocks of a prompt with their content ([`block_hashes`] with
/// what each hash stands for).
pub fn blocks(text: &str, block_tokens: u32) -> Vec<Block> {
    Chain::of(text, block_tokens).0
}

/// A block chain grown piece by piece: an engine starts it with its prompt
/// and continues it with the tokens it generates, so the pages its output
/// filled are named exactly as a later prompt resending that output
/// (the next turn of a conversation) will look them up.
#[derive(Debug, Clone)]
pub struct Chain {
    block: usize,
    /// Running hash of the partial block.
    hash: u64,
    /// The partial block's content so far, and its pieces.
    content: String,
    len: usize,
    /// Pieces pushed in all (prompt and continuation).
    pieces: u64,
}

impl Chain {
    /// The full blocks of `text`, and the chain ready to continue after it.
    pub fn of(text: &str, block_tokens: u32) -> (Vec<Block>, Chain) {
        let mut chain = Chain {
            block: block_tokens.max(1) as usize,
            hash: FNV_OFFSET,
            content: String::new(),
            len: 0,
            pieces: 0,
        };
        let blocks = pieces(text).filter_map(|p| chain.push(p)).collect();
        (blocks, chain)
    }

    /// Appends one token piece; the block it completes, if it does.
    pub fn push(&mut self, piece: &str) -> Option<Block> {
        self.hash = fnv(self.hash, piece.as_bytes());
        self.hash = fnv(self.hash, &[0xff]); // a piece boundary ("ab"+"c" is not "a"+"bc")
        self.content.push_str(piece);
        self.content.push('\u{1f}');
        self.len += 1;
        self.pieces += 1;
        if self.len < self.block {
            return None;
        }
        let block = Block { hash: self.hash, content: std::mem::take(&mut self.content).into() };
        self.hash = fnv(FNV_OFFSET, &block.hash.to_le_bytes()); // the next block chains on this one
        self.len = 0;
        Some(block)
    }

    /// Pieces pushed so far: where the next one sits in the token sequence.
    pub fn pieces(&self) -> u64 {
        self.pieces
    }
}

/// The token pieces of `text` as [`crate::tokens::count`] counts them: each
/// word cut into runs of four characters.
fn pieces(text: &str) -> impl Iterator<Item = &str> {
    text.split_whitespace().flat_map(|w| {
        let mut rest = w;
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            let end = rest.char_indices().nth(4).map_or(rest.len(), |(i, _)| i);
            let (piece, tail) = rest.split_at(end);
            rest = tail;
            Some(piece)
        })
    })
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Which engines were sent which prefixes, bounded.
#[derive(Debug)]
pub struct PrefixIndex {
    /// Block hash → engines (indexes) holding it, and when it was last used.
    entries: HashMap<u64, Entry>,
    /// Block hashes in order of last use (oldest first); stale duplicates
    /// are skipped when their stamp no longer matches.
    order: VecDeque<(u64, u64)>,
    capacity: usize,
    clock: u64,
}

#[derive(Debug)]
struct Entry {
    engines: Vec<u16>,
    used: u64,
}

/// Engines remembered per block (a prefix sent to more is remembered on
/// the most recent ones).
const MAX_ENGINES_PER_BLOCK: usize = 8;

impl PrefixIndex {
    /// An index of at most `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        Self { entries: HashMap::new(), order: VecDeque::new(), capacity: capacity.max(1), clock: 0 }
    }

    /// Blocks remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Records that a prompt with these block hashes went to `engine`.
    pub fn record(&mut self, engine: u16, hashes: &[u64]) {
        for &h in hashes {
            self.clock += 1;
            let e = self.entries.entry(h).or_insert_with(|| Entry { engines: Vec::new(), used: 0 });
            e.used = self.clock;
            if let Some(i) = e.engines.iter().position(|x| *x == engine) {
                e.engines.remove(i);
            } else if e.engines.len() == MAX_ENGINES_PER_BLOCK {
                e.engines.remove(0);
            }
            e.engines.push(engine);
            self.order.push_back((h, self.clock));
        }
        self.evict();
        // Stale order entries are bounded too: compact when they dominate.
        if self.order.len() > 4 * self.capacity {
            let entries = &self.entries;
            self.order.retain(|(h, t)| entries.get(h).is_some_and(|e| e.used == *t));
        }
    }

    fn evict(&mut self) {
        while self.entries.len() > self.capacity {
            let Some((h, t)) = self.order.pop_front() else { break };
            if self.entries.get(&h).is_some_and(|e| e.used == t) {
                self.entries.remove(&h);
            }
        }
    }

    /// Forgets that `engine` holds block `hash` (it evicted it).
    pub fn remove(&mut self, engine: u16, hash: u64) {
        if let Some(e) = self.entries.get_mut(&hash) {
            e.engines.retain(|x| *x != engine);
            if e.engines.is_empty() {
                self.entries.remove(&hash);
            }
        }
    }

    /// Forgets `engine` (it went away, or its cache was reset).
    pub fn forget_engine(&mut self, engine: u16) {
        self.entries.retain(|_, e| {
            e.engines.retain(|x| *x != engine);
            !e.engines.is_empty()
        });
    }

    /// For each of `engines`, how many leading blocks of `hashes` it holds.
    pub fn matched(&self, hashes: &[u64], engines: usize) -> Vec<u32> {
        let mut matched = vec![0u32; engines];
        let mut alive: Vec<bool> = vec![true; engines];
        for (k, h) in hashes.iter().enumerate() {
            let Some(e) = self.entries.get(h) else { break };
            let mut any = false;
            for (i, ok) in alive.iter_mut().enumerate() {
                if *ok && e.engines.iter().any(|x| usize::from(*x) == i) {
                    matched[i] = k as u32 + 1;
                    any = true;
                } else {
                    *ok = false;
                }
            }
            if !any {
                break;
            }
        }
        matched
    }
}

/// One candidate engine for the scorer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    pub idx: usize,
    /// Blocks of the prompt it holds ([`PrefixIndex::matched`]).
    pub matched_blocks: u32,
    /// Its load in the unit the fleet balances on (in-flight tokens).
    pub load: u64,
}

/// `[routing.prefix]`: prefix-cache affinity, and when it yields to load.
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AffinityConfig {
    /// Route by where prompts' prefixes are cached (and predict their
    /// prefill without the cached part).
    pub enabled: bool,
    /// Tokens per block: the engines' KV page size (`engine
    /// --page-tokens`); events from engines with another size are ignored.
    pub block_tokens: u32,
    /// Blocks the gateway's index remembers (least recently used go first).
    pub index_blocks: usize,
    /// The fleet is imbalanced when the most loaded candidate carries more
    /// than this many in-flight tokens above the least loaded...
    pub balance_abs: u64,
    /// ...and more than this factor times it.
    pub balance_rel: f64,
    /// A match shorter than this share of the prompt's blocks is no match.
    pub min_match: f64,
}

impl Default for AffinityConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            block_tokens: 16,
            index_blocks: 1 << 18,
            balance_abs: 4096,
            balance_rel: 1.5,
            min_match: 0.25,
        }
    }
}

impl AffinityConfig {
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.block_tokens == 0 {
            return Err(("routing.prefix.block_tokens", "must be > 0".into()));
        }
        if self.index_blocks == 0 {
            return Err(("routing.prefix.index_blocks", "must be > 0".into()));
        }
        if !(self.balance_rel >= 1.0 && self.balance_rel.is_finite()) {
            return Err(("routing.prefix.balance_rel", "must be >= 1".into()));
        }
        if !(0.0..=1.0).contains(&self.min_match) {
            return Err(("routing.prefix.min_match", "must be in [0, 1]".into()));
        }
        Ok(())
    }
}

/// Whether an engine carrying `load` is too busy for affinity, next to
/// the least loaded candidate's `least`: more than `balance_abs` above it
/// *and* more than `balance_rel` times it. Judged per engine against the
/// least loaded (not the fleet's spread, which in a large fleet nearly
/// always has an idle engine at one end).
pub fn overloaded(load: u64, least: u64, cfg: &AffinityConfig) -> bool {
    load.saturating_sub(least) > cfg.balance_abs && load as f64 > cfg.balance_rel * least as f64
}

/// The matched blocks affinity credits each of `choices` with (in order):
/// its match, unless it is [`overloaded`] or no engine that is not holds
/// `min_match` of a prompt of `blocks` full blocks; else 0.
pub fn credited(choices: &[Choice], blocks: u32, cfg: &AffinityConfig) -> Vec<u32> {
    let least = choices.iter().map(|c| c.load).min().unwrap_or(0);
    let mut credit: Vec<u32> =
        choices.iter().map(|c| if overloaded(c.load, least, cfg) { 0 } else { c.matched_blocks }).collect();
    let best = credit.iter().copied().max().unwrap_or(0);
    if !cfg.enabled || blocks == 0 || best == 0 || f64::from(best) < cfg.min_match * f64::from(blocks) {
        credit.iter_mut().for_each(|c| *c = 0);
    }
    credit
}

/// The engine to send a prompt of `blocks` full blocks to: the longest
/// [`credited`] match (least loaded among equals), or the least loaded
/// when none is credited, tied ones taken in turn from position `turn`
/// of `choices` (the caller's decision count). Taking ties in turn spreads
/// new prefixes over an idle fleet, one engine each, as SGLang's router
/// sends an unmatched prompt to the engine holding least; the lowest
/// index would pile every new prefix of a light load onto one engine
/// while the others idle (their first token then waits on its queue).
pub fn pick(choices: &[Choice], blocks: u32, cfg: &AffinityConfig, turn: u64) -> Option<usize> {
    let n = choices.len();
    let (_, least) =
        choices.iter().enumerate().min_by_key(|(i, c)| (c.load, crate::routing::from_turn(*i, n, turn)))?;
    let credit = credited(choices, blocks, cfg);
    let best = choices
        .iter()
        .zip(&credit)
        .filter(|(_, m)| **m > 0)
        .max_by_key(|(c, m)| (**m, std::cmp::Reverse((c.load, c.idx))));
    Some(best.map_or(least.idx, |(c, _)| c.idx))
}

#[cfg(test)]
mod tests;
