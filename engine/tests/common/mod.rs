//! Helpers shared by the engine's integration tests.

#[allow(dead_code)]
pub mod process;
#[allow(dead_code)]
pub mod text;

use policies::video::{ConfigPoint, Fidelity, VideoProfile};

/// A video profile with every configuration at 10 ms per step and quality
/// 0.9: enough for the scheduler, which only reads it for batch costs.
#[allow(dead_code)]
pub fn video_profile(engine_class: &str, latent_frames: u32) -> VideoProfile {
    let configs = Fidelity::sweep()
        .into_iter()
        .map(|f| ConfigPoint { fidelity: f, chunk_ms: f64::from(f.steps) * 10.0, quality: 0.9 })
        .collect();
    VideoProfile {
        model: "m".into(),
        engine_class: engine_class.into(),
        latent_frames,
        batch_cost: 0.5,
        sp2_factor: 0.6,
        configs,
    }
}
