//! Execution backends behind one interface.
//!
//! The scheduler owns the batch; a backend only computes. It is generic over
//! the backend (static dispatch), and each backend keeps whatever per-
//! sequence model state it needs in its associated [`Backend::Seq`] type.
//!
//! - `emulated`: deterministic words, timing from a latency profile; the
//!   time a step would take on the profiled device is returned for the
//!   scheduler to wait.
//! - `cpu`: a synthetic transformer computed on the host (see [`cpu`]);
//! - `cuda`: the same math on an NVIDIA GPU (`crate::gpu`, the `cuda`
//!   feature). Both compute for real and return zero: the time has
//!   already passed.

pub mod cpu;
pub mod cuda;
pub mod emulated;

use std::time::Duration;

use crate::api::GenerateRequest;
use crate::kv::PageId;

/// The backend asked for (`--backend`): one of [`BackendKind`], or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    Emulated,
    Cpu,
    Cuda,
    /// The best this machine offers: `cuda` when a GPU is present and this
    /// engine was built with the `cuda` feature, else `cpu`. Resolved once
    /// at start, with the reason logged (`event = "backend_selected"`).
    Auto,
}

impl BackendChoice {
    /// The concrete backend for this machine and why. `Auto` probes for a
    /// GPU and picks `cuda` when one answers, else `cpu`; `cuda` asked for
    /// stays `cuda` (and fails at start if there is no GPU).
    pub fn resolve(self) -> (BackendKind, String) {
        let asked = |k| (k, "asked for".to_string());
        match self {
            BackendChoice::Emulated => asked(BackendKind::Emulated),
            BackendChoice::Cpu => asked(BackendKind::Cpu),
            BackendChoice::Cuda => asked(BackendKind::Cuda),
            BackendChoice::Auto => match crate::gpu::probe() {
                Ok(d) => (
                    BackendKind::Cuda,
                    format!(
                        "GPU {} (compute capability {}.{}, {} MiB) found: using cuda",
                        d.name,
                        d.compute_capability.0,
                        d.compute_capability.1,
                        d.memory_bytes >> 20
                    ),
                ),
                Err(why) => (BackendKind::Cpu, format!("no usable GPU ({why}): using cpu")),
            },
        }
    }
}

/// The backend an engine runs (resolved: never `auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Profile-timed, no heavy math; results are labelled "emulated".
    Emulated,
    /// A synthetic transformer computed on the host's CPU.
    Cpu,
    /// The same models on an NVIDIA GPU (engines built with `--features
    /// cuda`; the CUDA libraries are loaded at start).
    Cuda,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Emulated => "emulated",
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        }
    }

    /// Whether steps compute (or wait for the device) on the calling
    /// thread, and so must not run on the async runtime's workers.
    pub fn computes_on_host(self) -> bool {
        matches!(self, BackendKind::Cpu | BackendKind::Cuda)
    }
}

/// What a step produced for one sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// The next token's text.
    Text(String),
    /// The model ended the sequence.
    End,
}

/// One sequence's slot in a prefill or decode step.
#[derive(Debug)]
pub struct Slot<'a, S> {
    pub seq: &'a mut S,
    /// KV pages the sequence owns, in order.
    pub pages: &'a [PageId],
    /// Tokens of context before this step (prompt + generated so far).
    pub context: u32,
    /// Leading tokens of the context whose K/V the pages already hold (a
    /// prefix shared from the cache): a prefill computes only the rest.
    pub cached: u32,
    /// Set by the backend.
    pub out: Option<Token>,
}

/// A model executor.
pub trait Backend: Send + 'static {
    /// Per-sequence model state (sampler, tokenised prompt, ...).
    type Seq: Send;

    fn kind(&self) -> BackendKind;

    /// Model state for a newly admitted sequence.
    fn start(&mut self, req: &GenerateRequest, prompt_tokens: u32) -> Self::Seq;

    /// Prefills a batch (each slot's context after its cached prefix) and
    /// produces each sequence's next token. Returns the device time still
    /// to wait.
    fn prefill(&mut self, batch: &mut [Slot<'_, Self::Seq>]) -> Duration;

    /// One decode step for every slot. Returns the device time still to wait.
    fn decode(&mut self, batch: &mut [Slot<'_, Self::Seq>]) -> Duration;

    /// Whether the text of each token it generates is the token: one
    /// piece that the tokenizer maps back to the same id, so the pages
    /// holding the output's K/V may serve a later prompt that resends it.
    /// The emulated backend's words are not (many are two pieces), and it
    /// has no K/V to share.
    fn output_round_trips(&self) -> bool {
        false
    }
}
