//! The `cpu` backend: a real (synthetic) transformer computed on the host.
//!
//! [`model`] holds the network and the paged K/V arena, [`math`] the
//! kernels, [`vocab`] the word vocabulary. A prefill step runs every
//! sequence's whole context as one batch of rows; a decode step runs one
//! row per sequence, attending over the K/V its pages hold. Sampling is
//! greedy at temperature 0 and otherwise draws from the softmax with the
//! sequence's own seeded generator, so a sequence's text does not depend
//! on what it was batched with, nor on being preempted and recomputed.
//!
//! Steps compute for real and return zero device time: the time has passed.

pub use crate::models::lm as model;
pub use crate::models::{math, vocab};

use std::time::Duration;

use super::{Backend, BackendKind, Slot, Token};
use crate::api::GenerateRequest;
use math::softmax;
use model::SeqInput;
pub use model::{KvArena, Model, ModelConfig};
use policies::rng::SplitMix;

/// Host-computed executor.
#[derive(Debug)]
pub struct Cpu {
    model: Model,
    kv: KvArena,
}

impl Cpu {
    /// Generates the weights and allocates the K/V arena for `pages` pages
    /// of `page_tokens` tokens (the allocator's sizing). Large matrix
    /// products use up to `threads` threads.
    pub fn new(cfg: ModelConfig, threads: usize, pages: u32, page_tokens: u32) -> Self {
        let kv = KvArena::new(&cfg, pages, page_tokens);
        Self { model: Model::new(cfg, threads), kv }
    }

    fn step(&mut self, batch: &mut [Slot<'_, CpuSeq>], decode: bool) {
        let (model, kv) = (&self.model, &mut self.kv);
        let cap = kv.page_tokens();
        run_step(batch, decode, cap, |inputs| Ok::<_, std::convert::Infallible>(model.forward(kv, inputs)));
    }
}

/// One prefill or decode step of any backend that computes logits: each
/// slot's tokens for this step (its whole context for a prefill, its last
/// token for a decode) go to `forward` as one batch, and each sequence
/// samples its next token from its logits. A slot without pages for its
/// positions (the scheduler always provides them) ends rather than
/// corrupting the cache, as does every slot when `forward` fails.
pub(crate) fn run_step<E: std::fmt::Display>(
    batch: &mut [Slot<'_, CpuSeq>],
    decode: bool,
    page_tokens: usize,
    forward: impl FnOnce(&[SeqInput<'_>]) -> Result<Vec<Vec<f32>>, E>,
) {
    let fits: Vec<bool> = batch.iter().map(|s| s.pages.len() * page_tokens >= s.context as usize).collect();
    let inputs: Vec<SeqInput<'_>> = batch
        .iter()
        .zip(&fits)
        .filter(|(_, &ok)| ok)
        .map(|(s, _)| {
            let ctx = (s.context as usize).min(s.seq.tokens.len());
            // A prefill starts after the cached prefix (never past the last
            // token: it is what the next token is sampled from).
            let start =
                if decode { ctx.saturating_sub(1) } else { (s.cached as usize).min(ctx.saturating_sub(1)) };
            SeqInput { tokens: &s.seq.tokens[start..ctx], start, pages: s.pages }
        })
        .collect();
    let logits = match forward(&inputs) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(event = "step_failed", error = %e, "the model step failed; its sequences end");
            Vec::new()
        }
    };
    let ran = !logits.is_empty() || inputs.is_empty();
    let mut logits = logits.into_iter();
    for (slot, ok) in batch.iter_mut().zip(fits) {
        slot.out =
            Some(if ok && ran { slot.seq.sample(logits.next().unwrap_or_default()) } else { Token::End });
    }
}

impl Backend for Cpu {
    type Seq = CpuSeq;

    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn start(&mut self, req: &GenerateRequest, prompt_tokens: u32) -> CpuSeq {
        CpuSeq::start(req, prompt_tokens, self.model.cfg.vocab as u32)
    }

    fn prefill(&mut self, batch: &mut [Slot<'_, CpuSeq>]) -> Duration {
        self.step(batch, false);
        Duration::ZERO
    }

    fn decode(&mut self, batch: &mut [Slot<'_, CpuSeq>]) -> Duration {
        self.step(batch, true);
        Duration::ZERO
    }

    fn output_round_trips(&self) -> bool {
        true // one vocabulary word per token (`vocab::ROUND_TRIP_IDS`)
    }
}

/// One sequence's tokens (prompt, then output) and sampler.
#[derive(Debug, Clone)]
pub struct CpuSeq {
    tokens: Vec<u32>,
    prompt_len: usize,
    rng: SplitMix,
    temperature: f32,
}

impl CpuSeq {
    /// A new sequence of `req`'s prompt, `prompt_tokens` long.
    pub(crate) fn start(req: &GenerateRequest, prompt_tokens: u32, vocab: u32) -> Self {
        let mut tokens = vocab::tokenize(&req.prompt, vocab);
        // The engine sized the KV reservation by `prompt_tokens`; the
        // tokenizer counts the same way, this only guards the invariant.
        tokens.resize(prompt_tokens as usize, 1);
        let seed = req.seed.unwrap_or_else(|| super::emulated::fnv1a(req.prompt.as_bytes()));
        CpuSeq {
            prompt_len: tokens.len(),
            tokens,
            rng: SplitMix(seed),
            // OpenAI's default temperature is 1.
            temperature: req.temperature.unwrap_or(1.0).max(0.0),
        }
    }

    /// Picks the next token from `logits`, appends it and returns its text.
    pub(crate) fn sample(&mut self, mut logits: Vec<f32>) -> Token {
        if logits.is_empty() {
            return Token::End;
        }
        let id = if self.temperature <= 1e-6 {
            // Greedy; ties go to the lowest id.
            logits.iter().enumerate().fold(0, |best, (i, &v)| if v > logits[best] { i } else { best })
        } else {
            logits.iter_mut().for_each(|l| *l /= self.temperature);
            softmax(&mut logits);
            let u = self.rng.unit();
            let mut acc = 0.0;
            logits
                .iter()
                .position(|&p| {
                    acc += p;
                    u < acc
                })
                .unwrap_or(logits.len() - 1)
        } as u32;
        if id == vocab::EOS {
            return Token::End;
        }
        let first = self.tokens.len() == self.prompt_len;
        self.tokens.push(id);
        let w = vocab::word(id);
        Token::Text(if first {
            let mut c = w.chars();
            c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
        } else {
            format!(" {w}")
        })
    }
}

#[cfg(test)]
mod tests;
