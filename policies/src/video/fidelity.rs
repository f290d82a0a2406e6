//! Fidelity configurations of the chunked video model and their profile:
//! the per-chunk latency and quality of every configuration, the Pareto
//! frontier over (latency, quality), and the quality floor.
//!
//! A configuration is (S denoising steps, attention sparsity ρ, KV window W
//! chunks, precision Q). Quality is the mean SSIM of a configuration's frames
//! against the highest-fidelity configuration's frames for the same prompt
//! and chunk (1.0 = identical), measured by `engine profile --video`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Arithmetic precision of the denoiser (fp8 is simulated by quantising and
/// dequantising activations on backends without it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp16,
    Fp8,
}

/// One fidelity configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Fidelity {
    /// Denoising steps per chunk (S).
    pub steps: u8,
    /// Share of attention key blocks skipped, in percent (ρ × 100).
    pub sparsity_pct: u8,
    /// Past chunks attended to besides the sink (W).
    pub window: u8,
    pub precision: Precision,
}

impl Fidelity {
    /// The reference: most steps, dense attention, widest window, fp16.
    pub const HIGHEST: Fidelity =
        Fidelity { steps: 4, sparsity_pct: 0, window: 7, precision: Precision::Fp16 };

    /// ρ as a fraction.
    pub fn sparsity(&self) -> f64 {
        f64::from(self.sparsity_pct) / 100.0
    }

    /// Context blocks attention keeps out of `blocks`: all but ⌊ρ·blocks⌋.
    pub fn kept_blocks(&self, blocks: usize) -> usize {
        blocks - ((blocks as f64) * self.sparsity()).floor() as usize
    }

    /// Every configuration `engine profile --video` measures:
    /// S ∈ {2,3,4}, ρ ∈ {0, 0.6, 0.7, 0.8, 0.9}, W ∈ {1,3,7}, Q ∈ {fp16, fp8}.
    pub fn sweep() -> Vec<Fidelity> {
        let mut out = Vec::new();
        for steps in [2, 3, 4] {
            for sparsity_pct in [0, 60, 70, 80, 90] {
                for window in [1, 3, 7] {
                    for precision in [Precision::Fp16, Precision::Fp8] {
                        out.push(Fidelity { steps, sparsity_pct, window, precision });
                    }
                }
            }
        }
        out
    }
}

impl fmt::Display for Fidelity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let q = match self.precision {
            Precision::Fp16 => "fp16",
            Precision::Fp8 => "fp8",
        };
        write!(f, "S{}-r{:.1}-W{}-{q}", self.steps, self.sparsity(), self.window)
    }
}

/// One measured configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConfigPoint {
    pub fidelity: Fidelity,
    /// Time to generate one chunk alone on the engine, milliseconds.
    pub chunk_ms: f64,
    /// Mean SSIM against the highest-fidelity output (1.0 = identical).
    pub quality: f64,
}

/// Errors loading a video profile.
#[derive(Debug, thiserror::Error)]
pub enum VideoProfileError {
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    #[error("{file}: {message}")]
    Invalid { file: String, message: String },
}

/// SP2's chunk time over SP1's when a profile does not say: half the work
/// plus 10% of a chunk in communication (SlackServe restricts elastic SP
/// to intra-node SP2, where all-to-all over NVLink is cheap).
pub const DEFAULT_SP2_FACTOR: f64 = 0.6;

fn default_sp2_factor() -> f64 {
    DEFAULT_SP2_FACTOR
}

