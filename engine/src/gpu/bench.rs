//! `engine gpu-bench`: the GPU benchmarks of docs/benchmarks.md, on the
//! first GPU (the tests run the same harness on the host emulator of the
//! kernels, which checks the harness, not the speed). Each result is the median of
//! `--repeats` timed runs after one warm-up run; times include every
//! launch, upload and download of the measured operation.
//!
//! - dense bf16 GEMM rate (cuBLAS, m = n = k = `--gemm-size`): the
//!   baseline the video step's rate is reported against;
//! - the video model's chunk at its largest configuration (highest
//!   fidelity, full window, `--video-resolution`, `--video-latent-frames`):
//!   achieved TFLOP/s of its denoising steps, and the ratio to the GEMM rate;
//! - the same chunk on the cpu backend in the same run (the speed-up);
//! - a coalesced batch of K = `--coalesce` chunks against K single runs;
//! - state offload/restore bandwidth over pinned memory;
//! - LM decode tokens/s at batch 1 and 32 (context `--lm-context`).

use std::sync::Arc;

use kernels::video::{CHANNELS, DIM, HIDDEN};
use kernels::{Device, Gemm, Result};
use policies::video::Fidelity;

use super::lm::GpuLm;
use super::offload::StateStore;
use super::video::GpuVideo;
use crate::backend::cpu::model::{ModelConfig, SeqInput};
use crate::profile::median;
use crate::video::model::{Resolution, StreamState, VideoModel, MAX_WINDOW};
use crate::video::BatchItem;

/// Options of `engine gpu-bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Timed runs per measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// m = n = k of the GEMM baseline.
    #[arg(long, default_value_t = 8192)]
    pub gemm_size: usize,
    /// Video: resolution of the measured chunks (the largest by default).
    #[arg(long, default_value = "small")]
    pub video_resolution: Resolution,
    /// Video: latent frames per chunk.
    #[arg(long, default_value_t = 5)]
    pub video_latent_frames: usize,
    /// Skip timing the same video chunk on the cpu backend.
    #[arg(long)]
    pub no_cpu_baseline: bool,
    /// K of the coalescing measurement.
    #[arg(long, default_value_t = 8)]
    pub coalesce: usize,
    /// Bytes moved per offload/restore measurement, in MiB.
    #[arg(long, default_value_t = 512)]
    pub offload_mib: usize,
    /// LM: context per sequence before the timed decode steps.
    #[arg(long, default_value_t = 512)]
    pub lm_context: usize,
    /// LM: decode steps timed per run.
    #[arg(long, default_value_t = 32)]
    pub lm_steps: usize,
    /// LM: transformer layers (a 1B-class shape by default).
    #[arg(long, default_value_t = 8)]
    pub lm_layers: usize,
    /// LM: hidden size.
    #[arg(long, default_value_t = 2048)]
    pub lm_hidden: usize,
    /// LM: attention heads.
    #[arg(long, default_value_t = 16)]
    pub lm_heads: usize,
    /// LM: MLP inner width.
    #[arg(long, default_value_t = 5632)]
    pub lm_ffn: usize,
    /// LM: vocabulary size.
    #[arg(long, default_value_t = 32000)]
    pub lm_vocab: usize,
}

/// One measured number.
#[derive(Debug, Clone)]
pub struct Measurement {
    pub name: String,
    pub value: f64,
    pub unit: &'static str,
    pub note: String,
}

/// Seconds of `f` (median of `repeats` after one warm-up).
fn time<D: Device>(dev: &D, repeats: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    dev.synchronize()?;
    let mut samples = Vec::new();
    for _ in 0..repeats.max(1) {
        let t = crate::clock::now();
        f()?;
        dev.synchronize()?;
        samples.push(crate::clock::since(t).as_secs_f64());
    }
    Ok(median(samples))
}

/// Dense bf16 GEMM rate in TFLOP/s.
pub fn gemm_tflops<D: Device>(dev: &D, size: usize, repeats: usize) -> Result<f64> {
    let (a, b, c) = (dev.alloc(size * size * 2)?, dev.alloc(size * size * 2)?, dev.alloc(size * size * 4)?);
    let reps = 10;
    let secs = time(dev, repeats, || {
        for _ in 0..reps {
            dev.gemm(Gemm { a: (&a, 0), b: (&b, 0), c: (&c, 0), m: size, n: size, k: size })?;
        }
        Ok(())
    })?;
    Ok(2.0 * (size as f64).powi(3) * reps as f64 / secs / 1e12)
}

