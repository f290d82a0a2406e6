//! Text generation through the real scheduler, for any backend: the
//! requests and the run loop the cpu and GPU backends' tests share.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use engine::api::{Event, FinishReason, GenerateRequest};
use engine::backend::Backend;
use engine::kv::{KvAllocator, KvConfig};
use engine::scheduler::{Scheduler, SchedulerConfig};
use policies::batching::BatchLimits;
use policies::LatencyProfile;
use tokio::sync::mpsc;

/// A scheduler over `backend` with a KV cache of `pages` pages of 4 tokens
/// (the backend's own cache must match).
pub fn scheduler_on<B: Backend>(
    backend: B,
    pages: u32,
    max_batch: u32,
    prefix_cache: bool,
) -> (Scheduler, Arc<KvAllocator>) {
    let kv = KvAllocator::new(KvConfig {
        total_pages: pages,
        page_tokens: 4,
        low_watermark: 0.0,
        high_watermark: 0.0,
        prefix_cache,
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
    (Scheduler::spawn(backend, Arc::clone(&kv), cfg), kv)
}

/// Request `i`: greedy when even, sampled when odd.
pub fn request(i: usize) -> GenerateRequest {
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
        priority: None,
    }
}

/// Requests behind one long system prompt (10 pages of 4 tokens), greedy
/// and sampled.
pub fn shared(i: usize) -> GenerateRequest {
    let system =
        "you are a careful assistant for the harbor city archive answer briefly and cite the records";
    GenerateRequest {
        prompt: format!("{system} question {i} about tide tables"),
        max_tokens: 16,
        ..request(i)
    }
}

/// Runs one request to the end: its text and finish reason.
pub async fn run(s: &Scheduler, r: GenerateRequest) -> (String, Option<FinishReason>) {
    let (text, finish, _) = run_counted(s, r).await;
    (text, finish)
}

/// [`run`], with the prompt tokens the prefix cache served.
pub async fn run_counted(s: &Scheduler, r: GenerateRequest) -> (String, Option<FinishReason>, u32) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
    let n = policies::tokens::count(&r.prompt);
    s.enqueue(r, n, tx).await.unwrap();
    let (mut text, mut finish, mut cached) = (String::new(), None, 0);
    while let Some(line) = rx.recv().await {
        match serde_json::from_slice(&line).unwrap() {
            Event::Token { text: t } => text.push_str(&t),
            Event::Done { finish_reason, usage, .. } => {
                finish = Some(finish_reason);
                cached = usage.cached_tokens;
            }
            Event::Error { code, message } => panic!("{code}: {message}"),
            other => panic!("an engine never sends {other:?}"),
        }
    }
    (text, finish, cached)
}

/// The `shared` prompts one after the other, with and without the prefix
/// cache, on schedulers over `make()`'s backends: how many texts agree of
/// all, and the tokens the cache served.
pub async fn prefix_cache_agreement<B: Backend>(mut make: impl FnMut() -> B, n: usize) -> (usize, u64) {
    let (off, _) = scheduler_on(make(), 512, 1, false);
    let (on, kv) = scheduler_on(make(), 512, 1, true);
    let mut same = 0;
    for i in 0..n {
        same += usize::from(run(&off, shared(i)).await == run(&on, shared(i)).await);
    }
    (same, kv.snapshot().hit_tokens)
}
