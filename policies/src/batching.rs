//! Micro-batch formation: which queued sequences join the next prefill batch.
//!
//! A pure function of the queue, the running batch, the limits, the latency
//! profile and `now` (time is a parameter, as a duration since any fixed
//! origin). The engine's scheduler calls it at every token boundary; the
//! simulator calls the same function.
//!
//! Rules, in the order they are applied to candidates taken by their
//! ordering key (lower first):
//! 1. **Slots.** At most `max_batch` sequences run at once (decode slots).
//! 2. **Reserve.** While long prompts wait, `reserved_long_slots` of the
//!    free slots are kept for them and the best long prompt is considered
//!    first, so a stream of short jobs with better keys cannot starve long
//!    ones (the split rule would otherwise keep a long prompt out of every
//!    batch of short ones).
//! 3. **Long cap.** At most `max_long_per_prefill` long prompts per batch
//!    (long prompts stall the decode of everyone else while they prefill).
//! 4. **Token budget.** At most `max_prefill_tokens` prompt tokens per batch.
//! 5. **Split.** A candidate that would make longest/median prompt length
//!    exceed `split_ratio` waits for a later batch (padding waste and
//!    head-of-line blocking).
//! 6. **TTFT.** Time already waited plus the batch's predicted prefill must
//!    stay within `ttft_fraction` (40%) of every member's TTFT budget.
//!
//! **Turns.** A token boundary runs a prefill batch when this function picks
//! one, else a decode step over the running batch, with one exception
//! ([`prefill_turn`]): once the running sequences have gone
//! `max_decode_stall_ms` without a token, a decode step comes first. Prefill
//! batches still run back to back while that is short (a burst of short
//! prompts is admitted at full speed), but a burst of long prompts can no
//! longer hold every running stream silent for as long as the burst takes
//! (30 s in a live run: the relay's silence limit). A single prefill batch
//! longer than the bound is not cut (the batch's token budget and the long
//! cap bound it); the bound is on how many follow each other. Strict
//! alternation (a decode step after every prefill batch) was tried and
//! failed the other way: with 5 s decode steps, a burst of 10,000 streams
//! admitted one batch per step waited minutes for first tokens.
//!
//! `BatchMode::Static` is the naive baseline of the admission benchmark:
//! no joining, a new batch of up to `max_batch` sequences (key order) only
//! once the running batch has finished completely.
//!
//! The first candidate in key order that fits the slot and lane rules is
//! always admitted, even alone over a budget: progress beats purity, and a
//! request that can no longer meet its budget is the admission layer's to
//! refuse, not the batcher's to strand.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::profile::LatencyProfile;

/// One sequence waiting for prefill.
#[derive(Debug, Clone, PartialEq)]
pub struct Queued {
    pub id: u64,
    /// What its prefill computes: the prompt after its cached prefix.
    pub prompt_tokens: u32,
    /// The prefix already in the KV cache (its rows attend to it).
    pub cached_tokens: u32,
    /// Ordering key sent by the gateway; lower runs first (for example
    /// estimated service time over priority weight, or a deadline for EDF).
    pub key: f64,
    /// When it was enqueued, on the same clock as `now`.
    pub enqueued_at: Duration,
    /// The request's TTFT budget.
    pub ttft_budget: Duration,
}

/// Continuous batching (the product) or static batches (a baseline).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchMode {
    /// Sequences join and leave the running batch at token boundaries.
    #[default]
    Continuous,
    /// A batch runs to completion before the next one is formed.
    Static,
}

/// Limits of batch formation (engine config; defaults are a sensible start).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchLimits {
    pub mode: BatchMode,
    pub max_batch: u32,
    pub max_prefill_tokens: u32,
    /// Prompts of at least this many tokens are in the long lane.
    pub long_prompt_tokens: u32,
    pub max_long_per_prefill: u32,
    pub split_ratio: f64,
    pub reserved_long_slots: u32,
    /// Share of the TTFT budget that batch formation plus prefill may use.
    pub ttft_fraction: f64,
    /// How long running sequences may go without a token while prefill
    /// batches run back to back (module docs, "Turns").
    pub max_decode_stall_ms: u32,
}

