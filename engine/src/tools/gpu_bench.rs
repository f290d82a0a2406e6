//! `engine gpu-bench`: the GPU benchmarks of docs/benchmarks/gpu.md, on the
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

use crate::gpu::lm::GpuLm;
use crate::gpu::offload::StateStore;
use crate::gpu::video::GpuVideo;
use crate::models::lm::{ModelConfig, SeqInput};
use crate::models::video::BatchItem;
use crate::models::video::{Resolution, StreamState, VideoModel, MAX_WINDOW};
use crate::stats::median;

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
    /// LM: decode batch sizes measured.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128")]
    pub lm_batches: Vec<usize>,
    /// Sections to run (gemm and bandwidth always run: the others are
    /// reported against them).
    #[arg(long, value_delimiter = ',', default_value = "video,dit,offload,lm")]
    pub only: Vec<String>,
    /// DiT: the model's shape (`tiny` is the same code at test size).
    #[arg(long, value_enum, default_value = "wan-1.3b")]
    pub dit_config: DitSize,
    /// DiT: the attention kernel its forwards run (both are timed alone).
    #[arg(long, value_enum, default_value = "staged")]
    pub dit_attention: crate::gpu::dit::AttentionKernel,
    /// MiB copied by the bandwidth measurement.
    #[arg(long, default_value_t = 1024)]
    pub bandwidth_mib: usize,
    /// DiT: coalesced batch sizes measured against single chunks (at
    /// S4-r0.0-W3, so that 8 members' caches fit an 80 GB card).
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    pub dit_coalesce: Vec<usize>,
    /// DiT: also measure every fp16 configuration of the fidelity sweep and
    /// write the DiT's video profile here (TOML).
    #[arg(long)]
    pub dit_profile: Option<std::path::PathBuf>,
    /// DiT: the video profile whose quality column the written profile
    /// carries (the DiT's weights are random, so its frames have no quality
    /// of their own; this is the synthetic model's measured SSIM per
    /// configuration).
    #[arg(long, default_value = "policies/profiles/video-cuda-h200.toml")]
    pub dit_quality_from: std::path::PathBuf,
}

/// The DiT shapes `engine gpu-bench` can measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DitSize {
    #[value(name = "wan-1.3b")]
    Wan13b,
    Tiny,
}

