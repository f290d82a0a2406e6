//! Workload files: what requests look like (prompt and output sizes, the
//! tenant mix) independent of when they arrive (see [`crate::arrival`]).
//!
//! A workload is a TOML file; the shipped ones live in `loadtest/workloads/`
//! and can be named by their stem (`--workload chat`). Unknown keys are
//! errors, so a typo in a copied file does not silently change the test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use policies::rng::SplitMix;
use serde::{Deserialize, Serialize};

/// Directory of the shipped workloads, relative to the repository root.
pub const SHIPPED_DIR: &str = "loadtest/workloads";

/// A parsed workload file.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Model named in every request.
    pub model: String,
    /// Prompt length in tokens.
    pub input_tokens: Length,
    /// Requested output length (`max_tokens`) before the per-tier cap.
    pub output_tokens: Length,
    /// Per-tier cap on `max_tokens`, by tier name.
    #[serde(default)]
    pub output_cap: BTreeMap<String, u32>,
    /// Who sends: API keys with their share of the traffic.
    pub mix: Vec<MixEntry>,
    /// Requests that start with one of a few shared prefixes (system
    /// prompts, RAG instructions): `input_tokens` is then what follows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<PrefixSpec>,
    /// Multi-turn conversations that resend their history: `input_tokens`
    /// is then each turn's new message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<ConversationSpec>,
}

/// `[prefix]`: shared prefixes.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PrefixSpec {
    /// Distinct prefixes; each request with one picks one uniformly.
    pub groups: u32,
    /// Tokens in each prefix.
    pub tokens: u32,
    /// Share of requests that start with one (the rest share nothing).
    #[serde(default = "all")]
    pub share: f64,
}

fn all() -> f64 {
    1.0
}

/// `[conversation]`: users in conversations that resend their history.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConversationSpec {
    /// Conversations going on at once; each request continues one, picked
    /// uniformly.
    pub users: u32,
    /// Turns of a conversation before its user starts a new one.
    pub turns: u32,
    /// Tokens each earlier turn's answer left in the history: a turn's
    /// prompt is the previous turn's prompt, this many tokens standing for
    /// its answer, then the new message (with `answers = "stand_in"`).
    pub turn_tokens: u32,
    /// What stands in the history for an earlier answer: `stand_in` (the
    /// default), `turn_tokens` of seeded text, or `received`, the answer
    /// the engine gave, resent as it came (what a chat client does). With
    /// `received` a turn waits for the previous turn's answer before it is
    /// sent (a user reads before typing; latencies count from the send),
    /// and the plan and the simulator take each answer to be the turn's
    /// `max_tokens` long.
    #[serde(default, skip_serializing_if = "Answers::is_stand_in")]
    pub answers: Answers,
}

/// See [`ConversationSpec::answers`].
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Answers {
    #[default]
    StandIn,
    Received,
}

impl Answers {
    fn is_stand_in(&self) -> bool {
        *self == Answers::StandIn
    }
}

/// One tenant (API key) in the mix.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MixEntry {
    pub key: String,
    /// Tier name, for per-tier reporting and output caps. It must be the
    /// tier the target's policy gives this key.
    pub tier: String,
    /// Relative share of requests (any positive scale).
    pub weight: f64,
}

/// A token-length distribution.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(tag = "dist", rename_all = "snake_case", deny_unknown_fields)]
pub enum Length {
    /// Always the same length.
    Fixed { tokens: u32 },
    /// Log-normal fitted to a median and a 95th percentile, clamped to
    /// `[min, max]`. Right-skewed with a long tail, the shape of published
    /// LLM serving traces for both prompt and output lengths.
    Lognormal {
        p50: f64,
        p95: f64,
        #[serde(default = "one")]
        min: u32,
        #[serde(default = "big")]
        max: u32,
    },
    /// One of several distributions, picked by weight per request: a mixed
    /// workload such as chat plus RAG (`weights` and `parts` pair up).
    Mixture { weights: Vec<f64>, parts: Vec<Length> },
}

fn one() -> u32 {
    1
}
fn big() -> u32 {
    1 << 20
}

/// z-score of the 95th percentile of the standard normal.
const Z95: f64 = 1.644_853_626_951_472;

