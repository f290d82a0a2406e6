//! The cpu backend through the real scheduler: continuous batching and
//! preemption never change a sequence's text.

use std::sync::Arc;

use engine::backend::cpu::{Cpu, ModelConfig};
use engine::kv::KvAllocator;
use engine::scheduler::Scheduler;

mod common;
use common::text::{request, run, scheduler_on, shared};

const MODEL: ModelConfig = ModelConfig { layers: 2, hidden: 64, heads: 4, ffn: 128, vocab: 512, seed: 7 };

fn scheduler(pages: u32, max_batch: u32) -> (Scheduler, Arc<KvAllocator>) {
    scheduler_with(pages, max_batch, true)
}

fn scheduler_with(pages: u32, max_batch: u32, prefix_cache: bool) -> (Scheduler, Arc<KvAllocator>) {
    scheduler_on(Cpu::new(MODEL, 2, pages, 4), pages, max_batch, prefix_cache)
}

#[tokio::test]
async fn six_sequences_batched_with_preemption_match_each_run_alone() {
    let (alone, _) = scheduler(256, 1);
    let mut want = Vec::new();
    for i in 0..6 {
        want.push(run(&alone, request(i)).await);
    }
    // 40 pages of 4 tokens cannot hold six sequences of ~17 + 24 tokens:
    // the scheduler has to preempt and recompute to finish them all.
    let (batched, kv) = scheduler(40, 8);
    let runs: Vec<_> = (0..6)
        .map(|i| {
            tokio::spawn({
                let s = batched.clone();
                async move { run(&s, request(i)).await }
            })
        })
        .collect();
    let mut got = Vec::new();
    for r in runs {
        got.push(r.await.unwrap());
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(!w.0.is_empty(), "sequence {i} produced text");
        assert_eq!(g, w, "sequence {i} differs batched");
    }
    let snap = batched.snapshot().await;
    assert!(snap.preemptions > 0, "the small cache forced preemptions: {snap:?}");
    assert_eq!(kv.snapshot().free, 40, "every page returned");
}

#[tokio::test]
async fn prompts_sharing_a_prefix_get_the_same_text_with_the_cache_even_after_eviction_and_preemption() {
    let (off, _) = scheduler_with(512, 1, false);
    let mut want = Vec::new();
    for i in 0..8 {
        want.push(run(&off, shared(i)).await);
    }
    // Alone, one after the other: every prompt after the first shares the
    // system prompt's pages.
    let (on, kv) = scheduler_with(512, 1, true);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&run(&on, shared(i)).await, w, "sequence {i} differs with the cache");
    }
    let snap = kv.snapshot();
    assert!(snap.hit_tokens >= 7 * 24, "seven prompts found the system prompt: {snap:?}");
    // Batched in a cache too small for them (one prompt is 8 pages, 6 of
    // them the system prompt; each grows 4 more): admitted on the shared
    // pages, they run out, so pages are evicted and sequences preempted;
    // the text stays the same.
    let (small, kv) = scheduler_with(36, 8, true);
    for round in 0..2 {
        assert_eq!(run(&small, shared(0)).await, want[0], "round {round}: the first alone");
        let runs: Vec<_> = (1..8)
            .map(|i| {
                let s = small.clone();
                tokio::spawn(async move { run(&s, shared(i)).await })
            })
            .collect();
        for (i, r) in runs.into_iter().enumerate() {
            assert_eq!(r.await.unwrap(), want[i + 1], "round {round}: sequence {} differs", i + 1);
        }
    }
    assert!(small.snapshot().await.preemptions > 0, "the small cache forced preemptions");
    let evicted = match kv.events_since(1, usize::MAX) {
        engine::kv::KvEventsSince::Events { events, .. } => events.iter().map(|e| e.evicted.len()).sum(),
        engine::kv::KvEventsSince::Snapshot { .. } => usize::MAX,
    };
    assert!(evicted > 0, "pages were evicted");
    assert!(kv.snapshot().hit_tokens > 0);
    assert_eq!(kv.snapshot().free, 36, "every page is free or evictable again");
}
