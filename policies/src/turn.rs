//! The engine scheduler's per-turn decision, as a state machine the engine
//! drives with real time and the simulator with virtual time.
//!
//! [`Turns`] holds an engine's waiting queue, its running batch and its
//! paused sequences, each with its KV pages ([`crate::kv`]), and decides at
//! every token boundary what runs next. The driver owns everything else:
//! the device (or its profile), the clock, the sequences' outputs. It
//! admits sequences ([`Turns::admit`]), drops those whose client went away
//! ([`Turns::retain`]), asks for the next step ([`Turns::next`]), runs it,
//! and hands the outcome back ([`Turns::prefilled`], [`Turns::decoded`]).
//! Each sequence carries a driver payload `S` (the engine's backend state
//! and stream; the simulator's request index), told through [`Payload`]
//! what happened to its sequence between steps.
//!
//! One turn, in order:
//! 1. **Priority** (004): paused sequences take free decode slots back
//!    unless a higher class waits for them ([`crate::preempt::resumes`]);
//!    with every slot taken, a lower class's running sequence is *paused*
//!    (pages kept) when the most important waiting one would otherwise
//!    miss its TTFT budget ([`crate::preempt::victim`]).
//! 2. **The turn rule** ([`crate::batching::prefill_turn`]): a prefill batch
//!    goes first unless the running sequences have waited
//!    `max_decode_stall_ms` for a token.
//! 3. **A prefill batch**: the sequences [`crate::batching::form_prefill`]
//!    picks, each computing only what the prefix cache does not hold; a
//!    preempted sequence gets pages again first (ignoring the watermarks;
//!    it stays queued while the cache is full, and ends when it has
//!    outgrown the whole cache).
//! 4. **Else one decode step** over every running sequence (continuous
//!    batching), after making room: each gets a page for its next token,
//!    `extend_pages` at a time; when none is free the running sequence with
//!    the worst key that has produced `min_quantum_tokens` since it last
//!    started, and has been preempted fewer than `max_preemptions` times,
//!    gives its pages back and returns to the queue (recompute); when none
//!    may be, the sequence that cannot grow ends (`kv_exhausted`).
//!
//! Admission reserves the prompt plus `output_reserve_tokens` (capped by
//! `max_tokens`) and shares the longest cached prefix of the prompt's
//! blocks; a prefilled prompt's blocks are named for later prompts.
//!
//! The simulator runs many decode steps as one when nothing can change in
//! between ([`Turns::fusable`]): no prefill waiting on the turn rule, no
//! priority decision pending, and pages enough for every running sequence
//! to grow through the run ([`Turns::extend`]).

use std::sync::Arc;
use std::time::Duration;

use crate::batching::{form_prefill, prefill_turn, BatchLimits, Queued};
use crate::kv::{KvAllocator, KvRefusal, PageSet};
use crate::prefix::Block;
use crate::LatencyProfile;

/// The scheduler's settings.
#[derive(Debug, Clone)]
pub struct TurnConfig {
    pub limits: BatchLimits,
    /// Used by batch formation and priority preemption to predict times.
    pub profile: LatencyProfile,
    /// Output tokens reserved at admission beyond the prompt (capped by
    /// `max_tokens`): the over-estimate of the output.
    pub output_reserve_tokens: u32,
    /// KV pages added at a time when a sequence outgrows its pages.
    pub extend_pages: u32,
    /// TTFT budget of a sequence that brings none.
    pub default_ttft: Duration,
    pub max_preemptions: u32,
    pub min_quantum_tokens: u32,
}

/// A sequence's standing for priority preemption.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Priority {
    /// Higher preempts lower.
    pub class: u32,
    /// How many times it may be paused for a higher class.
    pub max_pauses: u32,
    /// Its end-to-end budget: never paused when the pause would miss it.
    pub e2e_budget_ms: u32,
}

/// What the driver knows of a new sequence.
#[derive(Debug, Clone)]
pub struct Spec {
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    /// Shortest-first key (`None`: prompt plus `max_tokens`).
    pub key: Option<f64>,
    /// `None`: the configured default.
    pub ttft_budget: Option<Duration>,
    pub priority: Option<Priority>,
    /// The prompt's full blocks (none with the prefix cache off).
    pub blocks: Vec<Block>,
    /// Leading blocks that may come from the cache: those before the
    /// prompt's last token, which is always computed.
    pub reusable: usize,
}

/// Why a sequence was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("engine is draining")]
    Draining,
    #[error(transparent)]
    Kv(#[from] KvRefusal),
}