impl Default for BatchLimits {
    fn default() -> Self {
        Self {
            mode: BatchMode::Continuous,
            max_batch: 64,
            max_prefill_tokens: 8192,
            long_prompt_tokens: 1024,
            max_long_per_prefill: 1,
            split_ratio: 8.0,
            reserved_long_slots: 2,
            ttft_fraction: 0.4,
            max_decode_stall_ms: 500,
        }
    }
}

/// Batch-formation hints: the policy document's `[batching]` section,
/// which the gateway sends to every engine (`PUT /engine/v1/batching`) at
/// start, on every reload and when an engine comes back. A key left unset
/// keeps the engine's own flag; hardware limits (slots, KV) stay engine
/// flags. `long_prompt_tokens` is not written in `[batching]`: the gateway
/// fills it from `[routing]`, so engines and routing agree on what is long.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchHints {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_prefill_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_long_per_prefill: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split_ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved_long_slots: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_fraction: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub long_prompt_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_decode_stall_ms: Option<u32>,
}

impl BatchHints {
    /// Range checks, naming the key (as `batching.KEY`) that is wrong.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let key = |k: &str| format!("batching.{k}");
        if self.max_prefill_tokens == Some(0) {
            return Err((key("max_prefill_tokens"), "must be > 0".into()));
        }
        if self.max_decode_stall_ms == Some(0) {
            return Err((key("max_decode_stall_ms"), "must be > 0".into()));
        }
        if self.long_prompt_tokens == Some(0) {
            return Err((key("long_prompt_tokens"), "must be > 0".into()));
        }
        if self.split_ratio.is_some_and(|r| !(r >= 1.0 && r.is_finite())) {
            return Err((key("split_ratio"), "must be a finite number >= 1".into()));
        }
        if self.ttft_fraction.is_some_and(|f| !(f > 0.0 && f <= 1.0)) {
            return Err((key("ttft_fraction"), "must be in (0, 1]".into()));
        }
        Ok(())
    }

    /// `limits` with every set hint applied.
    pub fn apply(&self, limits: &BatchLimits) -> BatchLimits {
        BatchLimits {
            max_prefill_tokens: self.max_prefill_tokens.unwrap_or(limits.max_prefill_tokens),
            long_prompt_tokens: self.long_prompt_tokens.unwrap_or(limits.long_prompt_tokens),
            max_long_per_prefill: self.max_long_per_prefill.unwrap_or(limits.max_long_per_prefill),
            split_ratio: self.split_ratio.unwrap_or(limits.split_ratio),
            reserved_long_slots: self.reserved_long_slots.unwrap_or(limits.reserved_long_slots),
            ttft_fraction: self.ttft_fraction.unwrap_or(limits.ttft_fraction),
            max_decode_stall_ms: self.max_decode_stall_ms.unwrap_or(limits.max_decode_stall_ms),
            ..limits.clone()
        }
    }
}

/// The next prefill batch.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PrefillPlan {
    /// Ids of the admitted sequences, in key order.
    pub admit: Vec<u64>,
    pub prompt_tokens: u32,
    /// Predicted prefill time of the batch.
    pub prefill: Duration,
}

impl BatchLimits {
    pub fn is_long(&self, q: &Queued) -> bool {
        q.prompt_tokens >= self.long_prompt_tokens
    }
}

/// Whether the next token boundary may run a prefill batch: always while no
/// sequence runs, else only while the running ones have waited less than
/// `max_decode_stall_ms` for a token (`stalled`: since the decode step that
/// last gave them one, or since the prefill that gave the oldest of them its
/// first). The engine's scheduler and the simulator both ask (module docs,
/// "Turns").
pub fn prefill_turn(running: u32, stalled: Duration, limits: &BatchLimits) -> bool {
    running == 0 || stalled < Duration::from_millis(u64::from(limits.max_decode_stall_ms))
}

