//! Video session wire types: what a gateway asks an engine for (create a
//! session, the next chunk at a fidelity) and what comes back.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use policies::video::fidelity::{Fidelity, Precision};

/// Output resolution presets: latent `h × w` tokens per latent frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resolution {
    /// 32 × 32 pixels (8 × 8 latent).
    Tiny,
    /// 64 × 64 pixels (16 × 16 latent).
    Small,
}

impl Resolution {
    pub fn latent_side(self) -> usize {
        match self {
            Resolution::Tiny => 8,
            Resolution::Small => 16,
        }
    }

    pub fn pixels(self) -> usize {
        self.latent_side() * 4
    }
}

impl FromStr for Resolution {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tiny" => Ok(Resolution::Tiny),
            "small" => Ok(Resolution::Small),
            other => Err(format!("unknown resolution `{other}` (tiny, small)")),
        }
    }
}

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
    /// The chunk wanted, by its index within the prompt epoch (resuming a
    /// stream another gateway drove: [`RECENT_CHUNKS`]). A chunk already
    /// generated is answered from the engine's recent chunks (`replayed`);
    /// the next one is generated; anything else is refused
    /// (`chunk_in_flight`: one is being generated, retry; `chunk_gone`).
    /// Absent: the next chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<u64>,
}

/// Chunks an engine keeps per session after generating them, for a
/// gateway that resumes the stream from the last chunk its client saw.
pub const RECENT_CHUNKS: usize = 16;

fn sp1() -> u8 {
    1
}

impl ChunkRequest {
    /// Checks every field's bounds; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !self.key.is_finite() {
            return Err("key: must be a finite number".into());
        }
        if !self.credit.is_finite() {
            return Err("credit: must be a finite number".into());
        }
        if !(1..=2).contains(&self.sp) {
            return Err("sp: 1 or 2".into());
        }
        Ok(())
    }
}

/// `POST /engine/v1/video/sessions/{id}/prompt`: a prompt switch.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptSwitch {
    pub prompt: String,
}

impl PromptSwitch {
    pub fn validate(&self) -> Result<(), String> {
        if self.prompt.len() > MAX_PROMPT_BYTES {
            return Err(format!("prompt: at most {MAX_PROMPT_BYTES} bytes"));
        }
        Ok(())
    }
}

/// `POST /engine/v1/video/lend`: lend this engine's device for `ms` to a
/// chunk running with sequence parallelism elsewhere (elastic SP).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lend {
    pub ms: f64,
}

/// The longest loan, milliseconds.
pub const MAX_LEND_MS: f64 = 60_000.0;

impl Lend {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.ms.is_finite() && (0.0..=MAX_LEND_MS).contains(&self.ms)) {
            return Err("ms: 0 to 60000".into());
        }
        Ok(())
    }
}

/// `POST /engine/v1/video/sessions/{id}/offer`: the token a peer engine
/// pulls the session's state with (migration).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Offer {
    pub token: String,
}

/// The shortest and longest offer token (the gateway's are 32 hex digits).
pub const MIN_OFFER_TOKEN_LEN: usize = 16;
pub const MAX_OFFER_TOKEN_LEN: usize = 256;

impl Offer {
    pub fn validate(&self) -> Result<(), String> {
        if !(MIN_OFFER_TOKEN_LEN..=MAX_OFFER_TOKEN_LEN).contains(&self.token.len()) {
            return Err(format!("token: {MIN_OFFER_TOKEN_LEN} to {MAX_OFFER_TOKEN_LEN} characters"));
        }
        Ok(())
    }
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
    /// Answered from the engine's recent chunks (asked for with `at`), not
    /// generated for this request.
    #[serde(default)]
    pub replayed: bool,
}

/// A session's state at a point of its generation: the prompt epoch and
/// the chunks generated under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    pub epoch: u32,
    pub chunks: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_video_request_names_its_bad_field() {
        let chunk = |key: f64, credit: f64, sp: u8| ChunkRequest {
            epoch: 0,
            fidelity: Fidelity::HIGHEST,
            key,
            credit,
            sp,
            at: None,
        };
        assert!(chunk(1.0, 2.0, 1).validate().is_ok() && chunk(1.0, 2.0, 2).validate().is_ok());
        assert!(chunk(f64::NAN, 2.0, 1).validate().unwrap_err().starts_with("key"));
        assert!(chunk(1.0, f64::INFINITY, 1).validate().unwrap_err().starts_with("credit"));
        assert!(chunk(1.0, 2.0, 3).validate().unwrap_err().starts_with("sp"));
        assert!(PromptSwitch { prompt: "x".repeat(MAX_PROMPT_BYTES + 1) }.validate().is_err());
        assert!(PromptSwitch { prompt: "a cat".into() }.validate().is_ok());
        for ms in [-1.0, 60_001.0, f64::NAN] {
            assert_eq!(Lend { ms }.validate().unwrap_err(), "ms: 0 to 60000");
        }
        assert!(Lend { ms: 250.0 }.validate().is_ok());
        for len in [15, 257] {
            assert_eq!(
                Offer { token: "t".repeat(len) }.validate().unwrap_err(),
                "token: 16 to 256 characters"
            );
        }
        assert!(Offer { token: "t".repeat(32) }.validate().is_ok());
    }
}
