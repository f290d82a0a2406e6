//! The allocator's tests: watermarks, refcounts under random interleavings,
//! prefix sharing, eviction, hash collisions and the event log.
use super::*;

fn alloc(total: u32, low: f64, high: f64) -> Arc<KvAllocator> {
    KvAllocator::new(KvConfig {
        total_pages: total,
        page_tokens: 16,
        low_watermark: low,
        high_watermark: high,
        prefix_cache: true,
    })
}

#[test]
fn admission_reserves_pages_and_drop_returns_them() {
    let a = alloc(10, 0.0, 0.0);
    let mut s = a.admit(40, &[]).unwrap(); // 3 pages
    assert_eq!(s.pages(), &[0, 1, 2]);
    assert_eq!(a.snapshot().free, 7);
    s.ensure(16 * 5, 1).unwrap();
    assert_eq!(s.pages().len(), 5);
    drop(s);
    assert_eq!(a.snapshot().free, 10);
}

#[test]
fn low_watermark_refuses_with_a_typed_reason_and_high_reopens() {
    let a = alloc(100, 0.10, 0.30); // low 10 pages, high 30 pages
    let big = a.admit(16 * 85, &[]).unwrap(); // 15 free left
    let err = a.admit(16 * 6, &[]).unwrap_err(); // would leave 9 < 10
    assert_eq!(err, KvRefusal::LowWatermark { need: 6, free: 15, low: 10 });
    assert_eq!(err.code(), "kv_low_watermark");
    assert!(!a.snapshot().admitting);
    // Hysteresis: even a request that would fit waits for the high watermark.
    assert!(a.admit(16, &[]).is_err());
    drop(big);
    assert!(a.snapshot().admitting);
    assert!(a.admit(16, &[]).is_ok());
    assert_eq!(a.admit(16 * 101, &[]).unwrap_err().code(), "kv_request_too_large");
    // One request too big for the headroom does not close admission.
    let b = alloc(100, 0.10, 0.30);
    assert!(b.admit(16 * 95, &[]).is_err());
    assert!(b.snapshot().admitting);
    assert!(b.admit(16, &[]).is_ok());
}

#[test]
fn running_sequences_may_extend_below_the_low_watermark_until_exhausted() {
    let a = alloc(10, 0.5, 0.5);
    let mut s = a.admit(16 * 5, &[]).unwrap(); // leaves 5 = low
    s.ensure(16 * 10, 2).unwrap();
    assert_eq!(a.snapshot().free, 0);
    assert_eq!(s.ensure(16 * 11, 1), Err(KvExhausted));
}

#[test]
fn slope_follows_consumption_over_time_given_as_a_parameter() {
    let a = alloc(1000, 0.0, 0.0);
    a.sample(0.0);
    let _s = a.admit(16 * 100, &[]).unwrap();
    a.sample(1.0);
    assert!((a.snapshot().slope - 30.0).abs() < 1e-9, "{}", a.snapshot().slope);
}

/// xorshift64: deterministic randomness without a dependency.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

fn block(hash: u64, content: &str) -> Block {
    Block { hash, content: content.into() }
}

/// `n` blocks of the prompt family `tag` (one character; real chained
/// hashes): words of exactly one token.
fn prompt(tag: char, n: usize) -> Vec<Block> {
    let text: Vec<String> = (0..n * 16).map(|i| format!("{tag}{i:03x}")).collect();
    let blocks = crate::prefix::blocks(&text.join(" "), 16);
    assert_eq!(blocks.len(), n);
    blocks
}

/// Each page is free, in the LRU pool, or held exactly `refs` times by
/// the live sets; named pages are exactly the indexed ones.
fn check(a: &KvAllocator, live: &[PageSet], at: &str) {
    let inner = a.lock();
    let total = a.total as usize;
    let mut held = vec![0u32; total];
    for p in live.iter().flat_map(|s| s.pages()) {
        held[*p as usize] += 1;
    }
    for (p, &held) in held.iter().enumerate() {
        let in_free = inner.free.iter().filter(|x| **x as usize == p).count();
        let in_lru = usize::from(inner.lru_key[p] != 0);
        assert_eq!(inner.refs[p], held, "{at}: page {p}'s count");
        match held {
            0 => assert_eq!(in_free + in_lru, 1, "{at}: unheld page {p} is free or cached, once"),
            _ => assert_eq!(in_free + in_lru, 0, "{at}: held page {p} is neither free nor cached"),
        }
        assert_eq!(in_lru == 1, inner.named[p].is_some() && held == 0, "{at}: page {p}'s pool");
    }
    assert_eq!(inner.lru.len(), inner.lru_key.iter().filter(|k| **k != 0).count(), "{at}");
    for (h, p) in &inner.by_hash {
        assert_eq!(inner.named[*p as usize].as_ref().map(|n| n.block.hash), Some(*h), "{at}");
    }
}

