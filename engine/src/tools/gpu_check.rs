//! The GPU models against the cpu backend: the same inputs through both,
//! outputs compared within documented tolerances (docs/architecture.md,
//! "GPU backend"). The tests run these on the host emulator of the kernels;
//! `engine gpu-check` runs them on a GPU.
//!
//! Tolerances ([`Tolerances`]): the kernels sum in other orders than the
//! cpu backend (online softmax), and the LM's products read bf16 weights
//! and activations, so results are close, not equal. On a GPU the device's
//! `expf`/`sinf` (a few ulps) and fused multiply-adds add to that, and an
//! fp8 rounding or a block-selection tie can flip, so its limits are wider
//! than the emulator's (which uses the host's libm and no fusing).
//! Measured on the emulator: video latent max |Δ| 3e-6, SSIM 1.0; LM
//! logits 0.012 sd, greedy agreement 100%.

use std::sync::Arc;

use kernels::{Device, Result};
use policies::video::{Fidelity, Precision};

use crate::gpu::lm::GpuLm;
use crate::gpu::video::{ContextStats, GpuVideo};
use crate::models::lm::{KvArena, Model, ModelConfig, SeqInput};
use crate::models::video::BatchItem;
use crate::models::video::{ssim, Resolution, StreamState, VideoModel};
use crate::video::batch::denoise_batch;

/// Limits of a comparison run.
#[derive(Debug, Clone, Copy)]
pub struct Tolerances {
    /// Video: latent max |Δ| after all chunks (latents are ~unit scale).
    pub latent: f64,
    /// Video: least frame SSIM against the cpu backend's frames.
    pub ssim: f64,
    /// LM: logits max |Δ| over the logits' standard deviation.
    pub logits: f64,
    /// LM: least share of steps whose greedy token agrees.
    pub agreement: f64,
}

impl Tolerances {
    /// The host emulator: the same libm as the cpu backend.
    pub const EMULATOR: Tolerances = Tolerances { latent: 1e-4, ssim: 0.9999, logits: 0.03, agreement: 0.9 };
    /// A GPU (not yet measured on one: see docs/benchmarks/gpu.md).
    pub const GPU: Tolerances = Tolerances { latent: 5e-3, ssim: 0.995, logits: 0.08, agreement: 0.9 };
}

/// One comparison's outcome.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub name: String,
    /// The measured difference (what `limit` bounds).
    pub value: f64,
    pub limit: f64,
    /// True when a larger value is better (SSIM, agreement).
    pub at_least: bool,
}

impl Comparison {
    pub fn ok(&self) -> bool {
        if self.at_least {
            self.value >= self.limit
        } else {
            self.value <= self.limit
        }
    }
}

impl std::fmt::Display for Comparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let op = if self.at_least { ">=" } else { "<=" };
        let verdict = if self.ok() { "ok" } else { "FAIL" };
        write!(f, "{verdict:4} {}: {:.6} (limit {op} {})", self.name, self.value, self.limit)
    }
}

/// Prints every result (standard error) and returns the ones outside
/// tolerance.
pub fn report(results: &[Comparison]) -> Vec<String> {
    for r in results {
        eprintln!("{r}");
    }
    results.iter().filter(|r| !r.ok()).map(|r| r.to_string()).collect()
}

/// The video configurations compared: the highest fidelity, and cheap ones
/// that exercise sparsity, short windows, fp8 and fewer steps.
pub fn video_configs() -> Vec<Fidelity> {
    vec![
        Fidelity::HIGHEST,
        Fidelity { steps: 3, sparsity_pct: 60, window: 3, precision: Precision::Fp16 },
        Fidelity { steps: 2, sparsity_pct: 90, window: 1, precision: Precision::Fp8 },
    ]
}

