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
pub use batch::BatchItem;
pub mod model;
pub mod png;
pub mod profile;
pub mod routes;
pub mod sched;
pub mod state;
pub mod transfer;

use policies::video::Fidelity;
use serde::{Deserialize, Serialize};

pub use model::Resolution;
pub use sched::{parse_export, VideoConfig, VideoEngine};
pub use state::{Meta, Version};

/// `POST /engine/v1/video/sessions`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    pub id: String,
    pub prompt: String,
    pub resolution: Resolution,
    /// Latent frames per chunk (pixel frames / 4), 1 to [`MAX_LATENT_FRAMES`].
    pub latent_frames: u32,
}

/// Most latent frames per chunk (a chunk's memory and time grow with it).
pub const MAX_LATENT_FRAMES: u32 = 16;
/// Longest session id and prompt accepted.
pub const MAX_ID_BYTES: usize = 256;
pub const MAX_PROMPT_BYTES: usize = 64 << 10;

impl CreateSession {
    /// Checks every field's bounds; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_LATENT_FRAMES).contains(&self.latent_frames) {
            return Err(format!("latent_frames: must be 1 to {MAX_LATENT_FRAMES}"));
        }
        if self.id.is_empty() || self.id.len() > MAX_ID_BYTES {
            return Err(format!("id: 1 to {MAX_ID_BYTES} bytes"));
        }
        if self.prompt.len() > MAX_PROMPT_BYTES {
            return Err(format!("prompt: at most {MAX_PROMPT_BYTES} bytes"));
        }
        Ok(())
    }
}

/// `POST /engine/v1/video/sessions/{id}/chunk`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkRequest {
    /// The prompt epoch the chunk belongs to (a prompt switch starts a new
    /// one; chunks of an old epoch are refused).
    pub epoch: u32,
    pub fidelity: Fidelity,
    /// Ordering key, lower runs first: a point in time, Unix seconds (when
    /// the stream's credit or slack runs out, or the request's arrival).
    pub key: f64,
    /// The stream's service credit, seconds (eviction keeps the lowest).
    pub credit: f64,
    /// Sequence-parallel degree: 2 when the gateway lent this chunk a donor
    /// engine (elastic SP; the emulated backend runs it at the profile's
    /// `sp2_factor` of the time, the donor spending as long on its half).
    #[serde(default = "sp1")]
    pub sp: u8,
}

fn sp1() -> u8 {
    1
}

/// A generated chunk.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChunkOut {
    /// Chunks generated for this session's current prompt before this one.
    pub index: u64,
    pub epoch: u32,
    pub fidelity: Fidelity,
    /// Chunks in the coalesced batch it ran in.
    pub batch: u32,
    /// Waiting for a batch, and in it, milliseconds.
    pub queue_ms: f64,
    pub compute_ms: f64,
    /// The pixel frames, PNG, base64.
    pub frames: Vec<String>,
}

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
        }
    }
}

/// Standard base64 with padding (frames on the wire).
pub fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(char::from(A[(n >> shift) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_the_rfc_vectors() {
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(super::base64(plain.as_bytes()), enc);
        }
    }
}