/// What the state machine tells a sequence's payload. Every hook has a
/// default that does nothing.
pub trait Payload: Sized {
    /// Preempted for KV room: its pages went back, it is queued again.
    fn preempted(_seq: &mut Seq<Self>) {}
    /// Paused for a higher class, pages kept.
    fn paused(_seq: &mut Seq<Self>) {}
    /// Back in the running batch after a pause.
    fn resumed(_seq: &mut Seq<Self>) {}
    /// Ends here with an error; dropped right after.
    fn failed(_seq: &mut Seq<Self>, _code: &'static str, _message: &'static str) {}
}

/// One admitted sequence.
#[derive(Debug)]
pub struct Seq<S> {
    pub id: u64,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    /// Tokens produced so far ([`Seq::produced`]).
    pub generated: u32,
    pub key: f64,
    pub enqueued_at: Duration,
    pub ttft_budget: Duration,
    /// `None` while preempted (queued for recompute).
    pub pages: Option<PageSet>,
    pub preemptions: u32,
    pub priority: Option<Priority>,
    /// Times it was paused for a higher class.
    pub pauses: u32,
    /// Tokens produced since it last started (its quantum).
    pub since_start: u32,
    /// The context's full blocks: the prompt's (named once prefilled),
    /// then those the driver appends as its output completes them.
    pub blocks: Vec<Block>,
    pub reusable: usize,
    /// Prompt tokens its first prefill found cached.
    pub cached_tokens: u32,
    pub payload: S,
}

impl<S> Seq<S> {
    /// Prompt and output so far.
    pub fn context(&self) -> u32 {
        self.prompt_tokens + self.generated
    }

    /// The blocks admission may share from the cache.
    pub fn reuse(&self) -> &[Block] {
        &self.blocks[..self.reusable.min(self.blocks.len())]
    }

    /// Leading context tokens its pages hold already (a cached prefix).
    pub fn cached(&self) -> u32 {
        self.pages.as_ref().map_or(0, PageSet::cached_tokens)
    }

    /// Prompt plus output budget: what the sequence may still cost.
    pub fn tokens(&self) -> u64 {
        u64::from(self.prompt_tokens) + u64::from(self.max_tokens)
    }

    /// Records one produced token (the driver calls it per token).
    pub fn produced(&mut self) {
        self.generated += 1;
        self.since_start += 1;
    }

    /// Names the pages its context filled ([`Seq::blocks`], every position
    /// of which holds K/V: the last token produced has none yet), so that
    /// the next turn of a conversation, which resends this answer, finds
    /// them cached. The driver calls it as the sequence ends.
    pub fn commit_output(&mut self) {
        let Some(pages) = self.pages.as_mut() else { return };
        if self.generated == 0 {
            return; // nothing generated: the prefill named the prompt already
        }
        let computed = (self.prompt_tokens + self.generated - 1) / pages.page_tokens();
        pages.commit(&self.blocks[..self.blocks.len().min(computed as usize)]);
    }
}

/// What to run at this token boundary.
#[derive(Debug)]
pub enum Step<S> {
    /// Prefill these (out of the queue until [`Turns::prefilled`]).
    Prefill(Vec<Seq<S>>),
    /// One decode step over [`Turns::running_mut`], then [`Turns::decoded`].
    Decode,
    /// Nothing can run until a sequence arrives or pages free up.
    Idle,
}

/// An admission's outcome.
#[derive(Debug)]
pub enum Admitted<S> {
    /// Queued under this id.
    Queued(u64),
    /// Nothing to generate (`max_tokens` 0): the driver ends it now.
    Finished(Seq<S>),
}

/// Counters since the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TurnStats {
    pub preemptions: u64,
    pub pauses: u64,
    /// Prompt tokens of sequences prefilled (their first prefill), and of
    /// those found in the prefix cache.
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// The scheduler's state; see the module documentation.
#[derive(Debug)]
pub struct Turns<S> {
    cfg: TurnConfig,
    kv: Arc<KvAllocator>,
    queue: Vec<Seq<S>>,
    running: Vec<Seq<S>>,
    paused: Vec<Seq<S>>,
    draining: bool,
    next_id: u64,
    /// When every running sequence last had a token, at the latest: the
    /// end of the last decode step, or of the prefill that started the
    /// running batch.
    tokens_at: Duration,
    stats: TurnStats,
}

impl<S: Payload> Turns<S> {
    pub fn new(cfg: TurnConfig, kv: Arc<KvAllocator>) -> Self {
        Self {
            cfg,
            kv,
            queue: Vec::new(),
            running: Vec::new(),
            paused: Vec::new(),
            draining: false,
            next_id: 0,
            tokens_at: Duration::ZERO,
            stats: TurnStats::default(),
        }
    }

    pub fn config(&self) -> &TurnConfig {
        &self.cfg
    }