/// Three streams, one per configuration, coalesced into one batch per
/// chunk on both backends, `chunks` chunks each (the context grows, the
/// sink and window are used from the second chunk on). On the GPU the
/// streams are sessions whose contexts stay on the device, and before the
/// third chunk they are offloaded to pinned memory (restored by the batch).
pub fn video_vs_cpu<D: Device>(
    dev: Arc<D>,
    tol: Tolerances,
    res: Resolution,
    latent_frames: usize,
    chunks: usize,
) -> Result<Vec<Comparison>> {
    let model = VideoModel::new(7);
    let gpu = GpuVideo::new(dev, &model)?;
    let configs = video_configs();
    let prompts = ["a red fox in the snow", "waves on a beach", "a city at night"];
    let mut cpu_states: Vec<StreamState> = prompts.iter().map(|p| StreamState::new(p)).collect();
    let mut gpu_states = cpu_states.clone();
    let mut worst_latent = vec![0f64; configs.len()];
    let mut worst_ssim = vec![1f64; configs.len()];
    for chunk in 0..chunks {
        if chunk == 2 {
            // As if the scheduler suspended every stream: contexts go to
            // pinned memory and come back for the next batch.
            for p in &prompts {
                gpu.offload(p)?;
            }
        }
        let items = cpu_states
            .iter_mut()
            .zip(&configs)
            .map(|(state, f)| BatchItem { session: None, state, fidelity: *f, res, latent_frames })
            .collect();
        let cpu_latents = denoise_batch(&model, items, 2);
        let mut items: Vec<BatchItem<'_>> = gpu_states
            .iter_mut()
            .zip(&configs)
            .zip(&prompts)
            .map(|((state, f), p)| BatchItem { session: Some(p), state, fidelity: *f, res, latent_frames })
            .collect();
        let out = gpu.run_batch(&model, &mut items)?;
        for (i, (c, g)) in cpu_latents.iter().zip(&out).enumerate() {
            let d = c.iter().zip(&g.latent).map(|(a, b)| f64::from((a - b).abs())).fold(0.0, f64::max);
            worst_latent[i] = worst_latent[i].max(d);
            let frames = model.decode(c, res);
            worst_ssim[i] = worst_ssim[i].min(ssim(&frames, &g.frames, res.pixels()));
        }
    }
    kept_on_device(gpu.context_stats(), prompts.len(), chunks)?;
    let per_config = configs.iter().zip(worst_latent.iter().zip(&worst_ssim));
    Ok(per_config
        .flat_map(|(f, (&latent, &ssim))| {
            [
                Comparison {
                    name: format!("video {f} latent max |diff|"),
                    value: latent,
                    limit: tol.latent,
                    at_least: false,
                },
                Comparison {
                    name: format!("video {f} frame SSIM vs cpu"),
                    value: ssim,
                    limit: tol.ssim,
                    at_least: true,
                },
            ]
        })
        .collect())
}

/// That `streams` sessions' contexts stayed on the device over `chunks`
/// chunks (uploaded once each) and came back from pinned memory after the
/// offload before the third chunk.
fn kept_on_device(st: ContextStats, streams: usize, chunks: usize) -> Result<()> {
    let offloaded = if chunks > 2 { streams as u64 } else { 0 };
    let expected = ContextStats {
        resident: (streams * chunks.saturating_sub(1)) as u64 - offloaded,
        restored: offloaded,
        uploaded: streams as u64,
        offloaded,
    };
    if st != expected {
        return Err(kernels::DeviceError(format!(
            "contexts were not kept on the device: {st:?}, expected {expected:?}"
        )));
    }
    Ok(())
}

/// A small LM on both backends: two prompts prefilled together into
/// interleaved, out-of-order pages, then `decode_steps` decode steps of
/// both, teacher-forced with the cpu backend's greedy tokens.
pub fn lm_vs_cpu<D: Device>(
    dev: Arc<D>,
    tol: Tolerances,
    cfg: ModelConfig,
    decode_steps: usize,
) -> Result<Vec<Comparison>> {
    let page_tokens = 4u32;
    let pages = 32u32;
    let cpu = Model::new(cfg, 1);
    let mut kv = KvArena::new(&cfg, pages, page_tokens);
    let gpu = GpuLm::new(dev, cfg, pages, page_tokens)?;
    // Pages deliberately scattered: sequence A owns odd pages descending,
    // B even pages ascending.
    let pages_a: Vec<u32> = (0..16).rev().map(|i| 2 * i + 1).collect();
    let pages_b: Vec<u32> = (0..16).map(|i| 2 * i).collect();
    let mut toks: [Vec<u32>; 2] = [
        (0..13).map(|i| (i * 37 + 5) % cfg.vocab as u32).collect(),
        (0..6).map(|i| (i * 11 + 3) % cfg.vocab as u32).collect(),
    ];
    let mut stats = LogitStats::default();
    for step in 0..=decode_steps {
        // The prefill, then one decode step of each sequence's last token.
        let start = |t: &Vec<u32>| if step == 0 { 0 } else { t.len() - 1 };
        let (a, b) = (start(&toks[0]), start(&toks[1]));
        let inputs = [
            SeqInput { tokens: &toks[0][a..], start: a, pages: &pages_a },
            SeqInput { tokens: &toks[1][b..], start: b, pages: &pages_b },
        ];
        let next = stats.add(&cpu.forward(&mut kv, &inputs), &gpu.forward(&inputs)?);
        for (t, n) in toks.iter_mut().zip(next) {
            t.push(n);
        }
    }
    Ok(vec![
        Comparison {
            name: "lm logits max |diff| / logits sd (bf16)".into(),
            value: stats.worst_rel,
            limit: tol.logits,
            at_least: false,
        },
        Comparison {
            name: "lm greedy token agreement".into(),
            value: stats.agree as f64 / stats.total.max(1) as f64,
            limit: tol.agreement,
            at_least: true,
        },
    ])
}

