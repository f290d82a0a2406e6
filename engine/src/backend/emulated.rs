//! The emulated backend: deterministic, readable text seeded by the prompt,
//! and device time from a latency profile.
//!
//! A prefill batch takes `profile.prefill_batch(each member's computed and
//! cached tokens)` (the linear part on the batch's tokens, attention per
//! member: `policies::profile`); a decode
//! step takes `profile.decode_step(batch size, total context)`, so batching
//! gains (step time grows slowly with batch size) and long-context
//! interference look like a real GPU's.

use std::time::Duration;

use policies::LatencyProfile;

use super::{Backend, BackendKind, Slot, Token};
use crate::api::GenerateRequest;

/// Profile-timed executor.
#[derive(Debug)]
pub struct Emulated {
    pub profile: LatencyProfile,
    /// Answers never end by themselves: `max_tokens` ends them.
    pub to_max_tokens: bool,
}

impl Backend for Emulated {
    type Seq = TextSource;

    fn kind(&self) -> BackendKind {
        BackendKind::Emulated
    }

    fn start(&mut self, req: &GenerateRequest, _prompt_tokens: u32) -> TextSource {
        let mut src = TextSource::new(&req.prompt, req.seed);
        if self.to_max_tokens {
            src.natural_len = u32::MAX;
        }
        src
    }

    fn prefill(&mut self, batch: &mut [Slot<'_, TextSource>]) -> Duration {
        // A cached prefix costs no linear work; the new rows attend to it.
        let members: Vec<(u32, u32)> = batch
            .iter()
            .map(|s| {
                let cached = s.cached.min(s.context);
                (s.context - cached, cached)
            })
            .collect();
        for slot in batch.iter_mut() {
            slot.out = Some(slot.seq.next_token().map_or(Token::End, Token::Text));
        }
        self.profile.prefill_batch(members)
    }

    fn decode(&mut self, batch: &mut [Slot<'_, TextSource>]) -> Duration {
        let context: u32 = batch.iter().map(|s| s.context).sum();
        for slot in batch.iter_mut() {
            slot.out = Some(slot.seq.next_token().map_or(Token::End, Token::Text));
        }
        self.profile.decode_step(batch.len() as u32, context)
    }
}

/// Vocabulary of the emulated model: plain words so output reads as text.
const WORDS: &[&str] = &[
    "the", "a", "gateway", "engine", "token", "stream", "latency", "budget", "tier", "queue", "batch",
    "model", "request", "answer", "river", "mountain", "light", "quiet", "signal", "garden", "window",
    "paper", "story", "moment", "careful", "bright", "slow", "fast", "green", "blue", "of", "and", "to",
    "in", "with", "on", "is", "was", "will", "can", "every", "some", "north", "south", "small", "large",
    "simple", "steady", "early", "late", "open", "close", "number", "letter", "city", "harbor", "cloud",
    "stone", "field", "winter", "summer", "road",
];

/// Deterministic word source for one sequence.
#[derive(Debug, Clone)]
pub struct TextSource {
    state: u64,
    /// Tokens after which the model ends by itself (finish reason `stop`).
    natural_len: u32,
    emitted: u32,
}

impl TextSource {
    /// Seeds from the prompt text and the request's optional seed, so the
    /// same prompt and seed always give the same text.
    pub fn new(prompt: &str, seed: Option<u64>) -> Self {
        let mut state = fnv1a(prompt.as_bytes()) ^ seed.unwrap_or(0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        if state == 0 {
            state = 0x2545_F491_4F6C_DD1D;
        }
        let mut src = Self { state, natural_len: 0, emitted: 0 };
        // Natural answers run 16..=272 tokens: long enough to stream, short
        // enough for demos; max_tokens usually ends them first.
        src.natural_len = 16 + (src.next() % 257) as u32;
        src
    }

    /// The next token's text, or `None` when the model ends the answer.
    pub fn next_token(&mut self) -> Option<String> {
        if self.emitted >= self.natural_len {
            return None;
        }
        let word = WORDS[(self.next() % WORDS.len() as u64) as usize];
        let text = if self.emitted == 0 {
            let mut w = word.to_string();
            w[..1].make_ascii_uppercase();
            w
        } else {
            format!(" {word}")
        };
        self.emitted += 1;
        Some(text)
    }

    /// xorshift64*: small, fast, good enough for picking words.
    fn next(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// FNV-1a: a stable hash for seeding from text.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::TextSource;

    fn take(prompt: &str, seed: Option<u64>, n: usize) -> String {
        let mut s = TextSource::new(prompt, seed);
        (0..n).map_while(|_| s.next_token()).collect()
    }

    #[test]
    fn same_prompt_same_text_and_different_prompts_differ() {
        assert_eq!(take("hello", None, 12), take("hello", None, 12));
        assert_ne!(take("hello", None, 12), take("goodbye", None, 12));
        assert_ne!(take("hello", Some(1), 12), take("hello", Some(2), 12));
    }

    #[test]
    fn text_is_readable_words_and_ends_by_itself() {
        let mut s = TextSource::new("x", None);
        let mut n = 0;
        while let Some(t) = s.next_token() {
            assert!(t.trim().chars().all(|c| c.is_ascii_alphabetic()), "{t:?}");
            n += 1;
        }
        assert!((16..=272).contains(&n), "{n}");
    }

    #[test]
    fn with_to_max_tokens_answers_never_end_by_themselves() {
        use crate::backend::Backend;
        let profile = policies::LatencyProfile::parse(
            "p.toml",
            include_str!("../../../policies/profiles/emulated-a100-8b.toml"),
        )
        .unwrap();
        let req = crate::api::GenerateRequest {
            request_id: "t".into(),
            model: "m".into(),
            prompt: "x".into(),
            max_tokens: 2000,
            temperature: None,
            seed: None,
            stop: vec![],
            priority_key: None,
            ttft_budget_ms: None,
            priority: None,
        };
        let mut natural = super::Emulated { profile: profile.clone(), to_max_tokens: false };
        let mut to_max = super::Emulated { profile, to_max_tokens: true };
        let mut a = natural.start(&req, 1);
        assert!((0..2000).map_while(|_| a.next_token()).count() <= 272);
        let mut b = to_max.start(&req, 1);
        assert_eq!((0..2000).map_while(|_| b.next_token()).count(), 2000);
    }
}
