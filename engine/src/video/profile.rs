//! `engine profile --video`: measures the video model's latency and quality
//! for every fidelity configuration (S ∈ {2,3,4}, ρ ∈ {0, .6, .7, .8, .9},
//! W ∈ {1,3,7}, Q ∈ {fp16, fp8}) and the marginal cost of coalescing, and
//! writes a video profile (`policies::video::VideoProfile`).
//!
//! Each configuration generates the same `chunks`-chunk streams as the
//! reference (the highest-fidelity configuration) for the same prompts;
//! latency is the median chunk time, quality the mean SSIM of its frames
//! against the reference's, chunk by chunk. `batch_cost` compares a
//! coalesced batch of 4 reference chunks with one.

use policies::video::{ConfigPoint, Fidelity, VideoProfile};

use super::batch::denoise_batch;
use super::model::{ssim, Resolution, StreamState, VideoModel};
use crate::gpu::video::VideoRunner;
use crate::models::video::BatchItem;
use crate::stats::median;

/// Where the measured chunks run.
#[derive(Clone, Copy)]
pub enum Runner<'a> {
    /// The cpu backend, chunks of a batch over `threads` threads.
    Cpu { threads: usize },
    /// A GPU (the cuda backend); times include uploads and downloads.
    Gpu(&'a dyn VideoRunner),
}