impl Length {
    /// Draws one length.
    pub fn sample(&self, rng: &mut SplitMix) -> u32 {
        match self {
            Length::Fixed { tokens } => *tokens,
            &Length::Lognormal { p50, p95, min, max } => {
                let sigma = (p95 / p50).ln() / Z95;
                let x = (p50.ln() + sigma * rng.normal()).exp().round();
                (x.clamp(0.0, f64::from(u32::MAX)) as u32).clamp(min, max)
            }
            Length::Mixture { weights, parts } => {
                let mut x = rng.unit_f64() * weights.iter().sum::<f64>();
                let i = weights.iter().position(|w| {
                    let hit = x < *w;
                    x -= w;
                    hit
                });
                parts[i.unwrap_or(parts.len() - 1)].sample(rng)
            }
        }
    }

    fn check(&self, what: &str) -> Result<(), String> {
        if let Length::Mixture { weights, parts } = self {
            if parts.is_empty() || weights.len() != parts.len() {
                return Err(format!("{what}: a mixture needs as many weights as parts, at least one"));
            }
            if weights.iter().any(|w| !(w.is_finite() && *w > 0.0)) {
                return Err(format!("{what}: mixture weights must be > 0"));
            }
            return parts.iter().enumerate().try_for_each(|(i, p)| p.check(&format!("{what}.parts[{i}]")));
        }
        match *self {
            Length::Mixture { .. } => Ok(()),
            Length::Fixed { tokens: 0 } => Err(format!("{what}: tokens must be at least 1")),
            Length::Fixed { .. } => Ok(()),
            Length::Lognormal { p50, p95, min, max } => {
                if !(p50 >= 1.0 && p95 > p50 && p95.is_finite()) {
                    Err(format!("{what}: need 1 <= p50 < p95, got p50 {p50}, p95 {p95}"))
                } else if min == 0 || min > max {
                    Err(format!("{what}: need 1 <= min <= max, got {min}..{max}"))
                } else {
                    Ok(())
                }
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("reading workload {0}: {1}")]
    Read(String, std::io::Error),
    #[error("workload {0}: {1}")]
    Parse(String, String),
    #[error("workload {0}: {1}")]
    Invalid(String, String),
}

impl Workload {
    /// Loads `name_or_path`: a file path, or the stem of a shipped workload.
    pub fn load(name_or_path: &str) -> Result<Self, WorkloadError> {
        let path = resolve(name_or_path);
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|e| WorkloadError::Read(shown.clone(), e))?;
        Self::parse(&shown, &text)
    }

    /// Parses and validates workload text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, WorkloadError> {
        let w: Workload =
            toml::from_str(text).map_err(|e| WorkloadError::Parse(file.into(), e.to_string()))?;
        let invalid = |m: String| WorkloadError::Invalid(file.into(), m);
        w.input_tokens.check("input_tokens").map_err(invalid)?;
        w.output_tokens.check("output_tokens").map_err(invalid)?;
        if w.mix.is_empty() || w.mix.iter().any(|m| !(m.weight > 0.0 && m.weight.is_finite())) {
            return Err(invalid("mix: at least one entry, every weight > 0".into()));
        }
        if let Some((tier, _)) = w.output_cap.iter().find(|(_, &c)| c == 0) {
            return Err(invalid(format!("output_cap.{tier}: must be at least 1")));
        }
        if let Some(p) = w.prefix {
            if p.groups == 0 || p.tokens == 0 || !(0.0..=1.0).contains(&p.share) {
                return Err(invalid("prefix: groups and tokens >= 1, share in [0, 1]".into()));
            }
        }
        if let Some(c) = w.conversation {
            if c.users == 0 || c.turns == 0 || c.turn_tokens == 0 {
                return Err(invalid("conversation: users, turns and turn_tokens >= 1".into()));
            }
            if w.prefix.is_some() {
                return Err(invalid("prefix and conversation: one or the other".into()));
            }
        }
        Ok(w)
    }

    /// Picks a mix entry by weight.
    pub fn pick(&self, rng: &mut SplitMix) -> usize {
        let total: f64 = self.mix.iter().map(|m| m.weight).sum();
        let mut x = rng.unit_f64() * total;
        for (i, m) in self.mix.iter().enumerate() {
            if x < m.weight {
                return i;
            }
            x -= m.weight;
        }
        self.mix.len() - 1
    }

    /// `max_tokens` for a request of `tier` wanting `wanted` tokens.
    pub fn capped_output(&self, tier: &str, wanted: u32) -> u32 {
        self.output_cap.get(tier).map_or(wanted, |&cap| wanted.min(cap))
    }
}

fn resolve(name_or_path: &str) -> PathBuf {
    let p = Path::new(name_or_path);
    if p.extension().is_some() || p.components().count() > 1 {
        return p.to_path_buf();
    }
    Path::new(SHIPPED_DIR).join(format!("{name_or_path}.toml"))
}

