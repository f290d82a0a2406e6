//! The cpu backend through the real scheduler: continuous batching and
//! preemption never change a sequence's text.

use std::sync::Arc;

use engine::backend::cpu::{Cpu, ModelConfig};
use engine::kv::KvAllocator;
use engine::scheduler::Scheduler;

mod common;
use common::text::{request, run, run_counted, scheduler_on, shared};

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

/// Turn `k`'s prompt of a conversation whose earlier answers were `answers`:
/// the chat template the gateway applies, each answer resent as received.
fn turn(answers: &[String]) -> String {
    let mut p = String::from("<|system|>\nyou answer about tides\n");
    for (k, a) in answers.iter().enumerate() {
        p.push_str(&format!("<|user|>\nquestion {k} about the harbor\n<|assistant|>\n{a}\n"));
    }
    p.push_str(&format!("<|user|>\nquestion {} about the harbor\n<|assistant|>\n", answers.len()));
    p
}

fn conversation_turn(answers: &[String], i: usize) -> engine::api::GenerateRequest {
    engine::api::GenerateRequest { prompt: turn(answers), max_tokens: 18, ..request(i) }
}

#[tokio::test]
async fn a_conversation_resending_its_answers_finds_them_cached_and_gets_the_same_text() {
    for i in [0, 1] {
        // Greedy (0) and sampled (1): with the cache off, the reference.
        let (off, _) = scheduler_with(512, 1, false);
        let mut answers = Vec::new();
        for _ in 0..4 {
            let (text, ..) = run_counted(&off, conversation_turn(&answers, i)).await;
            answers.push(text);
        }
        let (on, kv) = scheduler_with(512, 1, true);
        let mut resent = Vec::new();
        for (k, want) in answers.iter().enumerate() {
            let prompt = turn(&resent);
            let (text, _, cached) = run_counted(&on, conversation_turn(&resent, i)).await;
            assert_eq!(&text, want, "request {i} turn {k} differs with the cache");
            if k > 0 {
                // Everything up to the previous answer's last token (whose
                // K/V was never computed) comes from the cache, rounded
                // down to whole pages of 4.
                let before = policies::tokens::count(&turn(&resent[..k - 1]));
                let answer = policies::tokens::count(&resent[k - 1]);
                let want_cached = (before + answer - 1) / 4 * 4;
                assert_eq!(cached, want_cached, "request {i} turn {k}: {prompt:?}");
            }
            resent.push(text);
        }
        assert_eq!(kv.snapshot().free, 512, "every page free or evictable");
    }
}

#[tokio::test]
async fn answers_are_named_only_after_they_are_computed_and_preemption_keeps_the_text() {
    // Six conversations' second turns at once in a cache too small for
    // them: preempted and recomputed, they still find their answers and
    // give the text of the cache-off run.
    let (off, _) = scheduler_with(512, 1, false);
    let (mut firsts, mut want) = (Vec::new(), Vec::new());
    for i in 0..6 {
        firsts.push(run(&off, conversation_turn(&[], i)).await.0);
        want.push(run(&off, conversation_turn(&firsts[i..=i], i)).await.0);
    }
    let (small, kv) = scheduler_with(60, 8, true);
    for (i, first) in firsts.iter().enumerate() {
        assert_eq!(&run(&small, conversation_turn(&[], i)).await.0, first);
    }
    let runs: Vec<_> = (0..6)
        .map(|i| {
            let (s, first) = (small.clone(), firsts[i].clone());
            tokio::spawn(async move { run(&s, conversation_turn(&[first], i)).await.0 })
        })
        .collect();
    for (i, r) in runs.into_iter().enumerate() {
        assert_eq!(r.await.unwrap(), want[i], "conversation {i} differs");
    }
    assert!(small.snapshot().await.preemptions > 0, "the small cache forced preemptions");
    assert!(kv.snapshot().hit_tokens > 0);
    assert_eq!(kv.snapshot().free, 60, "every page free or evictable");
}