/// Forms the next prefill batch from `queue` while `running` sequences
/// decode. See the module docs for the rules.
pub fn form_prefill(
    queue: &[Queued],
    running: u32,
    limits: &BatchLimits,
    profile: &LatencyProfile,
    now: Duration,
) -> PrefillPlan {
    let free = limits.max_batch.saturating_sub(running);
    let mut order: Vec<&Queued> = queue.iter().collect();
    order.sort_by(|a, b| {
        a.key.total_cmp(&b.key).then(a.enqueued_at.cmp(&b.enqueued_at)).then(a.id.cmp(&b.id))
    });
    if limits.mode == BatchMode::Static {
        let take = if running == 0 { limits.max_batch as usize } else { 0 };
        let chosen: Vec<&Queued> = order.into_iter().take(take).collect();
        let tokens = chosen.iter().map(|q| q.prompt_tokens).fold(0u32, u32::saturating_add);
        return PrefillPlan {
            admit: chosen.iter().map(|q| q.id).collect(),
            prompt_tokens: tokens,
            prefill: batch_time(profile, &chosen, None),
        };
    }
    let long_waiting = order.iter().filter(|q| limits.is_long(q)).count() as u32;
    let short_cap = free - limits.reserved_long_slots.min(long_waiting).min(free);
    if limits.reserved_long_slots > 0 {
        if let Some(i) = order.iter().position(|q| limits.is_long(q)) {
            let head = order.remove(i);
            order.insert(0, head);
        }
    }

    let mut chosen: Vec<&Queued> = Vec::new();
    let (mut longs, mut shorts, mut tokens) = (0u32, 0u32, 0u32);
    for q in order {
        if chosen.len() as u32 >= free {
            break;
        }
        let long = limits.is_long(q);
        if (long && longs >= limits.max_long_per_prefill) || (!long && shorts >= short_cap) {
            continue;
        }
        let total = tokens.saturating_add(q.prompt_tokens);
        let fits = chosen.is_empty()
            || (total <= limits.max_prefill_tokens
                && within_ratio(&chosen, q, limits.split_ratio)
                && within_ttft(&chosen, q, batch_time(profile, &chosen, Some(q)), limits.ttft_fraction, now));
        if fits {
            chosen.push(q);
            tokens = total;
            if long {
                longs += 1;
            } else {
                shorts += 1;
            }
        }
    }
    PrefillPlan {
        admit: chosen.iter().map(|q| q.id).collect(),
        prompt_tokens: tokens,
        prefill: batch_time(profile, &chosen, None),
    }
}

/// The prefill time of `chosen` (and `more`) as one batch.
fn batch_time(profile: &LatencyProfile, chosen: &[&Queued], more: Option<&Queued>) -> Duration {
    profile.prefill_batch(chosen.iter().copied().chain(more).map(|q| (q.prompt_tokens, q.cached_tokens)))
}

fn within_ratio(chosen: &[&Queued], q: &Queued, ratio: f64) -> bool {
    let mut sizes: Vec<u32> = chosen.iter().map(|c| c.prompt_tokens).chain([q.prompt_tokens]).collect();
    sizes.sort_unstable();
    let median = f64::from(sizes[(sizes.len() - 1) / 2].max(1));
    f64::from(*sizes.last().expect("non-empty")) / median <= ratio
}

