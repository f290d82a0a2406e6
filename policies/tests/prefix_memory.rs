//! The prefix index's memory, counted by a global allocator of this test
//! binary: what it holds when full, and that it stays there however many
//! more prompts are recorded (the soak's question: a bound being filled,
//! or growth).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use policies::prefix::PrefixIndex;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Prompts like a chat fleet's: a shared system prompt of 8 blocks, then
/// 24 blocks of their own, spread over 4 engines.
fn record(index: &mut PrefixIndex, prompts: std::ops::Range<u64>) {
    let mut hashes = Vec::with_capacity(32);
    for p in prompts {
        hashes.clear();
        hashes.extend((0..8).map(|b| 0x00C0_FFEE_0000 + b));
        hashes.extend((0..24).map(|b| p.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (b + 1)));
        index.record((p % 4) as u16, &hashes);
    }
}

#[test]
fn a_full_prefix_index_holds_a_bounded_heap_and_stops_growing() {
    const CAPACITY: usize = 1 << 16;
    let mut samples = Vec::with_capacity(40);
    let before = live();
    let mut index = PrefixIndex::new(CAPACITY);
    // Fill it: 24 new blocks a prompt, so ~2,700 prompts fill 65,536.
    let mut next = 0;
    for _ in 0..40 {
        record(&mut index, next..next + 2_000);
        next += 2_000;
        samples.push(live() - before);
    }
    assert_eq!(index.len(), CAPACITY);
    let per_block = *samples.iter().max().unwrap() as f64 / CAPACITY as f64;
    let (at_full, last) = (samples[2], *samples.last().unwrap());
    eprintln!(
        "heap: {} KiB after 10,000 prompts, {} KiB after 80,000, max {:.0} bytes a block; samples (KiB): {:?}",
        at_full / 1024,
        last / 1024,
        per_block,
        samples.iter().map(|s| s / 1024).collect::<Vec<_>>()
    );
    assert!(per_block < 120.0, "{per_block:.0} bytes a block");
    // Its structures are allocated at creation: once full (after ~2,700
    // prompts), more prompts add nothing.
    assert!(samples[2..].iter().all(|s| *s == at_full), "grows after it is full: {samples:?}");
}
