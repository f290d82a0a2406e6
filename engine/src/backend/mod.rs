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
//!   `cuda` (CUDA issue) will run the same math on a GPU. Both compute for
//!   real and return zero: the time has already passed.

pub mod cpu;
pub mod emulated;
pub mod gpu;

use std::time::Duration;

use crate::api::GenerateRequest;
use crate::kv::PageId;

/// Which backend an engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// Profile-timed, no heavy math; results are labelled "emulated".
    Emulated,
    /// A synthetic transformer computed on the host's CPU.
    Cpu,
    /// The best this machine offers: a GPU backend when a GPU is present and
    /// the engine has one for it, else `cpu`. Resolved once at start, with
    /// the reason logged (`event = "backend_selected"`).
    Auto,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Emulated => "emulated",
            BackendKind::Cpu => "cpu",
            BackendKind::Auto => "auto",
        }
    }

    /// The concrete backend for this machine and why. `Auto` probes for a
    /// GPU; the GPU model backend is not in this build yet (CUDA issue), so
    /// it resolves to `cpu` either way and says which case it is.
    pub fn resolve(self) -> (BackendKind, String) {
        match self {
            BackendKind::Auto => match gpu::probe() {
                Ok(d) => (
                    BackendKind::Cpu,
                    format!("GPU {} found, but this engine has no GPU model backend yet: using cpu", d.name),
                ),
                Err(why) => (BackendKind::Cpu, format!("no usable GPU ({why}): using cpu")),
            },
            other => (other, "asked for".to_string()),
        }
    }

    /// Whether steps compute on the calling thread (and so must not run on
    /// the async runtime's workers).
    pub fn computes_on_host(self) -> bool {
        matches!(self, BackendKind::Cpu | BackendKind::Auto)
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

    /// Prefills a batch (each slot's whole context) and produces each
    /// sequence's next token. Returns the device time still to wait.
    fn prefill(&mut self, batch: &mut [Slot<'_, Self::Seq>]) -> Duration;

    /// One decode step for every slot. Returns the device time still to wait.
    fn decode(&mut self, batch: &mut [Slot<'_, Self::Seq>]) -> Duration;
}
