//! Continuous batching vs a naive one-sequence-at-a-time engine on the cpu
//! backend, same offered load, same run.
//!
//! `cargo run --release -p engine --example batching_bench -- [--clients 8]
//! [--waves 3] [--max-tokens 128] [--rounds 3]`
//!
//! Offered load: `waves` waves of `clients` requests sent together (distinct
//! prompts of ~16 tokens, greedy, `max-tokens` output), the next wave once
//! the previous one has finished. The same requests go to three engines
//! built from the same model and kernels:
//! - `alone`: one client at a time (the single-sequence TBT baseline);
//! - `naive`: all clients, `max_batch = 1` (one sequence at a time);
//! - `continuous`: all clients, `max_batch = clients` (continuous batching).
//!
//! Rounds interleave the three so machine noise hits all of them alike;
//! medians over rounds are reported, with ratios to `naive` / `alone`.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

use engine::stats::median;
use std::time::{Duration, Instant};

use engine::api::{Event, GenerateRequest};
use engine::backend::cpu::{Cpu, ModelConfig};
use engine::kv::{KvAllocator, KvConfig};
use engine::scheduler::{Scheduler, SchedulerConfig};
use policies::batching::BatchLimits;
use policies::LatencyProfile;
use tokio::sync::mpsc;

#[derive(Debug, Clone, Copy)]
struct Opts {
    clients: usize,
    waves: usize,
    max_tokens: u32,
    rounds: usize,
}

fn opts() -> Opts {
    let mut o = Opts { clients: 8, waves: 3, max_tokens: 128, rounds: 3 };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let v = pair.get(1).and_then(|v| v.parse::<usize>().ok());
        match (pair[0].as_str(), v) {
            ("--clients", Some(v)) => o.clients = v.max(1),
            ("--waves", Some(v)) => o.waves = v.max(1),
            ("--max-tokens", Some(v)) => o.max_tokens = v.max(2) as u32,
            ("--rounds", Some(v)) => o.rounds = v.max(1),
            _ => {
                eprintln!("usage: batching_bench [--clients N] [--waves N] [--max-tokens N] [--rounds N]");
                std::process::exit(2);
            }
        }
    }
    o
}

/// The engine's default cpu model (`engine --backend cpu`).
const MODEL: ModelConfig = ModelConfig { layers: 4, hidden: 512, heads: 8, ffn: 1536, vocab: 8192, seed: 0 };

fn engine(max_batch: u32) -> Scheduler {
    let pages = 2048;
    let kv = KvAllocator::new(KvConfig {
        total_pages: pages,
        page_tokens: 16,
        low_watermark: 0.0,
        high_watermark: 0.0,
        prefix_cache: false, // measures batching alone
    });
    let cfg = SchedulerConfig {
        limits: BatchLimits { max_batch, ..BatchLimits::default() },
        profile: LatencyProfile::parse("cpu", engine::CPU_PROFILE).expect("bundled profile"),
        output_reserve_tokens: 64,
        extend_pages: 2,
        default_ttft: Duration::from_secs(60),
        max_preemptions: 2,
        min_quantum_tokens: 16,
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    Scheduler::spawn(Cpu::new(MODEL, threads, pages, 16), kv, cfg)
}

fn request(client: usize, wave: usize, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        request_id: format!("c{client}w{wave}"),
        model: "synthetic-small".into(),
        prompt: format!("client {client} wave {wave} asks the engine about batching and paged caches"),
        max_tokens,
        temperature: Some(0.0),
        seed: None,
        stop: vec![],
        priority_key: None,
        ttft_budget_ms: None,
        priority: None,
    }
}

/// Token arrival times of one request, from its send time.
async fn one(s: Scheduler, req: GenerateRequest) -> Vec<Duration> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let n = policies::tokens::count(&req.prompt);
    let t0 = Instant::now();
    s.enqueue(req, n, tx).await.expect("admitted");
    let mut at = Vec::new();
    while let Some(line) = rx.recv().await {
        if let Ok(Event::Token { .. }) = serde_json::from_slice(&line) {
            at.push(t0.elapsed());
        }
    }
    at
}

#[derive(Debug, Default, Clone, Copy)]
struct Run {
    tokens_per_s: f64,
    tbt_p50_ms: f64,
    tbt_p99_ms: f64,
    ttft_p50_ms: f64,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

async fn run(o: Opts, clients: usize, max_batch: u32) -> Run {
    let s = engine(max_batch);
    let t0 = Instant::now();
    let (mut tokens, mut tbt, mut ttft) = (0usize, Vec::new(), Vec::new());
    for wave in 0..o.waves {
        let tasks: Vec<_> =
            (0..clients).map(|c| tokio::spawn(one(s.clone(), request(c, wave, o.max_tokens)))).collect();
        for t in tasks {
            let at = t.await.expect("client task");
            tokens += at.len();
            if let Some(first) = at.first() {
                ttft.push(first.as_secs_f64() * 1e3);
            }
            tbt.extend(at.windows(2).map(|w| (w[1] - w[0]).as_secs_f64() * 1e3));
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    Run {
        tokens_per_s: tokens as f64 / secs,
        tbt_p50_ms: pct(&mut tbt, 0.5),
        tbt_p99_ms: pct(&mut tbt, 0.99),
        ttft_p50_ms: pct(&mut ttft, 0.5),
    }
}

#[tokio::main]
async fn main() {
    let o = opts();
    let modes: [(&str, usize, u32); 3] =
        [("alone", 1, 1), ("naive", o.clients, 1), ("continuous", o.clients, o.clients as u32)];
    let mut results: Vec<Vec<Run>> = vec![Vec::new(); modes.len()];
    for round in 1..=o.rounds {
        for (i, &(name, clients, max_batch)) in modes.iter().enumerate() {
            let r = run(o, clients, max_batch).await;
            eprintln!(
                "[round {round}/{}] {name:10} {:8.1} tok/s  TBT p50 {:6.2} ms  p99 {:6.2} ms  TTFT p50 {:7.1} ms",
                o.rounds, r.tokens_per_s, r.tbt_p50_ms, r.tbt_p99_ms, r.ttft_p50_ms
            );
            results[i].push(r);
        }
    }
    let med = |i: usize, f: fn(&Run) -> f64| median(results[i].iter().map(f).collect());
    println!(
        "backend cpu; model {} layers, hidden {}, MLP {}, vocab {}; {} clients x {} waves x {} tokens; median of {} rounds",
        MODEL.layers, MODEL.hidden, MODEL.ffn, MODEL.vocab, o.clients, o.waves, o.max_tokens, o.rounds
    );
    println!("| engine | tokens/s | TBT p50 ms | TBT p99 ms | TTFT p50 ms |");
    println!("|---|---:|---:|---:|---:|");
    for (i, (name, _, _)) in modes.iter().enumerate() {
        println!(
            "| {name} | {:.1} | {:.2} | {:.2} | {:.1} |",
            med(i, |r| r.tokens_per_s),
            med(i, |r| r.tbt_p50_ms),
            med(i, |r| r.tbt_p99_ms),
            med(i, |r| r.ttft_p50_ms)
        );
    }
    println!(
        "continuous / naive tokens/s: {:.2}x; continuous TBT p99 / alone TBT p99: {:.2}x",
        med(2, |r| r.tokens_per_s) / med(1, |r| r.tokens_per_s),
        med(2, |r| r.tbt_p99_ms) / med(0, |r| r.tbt_p99_ms)
    );
}
