//! Streaming video: the playout model, service credit and urgency tiers
//! ([`playout`]), fidelity configurations with their profile, Pareto
//! frontier and quality floor ([`fidelity`]), per-chunk fidelity selection by
//! Bi-Modal Pareto Routing ([`bmpr`]), and placement: home engine,
//! admission, eviction and re-homing ([`placement`]). The `[video]` section
//! of the policy document is [`VideoConfig`].

pub mod bmpr;
pub mod cost;
pub mod fidelity;
pub mod fleet;
pub mod placement;
pub mod playout;

use serde::Deserialize;

pub use fidelity::{frontier, quality_floor, ConfigPoint, Fidelity, Precision, VideoProfile};
pub use playout::{credit, urgency, Playout, Urgency};

/// How engines order ready chunks (the lower key runs first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChunkOrder {
    /// Lowest service credit first (the product).
    Credit,
    /// Lowest slack first (a baseline).
    LeastSlack,
    /// Oldest request first (a baseline).
    Fifo,
}

impl ChunkOrder {
    /// The engine ordering key of a chunk asked for at `now` (seconds on a
    /// clock every gateway of the fleet shares): a point in time, so that
    /// a request waiting in the engine's queue ages against later ones.
    /// Credit and slack fall one second per second while a chunk is
    /// awaited, so ordering by when they run out is ordering by their value
    /// at batch time; a key frozen at request time would let streams that
    /// ask again and again starve one that asked once.
    pub fn key(self, now: f64, credit_s: f64, slack_s: f64) -> f64 {
        match self {
            Self::Credit => now + credit_s,
            Self::LeastSlack => now + slack_s,
            Self::Fifo => now,
        }
    }
}

/// How a moving stream's state travels between engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransferMode {
    /// The target pulls a copy from the source while the stream keeps
    /// generating there, then only what changed at the switch (the
    /// product).
    Async,
    /// Export from the source, through the gateway, import on the target,
    /// the stream waiting throughout (SlackServe's "Sync" arm; a baseline).
    Sync,
}

/// How each chunk's fidelity is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FidelityMode {
    /// Bi-Modal Pareto Routing per chunk (the product).
    Bmpr,
    /// Always the profile's highest-quality configuration (a baseline).
    Static,
    /// Three fixed frontier levels switched by the stream's tier
    /// ([`bmpr::fixed_level`]; SlackServe's fixed-level baseline).
    Levels,
}

/// `[video]`: streaming video scheduling. Docs: docs/policies.md.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VideoConfig {
    /// Urgency margin α: URGENT below α·T of credit, RELAXED above 2α·T.
    pub alpha: f64,
    /// Initial slack budget of a stream (and after a prompt switch), in
    /// estimated first-chunk times.
    pub initial_slack_factor: f64,
    /// Seconds between control ticks (re-homing plans).
    pub control_tick_s: f64,
    /// A stream moves at most once in this many seconds.
    pub rehome_cooldown_s: f64,
    /// Streams one engine may send per tick.
    pub max_out_per_tick: u32,
    /// Streams one engine may receive per tick.
    pub max_in_per_tick: u32,
    /// Generation stops running ahead once this much video is buffered.
    pub max_buffer_s: f64,
    pub order: ChunkOrder,
    pub fidelity: FidelityMode,
    pub rehoming: bool,
    /// How a moving stream's state travels.
    pub transfer: TransferMode,
    /// Elastic sequence parallelism (SlackServe §4.3): a stream whose
    /// credit goes negative borrows the highest-credit RELAXED engine as a
    /// donor until it is out of the URGENT tier.
    pub elastic_sp: bool,
    /// Frames per second when the request gives none.
    pub default_fps: u32,
    /// Pixel frames per chunk when the request gives none (4 per latent frame).
    pub default_frames_per_chunk: u32,
    /// A stream paused longer than this ends (`paused_too_long`): a paused
    /// stream still holds a place on its engine.
    pub max_pause_s: f64,
    /// `[video.fleet]`: placement and autoscaling of sessions.
    pub fleet: fleet::FleetConfig,
}

impl Default for VideoConfig {
    fn default() -> Self {
        Self {
            alpha: 2.0,
            initial_slack_factor: 4.0,
            control_tick_s: 3.0,
            rehome_cooldown_s: 60.0,
            max_out_per_tick: 2,
            max_in_per_tick: 1,
            max_buffer_s: 6.0,
            order: ChunkOrder::Credit,
            fidelity: FidelityMode::Bmpr,
            rehoming: true,
            transfer: TransferMode::Async,
            elastic_sp: true,
            default_fps: 16,
            default_frames_per_chunk: 12,
            max_pause_s: 600.0,
            fleet: fleet::FleetConfig::default(),
        }
    }
}

impl VideoConfig {
    /// Range checks, naming the key.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        // Upper bounds too: times become `Duration`s and sleeps, where an
        // absurd value (1e20 s) would overflow instead of meaning "never".
        let within = |v: f64, most: f64| v > 0.0 && v <= most;
        if !within(self.alpha, 100.0) {
            return Err(("video.alpha", "must be in (0, 100]".into()));
        }
        if !within(self.initial_slack_factor, 100.0) {
            return Err(("video.initial_slack_factor", "must be in (0, 100]".into()));
        }
        if !within(self.control_tick_s, 3600.0) {
            return Err(("video.control_tick_s", "must be in (0, 3600]".into()));
        }
        if !(0.0..=86_400.0).contains(&self.rehome_cooldown_s) {
            return Err(("video.rehome_cooldown_s", "must be in [0, 86400]".into()));
        }
        if !within(self.max_buffer_s, 3600.0) {
            return Err(("video.max_buffer_s", "must be in (0, 3600]".into()));
        }
        if !within(self.max_pause_s, 86_400.0) {
            return Err(("video.max_pause_s", "must be in (0, 86400]".into()));
        }
        if self.default_fps == 0 || self.default_fps > 120 {
            return Err(("video.default_fps", "must be in [1, 120]".into()));
        }
        if self.default_frames_per_chunk == 0 || self.default_frames_per_chunk % 4 != 0 {
            return Err(("video.default_frames_per_chunk", "must be a positive multiple of 4".into()));
        }
        self.fleet.validate()
    }
}
