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

use std::collections::HashMap;

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

/// Which engines were sent which prefixes, bounded: an exact LRU of at
/// most `capacity` blocks. Each block is one slot of a slab (its hash, its
/// place in the recency list, the engines holding it, inline) and one
/// entry of a hash map from block hash to slot: about 110 bytes a block,
/// all reserved at creation and never exceeded (a default index of 262,144
/// blocks: about 28 MiB, resident as it fills; the queue of recency stamps
/// before took about 200 bytes a block and doubled in steps while
/// filling, until well after the index was full). Using a block again moves it to the front without adding
/// anything.
#[derive(Debug)]
pub struct PrefixIndex {
    /// Block hash → its slot.
    slots_of: HashMap<u64, u32>,
    slots: Vec<Slot>,
    /// Slots freed by [`PrefixIndex::remove`] and [`PrefixIndex::forget_engine`].
    free: Vec<u32>,
    /// Most and least recently used slots ([`NIL`] when empty).
    head: u32,
    tail: u32,
    capacity: usize,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    hash: u64,
    /// Towards the most recently used ([`NIL`] at the head).
    prev: u32,
    /// Towards the least recently used ([`NIL`] at the tail).
    next: u32,
    /// The engines holding this block, oldest first: `engines[..held]`.
    engines: [u16; MAX_ENGINES_PER_BLOCK],
    held: u8,
}

impl Slot {
    fn engines(&self) -> &[u16] {
        &self.engines[..usize::from(self.held)]
    }

    /// `engine` now holds this block, as the most recent of its engines
    /// (the oldest dropped when it already names the most it keeps).
    fn hold(&mut self, engine: u16) {
        let n = usize::from(self.held);
        match self.engines[..n].iter().position(|e| *e == engine) {
            Some(i) => self.engines[i..n].rotate_left(1),
            None if n == MAX_ENGINES_PER_BLOCK => {
                self.engines.rotate_left(1);
                self.engines[n - 1] = engine;
            }
            None => {
                self.engines[n] = engine;
                self.held += 1;
            }
        }
    }

    /// `engine` no longer holds it; whether any engine still does.
    fn release(&mut self, engine: u16) -> bool {
        let n = usize::from(self.held);
        if let Some(i) = self.engines[..n].iter().position(|e| *e == engine) {
            self.engines[i..n].rotate_left(1);
            self.held -= 1;
        }
        self.held > 0
    }
}

/// No slot.
const NIL: u32 = u32::MAX;

/// Engines remembered per block (a prefix sent to more is remembered on
/// the most recent ones).
const MAX_ENGINES_PER_BLOCK: usize = 8;

/// Slots an index reserves at creation, at most: a larger one grows to its
/// bound as it fills.
const PREALLOCATED: usize = 1 << 18;

impl PrefixIndex {
    /// An index of at most `capacity` blocks (and at most `u32::MAX - 1`).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, NIL as usize - 1);
        let reserve = capacity.min(PREALLOCATED);
        Self {
            // Twice the blocks: removals leave tombstones, and a table more
            // than half full would double itself to clear them (once, well
            // after start); at half it clears them in place.
            slots_of: HashMap::with_capacity(2 * reserve),
            slots: Vec::with_capacity(reserve),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            capacity,
        }
    }

    /// Blocks remembered.
    pub fn len(&self) -> usize {
        self.slots_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots_of.is_empty()
    }

    fn unlink(&mut self, i: u32) {
        let Slot { prev, next, .. } = self.slots[i as usize];
        match prev {
            NIL => self.head = next,
            p => self.slots[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.slots[n as usize].prev = prev,
        }
    }

    fn push_front(&mut self, i: u32) {
        let old = self.head;
        let slot = &mut self.slots[i as usize];
        slot.prev = NIL;
        slot.next = old;
        match old {
            NIL => self.tail = i,
            o => self.slots[o as usize].prev = i,
        }
        self.head = i;
    }

    /// Drops slot `i` and its block.
    fn drop_slot(&mut self, i: u32) {
        self.unlink(i);
        self.slots_of.remove(&self.slots[i as usize].hash);
        self.free.push(i);
    }

    /// Records that a prompt with these block hashes went to `engine`.
    pub fn record(&mut self, engine: u16, hashes: &[u64]) {
        for &h in hashes {
            let i = match self.slots_of.get(&h) {
                Some(&i) => {
                    self.unlink(i);
                    i
                }
                None => {
                    if self.slots_of.len() >= self.capacity {
                        self.drop_slot(self.tail); // full: the least recently used goes
                    }
                    let slot =
                        Slot { hash: h, prev: NIL, next: NIL, engines: [0; MAX_ENGINES_PER_BLOCK], held: 0 };
                    let i = match self.free.pop() {
                        Some(i) => {
                            self.slots[i as usize] = slot;
                            i
                        }
                        None => {
                            self.slots.push(slot);
                            (self.slots.len() - 1) as u32
                        }
                    };
                    self.slots_of.insert(h, i);
                    i
                }
            };
            self.slots[i as usize].hold(engine);
            self.push_front(i);
        }
    }

    /// Forgets that `engine` holds block `hash` (it evicted it).
    pub fn remove(&mut self, engine: u16, hash: u64) {
        if let Some(&i) = self.slots_of.get(&hash) {
            if !self.slots[i as usize].release(engine) {
                self.drop_slot(i);
            }
        }
    }

    /// Forgets `engine` (it went away, or its cache was reset).
    pub fn forget_engine(&mut self, engine: u16) {
        let mut i = self.head;
        while i != NIL {
            let next = self.slots[i as usize].next;
            if !self.slots[i as usize].release(engine) {
                self.drop_slot(i);
            }
            i = next;
        }
    }

    /// For each of `engines`, how many leading blocks of `hashes` it holds.
    pub fn matched(&self, hashes: &[u64], engines: usize) -> Vec<u32> {
        let mut matched = vec![0u32; engines];
        let mut alive: Vec<bool> = vec![true; engines];
        for (k, h) in hashes.iter().enumerate() {
            let Some(&slot) = self.slots_of.get(h) else { break };
            let held = self.slots[slot as usize].engines();
            let mut any = false;
            for (i, ok) in alive.iter_mut().enumerate() {
                if *ok && held.iter().any(|x| usize::from(*x) == i) {
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
