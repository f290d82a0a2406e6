//! Diffusion latency profiles: `T_img(b, w, h)` per image batch and
//! `T_step(w, h, F, p)` per video denoising step (GenServe §3: diffusion is
//! predictable, so a profile table is the scheduler's whole cost model).
//!
//! A profile is a TOML file under `policies/profiles/` (`genserve-*.toml`),
//! measured by `engine profile --diffusion` on a backend or taken from the
//! paper's published tables. Sizes are the API's `"WIDTHxHEIGHT"` strings;
//! a request for a size the profile does not list is refused with a 400.

use serde::Deserialize;

use super::ProfileError;

/// One image size: a batch of `b` images runs `steps` steps of
/// `step_ms · (1 + batch_slope · (b − 1))` each, then decodes each image.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSize {
    pub size: String,
    /// One denoising step of a batch of one, milliseconds.
    pub step_ms: f64,
    /// What each extra image in a batch adds to a step, as a share of
    /// `step_ms` (low resolutions underuse the GPU: batching is cheap).
    pub batch_slope: f64,
    /// VAE decode of one image, milliseconds.
    pub vae_ms: f64,
}

/// One video size: a denoising step of `frames` frames on `p` GPUs
/// (sequence parallelism) takes
/// `step_ms · frames / ref_frames · (1/p) · (1 + sp_comm · log2 p)`;
/// the VAE decode runs on one GPU whatever `p` was.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VideoSize {
    pub size: String,
    /// One step at SP degree 1 for `ref_frames` frames, milliseconds.
    pub step_ms: f64,
    /// Communication added per doubling of the SP degree, as a share of the
    /// per-GPU compute (what makes SP scale poorly at low resolutions).
    pub sp_comm: f64,
    /// VAE decode of `ref_frames` frames, milliseconds.
    pub vae_ms: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    model: String,
    engine_class: String,
    #[serde(default)]
    #[allow(dead_code)] // free text for humans: where the numbers came from
    source: String,
    image_steps: u32,
    video_steps: u32,
    video_fps: u32,
    ref_frames: u32,
    max_seconds: u32,
    max_batch: u32,
    /// Moving a paused video's state to another GPU (offload + reload), ms.
    #[serde(default)]
    migrate_ms: f64,
    /// Every time in the file is multiplied by this (a compressed clock for
    /// live runs of the published tables on a small machine; put it first
    /// in the file, before the tables).
    #[serde(default = "one")]
    time_scale: f64,
    image: Vec<ImageSize>,
    video: Vec<VideoSize>,
}

fn one() -> f64 {
    1.0
}

/// A validated diffusion profile. Construct with [`DiffusionProfile::parse`].
#[derive(Debug, Clone, PartialEq)]
pub struct DiffusionProfile {
    pub model: String,
    pub engine_class: String,
    pub image_steps: u32,
    pub video_steps: u32,
    pub video_fps: u32,
    ref_frames: u32,
    /// Longest video a request may ask for, seconds.
    pub max_seconds: u32,
    /// Largest image batch an engine runs.
    pub max_batch: u32,
    pub migrate_ms: f64,
    pub images: Vec<ImageSize>,
    pub videos: Vec<VideoSize>,
}

/// Index of an image size in [`DiffusionProfile::images`] (or of a video
/// size in [`DiffusionProfile::videos`]).
pub type SizeId = usize;