impl DitSize {
    pub fn config(self) -> crate::gpu::dit::DitConfig {
        match self {
            DitSize::Wan13b => crate::gpu::dit::DitConfig::WAN_1_3B,
            DitSize::Tiny => crate::gpu::dit::DitConfig::TINY,
        }
    }
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

/// Dense bf16 GEMM rate in TFLOP/s, on random inputs (zeros run faster
/// than real data on these cards).
pub fn gemm_tflops<D: Device>(dev: &D, size: usize, repeats: usize) -> Result<f64> {
    let (a, b, c) = (dev.alloc(size * size * 2)?, dev.alloc(size * size * 2)?, dev.alloc(size * size * 2)?);
    for (buf, seed) in [(&a, 1), (&b, 2)] {
        dev.launch(
            "dit_fill",
            (((size * size) as u32).div_ceil(kernels::BLOCK), 1, 1),
            &[
                kernels::Arg::Buf(buf, 0),
                kernels::Arg::I64((size * size) as i64),
                kernels::Arg::I32(seed),
                kernels::Arg::F32(1.0),
            ],
        )?;
    }
    let reps = 10;
    let secs = time(dev, repeats, || {
        for _ in 0..reps {
            dev.gemm(Gemm { a: (&a, 0), b: (&b, 0), c: (&c, 0), m: size, n: size, k: size, bf16_out: true })?;
        }
        Ok(())
    })?;
    Ok(2.0 * (size as f64).powi(3) * reps as f64 / secs / 1e12)
}

/// Device memory bandwidth in bytes/s: a device-to-device copy of `mib`
/// MiB, counting bytes read and written.
pub fn copy_bandwidth<D: Device>(dev: &D, mib: usize, repeats: usize) -> Result<f64> {
    let bytes = mib.max(1) << 20;
    let (a, b) = (dev.alloc(bytes)?, dev.alloc(bytes)?);
    let secs = time(dev, repeats.max(3), || dev.copy((&a, 0), (&b, 0), bytes))?;
    Ok(2.0 * bytes as f64 / secs)
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
    b.push(
        "dense bf16 GEMM (cuBLAS)".into(),
        gemm,
        "TFLOP/s",
        format!("m=n=k={}, random inputs, bf16 out", args.gemm_size),
    );
    let bw = copy_bandwidth(&*b.dev, args.bandwidth_mib, args.repeats)?;
    let note = format!("{} MiB device-to-device copy, read + written", args.bandwidth_mib);
    b.push("device memory bandwidth".into(), bw / 1e9, "GB/s", note);
    let on = |s: &str| args.only.iter().any(|o| o == s);
    if on("video") {
        b.video(gemm)?;
    }
    if on("dit") {
        b.dit(gemm)?;
    }
    if on("offload") {
        b.offload()?;
    }
    if on("lm") {
        b.lm_decode(gemm, bw)?;
    }
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

    /// LM decode tokens/s at each `--lm-batches` size, each sequence
    /// prefilled to `--lm-context` first, with the step's floor beside it:
    /// the weights and the K/V read once at the measured bandwidth `bw`
    /// (bytes/s), or the products at the GEMM rate `gemm` (TFLOP/s),
    /// whichever is longer.
    fn lm_decode(&mut self, gemm: f64, bw: f64) -> Result<()> {
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
        let most = args.lm_batches.iter().copied().max().unwrap_or(1);
        let per_seq = (args.lm_context + args.lm_steps * (args.repeats + 2)).div_ceil(page_tokens);
        let lm = GpuLm::new(Arc::clone(&self.dev), cfg, (most * per_seq) as u32, page_tokens as u32)?;
        let prompt: Vec<u32> = (0..args.lm_context as u32).map(|i| 1 + i % (cfg.vocab as u32 - 1)).collect();
        let (h, f) = (cfg.hidden as f64, cfg.ffn as f64);
        let layer_params = 3.0 * h * h + h * h + 2.0 * h * f + h * f;
        let weight_bytes = 2.0 * (cfg.layers as f64 * layer_params + cfg.vocab as f64 * h);
        let mut prefilled = 0usize;
        let tables: Vec<Vec<u32>> =
            (0..most).map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect()).collect();
        for &batch in &args.lm_batches {
            for t in &tables[prefilled.min(batch)..batch] {
                lm.forward(&[SeqInput { tokens: &prompt, start: 0, pages: t }])?;
            }
            prefilled = prefilled.max(batch);
            let mut pos = args.lm_context;
            let secs = time(&*self.dev, args.repeats, || {
                pos = args.lm_context;
                for _ in 0..args.lm_steps {
                    let inputs: Vec<SeqInput<'_>> = tables[..batch]
                        .iter()
                        .map(|t| SeqInput { tokens: &[1], start: pos, pages: t })
                        .collect();
                    lm.forward(&inputs)?;
                    pos += 1;
                }
                Ok(())
            })?;
            let step = secs / args.lm_steps as f64;
            // K/V (f32) of the whole context, every layer, read once a step.
            let kv_bytes = batch as f64
                * (args.lm_context as f64 + args.lm_steps as f64 / 2.0)
                * cfg.layers as f64
                * 2.0
                * h
                * 4.0;
            let flops = 2.0 * batch as f64 * (cfg.layers as f64 * layer_params + cfg.vocab as f64 * h);
            let floor = ((weight_bytes + kv_bytes) / bw).max(flops / (gemm * 1e12));
            let note = format!(
                "{:.3} ms a step; floor {:.3} ms ({:.0} MB weights + {:.0} MB K/V at {:.0} GB/s, or {:.2} GFLOP at the GEMM rate): {:.2}x the floor; {} layers, hidden {}, context {}",
                step * 1e3,
                floor * 1e3,
                weight_bytes / 1e6,
                kv_bytes / 1e6,
                bw / 1e9,
                flops / 1e9,
                step / floor,
                cfg.layers,
                cfg.hidden,
                args.lm_context
            );
            self.push(
                format!("LM decode, batch {batch}"),
                (batch * args.lm_steps) as f64 / secs,
                "tokens/s",
                note,
            );
        }
        Ok(())
    }

