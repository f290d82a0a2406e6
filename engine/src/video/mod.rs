//! Video sessions on an engine: the synthetic chunked model ([`model`]),
//! frames as PNG ([`png`]), and the single-owner session scheduler
//! ([`sched`]) that keeps each stream's state (resident in the state arena,
//! or suspended to host memory), coalesces ready chunks of several streams
//! into one batch per denoising step, and evicts the highest-credit
//! resident when the arena is full.
//!
//! The gateway drives sessions over the internal API (`/engine/v1/video/…`,
//! docs/api.md): create, next chunk (with its fidelity and ordering key),
//! prompt switch, suspend, resume, export, import, end.

pub(crate) mod batch;
pub use crate::models::video as model;
pub use crate::models::video::BatchItem;
pub mod png;
pub mod profile;
pub mod sched;
pub mod state;
pub mod transfer;

use serde::{Deserialize, Serialize};

pub use engine_api::video::{
    ChunkOut, ChunkRequest, CreateSession, Resolution, Version, MAX_ID_BYTES, MAX_LATENT_FRAMES,
    MAX_PROMPT_BYTES,
};
pub use sched::{parse_export, VideoConfig, VideoEngine};
pub use state::Meta;

/// `GET /engine/v1/video/load`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct VideoLoad {
    pub sessions: u32,
    pub resident: u32,
    pub suspended: u32,
    pub arena_slots: u32,
    pub queued_chunks: u32,
    pub batches: u64,
    pub chunks: u64,
    pub suspends: u64,
    pub resumes: u64,
    /// Chunks preempted at a step boundary (emulated backend).
    #[serde(default)]
    pub preemptions: u64,
    /// Halves of other engines' SP2 chunks this engine ran.
    #[serde(default)]
    pub lends: u64,
}

/// Why a session operation failed; `code` is the wire label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VideoError {
    #[error("no session `{0}` on this engine")]
    NoSession(String),
    #[error("session `{0}` already exists")]
    Exists(String),
    #[error("chunk of prompt epoch {got} refused: the session is at epoch {current}")]
    StaleEpoch { got: u32, current: u32 },
    #[error("fidelity {0} is not in this engine's video profile")]
    UnknownFidelity(String),
    #[error("malformed session state")]
    BadState,
    #[error("the engine is stopping")]
    Stopped,
    #[error("no open transfer of session `{0}` for this token")]
    NoOffer(String),
    #[error("too many transfers staged on this engine")]
    Busy,
    #[error("the transfer from the source engine failed: {0}")]
    Transfer(String),
    #[error("sequence-parallel degree {0} is not supported (1 or 2)")]
    BadSp(u8),
    #[error("chunk {at} of this session is being generated; ask again when it is done")]
    ChunkInFlight { at: u64 },
    #[error("chunk {at} is not available: the session has generated {generated} chunks of this prompt and keeps the last {kept}")]
    ChunkGone { at: u64, generated: u64, kept: usize },
}

impl VideoError {
    pub fn code(&self) -> &'static str {
        match self {
            VideoError::NoSession(_) => "no_session",
            VideoError::Exists(_) => "session_exists",
            VideoError::StaleEpoch { .. } => "stale_epoch",
            VideoError::UnknownFidelity(_) => "unknown_fidelity",
            VideoError::BadState => "bad_state",
            VideoError::Stopped => "stopped",
            VideoError::NoOffer(_) => "no_offer",
            VideoError::Busy => "busy",
            VideoError::Transfer(_) => "transfer_failed",
            VideoError::BadSp(_) => "invalid_request",
            VideoError::ChunkInFlight { .. } => "chunk_in_flight",
            VideoError::ChunkGone { .. } => "chunk_gone",
        }
    }
}

/// The video import as a fuzz target (`fuzz/`, `gateway/tests/parsers.rs`):
/// no input panics it, and what it accepts has the model's shape.
pub fn fuzz_import(data: &[u8]) {
    if let Ok((meta, state)) = parse_export(data) {
        let s = model::StreamState::from_bytes(&state).expect("accepted states parse");
        assert!(s.fits(meta.resolution, meta.latent_frames as usize));
    }
}

/// Standard base64 with padding (frames on the wire).
pub fn base64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}
