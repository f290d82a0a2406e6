//! Diffusion request traces: Poisson arrivals of image and video requests
//! with sizes drawn from a resolution setting, each with a deadline of
//! σ × its solo latency (the scheduler's own profile and default SP).

use policies::diffusion::{DiffusionProfile, JobKind, SchedConfig};
use policies::rng::SplitMix;
use serde::Serialize;

/// Share of each kind in the request stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mix {
    /// 75% images.
    ImageHeavy,
    /// 50% images.
    Balanced,
    /// 25% images.
    VideoHeavy,
}

impl Mix {
    pub const ALL: [Mix; 3] = [Mix::ImageHeavy, Mix::Balanced, Mix::VideoHeavy];

    pub fn image_share(self) -> f64 {
        match self {
            Mix::ImageHeavy => 0.75,
            Mix::Balanced => 0.5,
            Mix::VideoHeavy => 0.25,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mix::ImageHeavy => "image-heavy",
            Mix::Balanced => "balanced",
            Mix::VideoHeavy => "video-heavy",
        }
    }
}

/// How sizes are drawn: every profiled size equally (`uniform`), or
/// skewed to the largest (`skewed`: the largest size half the time, the
/// rest split evenly), the setting of GenServe's ablation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Resolutions {
    Uniform,
    Skewed,
}

/// What a trace is drawn from.
#[derive(Debug, Clone, Serialize)]
pub struct Spec {
    pub mix: Mix,
    pub resolutions: Resolutions,
    /// Requests per minute (Poisson).
    pub rate_per_min: f64,
    /// SLO scale σ.
    pub sigma: f64,
    pub requests: usize,
    /// Length of every video, seconds.
    pub video_seconds: u32,
}

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Request {
    pub at_ms: f64,
    pub video: bool,
    /// The API's size string.
    pub size: String,
    #[serde(skip)]
    pub kind: JobKind,
    /// Video length (0 for an image).
    pub seconds: u32,
    pub solo_ms: f64,
    pub deadline_ms: f64,
}

impl Request {
    /// `video` or `image`, for messages.
    pub fn kind_name(&self) -> &'static str {
        if self.video {
            "video"
        } else {
            "image"
        }
    }
}

fn pick(rng: &mut SplitMix, n: usize, resolutions: Resolutions) -> usize {
    let u = rng.unit_f64();
    match resolutions {
        Resolutions::Uniform => ((u * n as f64) as usize).min(n - 1),
        Resolutions::Skewed if n == 1 || u < 0.5 => n - 1,
        Resolutions::Skewed => (((u - 0.5) / 0.5 * (n - 1) as f64) as usize).min(n - 2),
    }
}

/// The trace of `spec` for `seed` (deterministic).
pub fn generate(spec: &Spec, profile: &DiffusionProfile, cfg: &SchedConfig, seed: u64) -> Vec<Request> {
    let mut rng = SplitMix(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1FF);
    let rate_per_ms = spec.rate_per_min / 60_000.0;
    let mut t = 0.0;
    let mut out = Vec::with_capacity(spec.requests);
    for _ in 0..spec.requests {
        t += rng.exponential(rate_per_ms);
        let video = rng.unit_f64() >= spec.mix.image_share();
        let (kind, size) = if video {
            let s = pick(&mut rng, profile.videos.len(), spec.resolutions);
            (
                JobKind::Video { size: s, frames: profile.frames(spec.video_seconds) },
                profile.videos[s].size.clone(),
            )
        } else {
            let s = pick(&mut rng, profile.images.len(), spec.resolutions);
            (JobKind::Image { size: s, n: 1 }, profile.images[s].size.clone())
        };
        let solo_ms = cfg.solo_ms(profile, &kind);
        let seconds = if video { spec.video_seconds } else { 0 };
        out.push(Request {
            at_ms: t,
            video,
            size,
            kind,
            seconds,
            solo_ms,
            deadline_ms: t + spec.sigma * solo_ms,
        });
    }
    out
}
