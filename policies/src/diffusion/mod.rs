//! Image and whole-video generation co-served on one GPU pool (GenServe,
//! seed 003).
//!
//! Diffusion is predictable (a profile gives `T_img(b, w, h)` and
//! `T_step(w, h, F, p)`) and preemptible at step boundaries. The pool's
//! scheduler runs at every event (an arrival, an image batch's end, a video
//! round's end) and plans the GPUs that are free or held by a video at a
//! round boundary:
//! - [`Mode::Fcfs`]: arrival order, one image per batch, videos at the
//!   default SP degree to completion, never paused (the baseline,
//!   head-of-line blocking; in rounds like every mode, so live runs pay
//!   the same call per round).
//! - [`Mode::Preempt`]: + intelligent video preemption: at a round boundary
//!   the running video with slack pauses for waiting images; a paused video
//!   resumes when its budget gets tight or GPUs idle.
//! - [`Mode::Dp`]: + the SLO-aware DP scheduler (EDF same-size image batches
//!   with the deadline check, per-video candidates, knapsack over the GPUs).
//! - [`Mode::GenServe`]: + elastic sequence parallelism (the candidates span
//!   every SP degree, so a video's degree drops when images need GPUs, and
//!   only then below the default, and rises when GPUs idle).
//!
//! [`Pool`] is the state machine the gateway and the simulator drive with
//! events that carry `now`; [`plan`] is the decision, pure.

mod baseline;
mod dp;
mod pool;
mod profile;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::Deserialize;

pub use dp::{plan_dp, video_outlook, Outlook};
pub use pool::{Action, GpuUse, Pool, PoolStats, Refusal, RefuseReason};
pub use profile::{parse_size, DiffusionProfile, ImageSize, SizeId, VideoSize};

pub use crate::profile::ProfileError;

/// An engine (one GPU) of the pool, `0..N`.
pub type Gpu = u16;

/// The scheduler configurations of the ablation, each adding one mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Fcfs,
    Preempt,
    Dp,
    #[serde(rename = "genserve")]
    GenServe,
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fcfs" => Ok(Mode::Fcfs),
            "preempt" => Ok(Mode::Preempt),
            "dp" => Ok(Mode::Dp),
            "genserve" => Ok(Mode::GenServe),
            other => Err(format!("unknown diffusion scheduler `{other}` (fcfs, preempt, dp, genserve)")),
        }
    }
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Fcfs => "fcfs",
            Mode::Preempt => "preempt",
            Mode::Dp => "dp",
            Mode::GenServe => "genserve",
        }
    }
}

/// The `[diffusion]` knobs of the policy document.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedConfig {
    /// Which scheduler runs (the ablation's steps).
    pub mode: Mode,
    /// Denoising steps of a video between two decisions (`Δ_round`).
    pub round_steps: u32,
    /// The SP degrees a video may run at (elastic SP picks among them).
    pub sp_degrees: Vec<u32>,
    /// The degree a video runs at without elastic SP, and the one its solo
    /// latency (the SLO's base) is profiled at.
    pub default_sp: u32,
    /// Deadline = `slo_scale` (σ) × solo latency unless the request names one.
    pub slo_scale: f64,
    /// Most videos the DP weighs in one decision (the earliest deadlines;
    /// the rest wait for the next one). Bounds the solver's time.
    pub max_groups: usize,
    /// σ per tier (tier name → scale); tiers not named use `slo_scale`.
    pub tier_slo_scale: BTreeMap<String, f64>,
    /// Refuse a request whose deadline the pool cannot meet (reason and
    /// Retry-After); off, every request is queued and may finish late.
    pub admission: bool,
    /// Most jobs (images waiting and videos unfinished) the pool holds.
    pub max_jobs: usize,
    /// Most images one request may ask for (`n`).
    pub max_images: u32,
    /// How long a finished video's content is kept for download, seconds.
    pub result_ttl_s: u64,
    /// Model names the images and videos APIs answer to; the first is
    /// reported when a request names none.
    pub models: Vec<String>,
}

impl Default for SchedConfig {
    fn default() -> Self {
        Self {
            mode: Mode::GenServe,
            round_steps: 5,
            sp_degrees: vec![1, 2, 4, 8],
            default_sp: 2,
            slo_scale: 1.0,
            max_groups: 64,
            tier_slo_scale: BTreeMap::new(),
            admission: true,
            max_jobs: 256,
            max_images: 10,
            result_ttl_s: 3600,
            models: ["genserve-synthetic", "gpt-image-1", "dall-e-2", "dall-e-3", "sora-2", "sora-2-pro"]
                .map(String::from)
                .to_vec(),
        }
    }
}