/// Diffusion jobs on the device (issue 24) against the host: an image
/// batch of three prompts through all of its steps in one call, and a
/// two-frame video run in two rounds (paused after the first), both at the
/// model's small resolution; latent max |Δ| after the last step.
pub fn diffusion_vs_cpu<D: Device>(dev: Arc<D>, tol: Tolerances) -> Result<Vec<Comparison>> {
    use crate::diffusion::advance;
    let model = crate::models::video::diffusion_model(0);
    let gpu = GpuVideo::new(dev, &model)?;
    let res = Resolution::Tiny;
    let tokens = res.latent_side() * res.latent_side() * crate::models::video::CHANNELS;
    let mut rng = policies::rng::SplitMix(0x5EED);
    let mut latents = |n: usize, frames: usize| -> Vec<Vec<f32>> {
        (0..n).map(|_| (0..tokens * frames).map(|_| rng.normal() as f32).collect()).collect()
    };
    let failed = |e: crate::diffusion::DiffusionError| kernels::DeviceError(e.to_string());
    let mut worst = Vec::new();
    for (prompts, frames, rounds, total) in [
        (vec!["a red kite", "a lighthouse", "a cat asleep"], 1, vec![(0, 8)], 8),
        (vec!["waves"], 2, vec![(0, 3), (3, 6)], 6),
    ] {
        let states: Vec<StreamState> = prompts.iter().map(|p| StreamState::new(p)).collect();
        let mut host = latents(prompts.len(), frames);
        let mut dev = host.clone();
        for (from, to) in rounds {
            advance(None, &model, res, &mut host, &states, from, to, total).map_err(failed)?;
            advance(Some(&gpu), &model, res, &mut dev, &states, from, to, total).map_err(failed)?;
        }
        let d = host.iter().flatten().zip(dev.iter().flatten()).map(|(a, b)| f64::from((a - b).abs()));
        worst.push(d.fold(0.0, f64::max));
    }
    Ok(["diffusion image batch of 3", "diffusion video, paused and resumed"]
        .iter()
        .zip(worst)
        .map(|(what, value)| Comparison {
            name: format!("{what}: latent max |diff|"),
            value,
            limit: tol.latent,
            at_least: false,
        })
        .collect())
}

/// The prefix cache on the device (issue 23): sequence B shares its first
/// two full pages with sequence A's prompt, reuses A's pages for them (the
/// page table the engine's allocator builds for a cache hit) and prefills
/// only the rest; its logits, and those of its decode steps, are compared
/// with the cpu backend computing B from scratch.
pub fn lm_prefix_reuse<D: Device>(
    dev: Arc<D>,
    tol: Tolerances,
    cfg: ModelConfig,
    decode_steps: usize,
) -> Result<Vec<Comparison>> {
    let (page_tokens, pages) = (4u32, 32u32);
    let shared = 2 * page_tokens as usize;
    let cpu = Model::new(cfg, 1);
    let mut kv = KvArena::new(&cfg, pages, page_tokens);
    let gpu = GpuLm::new(dev, cfg, pages, page_tokens)?;
    let vocab = cfg.vocab as u32;
    let a: Vec<u32> = (0..13).map(|i| (i * 37 + 5) % vocab).collect();
    let mut b: Vec<u32> = a[..shared].to_vec();
    b.extend((0..5).map(|i| (i * 53 + 11) % vocab));
    let pages_a: Vec<u32> = (0..16).rev().map(|i| 2 * i + 1).collect();
    // B's table: A's first two pages (cached), then pages of its own.
    let mut pages_b: Vec<u32> = pages_a[..2].to_vec();
    pages_b.extend((0..14).map(|i| 2 * i));
    let pages_cpu: Vec<u32> = (0..16).map(|i| 2 * i).collect();
    gpu.forward(&[SeqInput { tokens: &a, start: 0, pages: &pages_a }])?;
    let mut stats = LogitStats::default();
    for step in 0..=decode_steps {
        let (cpu_start, gpu_start) = if step == 0 { (0, shared) } else { (b.len() - 1, b.len() - 1) };
        let c = cpu
            .forward(&mut kv, &[SeqInput { tokens: &b[cpu_start..], start: cpu_start, pages: &pages_cpu }]);
        let g = gpu.forward(&[SeqInput { tokens: &b[gpu_start..], start: gpu_start, pages: &pages_b }])?;
        b.extend(stats.add(&c, &g));
    }
    Ok(vec![
        Comparison {
            name: "lm after a cached prefix: logits max |diff| / sd".into(),
            value: stats.worst_rel,
            limit: tol.logits,
            at_least: false,
        },
        Comparison {
            name: "lm after a cached prefix: greedy agreement".into(),
            value: stats.agree as f64 / stats.total.max(1) as f64,
            limit: tol.agreement,
            at_least: true,
        },
    ])
}