/// Floating-point operations of one chunk at `fid` with a context of `m`
/// tokens and `n` chunk tokens, counting multiply-adds as 2: context K/V
/// once, then per step chunk K/V/Q, attention over the kept columns, and
/// the update's three small products.
pub fn chunk_flops(fid: &Fidelity, m: usize, n: usize, side: usize) -> f64 {
    let (c, d, h) = (CHANNELS as f64, DIM as f64, HIDDEN as f64);
    let cols = (fid.kept_blocks(m / side.max(1)) * side + n) as f64;
    let (m, n) = (m as f64, n as f64);
    let ctx = 2.0 * m * 2.0 * c * d;
    let step = 3.0 * n * 2.0 * c * d + n * cols * d * 4.0 + n * (2.0 * d * c + 4.0 * c * h);
    ctx + f64::from(fid.steps) * step
}

fn warmed_state(model: &VideoModel, prompt: &str, res: Resolution, frames: usize) -> StreamState {
    let mut st = StreamState::new(prompt);
    for _ in 0..=MAX_WINDOW {
        // Cheapest configuration: only the state's shape matters here.
        let fid =
            Fidelity { steps: 2, sparsity_pct: 90, window: 1, precision: policies::video::Precision::Fp8 };
        model.generate(&mut st, &fid, res, frames);
    }
    st
}

/// Runs every benchmark; `progress` is told each result as it is measured.
pub fn run<D: Device>(
    dev: Arc<D>,
    args: &BenchArgs,
    progress: impl FnMut(&Measurement),
) -> Result<Vec<Measurement>> {
    let mut b = Bench { dev, args, out: Vec::new(), progress };
    let gemm = gemm_tflops(&*b.dev, args.gemm_size, args.repeats)?;
    b.push("dense bf16 GEMM (cuBLAS)".into(), gemm, "TFLOP/s", format!("m=n=k={}", args.gemm_size));
    b.video(gemm)?;
    b.offload()?;
    b.lm_decode()?;
    Ok(b.out)
}

/// A benchmark run: where, with what, and what it measured so far.
struct Bench<'a, D, P> {
    dev: Arc<D>,
    args: &'a BenchArgs,
    out: Vec<Measurement>,
    progress: P,
}