/// Property: under random interleavings of admit (with shared
/// prefixes), commit, extend, cancel and preempt, reference counts never
/// go negative or leak: every page is owned by its holders, the free
/// list or the cache pool, and everything is available again when all
/// sequences end.
#[test]
fn random_interleavings_never_double_free_or_leak() {
    let families: Vec<Vec<Block>> = "abcd".chars().map(|f| prompt(f, 6)).collect();
    for seed in 1..=200u64 {
        let total = 64;
        let a = alloc(total, 0.1, 0.25);
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut live: Vec<PageSet> = Vec::new();
        for step in 0..300 {
            match rng.below(5) {
                0 => {
                    let fam = &families[rng.below(4) as usize];
                    let reuse = &fam[..rng.below(6) as usize];
                    let running = rng.below(3) == 0;
                    let tokens = rng.below(16 * 12) + 1;
                    let got = if running {
                        a.admit_running(tokens, reuse).ok()
                    } else {
                        a.admit(tokens, reuse).ok()
                    };
                    if let Some(mut s) = got {
                        assert!(s.cached_tokens() as usize <= reuse.len() * 16);
                        if rng.below(2) == 0 {
                            s.commit(fam); // prefilled
                        }
                        live.push(s);
                    }
                }
                1 if !live.is_empty() => {
                    let i = rng.below(live.len() as u64) as usize;
                    let want = live[i].capacity_tokens() + rng.below(64);
                    let _ = live[i].ensure(want, rng.below(3) as u32 + 1);
                }
                // 2: cancel or complete; 3: preempt (same release path, from the middle)
                2 | 3 if !live.is_empty() => {
                    let i = rng.below(live.len() as u64) as usize;
                    drop(live.swap_remove(i));
                }
                _ => {}
            }
            check(&a, &live, &format!("seed {seed} step {step}"));
        }
        live.clear();
        check(&a, &live, &format!("seed {seed} end"));
        let snap = a.snapshot();
        assert_eq!(snap.free, total, "seed {seed}: pages leaked");
        assert!(snap.admitting, "seed {seed}: admission reopens once everything is free");
    }
}

#[test]
fn a_finished_prompt_is_shared_by_the_next_and_kept_until_evicted() {
    let a = alloc(16, 0.0, 0.0);
    let p = prompt('s', 4); // 64 tokens
    let mut first = a.admit(64 + 16, &p[..3]).unwrap();
    assert_eq!(first.cached_tokens(), 0, "nothing cached yet");
    first.commit(&p);
    // While the first runs, a second shares its 3 reusable pages.
    let second = a.admit(64 + 16, &p[..3]).unwrap();
    assert_eq!(second.cached_tokens(), 48);
    assert_eq!(second.pages()[..3], first.pages()[..3]);
    assert_ne!(second.pages()[3], first.pages()[3], "the last prompt page is computed again");
    let firsts: Vec<PageId> = first.pages().to_vec();
    drop(first);
    drop(second);
    let snap = a.snapshot();
    assert_eq!((snap.free, snap.cached_pages, snap.cached_free_pages), (16, 4, 4), "{snap:?}");
    assert_eq!((snap.looked_up_tokens, snap.hit_tokens), (96, 48));
    // Cached-but-free pages count as free: a request for all 16 pages is
    // admitted and evicts them, oldest first.
    let all = a.admit(16 * 16, &[]).unwrap();
    assert_eq!(a.snapshot().cached_pages, 0);
    drop(all);
    let again = a.admit(64, &p[..3]).unwrap();
    assert_eq!(again.cached_tokens(), 0, "evicted");
    let _ = firsts;
}

#[test]
fn eviction_takes_the_least_recently_used_and_never_a_page_in_use() {
    let a = alloc(8, 0.0, 0.0);
    let (x, y) = (prompt('x', 2), prompt('y', 2));
    let mut sx = a.admit(32, &[]).unwrap();
    sx.commit(&x);
    let mut sy = a.admit(32, &[]).unwrap();
    sy.commit(&y);
    drop(sx); // x's pages go to the pool first: oldest
              // y is still held: an allocation of 6 takes 4 free + x's 2, never y's.
    let big = a.admit(16 * 6, &[]).unwrap();
    assert!(big.pages().iter().all(|p| !sy.pages().contains(p)));
    assert_eq!(a.admit(16, &[]).unwrap_err().code(), "kv_low_watermark", "nothing left");
    drop(big);
    assert_eq!(a.admit(32, &y[..2]).unwrap().cached_tokens(), 32, "y survived");
    assert_eq!(a.admit(32, &x[..2]).unwrap().cached_tokens(), 0, "x was evicted");
    let evicted: Vec<u64> = match a.events_since(1, 100) {
        KvEventsSince::Events { events, .. } => events.iter().flat_map(|e| e.evicted.clone()).collect(),
        other => panic!("{other:?}"),
    };
    assert_eq!(evicted, vec![x[0].hash, x[1].hash]);
}

