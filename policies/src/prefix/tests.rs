use super::*;
use crate::rng::SplitMix;

fn words(n: usize, tag: &str) -> String {
    (0..n).map(|i| format!("{tag}{i:03}")).collect::<Vec<_>>().join(" ")
}

#[test]
fn prompts_share_leading_hashes_exactly_as_far_as_they_share_blocks() {
    // Each word "sysNNN" is 2 pieces ("sysN", "NN"): 32 words = 64 tokens.
    let system = words(32, "sys");
    let a = block_hashes(&format!("{system} {}", words(16, "aaa")), 16);
    let b = block_hashes(&format!("{system} {}", words(16, "bbb")), 16);
    assert_eq!(a.len(), 6, "96 tokens in blocks of 16");
    assert_eq!(a[..4], b[..4], "the 64-token system prompt: 4 shared blocks");
    assert!(a[4..].iter().zip(&b[4..]).all(|(x, y)| x != y), "everything after differs");
    // A change inside block 2 changes every hash from block 2 on.
    let edited =
        block_hashes(&format!("{} sysXXX {} {}", words(10, "sys"), words(21, "sys"), words(16, "aaa")), 16);
    assert_eq!(edited[..1], a[..1]);
    assert!(edited[1..].iter().zip(&a[1..]).all(|(x, y)| x != y));
    // A trailing partial block has no hash; piece boundaries count.
    assert_eq!(block_hashes(&words(7, "sys"), 16).len(), 0);
    assert_ne!(block_hashes("abc de", 2), block_hashes("ab cde", 2), "same bytes, other tokens");
    assert_eq!(block_hashes("abcd efgh", 2), block_hashes("abcdefgh", 2), "same tokens, same hash");
    assert_eq!(block_hashes("", 16), Vec::<u64>::new());
}

#[test]
fn the_index_matches_leading_blocks_per_engine() {
    let mut idx = PrefixIndex::new(1000);
    let p = block_hashes(&words(64, "ppp"), 16); // 64 words of 2 pieces = 8 blocks of 16
    idx.record(0, &p[..8]);
    idx.record(1, &p[..3]);
    assert_eq!(idx.matched(&p, 3), vec![8, 3, 0]);
    // A prompt diverging after 2 blocks matches 2 on both.
    let mut q = p[..2].to_vec();
    q.extend(block_hashes(&words(64, "qqq"), 16).into_iter().skip(2));
    assert_eq!(idx.matched(&q, 3), vec![2, 2, 0]);
    idx.forget_engine(0);
    assert_eq!(idx.matched(&p, 3), vec![0, 3, 0]);
    assert_eq!(idx.len(), 3, "blocks only engine 0 held are gone");
}

#[test]
fn the_index_is_bounded_and_keeps_what_was_used_last() {
    let mut idx = PrefixIndex::new(10);
    let hot = block_hashes(&words(40, "hot"), 16); // 5 blocks
    idx.record(0, &hot);
    let mut rng = SplitMix(7);
    for round in 0..200 {
        let cold = block_hashes(&words(16 + (rng.next_u64() % 48) as usize, &format!("c{round}x")), 16);
        idx.record(1, &cold);
        if round % 2 == 0 {
            idx.record(0, &hot); // the shared system prompt keeps being sent
        }
        assert!(idx.len() <= 10, "{}", idx.len());
        assert!(idx.slots.len() <= 10, "no slot beyond the bound: {}", idx.slots.len());
        assert_consistent(&idx);
    }
    idx.record(0, &hot);
    assert_eq!(idx.matched(&hot, 2)[0], 5, "recently used blocks survive eviction");
}

#[test]
fn a_block_remembers_a_bounded_number_of_engines() {
    let mut idx = PrefixIndex::new(100);
    let p = block_hashes(&words(8, "ppp"), 16);
    for e in 0..20u16 {
        idx.record(e, &p);
    }
    let m = idx.matched(&p, 20);
    assert_eq!(m.iter().filter(|x| **x == 1).count(), MAX_ENGINES_PER_BLOCK);
    assert_eq!(m[19], 1, "the most recent ones");
}

