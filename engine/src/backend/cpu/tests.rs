//! The cpu backend computes the same text for a sequence whatever it is
//! batched with, wherever its pages are, and after a recompute.

use super::*;
use crate::backend::Slot;
use crate::kv::PageId;

const PAGE_TOKENS: u32 = 4;

fn tiny() -> ModelConfig {
    ModelConfig { layers: 2, hidden: 32, heads: 4, ffn: 64, vocab: 97, seed: 42 }
}

fn req(prompt: &str, temperature: Option<f32>) -> GenerateRequest {
    GenerateRequest {
        request_id: "t".into(),
        model: "m".into(),
        prompt: prompt.into(),
        max_tokens: 64,
        temperature,
        seed: None,
        stop: vec![],
        priority_key: None,
        ttft_budget_ms: None,
        priority: None,
    }
}

/// A sequence being driven by hand: its state, pages and text so far.
struct Driven {
    seq: CpuSeq,
    pages: Vec<PageId>,
    text: String,
    ended: bool,
}

fn start(cpu: &mut Cpu, prompt: &str, temperature: Option<f32>, pages: Vec<PageId>) -> Driven {
    let r = req(prompt, temperature);
    let seq = cpu.start(&r, policies::tokens::count(prompt));
    Driven { seq, pages, text: String::new(), ended: false }
}

/// One prefill (or decode) step over `ds`, as the scheduler would run it.
fn step(cpu: &mut Cpu, mut ds: Vec<&mut Driven>, decode: bool) {
    let mut slots: Vec<Slot<'_, CpuSeq>> = ds
        .iter_mut()
        .map(|d| Slot {
            context: d.seq.tokens.len() as u32,
            cached: 0,
            pages: &d.pages,
            seq: &mut d.seq,
            out: None,
        })
        .collect();
    if decode {
        cpu.decode(&mut slots);
    } else {
        cpu.prefill(&mut slots);
    }
    let outs: Vec<Token> = slots.into_iter().map(|s| s.out.unwrap()).collect();
    for (d, out) in ds.iter_mut().zip(outs) {
        match out {
            Token::Text(t) => d.text.push_str(&t),
            Token::End => d.ended = true,
        }
    }
}

fn alone(prompt: &str, temperature: Option<f32>, steps: usize) -> String {
    let mut cpu = Cpu::new(tiny(), 2, 64, PAGE_TOKENS);
    let mut d = start(&mut cpu, prompt, temperature, (0..16).collect());
    step(&mut cpu, vec![&mut d], false);
    for _ in 0..steps {
        if d.ended {
            break;
        }
        step(&mut cpu, vec![&mut d], true);
    }
    d.text
}

const PROMPTS: [(&str, Option<f32>); 4] = [
    ("the quick brown fox jumps over the lazy dog", Some(0.0)),
    ("a", None),
    ("", Some(0.7)),
    ("streaming video generation with playout deadlines and long prompts everywhere", Some(1.3)),
];

#[test]
fn output_is_identical_alone_and_batched_with_staggered_joins() {
    let want: Vec<String> = PROMPTS.iter().map(|(p, t)| alone(p, *t, 20)).collect();
    assert!(want.iter().all(|w| !w.is_empty()), "{want:?}");
    assert_ne!(want[0], want[3], "different prompts give different text");

    // Batched: interleaved, non-contiguous pages; sequences 2 and 3 join
    // the running batch later (continuous batching), prefilled together.
    let mut cpu = Cpu::new(tiny(), 2, 64, PAGE_TOKENS);
    let pages = |k: u32| (0..16).map(|i| i * 4 + k).rev().collect::<Vec<_>>();
    let mut ds: Vec<Driven> =
        PROMPTS.iter().zip(0..).map(|((p, t), k)| start(&mut cpu, p, *t, pages(k))).collect();
    let (first, later) = ds.split_at_mut(2);
    step(&mut cpu, first.iter_mut().collect(), false);
    for _ in 0..3 {
        step(&mut cpu, first.iter_mut().collect(), true);
    }
    step(&mut cpu, later.iter_mut().collect(), false);
    for _ in 0..20 {
        let live: Vec<&mut Driven> = ds.iter_mut().filter(|d| !d.ended).collect();
        if live.is_empty() {
            break;
        }
        step(&mut cpu, live, true);
    }
    for (i, d) in ds.iter().enumerate() {
        assert!(d.text.starts_with(&want[i]), "sequence {i}: {:?} vs alone {:?}", d.text, want[i]);
    }
}

#[test]
fn recompute_after_preemption_continues_the_same_text() {
    let (prompt, temp) = PROMPTS[3];
    let want = alone(prompt, temp, 12);
    let mut cpu = Cpu::new(tiny(), 2, 64, PAGE_TOKENS);
    let mut d = start(&mut cpu, prompt, temp, (0..16).collect());
    step(&mut cpu, vec![&mut d], false);
    for _ in 0..5 {
        step(&mut cpu, vec![&mut d], true);
    }
    // Preempted: the pages go; later it returns with other pages and its
    // whole context (prompt + output so far) is prefilled again.
    d.pages = (32..48).collect();
    step(&mut cpu, vec![&mut d], false);
    for _ in 0..6 {
        step(&mut cpu, vec![&mut d], true);
    }
    assert_eq!(d.text, want);
}

#[test]
fn greedy_and_seeded_sampling_are_reproducible_and_seeds_matter() {
    assert_eq!(alone("hello there", Some(0.0), 10), alone("hello there", Some(0.0), 10));
    let seeded = |seed| {
        let mut cpu = Cpu::new(tiny(), 2, 64, PAGE_TOKENS);
        let mut r = req("hello there", Some(1.0));
        r.seed = Some(seed);
        let seq = cpu.start(&r, policies::tokens::count(&r.prompt));
        let mut d = Driven { seq, pages: (0..16).collect(), text: String::new(), ended: false };
        step(&mut cpu, vec![&mut d], false);
        for _ in 0..10 {
            step(&mut cpu, vec![&mut d], true);
        }
        d.text
    };
    assert_eq!(seeded(1), seeded(1));
    assert_ne!(seeded(1), seeded(2));
    let text = alone("hello there", Some(0.0), 10);
    assert!(text.chars().next().unwrap().is_ascii_uppercase(), "{text}");
    assert!(text.split(' ').all(|w| w.chars().all(|c| c.is_ascii_alphabetic())), "{text}");
}

#[test]
fn a_slot_without_pages_for_its_context_ends_instead_of_writing_elsewhere() {
    let mut cpu = Cpu::new(tiny(), 2, 64, PAGE_TOKENS);
    let mut d = start(&mut cpu, "one two three four five six seven eight nine", None, vec![0]);
    step(&mut cpu, vec![&mut d], false);
    assert!(d.ended);
}