/// A prompt of exactly `tokens` tokens by [`policies::tokens::count`]: words
/// of four letters (one token each), varied by `seed` so no two requests
/// share a prefix. The same seed gives the same words: a shorter prompt of
/// a seed is a prefix of a longer one (how conversations grow).
pub fn synth_prompt(tokens: u32, seed: u64) -> String {
    const SYLLABLES: [&str; 16] =
        ["ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "ba", "di", "fu", "go", "hi", "ju", "pe", "zo"];
    let mut rng = SplitMix(seed);
    let mut s = String::with_capacity(tokens as usize * 5);
    for i in 0..tokens {
        if i > 0 {
            s.push(' ');
        }
        let r = rng.next_u64();
        s.push_str(SYLLABLES[(r & 15) as usize]);
        s.push_str(SYLLABLES[((r >> 4) & 15) as usize]);
    }
    s
}

/// A request's prompt: its shared prefix (`(seed, tokens)`, if any), then
/// `rest` tokens of its own.
pub fn prompt(prefix: Option<(u64, u32)>, rest: u32, seed: u64) -> String {
    match prefix {
        Some((pseed, n)) if rest > 0 => format!("{} {}", synth_prompt(n, pseed), synth_prompt(rest, seed)),
        Some((pseed, n)) => synth_prompt(n, pseed),
        None => synth_prompt(rest, seed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::percentile;

    fn shipped(name: &str) -> Workload {
        let path = format!("{}/workloads/{name}.toml", env!("CARGO_MANIFEST_DIR"));
        Workload::load(&path).unwrap()
    }

    fn quantiles(len: &Length, n: usize) -> (f64, f64) {
        let mut rng = SplitMix(3);
        let v: Vec<f64> = (0..n).map(|_| f64::from(len.sample(&mut rng))).collect();
        (percentile(&v, 50.0).unwrap(), percentile(&v, 95.0).unwrap())
    }

    #[test]
    fn shipped_workloads_hit_their_stated_quantiles() {
        let chat = shipped("chat");
        let (p50, p95) = quantiles(&chat.input_tokens, 40_000);
        assert!((p50 - 120.0).abs() < 6.0 && (p95 - 480.0).abs() < 30.0, "chat input {p50} {p95}");
        let rag = shipped("rag");
        let (p50, p95) = quantiles(&rag.input_tokens, 40_000);
        assert!((p50 - 1200.0).abs() < 60.0 && (p95 - 3500.0).abs() < 200.0, "rag input {p50} {p95}");
        for w in [&chat, &rag] {
            assert_eq!(w.capped_output("gold", 5000), 1024);
            assert_eq!(w.capped_output("silver", 5000), 512);
            assert_eq!(w.capped_output("bronze", 5000), 256);
            assert_eq!(w.capped_output("bronze", 10), 10);
        }
    }

    #[test]
    fn the_mixed_workload_draws_each_part_by_weight() {
        let w = shipped("chat-rag");
        let mut rng = SplitMix(5);
        let n = 20_000;
        let long = (0..n).filter(|_| w.input_tokens.sample(&mut rng) >= 700).count() as f64 / n as f64;
        // 30% RAG x P(RAG >= 700) = 0.3 x 0.80, plus chat's tail above 700
        // tokens, 0.7 x 0.018: 0.253 in all (closed form of both log-normals).
        assert!((0.235..0.27).contains(&long), "share of long prompts {long}");
        let bad = Length::Mixture { weights: vec![1.0], parts: vec![] };
        assert!(bad.check("x").is_err());
    }

    #[test]
    fn prompts_have_exactly_the_target_token_count() {
        for n in [1, 2, 17, 480, 3500] {
            let p = synth_prompt(n, u64::from(n));
            assert_eq!(policies::tokens::count(&p), n);
        }
        assert_ne!(synth_prompt(50, 1), synth_prompt(50, 2));
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let base = "name='x'\nmodel='m'\n[[mix]]\nkey='k'\ntier='gold'\nweight=1\n";
        let ok = format!(
            "{base}[input_tokens]\ndist='fixed'\ntokens=3\n[output_tokens]\ndist='fixed'\ntokens=2\n"
        );
        assert!(Workload::parse("w", &ok).is_ok());
        let typo = ok.replace("tokens=3", "tokens=3\ntoken=4");
        assert!(matches!(Workload::parse("w", &typo), Err(WorkloadError::Parse(..))));
        let bad = ok.replace("dist='fixed'\ntokens=3", "dist='lognormal'\np50=100\np95=50");
        let err = Workload::parse("w", &bad).unwrap_err().to_string();
        assert!(err.contains("input_tokens") && err.contains("p95"), "{err}");
    }
}