/// A validated video profile (TOML, see `policies/profiles/video-*.toml`).
#[derive(Debug, Clone, PartialEq)]
pub struct VideoProfile {
    pub model: String,
    pub engine_class: String,
    /// Latent frames per chunk the measurements were taken at.
    pub latent_frames: u32,
    /// A coalesced batch of k chunks takes `chunk_ms × (1 + batch_cost ×
    /// (k − 1))`: the marginal cost of one more chunk in the batch.
    pub batch_cost: f64,
    /// Elastic sequence parallelism over two engines (SlackServe §4.3): a
    /// chunk takes `chunk_ms × sp2_factor` (half the work plus the
    /// all-to-all communication), and the donor engine spends the same
    /// time on its half.
    pub sp2_factor: f64,
    pub configs: Vec<ConfigPoint>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    model: String,
    engine_class: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    source: String,
    latent_frames: u32,
    batch_cost: f64,
    #[serde(default = "default_sp2_factor")]
    sp2_factor: f64,
    configs: Vec<RawPoint>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPoint {
    steps: u8,
    sparsity: f64,
    window: u8,
    precision: Precision,
    chunk_ms: f64,
    quality: f64,
}

impl VideoProfile {
    /// Parses and validates a profile; `file` labels errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, VideoProfileError> {
        let raw: RawProfile = toml::from_str(text)
            .map_err(|e| VideoProfileError::Parse { file: file.into(), message: e.to_string() })?;
        let invalid = |message: String| VideoProfileError::Invalid { file: file.into(), message };
        if raw.configs.is_empty() {
            return Err(invalid("at least one configuration is required".into()));
        }
        if !(0.0..=1.0).contains(&raw.batch_cost) {
            return Err(invalid("`batch_cost` must be in [0, 1]".into()));
        }
        if !(raw.sp2_factor >= 0.5 && raw.sp2_factor <= 1.0) {
            return Err(invalid("`sp2_factor` must be in [0.5, 1]".into()));
        }
        let mut configs = Vec::new();
        for (i, p) in raw.configs.into_iter().enumerate() {
            if !(p.chunk_ms > 0.0 && p.chunk_ms.is_finite() && (0.0..=1.0).contains(&p.quality)) {
                return Err(invalid(format!("configs[{i}]: chunk_ms must be > 0 and quality in [0, 1]")));
            }
            if p.steps == 0 || p.window == 0 || !(0.0..1.0).contains(&p.sparsity) {
                return Err(invalid(format!("configs[{i}]: steps, window >= 1 and sparsity in [0, 1)")));
            }
            let sparsity_pct = (p.sparsity * 100.0).round() as u8;
            let fidelity =
                Fidelity { steps: p.steps, sparsity_pct, window: p.window, precision: p.precision };
            configs.push(ConfigPoint { fidelity, chunk_ms: p.chunk_ms, quality: p.quality });
        }
        Ok(Self {
            model: raw.model,
            engine_class: raw.engine_class,
            latent_frames: raw.latent_frames,
            batch_cost: raw.batch_cost,
            sp2_factor: raw.sp2_factor,
            configs,
        })
    }

    /// The profile as TOML (what `engine profile --video` writes).
    pub fn to_toml(&self, source: &str) -> String {
        let raw = RawProfile {
            model: self.model.clone(),
            engine_class: self.engine_class.clone(),
            source: source.to_string(),
            latent_frames: self.latent_frames,
            batch_cost: self.batch_cost,
            sp2_factor: self.sp2_factor,
            configs: self
                .configs
                .iter()
                .map(|c| RawPoint {
                    steps: c.fidelity.steps,
                    sparsity: c.fidelity.sparsity(),
                    window: c.fidelity.window,
                    precision: c.fidelity.precision,
                    chunk_ms: (c.chunk_ms * 1000.0).round() / 1000.0,
                    quality: (c.quality * 1e5).round() / 1e5,
                })
                .collect(),
        };
        toml::to_string(&raw).expect("a profile serialises")
    }

    /// The measured point of `f`, if it was measured.
    pub fn point(&self, f: &Fidelity) -> Option<&ConfigPoint> {
        self.configs.iter().find(|c| c.fidelity == *f)
    }

    /// The highest-quality point (ties: the faster).
    pub fn best(&self) -> ConfigPoint {
        *self
            .configs
            .iter()
            .max_by(|a, b| a.quality.total_cmp(&b.quality).then(b.chunk_ms.total_cmp(&a.chunk_ms)))
            .expect("a profile has at least one configuration")
    }