impl<D: Device, P: FnMut(&Measurement)> Bench<'_, D, P> {
    fn push(&mut self, name: String, value: f64, unit: &'static str, note: String) {
        let m = Measurement { name, value, unit, note };
        (self.progress)(&m);
        self.out.push(m);
    }

    /// The largest configuration with a full context: one chunk (time and
    /// achieved rate against `gemm`), the same on the cpu backend, and a
    /// coalesced batch against single runs.
    fn video(&mut self, gemm: f64) -> Result<()> {
        let args = self.args;
        let model = VideoModel::new(7);
        let gpu = GpuVideo::new(Arc::clone(&self.dev), &model)?;
        let (res, frames, fid) = (args.video_resolution, args.video_latent_frames, Fidelity::HIGHEST);
        let base = warmed_state(&model, "benchmark stream", res, frames);
        let (n, m) = (VideoModel::chunk_tokens(res, frames), VideoModel::context_len(&base, &fid));
        let run_k = |k: usize| -> Result<f64> {
            time(&*self.dev, args.repeats, || {
                let mut states: Vec<StreamState> = (0..k).map(|_| base.clone()).collect();
                let mut items: Vec<BatchItem<'_>> = states
                    .iter_mut()
                    .map(|state| BatchItem {
                        session: None,
                        state,
                        fidelity: fid,
                        res,
                        latent_frames: frames,
                    })
                    .collect();
                gpu.run_batch(&model, &mut items).map(|_| ())
            })
        };
        let (one, k) = (run_k(1)?, args.coalesce.max(1));
        let batched = run_k(k)?;
        let flops = chunk_flops(&fid, m, n, res.latent_side());
        let rate = flops / one / 1e12;
        let what = format!("{fid}, {n} chunk tokens, {m} context tokens");
        self.push("video chunk, largest configuration".into(), one * 1e3, "ms", what);
        let share = format!(
            "{:.1}% of the GEMM rate ({:.2} GFLOP per chunk)",
            100.0 * rate / gemm.max(1e-12),
            flops / 1e9
        );
        self.push("video denoising achieved rate".into(), rate, "TFLOP/s", share);
        if !args.no_cpu_baseline {
            let (cpu, threads) = cpu_chunk(&model, &base, res, frames, args.repeats.clamp(1, 3));
            let note = format!("cpu {:.1} ms on {threads} threads, gpu {:.2} ms", cpu * 1e3, one * 1e3);
            self.push(
                "video chunk, largest configuration, cpu backend".into(),
                cpu / one,
                "x (cpu time / gpu time)",
                note,
            );
        }
        let note = format!(
            "batch {:.2} ms, single {:.2} ms; target >= {:.1}",
            batched * 1e3,
            one * 1e3,
            0.8 * k as f64
        );
        self.push(
            format!("coalesced batch of {k} vs {k} single runs"),
            k as f64 * one / batched,
            "x throughput",
            note,
        );
        Ok(())
    }

    /// State offload and restore bandwidth over pinned memory.
    fn offload(&mut self) -> Result<()> {
        let bytes = self.args.offload_mib << 20;
        let mut store = StateStore::new(Arc::clone(&self.dev));
        store.put("bench", &vec![7u8; bytes])?;
        let (mut out, mut back) = (Vec::new(), Vec::new());
        for _ in 0..self.args.repeats.max(1) + 1 {
            let t = crate::clock::now();
            store.offload("bench")?;
            store.settle()?;
            out.push(crate::clock::since(t).as_secs_f64());
            let t = crate::clock::now();
            store.restore("bench")?;
            store.settle()?;
            self.dev.synchronize()?;
            back.push(crate::clock::since(t).as_secs_f64());
        }
        // The first round trip is the warm-up.
        for (what, mut s) in
            [("offload (device to pinned host)", out), ("restore (pinned host to device)", back)]
        {
            s.remove(0);
            let note = format!("{} MiB; target >= 20", self.args.offload_mib);
            self.push(format!("state {what}"), bytes as f64 / median(s) / 1e9, "GB/s", note);
        }
        Ok(())
    }

    /// LM decode tokens/s at batch 1 and 32, each sequence prefilled to
    /// `--lm-context` first.
    fn lm_decode(&mut self) -> Result<()> {
        let args = self.args;
        let cfg = ModelConfig {
            layers: args.lm_layers,
            hidden: args.lm_hidden,
            heads: args.lm_heads,
            ffn: args.lm_ffn,
            vocab: args.lm_vocab,
            seed: 0,
        };
        cfg.validate().map_err(kernels::DeviceError)?;
        let page_tokens = 16usize;
        let per_seq = (args.lm_context + args.lm_steps * (args.repeats + 2)).div_ceil(page_tokens);
        let lm = GpuLm::new(Arc::clone(&self.dev), cfg, (32 * per_seq) as u32, page_tokens as u32)?;
        let prompt: Vec<u32> = (0..args.lm_context as u32).map(|i| 1 + i % (cfg.vocab as u32 - 1)).collect();
        for batch in [1usize, 32] {
            let tables: Vec<Vec<u32>> =
                (0..batch).map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect()).collect();
            for t in &tables {
                lm.forward(&[SeqInput { tokens: &prompt, start: 0, pages: t }])?;
            }
            let mut pos = args.lm_context;
            let secs = time(&*self.dev, args.repeats, || {
                for _ in 0..args.lm_steps {
                    let inputs: Vec<SeqInput<'_>> =
                        tables.iter().map(|t| SeqInput { tokens: &[1], start: pos, pages: t }).collect();
                    lm.forward(&inputs)?;
                    pos += 1;
                }
                Ok(())
            })?;
            let note = format!("{} layers, hidden {}, context {}", cfg.layers, cfg.hidden, args.lm_context);
            self.push(
                format!("LM decode, batch {batch}"),
                (batch * args.lm_steps) as f64 / secs,
                "tokens/s",
                note,
            );
        }
        Ok(())
    }
}

/// Seconds of one chunk from `base` on the cpu backend (all host threads;
/// median of `repeats`), and the threads.
fn cpu_chunk(
    model: &VideoModel,
    base: &StreamState,
    res: Resolution,
    frames: usize,
    repeats: usize,
) -> (f64, usize) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let samples = (0..repeats)
        .map(|_| {
            let mut state = base.clone();
            let item = BatchItem {
                session: None,
                state: &mut state,
                fidelity: Fidelity::HIGHEST,
                res,
                latent_frames: frames,
            };
            let t = crate::clock::now();
            let latent = crate::video::batch::denoise_batch(model, vec![item], threads);
            model.decode(&latent[0], res);
            crate::clock::since(t).as_secs_f64()
        })
        .collect();
    (median(samples), threads)
}