#[test]
fn affinity_wins_until_the_fleet_is_imbalanced_or_the_match_is_short() {
    let cfg =
        AffinityConfig { balance_abs: 1000, balance_rel: 1.5, min_match: 0.25, ..AffinityConfig::default() };
    let c = |idx, matched_blocks, load| Choice { idx, matched_blocks, load };
    // The longest match, though busier.
    assert_eq!(pick(&[c(0, 0, 100), c(1, 6, 900), c(2, 2, 50)], 8, &cfg, 0), Some(1));
    // Engine 1 is too busy next to the least loaded (2,900 vs 50): the
    // longest match among the others.
    assert_eq!(pick(&[c(0, 0, 100), c(1, 6, 2_900), c(2, 2, 50)], 8, &cfg, 0), Some(2));
    // ...and with no other match, the least loaded.
    assert_eq!(pick(&[c(0, 0, 100), c(1, 6, 2_900), c(2, 0, 50)], 8, &cfg, 0), Some(2));
    assert_eq!(pick(&[c(0, 0, 10), c(1, 6, 2_900), c(2, 0, 50)], 8, &cfg, 0), Some(0));
    // In a large fleet an idle engine does not switch affinity off for the
    // others: engine 1 is within 1,000 of the least loaded.
    assert_eq!(pick(&[c(0, 0, 0), c(1, 6, 900), c(2, 0, 5_000)], 8, &cfg, 0), Some(1));
    // A match under a quarter of the prompt is no match.
    assert_eq!(pick(&[c(0, 1, 300), c(1, 0, 100)], 8, &cfg, 0), Some(1));
    // Equal matches: the less loaded; equal loads: the lower index.
    assert_eq!(pick(&[c(0, 4, 300), c(1, 4, 200)], 8, &cfg, 0), Some(1));
    assert_eq!(pick(&[c(3, 4, 200), c(1, 4, 200)], 8, &cfg, 0), Some(1));
    assert_eq!(pick(&[], 8, &cfg, 0), None);
    // A prompt with no full block: load.
    assert_eq!(pick(&[c(0, 0, 300), c(1, 0, 100)], 0, &cfg, 0), Some(1));
    // Turned off: load, whatever the matches.
    let off = AffinityConfig { enabled: false, ..cfg };
    assert_eq!(pick(&[c(0, 0, 100), c(1, 6, 900)], 8, &off, 0), Some(0));
    // No match: the least loaded, tied ones in turn (an idle fleet gets one
    // new prefix per engine), never a busier one.
    let idle = [c(0, 0, 0), c(1, 0, 0), c(2, 0, 0)];
    let picks: Vec<_> = (0..4).map(|t| pick(&idle, 8, &cfg, t).unwrap()).collect();
    assert_eq!(picks, vec![0, 1, 2, 0]);
    let mixed = [c(0, 0, 50), c(1, 0, 0), c(2, 0, 70), c(3, 0, 0)];
    let picks: Vec<_> = (0..4).map(|t| pick(&mixed, 8, &cfg, t).unwrap()).collect();
    assert_eq!(picks, vec![1, 1, 3, 3]);
    // A credited match is followed whatever the turn.
    assert_eq!(pick(&[c(0, 0, 0), c(1, 6, 900), c(2, 0, 0)], 8, &cfg, 2), Some(1));
    assert_eq!(credited(&[c(0, 0, 100), c(1, 6, 900)], 8, &cfg), vec![0, 6]);
    assert_eq!(credited(&[c(0, 0, 100), c(1, 6, 900)], 8, &off), vec![0, 0]);
}

#[test]
fn an_evicted_block_is_forgotten_for_that_engine_only() {
    let mut idx = PrefixIndex::new(100);
    let p = block_hashes(&words(32, "evi"), 16); // 4 blocks
    idx.record(0, &p);
    idx.record(1, &p);
    idx.remove(0, p[2]);
    assert_eq!(idx.matched(&p, 2), vec![2, 4], "engine 0 matches up to the evicted block");
    idx.remove(1, p[0]);
    assert_eq!(idx.matched(&p, 2), vec![2, 0]);
    idx.remove(0, p[0]);
    assert_eq!(idx.matched(&p, 2), vec![0, 0]);
    assert_eq!(idx.len(), 3, "a block no engine holds is dropped");
}

#[test]
fn a_chain_continued_with_generated_pieces_names_what_the_resent_text_looks_up() {
    let prompt = words(21, "s"); // one piece each
    let (prompt_blocks, mut chain) = Chain::of(&prompt, 16);
    assert_eq!(prompt_blocks, blocks(&prompt, 16));
    assert_eq!(chain.pieces(), 21);
    // The engine generates eleven one-piece words after the prompt.
    let answer: Vec<String> = (0..11).map(|i| format!("w{i:02}")).collect();
    let mut all = prompt_blocks.clone();
    all.extend(answer.iter().filter_map(|w| chain.push(w)));
    assert_eq!(chain.pieces(), 32);
    // The next turn resends the prompt, the answer and a new message.
    let next = format!("{prompt}\n{}\nand more", answer.join(" "));
    let resent = blocks(&next, 16);
    assert_eq!(all.len(), 2);
    assert_eq!(&resent[..2], &all[..], "same hashes and content");
    assert_eq!(block_hashes(&next, 16), resent.iter().map(|b| b.hash).collect::<Vec<_>>());
}

/// The recency list runs through every remembered block once, each way,
/// and the free slots are the others.
fn assert_consistent(idx: &PrefixIndex) {
    let (mut seen, mut i, mut prev) = (0, idx.head, NIL);
    while i != NIL {
        let slot = &idx.slots[i as usize];
        assert_eq!(slot.prev, prev);
        assert_eq!(idx.slots_of.get(&slot.hash), Some(&i));
        assert!(slot.held > 0, "a remembered block is held by some engine");
        (prev, i) = (i, slot.next);
        seen += 1;
    }
    assert_eq!(idx.tail, prev);
    assert_eq!(seen, idx.len());
    assert_eq!(idx.len() + idx.free.len(), idx.slots.len());
}

#[test]
fn the_recency_list_stays_whole_through_records_removals_and_forgotten_engines() {
    let mut idx = PrefixIndex::new(64);
    let mut rng = SplitMix(11);
    for step in 0..5_000u64 {
        let engine = (rng.next_u64() % 5) as u16;
        match rng.next_u64() % 10 {
            0 => idx.remove(engine, rng.next_u64() % 200),
            1 if step % 50 == 0 => idx.forget_engine(engine),
            _ => {
                let first = rng.next_u64() % 200;
                let hashes: Vec<u64> = (first..first + 1 + rng.next_u64() % 12).collect();
                idx.record(engine, &hashes);
                assert!(idx.matched(&hashes, 5)[usize::from(engine)] as usize == hashes.len().min(64));
            }
        }
        assert!(idx.len() <= 64);
        assert_consistent(&idx);
    }
}