    /// The fastest point (ties: the better).
    pub fn fastest(&self) -> ConfigPoint {
        *frontier(&self.configs).first().expect("a profile has at least one configuration")
    }

    /// Time of a coalesced batch of `k` chunks at a configuration taking
    /// `chunk_ms` alone.
    pub fn batch_ms(&self, chunk_ms: f64, k: usize) -> f64 {
        chunk_ms * (1.0 + self.batch_cost * (k.max(1) - 1) as f64)
    }

    /// The Pareto frontier of this profile (see [`frontier`]).
    pub fn frontier(&self) -> Vec<ConfigPoint> {
        frontier(&self.configs)
    }

    /// The quality floor: the median quality of all configurations.
    pub fn quality_floor(&self) -> f64 {
        quality_floor(&self.configs)
    }
}

/// The Pareto frontier over (latency, quality): points no other point beats
/// on both (faster or as fast, and better or as good, one strictly), sorted
/// by latency; quality strictly increases along it.
pub fn frontier(points: &[ConfigPoint]) -> Vec<ConfigPoint> {
    let mut sorted: Vec<ConfigPoint> = points.to_vec();
    sorted.sort_by(|a, b| a.chunk_ms.total_cmp(&b.chunk_ms).then(b.quality.total_cmp(&a.quality)));
    let mut out: Vec<ConfigPoint> = Vec::new();
    for p in sorted {
        if out.last().is_none_or(|last| p.quality > last.quality) {
            out.push(p);
        }
    }
    out
}

/// The median quality of `points` (the mean of the middle two for an even
/// count).
pub fn quality_floor(points: &[ConfigPoint]) -> f64 {
    let mut q: Vec<f64> = points.iter().map(|p| p.quality).collect();
    q.sort_by(f64::total_cmp);
    match q.len() {
        0 => 0.0,
        n if n % 2 == 1 => q[n / 2],
        n => (q[n / 2 - 1] + q[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(steps: u8, ms: f64, q: f64) -> ConfigPoint {
        let fidelity = Fidelity { steps, sparsity_pct: 0, window: 7, precision: Precision::Fp16 };
        ConfigPoint { fidelity, chunk_ms: ms, quality: q }
    }

    #[test]
    fn frontier_keeps_only_undominated_points_in_latency_order() {
        let pts =
            [p(1, 100.0, 0.90), p(2, 150.0, 0.85), p(3, 200.0, 0.97), p(4, 200.0, 0.95), p(5, 300.0, 1.0)];
        let f: Vec<u8> = frontier(&pts).iter().map(|c| c.fidelity.steps).collect();
        assert_eq!(f, vec![1, 3, 5]);
        assert_eq!(quality_floor(&pts), 0.95);
        assert_eq!(quality_floor(&pts[..4]), (0.90 + 0.95) / 2.0);
    }

    #[test]
    fn sweep_covers_the_grid_and_profiles_round_trip() {
        let sweep = Fidelity::sweep();
        assert_eq!(sweep.len(), 3 * 5 * 3 * 2);
        assert!(sweep.contains(&Fidelity::HIGHEST));
        assert_eq!(Fidelity::HIGHEST.to_string(), "S4-r0.0-W7-fp16");
        let profile = VideoProfile {
            model: "m".into(),
            engine_class: "c".into(),
            latent_frames: 3,
            batch_cost: 0.3,
            sp2_factor: DEFAULT_SP2_FACTOR,
            configs: vec![p(4, 400.0, 1.0), p(2, 150.0, 0.96)],
        };
        let back = VideoProfile::parse("p", &profile.to_toml("test")).unwrap();
        assert_eq!(back, profile);
        assert_eq!(back.best().fidelity.steps, 4);
        assert_eq!(back.fastest().fidelity.steps, 2);
        assert_eq!(back.batch_ms(100.0, 3), 160.0);
    }
}
