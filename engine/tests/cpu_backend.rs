//! The cpu backend through the real scheduler: continuous batching and
//! preemption never change a sequence's text.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use engine::api::{Event, FinishReason, GenerateRequest};
use engine::backend::cpu::{Cpu, ModelConfig};
use engine::kv::{KvAllocator, KvConfig};
use engine::scheduler::{Scheduler, SchedulerConfig};
use policies::batching::BatchLimits;
use policies::LatencyProfile;
use tokio::sync::mpsc;

const MODEL: ModelConfig = ModelConfig { layers: 2, hidden: 64, heads: 4, ffn: 128, vocab: 512, seed: 7 };

fn scheduler(pages: u32, max_batch: u32) -> (Scheduler, Arc<KvAllocator>) {
    let kv = KvAllocator::new(KvConfig {
        total_pages: pages,
        page_tokens: 4,
        low_watermark: 0.0,
        high_watermark: 0.0,
    });
    let cfg = SchedulerConfig {
        limits: BatchLimits { max_batch, ..BatchLimits::default() },
        profile: LatencyProfile::parse("cpu", engine::CPU_PROFILE).unwrap(),
        output_reserve_tokens: 0,
        extend_pages: 1,
        default_ttft: Duration::from_secs(10),
        max_preemptions: 3,
        min_quantum_tokens: 2,
    };
    (Scheduler::spawn(Cpu::new(MODEL, 2, pages, 4), Arc::clone(&kv), cfg), kv)
}

fn request(i: usize) -> GenerateRequest {
    GenerateRequest {
        request_id: format!("r{i}"),
        model: "synthetic-small".into(),
        prompt: format!("request number {i} asks about paged attention and batching"),
        max_tokens: 24,
        temperature: Some(if i % 2 == 0 { 0.0 } else { 0.8 }),
        seed: Some(i as u64),
        stop: vec![],
        priority_key: Some(i as f64),
        ttft_budget_ms: None,
    }
}

async fn run(s: &Scheduler, r: GenerateRequest) -> (String, Option<FinishReason>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
    let n = policies::tokens::count(&r.prompt);
    s.enqueue(r, n, tx).await.unwrap();
    let (mut text, mut finish) = (String::new(), None);
    while let Some(line) = rx.recv().await {
        match serde_json::from_slice(&line).unwrap() {
            Event::Token { text: t } => text.push_str(&t),
            Event::Done { finish_reason, .. } => finish = Some(finish_reason),
            Event::Error { code, message } => panic!("{code}: {message}"),
            other => panic!("an engine never sends {other:?}"),
        }
    }
    (text, finish)
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