impl DiffusionProfile {
    /// Parses and validates a profile; `file` is only used in errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, ProfileError> {
        let raw: Raw = toml::from_str(text)
            .map_err(|e| ProfileError::Parse { file: file.to_string(), message: e.to_string() })?;
        let bad = |key: &'static str, message: &str| ProfileError::Invalid {
            file: file.to_string(),
            key,
            message: message.to_string(),
        };
        let pos = |v: f64| v.is_finite() && v > 0.0;
        let nonneg = |v: f64| v.is_finite() && v >= 0.0;
        if raw.image_steps == 0 || raw.video_steps == 0 || raw.video_fps == 0 || raw.ref_frames == 0 {
            return Err(bad("image_steps", "steps, fps and ref_frames must be at least 1"));
        }
        if !(1..=64).contains(&raw.max_batch) || !(1..=120).contains(&raw.max_seconds) {
            return Err(bad("max_batch", "max_batch 1 to 64, max_seconds 1 to 120"));
        }
        if !pos(raw.time_scale) {
            return Err(bad("time_scale", "must be > 0"));
        }
        if !nonneg(raw.migrate_ms) {
            return Err(bad("migrate_ms", "must be finite and >= 0"));
        }
        if raw.image.is_empty() || raw.video.is_empty() {
            return Err(bad("image", "needs at least one image and one video size"));
        }
        for i in &raw.image {
            if parse_size(&i.size).is_none() || !pos(i.step_ms) || !nonneg(i.batch_slope) || !nonneg(i.vae_ms)
            {
                return Err(bad(
                    "image",
                    &format!("size `{}`: WxH, step_ms > 0, slope and vae >= 0", i.size),
                ));
            }
        }
        for v in &raw.video {
            if parse_size(&v.size).is_none() || !pos(v.step_ms) || !nonneg(v.sp_comm) || !nonneg(v.vae_ms) {
                return Err(bad(
                    "video",
                    &format!("size `{}`: WxH, step_ms > 0, sp_comm and vae >= 0", v.size),
                ));
            }
        }
        let scale = raw.time_scale;
        Ok(Self {
            model: raw.model,
            engine_class: raw.engine_class,
            image_steps: raw.image_steps,
            video_steps: raw.video_steps,
            video_fps: raw.video_fps,
            ref_frames: raw.ref_frames,
            max_seconds: raw.max_seconds,
            max_batch: raw.max_batch,
            migrate_ms: raw.migrate_ms,
            images: raw.image,
            videos: raw.video,
        }
        .scaled(scale))
    }

    /// The same tables with every time multiplied by `factor` (a faster
    /// clock for live runs on a small machine; a slower device).
    pub fn scaled(&self, factor: f64) -> Self {
        let f = if factor.is_finite() && factor > 0.0 { factor } else { 1.0 };
        let mut p = self.clone();
        p.migrate_ms *= f;
        p.images.iter_mut().for_each(|i| {
            i.step_ms *= f;
            i.vae_ms *= f;
        });
        p.videos.iter_mut().for_each(|v| {
            v.step_ms *= f;
            v.vae_ms *= f;
        });
        p
    }

    pub fn image_size(&self, size: &str) -> Option<SizeId> {
        self.images.iter().position(|i| i.size == size)
    }

    pub fn video_size(&self, size: &str) -> Option<SizeId> {
        self.videos.iter().position(|v| v.size == size)
    }

    /// Frames of a video of `seconds` (the first frame plus `fps` per second).
    pub fn frames(&self, seconds: u32) -> u32 {
        seconds * self.video_fps + 1
    }

    /// One denoising step of an image batch of `b`, milliseconds.
    pub fn image_step_ms(&self, size: SizeId, b: u32) -> f64 {
        let i = &self.images[size];
        i.step_ms * (1.0 + i.batch_slope * f64::from(b.max(1) - 1))
    }

    /// `T_img(b, w, h)`: a whole batch of `b` images, decode included.
    pub fn image_ms(&self, size: SizeId, b: u32) -> f64 {
        let i = &self.images[size];
        f64::from(self.image_steps) * self.image_step_ms(size, b) + i.vae_ms * f64::from(b.max(1))
    }

    /// `T_step(w, h, F, p)`: one video denoising step on `p` GPUs.
    pub fn video_step_ms(&self, size: SizeId, frames: u32, p: u32) -> f64 {
        let v = &self.videos[size];
        let p = f64::from(p.max(1));
        let base = v.step_ms * f64::from(frames) / f64::from(self.ref_frames);
        base / p * (1.0 + v.sp_comm * p.log2())
    }

    /// The VAE decode of a video (one GPU), milliseconds.
    pub fn video_vae_ms(&self, size: SizeId, frames: u32) -> f64 {
        self.videos[size].vae_ms * f64::from(frames) / f64::from(self.ref_frames)
    }

    /// A whole video run alone at SP degree `p`.
    pub fn video_ms(&self, size: SizeId, frames: u32, p: u32) -> f64 {
        f64::from(self.video_steps) * self.video_step_ms(size, frames, p) + self.video_vae_ms(size, frames)
    }
}

/// `"1024x768"` → `(1024, 768)`; sides 1 to 8,192.
pub fn parse_size(s: &str) -> Option<(u32, u32)> {
    let (w, h) = s.split_once('x')?;
    let (w, h) = (w.parse::<u32>().ok()?, h.parse::<u32>().ok()?);
    ((1..=8192).contains(&w) && (1..=8192).contains(&h)).then_some((w, h))
}