/// Differences of logits rows, cpu against GPU.
#[derive(Default)]
struct LogitStats {
    /// Largest max |Δ| over the cpu row's standard deviation.
    worst_rel: f64,
    /// Rows whose argmax agrees, of all rows.
    agree: usize,
    total: usize,
}

impl LogitStats {
    /// Adds one step's rows; returns the cpu backend's greedy tokens.
    fn add(&mut self, cpu: &[Vec<f32>], gpu: &[Vec<f32>]) -> Vec<u32> {
        let argmax = |l: &[f32]| l.iter().enumerate().fold(0, |b, (i, &v)| if v > l[b] { i } else { b });
        cpu.iter()
            .zip(gpu)
            .map(|(c, g)| {
                let n = c.len() as f64;
                let mean = c.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
                let sd = (c.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n).sqrt().max(1e-9);
                let d = c.iter().zip(g).map(|(a, b)| f64::from((a - b).abs())).fold(0.0, f64::max);
                self.worst_rel = self.worst_rel.max(d / sd);
                self.agree += usize::from(argmax(c) == argmax(g));
                self.total += 1;
                argmax(c) as u32
            })
            .collect()
    }
}

/// Offload to pinned memory and restore: the bytes come back exactly.
pub fn offload_round_trip<D: Device>(dev: Arc<D>) -> Result<Vec<Comparison>> {
    let mut store = crate::gpu::offload::StateStore::new(dev);
    let model = VideoModel::new(7);
    let mut st = StreamState::new("a lighthouse in fog");
    for _ in 0..3 {
        model.generate(&mut st, &Fidelity::HIGHEST, Resolution::Tiny, 2);
    }
    let bytes = st.to_bytes();
    store.put("s", &bytes)?;
    store.offload("s")?;
    store.settle()?;
    let offloaded = store.read("s")?;
    store.restore("s")?;
    let restored = store.read("s")?;
    let same = offloaded == bytes && restored == bytes && store.on_device("s") == Some(true);
    Ok(vec![Comparison {
        name: "state offload/restore is exact".into(),
        value: f64::from(u8::from(same)),
        limit: 1.0,
        at_least: true,
    }])
}

/// The DiT's attention kernel and its whole network against their host
/// references (`gpu::dit`): ragged attention members (tails of both tiles,
/// a member shorter than a tile) plus, with `real_keys`, one member that
/// attends over a full window of the 1.3B configuration; then the tiny DiT
/// (two members of different context, two forwards) against
/// [`crate::gpu::dit::reference_forward`]. Limits: relative L2 error, bf16
/// probabilities and activations (measured on the emulator: attention
/// ~2e-3, network ~5e-3).
pub fn dit_vs_reference<D: Device>(dev: Arc<D>, real_keys: Option<usize>) -> Result<Vec<Comparison>> {
    use crate::gpu::dit::{
        check_attention, reference_forward, rel_l2, AttentionKernel, ChunkShape, DitBatch, DitConfig, GpuDit,
    };
    let mut out = Vec::new();
    let mut members = vec![(70, 150), (16, 9), (64, 64), (1, 200), (3, 33)];
    if let Some(keys) = real_keys {
        members.push((100, keys));
    }
    for kernel in [AttentionKernel::Staged, AttentionKernel::Async] {
        let worst = check_attention(&*dev, kernel, &members, 2, 5)?;
        out.push(Comparison {
            name: format!("{} ragged members {members:?}: relative L2", kernel.kernel()),
            value: worst,
            limit: 8e-3,
            at_least: false,
        });
    }
    let cfg = DitConfig::TINY;
    let model = GpuDit::new(Arc::clone(&dev), cfg)?;
    let shapes = [ChunkShape { tokens: 90, context: 60 }, ChunkShape { tokens: 90, context: 150 }];
    let batch = DitBatch::new(&model, &shapes, &[1, 2])?;
    model.start(&batch)?;
    model.forward(&batch)?;
    model.forward(&batch)?;
    let got = batch.output(&*dev)?;
    let h = cfg.hidden;
    for (i, s) in shapes.iter().enumerate() {
        let want = reference_forward(&cfg, *s, i as u32 + 1, i * s.tokens, 2);
        let rows = &got[i * s.tokens * h..(i + 1) * s.tokens * h];
        out.push(Comparison {
            name: format!("dit tiny, member {i} (context {}): relative L2", s.context),
            value: rel_l2(rows, &want),
            limit: 2e-2,
            at_least: false,
        });
    }
    Ok(out)
}
