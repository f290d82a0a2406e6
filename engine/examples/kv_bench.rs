//! Per-page cost of the KV allocator, against a naive baseline in the same run.
//!
//! `cargo run --release -p engine --example kv_bench`
//!
//! Three patterns on a 16,384-page cache, each timed over many operations,
//! 7 rounds, median reported:
//! - single: admit a 1-page sequence and drop it (admission + release path);
//! - batch: admit a 64-page sequence and drop it (cost per page);
//! - extend: grow a sequence one page at a time to 256 pages, then drop it
//!   (the decode path).
//!
//! Baseline: a naive allocator that scans a `Vec<bool>` for a free page
//! (what a first implementation often does), on the same patterns at 50%
//! occupancy so the scan has work to do.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

use engine::stats::median;
use std::hint::black_box;
use std::time::Instant;

use engine::kv::{KvAllocator, KvConfig};

const PAGES: u32 = 16_384;

/// Nanoseconds per page for `pages_per_op` pages done `ops` times by `f`.
fn time(rounds: usize, ops: usize, pages_per_op: usize, mut f: impl FnMut()) -> f64 {
    let samples = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..ops {
                f();
            }
            t.elapsed().as_nanos() as f64 / (ops * pages_per_op) as f64
        })
        .collect();
    median(samples)
}

struct NaiveAllocator {
    used: Vec<bool>,
}

impl NaiveAllocator {
    fn alloc(&mut self) -> Option<usize> {
        let i = self.used.iter().position(|u| !u)?;
        self.used[i] = true;
        Some(i)
    }

    fn free(&mut self, i: usize) {
        self.used[i] = false;
    }
}

fn main() {
    let cfg = KvConfig {
        total_pages: PAGES,
        page_tokens: 16,
        low_watermark: 0.0,
        high_watermark: 0.0,
        prefix_cache: true,
    };
    let kv = KvAllocator::new(cfg);
    // Half the cache held by others, as in a busy engine.
    let _held = kv.admit(u64::from(PAGES / 2) * 16, &[]).unwrap();
    let rounds = 7;

    let single = time(rounds, 200_000, 1, || drop(black_box(kv.admit(16, &[]).unwrap())));
    let batch = time(rounds, 20_000, 64, || drop(black_box(kv.admit(64 * 16, &[]).unwrap())));
    let extend = time(rounds, 2_000, 256, || {
        let mut s = kv.admit(16, &[]).unwrap();
        for p in 2..=256u64 {
            s.ensure(p * 16, 1).unwrap();
        }
        drop(black_box(s));
    });

    let mut naive = NaiveAllocator { used: vec![false; PAGES as usize] };
    for i in 0..PAGES as usize / 2 {
        naive.used[i] = true;
    }
    let naive_single = time(rounds, 20_000, 1, || {
        let p = naive.alloc().unwrap();
        naive.free(black_box(p));
    });
    let naive_batch = time(rounds, 2_000, 64, || {
        let ps: Vec<usize> = (0..64).map(|_| naive.alloc().unwrap()).collect();
        for p in black_box(ps) {
            naive.free(p);
        }
    });

    println!("KV allocator, {PAGES} pages, half held; ns per page (alloc + free), median of {rounds} rounds");
    println!("{:<32} {:>10} {:>12} {:>8}", "pattern", "free list", "naive scan", "speedup");
    println!(
        "{:<32} {:>10.1} {:>12.1} {:>7.1}x",
        "single page admit + drop",
        single,
        naive_single,
        naive_single / single
    );
    println!(
        "{:<32} {:>10.1} {:>12.1} {:>7.1}x",
        "64-page admit + drop",
        batch,
        naive_batch,
        naive_batch / batch
    );
    println!("{:<32} {:>10.1} {:>12} {:>8}", "extend 1 page at a time to 256", extend, "-", "-");
}