impl SchedConfig {
    /// Checks the knobs; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.round_steps == 0 {
            return Err("diffusion.round_steps: must be at least 1".into());
        }
        if self.sp_degrees.is_empty() || self.sp_degrees.iter().any(|&p| !(1..=64).contains(&p)) {
            return Err("diffusion.sp_degrees: 1 to 64 each, at least one".into());
        }
        if !self.sp_degrees.contains(&self.default_sp) {
            return Err("diffusion.default_sp: must be one of sp_degrees".into());
        }
        if !(self.slo_scale.is_finite() && self.slo_scale > 0.0) {
            return Err("diffusion.slo_scale: must be > 0".into());
        }
        if !(1..=1024).contains(&self.max_groups) {
            return Err("diffusion.max_groups: 1 to 1024".into());
        }
        if let Some((t, _)) = self.tier_slo_scale.iter().find(|(_, v)| !(v.is_finite() && **v > 0.0)) {
            return Err(format!("diffusion.tier_slo_scale.{t}: must be > 0"));
        }
        if !(1..=100_000).contains(&self.max_jobs) || !(1..=64).contains(&self.max_images) {
            return Err("diffusion.max_jobs: 1 to 100000; diffusion.max_images: 1 to 64".into());
        }
        if !(1..=7 * 86_400).contains(&self.result_ttl_s) {
            return Err("diffusion.result_ttl_s: 1 s to 7 days".into());
        }
        if self.models.is_empty() {
            return Err("diffusion.models: at least one name".into());
        }
        Ok(())
    }

    /// σ for `tier`.
    pub fn slo_scale_of(&self, tier: &str) -> f64 {
        self.tier_slo_scale.get(tier).copied().unwrap_or(self.slo_scale)
    }

    /// The solo latency a request's deadline is based on.
    pub fn solo_ms(&self, profile: &DiffusionProfile, job: &JobKind) -> f64 {
        match *job {
            JobKind::Image { size, n } => profile.image_ms(size, n),
            JobKind::Video { size, frames } => profile.video_ms(size, frames, self.default_sp),
        }
    }
}

/// Whether work ending at `finish_ms` meets `deadline_ms`. Times are sums
/// of profiled durations in floating point: a video run in ten rounds ends
/// a few femtoseconds after the same video run in one, so "on time" allows
/// [`SAME_INSTANT_MS`] (a nanosecond, far below any step's length).
pub fn on_time(finish_ms: f64, deadline_ms: f64) -> bool {
    finish_ms <= deadline_ms + SAME_INSTANT_MS
}

/// Two times closer than this are the same instant ([`on_time`]).
pub const SAME_INSTANT_MS: f64 = 1e-6;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum JobKind {
    /// `n` images of one size (one request; served as one batch or more).
    Image {
        size: SizeId,
        n: u32,
    },
    Video {
        size: SizeId,
        frames: u32,
    },
}

/// An image waiting to run.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageReq {
    pub id: u64,
    pub size: SizeId,
    pub arrival_ms: f64,
    pub deadline_ms: f64,
}

/// Where a video the scheduler may decide about stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Place {
    /// Not started.
    Queued,
    /// Paused at a step boundary; its state stays on `home`.
    Paused { home: Gpu },
    /// At a round boundary, still holding `gpus` (lead first).
    Boundary { gpus: Vec<Gpu> },
}

/// A video the scheduler may decide about.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoReq {
    pub id: u64,
    pub size: SizeId,
    pub frames: u32,
    pub arrival_ms: f64,
    pub deadline_ms: f64,
    pub steps_left: u32,
    pub place: Place,
}

/// What the scheduler sees: the GPUs it may assign (free, or held by a
/// video at a boundary) and the work it may assign them to.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot<'a> {
    pub now_ms: f64,
    pub avail: &'a [Gpu],
    pub images: &'a [ImageReq],
    pub videos: &'a [VideoReq],
    /// GPUs elastic SP leaves free for the images expected during a round
    /// (Little's law over the recent image arrivals, [`Pool`] measures it):
    /// a video widens beyond the default degree only into GPUs past these.
    pub image_reserve: usize,
    /// No GPU is busy beyond `avail`: hopeless work may run at its base
    /// degree whatever the reserve (nothing waits on an idle pool).
    pub idle: bool,
}

/// One image batch on one GPU (same size, run to completion).
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub gpu: Gpu,
    pub size: SizeId,
    pub ids: Vec<u64>,
}

/// One round of a video: `steps` denoising steps on `gpus` (SP degree =
/// `gpus.len()`, lead first; the lead keeps the state and runs the decode).
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub id: u64,
    pub gpus: Vec<Gpu>,
    pub steps: u32,
}

/// A decision. Videos of the snapshot without a run wait (a video at a
/// boundary is paused, its state kept on its lead GPU).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub batches: Vec<Batch>,
    pub runs: Vec<Run>,
}

/// The decision of `cfg.mode` for `snap`.
pub fn plan(snap: &Snapshot, profile: &DiffusionProfile, cfg: &SchedConfig) -> Plan {
    match cfg.mode {
        Mode::Fcfs => baseline::plan_fcfs(snap, profile, cfg),
        Mode::Preempt => baseline::plan_preempt(snap, profile, cfg),
        Mode::Dp | Mode::GenServe => plan_dp(snap, profile, cfg),
    }
}