    /// Batch limits from the next batch formed on.
    pub fn set_limits(&mut self, limits: BatchLimits) {
        self.cfg.limits = limits;
    }

    pub fn kv(&self) -> &Arc<KvAllocator> {
        &self.kv
    }

    pub fn queue(&self) -> &[Seq<S>] {
        &self.queue
    }

    pub fn running(&self) -> &[Seq<S>] {
        &self.running
    }

    /// The running batch, for the driver's decode step.
    pub fn running_mut(&mut self) -> &mut [Seq<S>] {
        &mut self.running
    }

    pub fn paused(&self) -> &[Seq<S>] {
        &self.paused
    }

    /// No sequence queued, running or paused (a prefill batch the driver
    /// holds is not counted).
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty() && self.running.is_empty() && self.paused.is_empty()
    }

    pub fn stats(&self) -> TurnStats {
        self.stats
    }

    pub fn draining(&self) -> bool {
        self.draining
    }

    /// Stops admitting; admitted sequences run to their end.
    pub fn drain(&mut self) {
        self.draining = true;
    }

    /// Admits a sequence at `now`: reserves its prompt and output reserve
    /// in the KV cache, sharing the cached prefix of its blocks, or refuses
    /// with a typed reason. `payload` is built only once it is admitted.
    pub fn admit(
        &mut self,
        now: Duration,
        spec: Spec,
        payload: impl FnOnce(u64) -> S,
    ) -> Result<Admitted<S>, Refusal> {
        if self.draining {
            return Err(Refusal::Draining);
        }
        let reserve = self.cfg.output_reserve_tokens.min(spec.max_tokens);
        let reusable = spec.reusable.min(spec.blocks.len());
        let tokens = u64::from(spec.prompt_tokens) + u64::from(reserve);
        let pages = self.kv.admit(tokens, &spec.blocks[..reusable])?;
        self.next_id += 1;
        let id = self.next_id;
        let seq = Seq {
            id,
            prompt_tokens: spec.prompt_tokens,
            max_tokens: spec.max_tokens,
            generated: 0,
            key: spec.key.unwrap_or((u64::from(spec.prompt_tokens) + u64::from(spec.max_tokens)) as f64),
            enqueued_at: now,
            ttft_budget: spec.ttft_budget.unwrap_or(self.cfg.default_ttft),
            pages: Some(pages),
            preemptions: 0,
            priority: spec.priority,
            pauses: 0,
            since_start: 0,
            blocks: spec.blocks,
            reusable,
            cached_tokens: 0,
            payload: payload(id),
        };
        if spec.max_tokens == 0 {
            return Ok(Admitted::Finished(seq));
        }
        self.queue.push(seq);
        Ok(Admitted::Queued(id))
    }

    /// Keeps only the sequences `keep` holds to (the others' clients went
    /// away): their pages return at once.
    pub fn retain(&mut self, mut keep: impl FnMut(&Seq<S>) -> bool) {
        self.queue.retain(&mut keep);
        self.running.retain(&mut keep);
        self.paused.retain(&mut keep);
    }

    /// The token boundary at `now`: what runs next (module documentation).
    pub fn next(&mut self, now: Duration) -> Step<S> {
        self.reprioritize(now);
        let prefill_first = self.prefill_first(now);
        if prefill_first {
            let batch = self.take_planned(now);
            if !batch.is_empty() {
                return Step::Prefill(batch);
            }
        }
        let before = self.queue.len();
        self.make_room();
        if !self.running.is_empty() {
            return Step::Decode;
        }
        // No decode: a prefill the turn rule held back, or the sequences
        // making room just preempted, may start now.
        if !prefill_first || self.queue.len() > before {
            let batch = self.take_planned(now);
            if !batch.is_empty() {
                return Step::Prefill(batch);
            }
        }
        Step::Idle
    }

    fn prefill_first(&self, now: Duration) -> bool {
        prefill_turn(self.running.len() as u32, now.saturating_sub(self.tokens_at), &self.cfg.limits)
    }

    /// A prefill batch ended at `now`: its prompts' pages are named for
    /// later prompts, then `apply` takes each member's first token (calling
    /// [`Seq::produced`] for it) and says whether the sequence is done;
    /// the others join the running batch.
    pub fn prefilled(
        &mut self,
        now: Duration,
        batch: Vec<Seq<S>>,
        mut apply: impl FnMut(&mut Seq<S>) -> bool,
    ) {
        if self.running.is_empty() {
            // The batch starts the running set: its first tokens are the
            // newest the running sequences have.
            self.tokens_at = now;
        }
        for mut seq in batch {
            // Every block of the context it computed (the prompt's; a
            // recomputed sequence's output too) holds K/V now.
            let full = (seq.context() / self.kv.page_tokens()) as usize;
            if let Some(pages) = seq.pages.as_mut() {
                pages.commit(&seq.blocks[..seq.blocks.len().min(full)]);
            }
            if !apply(&mut seq) {
                self.running.push(seq);
            }
        }
    }

    /// A decode step (or a run of [`Turns::fusable`] steps) over the
    /// running batch ended at `now`: `apply` takes each sequence's tokens
    /// and says whether it is done; done ones leave (their pages return).
    pub fn decoded(&mut self, now: Duration, mut apply: impl FnMut(&mut Seq<S>) -> bool) {
        self.tokens_at = now;
        self.running.retain_mut(|s| !apply(s));
    }

    /// How many decode steps, at most `limit`, may run as one from this
    /// boundary: those over which no decision here could differ. One while
    /// a queued sequence could start at the next boundary (a free decode
    /// slot, or the turn rule holding it back), takes part in priority
    /// preemption, or a paused one waits; otherwise (the queue empty, or
    /// every slot taken until a sequence ends) as many as the free pages
    /// let every running sequence grow through ([`Turns::extend`]).
    /// Call it right after [`Turns::next`] answered [`Step::Decode`].
    pub fn fusable(&self, now: Duration, limit: u64) -> u64 {
        if limit <= 1 || self.running.is_empty() {
            return limit.min(1);
        }
        let queued = !self.queue.is_empty();
        let slot_free = self.running.len() < self.cfg.limits.max_batch as usize;
        if !self.paused.is_empty()
            || (queued
                && (slot_free || !self.prefill_first(now) || self.queue.iter().any(|s| s.priority.is_some())))
        {
            return 1;
        }
        let free = u64::from(self.kv.free_pages());
        let (mut lo, mut hi) = (1, limit);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.growth_pages(mid) <= free {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// Pages the running batch takes to grow by `steps` tokens each, in
    /// `extend_pages` units as [`PageSet::ensure`] takes them.
    fn growth_pages(&self, steps: u64) -> u64 {
        let unit = u64::from(self.cfg.extend_pages.max(1));
        let page = u64::from(self.kv.page_tokens());
        self.running
            .iter()
            .map(|s| {
                let have = s.pages.as_ref().map_or(0, |p| p.pages().len() as u64);
                let need = (u64::from(s.context()) + steps).div_ceil(page);
                need.saturating_sub(have).div_ceil(unit) * unit
            })
            .sum()
    }

    /// Grows every running sequence's pages to hold `steps` more tokens
    /// (the run [`Turns::fusable`] allowed, which the free pages cover).
    pub fn extend(&mut self, steps: u64) {
        let unit = self.cfg.extend_pages;
        for s in &mut self.running {
            let need = u64::from(s.context()) + steps;
            if let Some(p) = s.pages.as_mut() {
                // Cannot fail within what `fusable` allowed; a shortfall
                // would be met by `make_room` at the next boundary.
                let _ = p.ensure(need, unit);
            }
        }
    }

    /// Takes the sequences batch formation picks out of the queue. A
    /// preempted one gets pages again first; it stays queued while the
    /// cache is full, and ends if it has outgrown the whole cache.
    fn take_planned(&mut self, now: Duration) -> Vec<Seq<S>> {
        if self.queue.is_empty() {
            return Vec::new();
        }
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
        let plan = form_prefill(&views, self.running.len() as u32, &self.cfg.limits, &self.cfg.profile, now);
        let mut batch = Vec::with_capacity(plan.admit.len());
        for id in &plan.admit {
            let Some(i) = self.queue.iter().position(|s| s.id == *id) else { continue };
            let mut seq = self.queue.remove(i);
            if seq.pages.is_none() {
                // A preempted sequence returns: it was admitted already, so
                // only real exhaustion keeps it waiting. It needs room for
                // its context and its next token.
                let tokens = u64::from(seq.context()) + 1;
                match self.kv.admit_running(tokens, seq.reuse()) {
                    Ok(p) => seq.pages = Some(p),
                    Err(_) if self.kv.pages_for(tokens) > self.kv.total_pages() => {
                        S::failed(&mut seq, "kv_exhausted", "the sequence has outgrown the whole KV cache");
                        continue;
                    }
                    Err(_) => {
                        self.queue.push(seq);
                        continue;
                    }
                }
            }
            if seq.generated == 0 {
                seq.cached_tokens = seq.cached();
                self.stats.prompt_tokens += u64::from(seq.prompt_tokens);
                self.stats.cached_tokens += u64::from(seq.cached_tokens);
            }
            batch.push(seq);
        }
        batch
    }
}

mod preempt;

#[cfg(test)]
mod tests;
