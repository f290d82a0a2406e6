//! Property tests for every parser of untrusted input: no input makes one
//! panic, and what each accepts satisfies its invariants (the checks live
//! in `gateway::fuzzing`, shared with the cargo-fuzz targets in `fuzz/`).
//! Inputs are random mutations of the fuzz corpus (`fuzz/corpus/`), a
//! fixed number per target with a fixed seed, so a failure reproduces; the
//! long, coverage-guided runs are `scripts/fuzz` (docs/reliability.md).
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::time::{Duration, Instant};

/// Mutated inputs per target (bounded in time too, see [`TIME_LIMIT`]).
const CASES: usize = 20_000;
const TIME_LIMIT: Duration = Duration::from_secs(20);

/// SplitMix64: a small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Tokens that parsers treat specially.
const INTERESTING: &[&[u8]] = &[
    b"\"",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"\n",
    b"\r",
    b"\r\n",
    b"\\",
    b"\\u0000",
    b"\\ud800",
    b"null",
    b"1e400",
    b"-1",
    b"4294967296",
    b"18446744073709551616",
    b"NaN",
    b"\xff\xfe",
    b"=",
    b"[[",
    b"]]",
    b"data:",
    b"event:",
    b"0",
    b"true",
];

/// One random mutation of `input` (with `other` to splice from).
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(6) {
        let at = rng.below(v.len() + 1);
        match rng.below(8) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            2 => {
                let t = INTERESTING[rng.below(INTERESTING.len())];
                v.splice(at..at, t.iter().copied());
            }
            3 if at < v.len() => {
                let end = (at + 1 + rng.below(16)).min(v.len());
                v.drain(at..end);
            }
            4 if at < v.len() => {
                let end = (at + 1 + rng.below(32)).min(v.len());
                let piece = v[at..end].to_vec();
                v.splice(at..at, piece);
            }
            5 if !other.is_empty() => {
                let from = rng.below(other.len());
                let end = (from + 1 + rng.below(64)).min(other.len());
                v.splice(at..at, other[from..end].iter().copied());
            }
            6 => v.truncate(at),
            _ => v.insert(at, rng.next() as u8),
        }
    }
    v
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// Runs `check` on every seed and on [`CASES`] mutations of them.
fn property(target: &str, seeds: Vec<Vec<u8>>, check: impl Fn(&[u8])) {
    assert!(!seeds.is_empty(), "{target}: empty corpus");
    let mut rng = Rng(0x5eed ^ target.len() as u64);
    let started = Instant::now();
    for s in &seeds {
        check(s);
    }
    let mut n = 0;
    while n < CASES && started.elapsed() < TIME_LIMIT {
        let a = &seeds[rng.below(seeds.len())];
        let b = &seeds[rng.below(seeds.len())];
        let input = mutate(&mut rng, a, b);
        check(&input);
        n += 1;
    }
    assert!(n >= CASES / 4, "{target}: only {n} cases in {TIME_LIMIT:?}");
}

#[test]
fn openai_requests_never_panic_the_parser() {
    property("openai_request", corpus("openai_request"), gateway::fuzzing::openai_request);
}

#[test]
fn anthropic_requests_never_panic_the_parser() {
    property("anthropic_request", corpus("anthropic_request"), gateway::fuzzing::anthropic_request);
}

#[test]
fn responses_requests_never_panic_the_parser() {
    property("responses_request", corpus("responses_request"), gateway::fuzzing::responses_request);
}

#[test]
fn policy_documents_never_panic_the_parser() {
    property("policy_document", corpus("policy_document"), gateway::fuzzing::policy_document);
}

#[test]
fn engine_event_streams_never_panic_the_reader_nor_grow_its_buffer() {
    property("engine_events", corpus("engine_events"), gateway::fuzzing::engine_events);
    // A line that never ends is cut at the bound.
    let mut endless = vec![1u8];
    endless.extend(std::iter::repeat_n(b'x', gateway::fuzzing::MAX_EVENT_LINE + 10));
    gateway::fuzzing::engine_events(&endless);
}

#[test]
fn engine_token_lines_read_fast_are_what_serde_reads() {
    let texts = ["hello", " world", "x\"}", "\\", "line\nbreak", "é漢字🙂", "\u{1}", "", "}\"}"];
    let mut lines: Vec<Vec<u8>> = texts
        .iter()
        .map(|t| {
            let mut l = serde_json::to_vec(&engine_api::Event::Token { text: (*t).to_string() }).unwrap();
            l.push(b'\n');
            l
        })
        .collect();
    // Shapes off the fast path: still read, by serde.
    lines.push(br#"{"text":"a","event":"token"}"#.to_vec());
    lines.push(br#"{"event":"token","text":"a","extra":1}"#.to_vec());
    lines.push(br#"{"event":"token","text":"a"} "#.to_vec());
    lines.push(br#"{"event":"token","text":"a\x"}"#.to_vec()); // a bad escape: refused by both
    lines.push(br#"{"event":"token","text":"a"}}"#.to_vec());
    for line in &lines {
        gateway::fuzzing::engine_event_line(line);
    }
    property("engine_events", corpus("engine_events"), gateway::fuzzing::engine_event_line);
}

#[test]
fn engine_api_bodies_never_panic_the_engine() {
    property("engine_api", corpus("engine_api"), gateway::fuzzing::engine_api);
}

#[test]
fn sse_is_parsed_the_same_in_any_pieces() {
    property("sse", corpus("sse"), loadtest::sse::fuzz);
}

#[tokio::test]
async fn video_imports_never_panic_and_only_well_shaped_states_are_accepted() {
    // A real export as a seed, beside the corpus.
    let v = engine::video::VideoEngine::spawn(engine::video::VideoConfig {
        backend: engine::backend::BackendKind::Cpu,
        profile: policies::video::VideoProfile::parse(
            "bundled",
            include_str!("../../policies/profiles/video-cpu-epyc-2core.toml"),
        )
        .unwrap(),
        arena_slots: 2,
        max_batch: 2,
        threads: 1,
        model_seed: 1,
        gpu: None,
        state_bytes: 0,
    });
    let session = engine::video::CreateSession {
        id: "a".into(),
        prompt: "a fox".into(),
        resolution: engine::video::Resolution::Tiny,
        latent_frames: 3,
    };
    v.create(session).await.unwrap();
    let req = engine::video::ChunkRequest {
        epoch: 0,
        fidelity: policies::video::Fidelity::HIGHEST,
        key: 1.0,
        credit: 1.0,
        sp: 1,
        at: None,
    };
    v.chunk("a", req).await.unwrap();
    let export = v.export("a").await.unwrap();
    assert!(engine::video::parse_export(&export).is_ok(), "a real export is accepted");
    if std::env::var_os("WRITE_FUZZ_CORPUS").is_some() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/video_import");
        std::fs::write(dir.join("export-tiny-1-chunk"), &export).unwrap();
    }
    let mut seeds = corpus("video_import");
    seeds.push(export);
    property("video_import", seeds, engine::video::fuzz_import);
}