#[test]
fn a_hash_match_is_verified_against_the_content_and_the_chain() {
    let a = alloc(16, 0.0, 0.0);
    let mut s = a.admit(48, &[]).unwrap();
    s.commit(&[block(1, "a"), block(2, "b"), block(3, "c")]);
    // Same hash, other content (a collision): a miss, never a wrong page.
    assert_eq!(a.admit(48, &[block(1, "a"), block(2, "B")]).unwrap().cached_tokens(), 16);
    assert_eq!(a.admit(48, &[block(1, "A")]).unwrap().cached_tokens(), 0);
    // A known block behind another first block is another chain: a miss.
    assert_eq!(a.admit(48, &[block(9, "z"), block(2, "b")]).unwrap().cached_tokens(), 0);
    assert_eq!(a.admit(48, &[block(1, "a"), block(2, "b")]).unwrap().cached_tokens(), 32);
    // A colliding block is not named over the one cached; the rest of
    // its chain stays private.
    let mut t = a.admit(48, &[]).unwrap();
    t.commit(&[block(1, "a"), block(2, "X"), block(4, "d")]);
    assert_eq!(a.snapshot().cached_pages, 3);
    assert_eq!(a.admit(48, &[block(1, "a"), block(2, "b"), block(3, "c")]).unwrap().cached_tokens(), 48);
    drop((s, t));
}

#[test]
fn events_are_numbered_and_a_reader_past_the_log_gets_a_snapshot() {
    let a = alloc(64, 0.0, 0.0);
    for i in 0..3u64 {
        let mut s = a.admit(32, &[]).unwrap();
        s.commit(&[block(10 * i + 1, "p"), block(10 * i + 2, "q")]);
    }
    // A new reader starts from a snapshot, then reads events.
    assert!(matches!(a.events_since(0, 2), KvEventsSince::Snapshot { last_seq: 3, .. }));
    let last = match a.events_since(1, 1) {
        KvEventsSince::Events { events, last_seq, more } => {
            assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![2]);
            assert_eq!(events[0].stored, vec![11, 12]);
            assert!(more);
            last_seq
        }
        other => panic!("{other:?}"),
    };
    assert!(
        matches!(a.events_since(last, 10), KvEventsSince::Events { ref events, more: false, .. } if events.len() == 1)
    );
    // A reader ahead of the log (the engine restarted) resynchronises.
    match a.events_since(99, 10) {
        KvEventsSince::Snapshot { hashes, last_seq } => {
            assert_eq!(hashes, vec![1, 2, 11, 12, 21, 22]);
            assert_eq!(last_seq, 3);
        }
        other => panic!("{other:?}"),
    }
    // The log is bounded; a reader behind it gets a snapshot too.
    let mut s = a.admit(16, &[]).unwrap();
    for i in 0..=(EVENT_LOG_HASHES as u64) {
        let mut inner = a.lock();
        inner.log(vec![1000 + i], Vec::new());
    }
    s.commit(&[]);
    assert!(a.lock().event_hashes <= EVENT_LOG_HASHES);
    assert!(matches!(a.events_since(1, 10), KvEventsSince::Snapshot { .. }));
}

#[test]
fn with_the_cache_off_nothing_is_named_or_shared() {
    let a = KvAllocator::new(KvConfig { total_pages: 8, prefix_cache: false, ..KvConfig::default() });
    let p = prompt('o', 2);
    let mut s = a.admit(32, &p).unwrap();
    s.commit(&p);
    drop(s);
    assert_eq!(a.admit(32, &p).unwrap().cached_tokens(), 0);
    assert_eq!(a.snapshot().cached_pages, 0);
}

#[test]
fn a_reader_of_evictions_gets_each_evicted_hash_once() {
    let a = alloc(4, 0.0, 0.0);
    let mut seen = Vec::new();
    let mut last = a.evicted_since(0, &mut seen);
    assert_eq!((last, seen.len()), (0, 0));
    // Two named pages, released: they stay cached (no eviction yet).
    let mut s = a.admit(32, &[]).unwrap();
    s.commit(&[block(1, "p"), block(2, "q")]);
    drop(s);
    last = a.evicted_since(last, &mut seen);
    assert_eq!((last, seen.as_slice()), (1, &[][..]));
    // Four fresh pages take the two free ones, then evict both named.
    let s = a.admit(64, &[]).unwrap();
    last = a.evicted_since(last, &mut seen);
    assert_eq!(seen, vec![1, 2], "least recently released first");
    assert_eq!(a.last_seq(), last);
    // Nothing new: nothing appended.
    assert_eq!(a.evicted_since(last, &mut seen), last);
    assert_eq!(seen.len(), 2);
    assert_eq!(a.free_pages(), 0);
    drop(s);
    assert_eq!(a.free_pages(), 4);
}