fn within_ttft(chosen: &[&Queued], q: &Queued, prefill: Duration, fraction: f64, now: Duration) -> bool {
    chosen.iter().copied().chain([q]).all(|m| {
        let waited = now.saturating_sub(m.enqueued_at);
        (waited + prefill).as_secs_f64() <= fraction * m.ttft_budget.as_secs_f64()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prefill costs 1 ms per 10 prompt tokens.
    fn profile() -> LatencyProfile {
        LatencyProfile::parse(
            "t",
            "model = \"m\"\nengine_class = \"t\"\n[prefill]\npoints = [[0, 0.0], [10000, 1000.0]]\n\
             [decode]\nbatch_points = [[1, 10.0]]\n",
        )
        .unwrap()
    }

    fn q(id: u64, tokens: u32, key: f64) -> Queued {
        Queued {
            id,
            prompt_tokens: tokens,
            cached_tokens: 0,
            key,
            enqueued_at: Duration::ZERO,
            ttft_budget: Duration::from_secs(10),
        }
    }

    fn limits() -> BatchLimits {
        BatchLimits { reserved_long_slots: 0, ..BatchLimits::default() }
    }

    #[test]
    fn takes_candidates_in_key_order_up_to_free_slots() {
        let queue = [q(1, 100, 3.0), q(2, 100, 1.0), q(3, 100, 2.0)];
        let plan = form_prefill(&queue, 62, &limits(), &profile(), Duration::ZERO);
        assert_eq!(plan.admit, vec![2, 3], "two free slots, best keys first");
        assert_eq!(plan.prompt_tokens, 200);
        assert_eq!(plan.prefill, Duration::from_millis(20));
        assert!(form_prefill(&queue, 64, &limits(), &profile(), Duration::ZERO).admit.is_empty());
    }

    #[test]
    fn static_batches_wait_for_the_whole_batch_to_finish() {
        let queue = [q(1, 100, 3.0), q(2, 5000, 1.0), q(3, 100, 2.0)];
        let limits = BatchLimits { mode: BatchMode::Static, max_batch: 2, ..limits() };
        assert!(form_prefill(&queue, 1, &limits, &profile(), Duration::ZERO).admit.is_empty());
        let plan = form_prefill(&queue, 0, &limits, &profile(), Duration::ZERO);
        assert_eq!(plan.admit, vec![2, 3], "key order, no length rules");
    }

    #[test]
    fn ttft_budget_bounds_the_batch_at_40_percent() {
        // Budget 100 ms -> 40 ms for waiting + prefill = 400 tokens at 0 wait.
        let mut queue: Vec<Queued> = (0..10).map(|i| q(i, 100, i as f64)).collect();
        for x in &mut queue {
            x.ttft_budget = Duration::from_millis(100);
        }
        let plan = form_prefill(&queue, 0, &limits(), &profile(), Duration::ZERO);
        assert_eq!(plan.admit, vec![0, 1, 2, 3]);
        // Having waited 20 ms leaves 20 ms: 200 tokens.
        let plan = form_prefill(&queue, 0, &limits(), &profile(), Duration::from_millis(20));
        assert_eq!(plan.admit, vec![0, 1]);
    }

    #[test]
    fn long_prompts_are_capped_per_batch_and_ratio_splits() {
        let queue = [q(1, 2000, 1.0), q(2, 3000, 2.0), q(3, 200, 3.0), q(4, 150, 4.0)];
        let plan = form_prefill(&queue, 0, &limits(), &profile(), Duration::ZERO);
        // One long prompt; the short ones would make longest/median > 8.
        assert_eq!(plan.admit, vec![1]);
        let queue = [q(3, 200, 3.0), q(4, 150, 4.0), q(5, 1000, 5.0)];
        let plan = form_prefill(&queue, 0, &limits(), &profile(), Duration::ZERO);
        assert_eq!(plan.admit, vec![3, 4, 5], "1000 / median 200 = 5 <= 8");
    }

    #[test]
    fn a_lone_oversized_or_late_request_still_runs() {
        let mut late = q(1, 20000, 1.0);
        late.ttft_budget = Duration::from_millis(1);
        let plan = form_prefill(&[late, q(2, 10, 2.0)], 0, &limits(), &profile(), Duration::from_secs(5));
        assert_eq!(plan.admit, vec![1], "progress: the head runs alone");
    }

    #[test]
    fn reserved_slots_keep_long_jobs_from_starving() {
        let l = BatchLimits { max_batch: 4, reserved_long_slots: 1, ..BatchLimits::default() };
        // Many short jobs with better keys, one long job with the worst key.
        let mut queue: Vec<Queued> = (0..10).map(|i| q(i, 100, i as f64)).collect();
        queue.push(q(99, 1500, 100.0));
        let plan = form_prefill(&queue, 0, &l, &profile(), Duration::ZERO);
        assert_eq!(
            plan.admit,
            vec![99],
            "the long job goes first; the split rule keeps shorts for the next batch"
        );
        // Once it runs, short jobs fill the slots left, minus none reserved.
        let shorts: Vec<Queued> = queue.iter().filter(|x| x.id != 99).cloned().collect();
        assert_eq!(form_prefill(&shorts, 1, &l, &profile(), Duration::ZERO).admit, vec![0, 1, 2]);
        // Without the reserve the long job waits behind every short one.
        let l0 = BatchLimits { reserved_long_slots: 0, ..l };
        assert!(!form_prefill(&queue, 0, &l0, &profile(), Duration::ZERO).admit.contains(&99));
    }

    #[test]
    fn prefill_waits_for_a_decode_step_once_running_streams_stall_too_long() {
        let l = BatchLimits { max_decode_stall_ms: 200, ..limits() };
        let ms = Duration::from_millis;
        assert!(prefill_turn(0, ms(10_000), &l), "nothing runs: nothing to stall");
        assert!(prefill_turn(3, ms(0), &l), "right after a decode step");
        assert!(prefill_turn(3, ms(199), &l), "back to back within the bound");
        assert!(!prefill_turn(3, ms(200), &l), "at the bound the decode step comes first");
        assert!(!prefill_turn(1, ms(30_000), &l));
        let hints = BatchHints { max_decode_stall_ms: Some(50), ..BatchHints::default() };
        assert_eq!(hints.apply(&l).max_decode_stall_ms, 50);
        assert_eq!(BatchHints::default().apply(&l).max_decode_stall_ms, 200, "unset keeps the flag");
        let zero = BatchHints { max_decode_stall_ms: Some(0), ..BatchHints::default() };
        assert_eq!(zero.validate().unwrap_err().0, "batching.max_decode_stall_ms");
    }

    /// Property: over random queues, every rule holds for every batch that
    /// has more than one member, and the batch is never empty when a slot
    /// is free and something is queued.
    #[test]
    fn random_queues_respect_every_limit() {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = |n: u64| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s % n
        };
        let p = profile();
        for _ in 0..2000 {
            let l = BatchLimits {
                mode: BatchMode::Continuous,
                max_batch: 1 + rnd(16) as u32,
                max_prefill_tokens: 500 + rnd(8000) as u32,
                long_prompt_tokens: 1024,
                max_long_per_prefill: 1 + rnd(2) as u32,
                split_ratio: 2.0 + rnd(8) as f64,
                reserved_long_slots: rnd(3) as u32,
                ttft_fraction: 0.4,
                max_decode_stall_ms: 500,
            };
            let now = Duration::from_millis(500);
            let queue: Vec<Queued> = (0..rnd(20))
                .map(|id| Queued {
                    id,
                    prompt_tokens: 1 + rnd(3000) as u32,
                    cached_tokens: 0,
                    key: rnd(100) as f64,
                    enqueued_at: Duration::from_millis(rnd(500)),
                    ttft_budget: Duration::from_millis(200 + rnd(3000)),
                })
                .collect();
            let running = rnd(u64::from(l.max_batch) + 1) as u32;
            let plan = form_prefill(&queue, running, &l, &p, now);
            let members: Vec<&Queued> =
                plan.admit.iter().map(|id| queue.iter().find(|x| x.id == *id).unwrap()).collect();
            assert!(members.len() as u32 <= l.max_batch - running);
            if running < l.max_batch && !queue.is_empty() {
                assert!(!members.is_empty(), "a free slot and a queue give a batch");
            }
            assert!(members.iter().filter(|m| l.is_long(m)).count() as u32 <= l.max_long_per_prefill);
            if members.len() > 1 {
                assert!(plan.prompt_tokens <= l.max_prefill_tokens);
                let max = members.iter().map(|m| m.prompt_tokens).max().unwrap();
                let mut sizes: Vec<u32> = members.iter().map(|m| m.prompt_tokens).collect();
                sizes.sort_unstable();
                assert!(f64::from(max) / f64::from(sizes[(sizes.len() - 1) / 2]) <= l.split_ratio);
                for m in &members[1..] {
                    let used = now.saturating_sub(m.enqueued_at) + plan.prefill;
                    assert!(used.as_secs_f64() <= 0.4 * m.ttft_budget.as_secs_f64() + 1e-9);
                }
            }
        }
    }
}