    /// The DiT-shaped video model (`gpu::dit`, Wan-1.3B shapes): one
    /// denoising forward at the largest configuration (achieved rate against
    /// `gemm`), its attention kernel alone, the whole chunk, coalesced
    /// batches against single chunks, and with `--dit-profile` every fp16
    /// configuration of the sweep.
    fn dit(&mut self, gemm: f64) -> Result<()> {
        use crate::gpu::dit::{forward_flops, forwards, AttentionKernel, ChunkShape, DitBatch, GpuDit};
        let args = self.args;
        let cfg = args.dit_config.config();
        let mut model = GpuDit::new(Arc::clone(&self.dev), cfg)?;
        model.attention = args.dit_attention;
        let fid = Fidelity::HIGHEST;
        let shape = ChunkShape::at(&cfg, &fid);
        let (gf, af) = forward_flops(&cfg, shape);
        {
            let batch = DitBatch::new(&model, &[shape], &[1])?;
            model.start(&batch)?;
            let fwd = time(&*self.dev, args.repeats, || model.forward(&batch))?;
            let what = format!(
                "{fid}: {} chunk tokens, {} context keys, {:.2}B parameters",
                shape.tokens,
                shape.context,
                cfg.params() / 1e9
            );
            self.push("DiT denoising forward, largest configuration".into(), fwd * 1e3, "ms", what);
            let rate = (gf + af) / fwd / 1e12;
            let share = format!(
                "{:.1}% of the GEMM rate ({:.1} TFLOP per forward, {:.0}% of it attention)",
                100.0 * rate / gemm.max(1e-12),
                (gf + af) / 1e12,
                100.0 * af / (gf + af)
            );
            self.push("DiT denoising achieved rate".into(), rate, "TFLOP/s", share);
            let att_flops = 4.0 * (shape.tokens * (shape.tokens + shape.context) * cfg.hidden) as f64;
            for kernel in [AttentionKernel::Staged, AttentionKernel::Async] {
                let att = time(&*self.dev, args.repeats, || {
                    for _ in 0..10 {
                        model.attention_only(&batch, kernel)?;
                    }
                    Ok(())
                })? / 10.0;
                let note = format!(
                    "one block's self-attention, {:.3} ms; {:.1}% of the GEMM rate",
                    att * 1e3,
                    100.0 * att_flops / att / 1e12 / gemm.max(1e-12)
                );
                self.push(
                    format!("DiT flash attention ({})", kernel.kernel()),
                    att_flops / att / 1e12,
                    "TFLOP/s",
                    note,
                );
            }
            let chunk = time(&*self.dev, args.repeats.min(3), || model.chunk(&batch, &fid))?;
            let note = format!("{} forwards ({} steps + the cache pass)", forwards(&fid), fid.steps);
            self.push(format!("DiT chunk at {fid}"), chunk * 1e3, "ms", note);
        }
        let mid = Fidelity { window: 3, ..Fidelity::HIGHEST };
        let mid_shape = ChunkShape::at(&cfg, &mid);
        let single = {
            let batch = DitBatch::new(&model, &[mid_shape], &[1])?;
            time(&*self.dev, args.repeats.min(3), || model.chunk(&batch, &mid))?
        };
        self.push(
            format!("DiT chunk at {mid}"),
            single * 1e3,
            "ms",
            "single chunk (the coalescing baseline)".into(),
        );
        let mut batch_cost = None;
        for &k in &args.dit_coalesce {
            let seeds: Vec<u32> = (1..=k as u32).collect();
            let batch = match DitBatch::new(&model, &vec![mid_shape; k], &seeds) {
                Ok(b) => b,
                Err(e) => {
                    self.push(format!("DiT coalesced batch of {k}"), 0.0, "skipped", e.to_string());
                    continue;
                }
            };
            let t = time(&*self.dev, args.repeats.min(3), || model.chunk(&batch, &mid))?;
            if batch_cost.is_none() && k > 1 {
                batch_cost = Some(((t / single - 1.0) / (k - 1) as f64).clamp(0.0, 1.0));
            }
            let note =
                format!("batch {:.1} ms, {k} single chunks {:.1} ms", t * 1e3, k as f64 * single * 1e3);
            self.push(
                format!("DiT coalesced batch of {k} vs {k} single chunks"),
                k as f64 * single / t,
                "x throughput",
                note,
            );
        }
        if let Some(path) = &args.dit_profile {
            let text = std::fs::read_to_string(&args.dit_quality_from)
                .map_err(|e| kernels::DeviceError(format!("{}: {e}", args.dit_quality_from.display())))?;
            let quality =
                policies::video::VideoProfile::parse(&args.dit_quality_from.display().to_string(), &text)
                    .map_err(|e| kernels::DeviceError(e.to_string()))?;
            let mut rows = Vec::new();
            for fid in
                Fidelity::sweep().into_iter().filter(|f| f.precision == policies::video::Precision::Fp16)
            {
                let Some(q) = quality.configs.iter().find(|c| c.fidelity == fid) else { continue };
                let shape = ChunkShape::at(&cfg, &fid);
                let batch = DitBatch::new(&model, &[shape], &[1])?;
                let t = time(&*self.dev, args.repeats.min(2), || model.chunk(&batch, &fid))?;
                eprintln!("dit profile {fid}: {:.1} ms", t * 1e3);
                rows.push((fid, t * 1e3, q.quality));
            }
            let name = self.dev.name();
            let class: String = name.trim().to_lowercase().split_whitespace().collect::<Vec<_>>().join("-");
            let mut out = format!(
                "# The DiT-shaped video model (engine/src/gpu/dit.rs, Wan-2.1-1.3B shapes: hidden 1536, 30 blocks,\n\
                 # 12 heads, MLP 8960, 512 text tokens; a chunk = 3 latent frames x 1560 tokens, steps + 1 forwards)\n\
                 # measured on {name} by `engine gpu-bench --only dit --dit-profile` (scripts/gpu-verify).\n\
                 # chunk_ms is measured; quality is the synthetic model's SSIM at the same configuration\n\
                 # (from {}), since the DiT's weights are random. fp8 rows are absent: there is no fp8\n\
                 # attention kernel on the GPU yet. batch_cost from the coalesced batch of 2 at S4-r0.0-W3.\n\
                 model = \"dit-wan-1.3b-shape\"\nengine_class = \"cuda-{class}\"\n\
                 source = \"measured on {name}: engine gpu-bench --only dit --dit-profile\"\n\
                 latent_frames = {}\nbatch_cost = {:.4}\nsp2_factor = 0.6\n",
                args.dit_quality_from.display(),
                cfg.chunk_frames,
                batch_cost.unwrap_or(1.0),
            );
            for (fid, ms, q) in &rows {
                out.push_str(&format!(
                    "\n[[configs]]\nsteps = {}\nsparsity = {:.1}\nwindow = {}\nprecision = \"fp16\"\nchunk_ms = {:.2}\nquality = {}\n",
                    fid.steps,
                    fid.sparsity(),
                    fid.window,
                    ms,
                    q
                ));
            }
            std::fs::write(path, out)
                .map_err(|e| kernels::DeviceError(format!("{}: {e}", path.display())))?;
            self.push(
                "DiT profile configurations".into(),
                rows.len() as f64,
                "written",
                path.display().to_string(),
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