impl Runner<'_> {
    /// Runs one coalesced batch; each member's frames.
    fn batch(&self, model: &VideoModel, mut items: Vec<BatchItem<'_>>) -> Vec<Vec<Vec<u8>>> {
        match self {
            Runner::Cpu { threads } => {
                let res: Vec<Resolution> = items.iter().map(|i| i.res).collect();
                let latents = denoise_batch(model, items, *threads);
                latents.iter().zip(res).map(|(l, r)| model.decode(l, r)).collect()
            }
            Runner::Gpu(gpu) => match gpu.run(model, &mut items) {
                Ok(out) => out.into_iter().map(|c| c.frames).collect(),
                Err(e) => panic!("the GPU failed while profiling: {e}"),
            },
        }
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct VideoProfileArgs {
    pub resolution: Resolution,
    pub latent_frames: usize,
    pub chunks: usize,
    pub prompts: Vec<String>,
    pub threads: usize,
    pub model_seed: u64,
    pub engine_class: String,
    pub model: String,
}

/// Runs the sweep on `runner`; `progress` is told each configuration as it
/// finishes. A chunk's time covers denoising and frame decoding.
pub fn measure(
    args: &VideoProfileArgs,
    runner: Runner<'_>,
    mut progress: impl FnMut(usize, usize, &ConfigPoint),
) -> VideoProfile {
    let model = VideoModel::new(args.model_seed);
    let run = |fid: &Fidelity| -> (Vec<f64>, Vec<Vec<Vec<u8>>>) {
        let mut times = Vec::new();
        let mut frames = Vec::new();
        for p in &args.prompts {
            let mut st = StreamState::new(p);
            for _ in 0..args.chunks {
                let item = BatchItem {
                    session: None,
                    state: &mut st,
                    fidelity: *fid,
                    res: args.resolution,
                    latent_frames: args.latent_frames,
                };
                let t = crate::clock::now();
                let mut out = runner.batch(&model, vec![item]);
                times.push(crate::clock::since(t).as_secs_f64() * 1e3);
                frames.push(out.pop().unwrap_or_default());
            }
        }
        (times, frames)
    };
    let (_, reference) = run(&Fidelity::HIGHEST);
    let side = args.resolution.pixels();
    let sweep = Fidelity::sweep();
    let mut configs = Vec::new();
    for (i, fid) in sweep.iter().enumerate() {
        let (times, frames) = run(fid);
        let quality =
            reference.iter().zip(&frames).map(|(a, b)| ssim(a, b, side)).sum::<f64>() / frames.len() as f64;
        let point = ConfigPoint { fidelity: *fid, chunk_ms: median(times), quality: quality.clamp(0.0, 1.0) };
        progress(i + 1, sweep.len(), &point);
        configs.push(point);
    }
    let batch_cost = measure_batch_cost(&model, args, runner);
    VideoProfile {
        model: args.model.clone(),
        engine_class: args.engine_class.clone(),
        latent_frames: args.latent_frames as u32,
        batch_cost,
        sp2_factor: policies::video::fidelity::DEFAULT_SP2_FACTOR,
        configs,
    }
}

/// `(T(4) / T(1) − 1) / 3` for reference chunks, in [0, 1].
fn measure_batch_cost(model: &VideoModel, args: &VideoProfileArgs, runner: Runner<'_>) -> f64 {
    let time = |k: usize| -> f64 {
        let mut samples = Vec::new();
        for _ in 0..3 {
            let mut states: Vec<StreamState> =
                (0..k).map(|i| StreamState::new(&format!("batch probe {i}"))).collect();
            let items = states
                .iter_mut()
                .map(|state| BatchItem {
                    session: None,
                    state,
                    fidelity: Fidelity::HIGHEST,
                    res: args.resolution,
                    latent_frames: args.latent_frames,
                })
                .collect();
            let t = crate::clock::now();
            runner.batch(model, items);
            samples.push(crate::clock::since(t).as_secs_f64());
        }
        median(samples)
    };
    let (one, four) = (time(1), time(4));
    ((four / one - 1.0) / 3.0).clamp(0.0, 1.0)
}

/// A GPU-class profile from a measured one: quality as measured, chunk
/// times from the DiT cost model (`policies::video::cost`: Wan-2.1-1.3B's
/// shapes, the products as measured on an H100 and the attention at
/// FlashAttention-3's rates, fp8 shortening the attention share only)
/// scaled so the highest-fidelity configuration takes
/// `reference_ms`. (On the cpu backend fp8 is simulated and so costs more,
/// not less: its measured times are not a GPU's.) `batch_cost` is the
/// marginal cost of one more chunk in a batch.
pub fn rescale(
    profile: &VideoProfile,
    reference_ms: f64,
    batch_cost: f64,
    engine_class: &str,
) -> VideoProfile {
    use policies::video::cost::{DitShape, Rates};
    let (shape, rates) = (DitShape::WAN_1_3B, Rates::H100_FA3);
    let top = rates.chunk_ms(&shape, &Fidelity::HIGHEST);
    let mut out = profile.clone();
    out.engine_class = engine_class.to_string();
    out.batch_cost = batch_cost.clamp(0.0, 1.0);
    for c in &mut out.configs {
        c.chunk_ms = reference_ms * rates.chunk_ms(&shape, &c.fidelity) / top;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rescaled_profiles_keep_quality_and_put_the_reference_at_its_time() {
        let configs = Fidelity::sweep()
            .into_iter()
            .map(|f| ConfigPoint { fidelity: f, chunk_ms: 1.0, quality: f64::from(f.steps) / 4.0 })
            .collect();
        let measured = VideoProfile {
            model: "m".into(),
            engine_class: "cpu".into(),
            latent_frames: 3,
            batch_cost: 0.5,
            sp2_factor: 0.6,
            configs,
        };
        let p = rescale(&measured, 600.0, 0.3, "emulated-x");
        assert!((p.point(&Fidelity::HIGHEST).unwrap().chunk_ms - 600.0).abs() < 1e-9);
        assert_eq!(p.batch_cost, 0.3);
        let fast = p.fastest();
        assert_eq!(fast.fidelity.steps, 2);
        assert!(fast.chunk_ms < 200.0, "{fast:?}");
        assert_eq!(p.best().quality, 1.0);
        // fp8 shortens the attention only: never the whole chunk's 0.5.
        for c in p.configs.iter().filter(|c| c.fidelity.precision == policies::video::Precision::Fp8) {
            let fp16 = Fidelity { precision: policies::video::Precision::Fp16, ..c.fidelity };
            let ratio = c.chunk_ms / p.point(&fp16).unwrap().chunk_ms;
            assert!((0.5..1.0).contains(&ratio), "{:?}: {ratio}", c.fidelity);
        }
    }
}
