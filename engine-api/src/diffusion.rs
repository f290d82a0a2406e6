//! Diffusion jobs on an engine (`/engine/v1/diffusion/…`, docs/api.md):
//! image batches run to completion; a video runs in rounds of denoising
//! steps, its state kept on the engine between rounds (paused) and moved
//! between engines by export / import when the scheduler resumes it
//! elsewhere.

use serde::{Deserialize, Serialize};

/// `POST`: one image batch ([`ImagesRequest`] → [`ImagesResponse`]).
pub const IMAGES_PATH: &str = "/engine/v1/diffusion/images";
/// `GET`: the engine's diffusion latency profile (TOML).
pub const PROFILE_PATH: &str = "/engine/v1/diffusion/profile";
/// Videos: `…/videos/{id}/steps` (`POST`, [`StepsRequest`]), `…/decode`
/// (`POST`, the animated PNG), `…/state` (`GET` export, `PUT` import),
/// `…/videos/{id}` (`DELETE`).
pub const VIDEOS_PREFIX: &str = "/engine/v1/diffusion/videos/";

/// Most images in one batch, and longest prompt.
pub const MAX_BATCH: usize = 64;
pub const MAX_PROMPT_BYTES: usize = 32 << 10;
/// Longest job id.
pub const MAX_ID_BYTES: usize = 128;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImagesRequest {
    /// `"WIDTHxHEIGHT"`, one the engine's profile lists.
    pub size: String,
    /// One prompt per image of the batch.
    pub prompts: Vec<String>,
    /// Noise seed of the first image (the next ones add one each).
    #[serde(default)]
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImagesResponse {
    /// Base64 PNGs, in prompt order.
    pub images: Vec<String>,
}

/// Run `steps` more denoising steps of a video at SP degree `sp`; the
/// first call creates the job from its spec.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepsRequest {
    pub prompt: String,
    pub size: String,
    pub frames: u32,
    pub total_steps: u32,
    pub steps: u32,
    pub sp: u32,
    #[serde(default)]
    pub seed: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepsResponse {
    pub steps_done: u32,
    pub steps_left: u32,
}

impl ImagesRequest {
    pub fn validate(&self) -> Result<(), String> {
        if self.prompts.is_empty() || self.prompts.len() > MAX_BATCH {
            return Err(format!("prompts: 1 to {MAX_BATCH}"));
        }
        if self.prompts.iter().any(|p| p.len() > MAX_PROMPT_BYTES) {
            return Err(format!("prompts: at most {MAX_PROMPT_BYTES} bytes each"));
        }
        Ok(())
    }
}

impl StepsRequest {
    pub fn validate(&self) -> Result<(), String> {
        if self.prompt.len() > MAX_PROMPT_BYTES {
            return Err(format!("prompt: at most {MAX_PROMPT_BYTES} bytes"));
        }
        if !(1..=10_000).contains(&self.total_steps) || self.steps == 0 || self.steps > self.total_steps {
            return Err("steps: 1 to total_steps (1 to 10000)".into());
        }
        if !(1..=2_000).contains(&self.frames) || !(1..=64).contains(&self.sp) {
            return Err("frames 1 to 2000, sp 1 to 64".into());
        }
        Ok(())
    }
}
