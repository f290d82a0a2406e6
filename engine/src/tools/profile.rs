//! `engine profile`: measures a backend's prefill and decode step times and
//! writes a latency profile (the TOML format of `policies::profile`) that
//! the emulated backend replays and batch formation and admission read.
//!
//! Prefill is timed per prompt length (one sequence), decode per batch size
//! at short context, and the context term from the same batch at a short
//! and a long context. Each point is the median of `--repeats` runs after
//! one unmeasured run. Device time a backend returns (the emulated one) is
//! counted as if it had been waited for, so profiling `emulated` reproduces
//! its own profile.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::api::GenerateRequest;
use crate::backend::cpu::Cpu;
use crate::backend::emulated::Emulated;
use crate::backend::{Backend, BackendKind, Slot, Token};
use crate::cli::EngineArgs;
use crate::kv::{KvAllocator, PageSet};

mod mixed;

/// Options of `engine profile`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProfileArgs {
    /// Where to write the profile (TOML).
    #[arg(long)]
    pub out: PathBuf,
    /// Engine class recorded in the profile [default: `<backend>-<host cpu>`].
    #[arg(long)]
    pub engine_class: Option<String>,
    /// Model name recorded in the profile.
    #[arg(long, default_value = "synthetic-small")]
    pub model: String,
    /// Prompt lengths to time prefill at.
    #[arg(long, value_delimiter = ',', default_value = "16,64,256,1024")]
    pub prompts: Vec<u32>,
    /// Batch sizes to time decode at.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32")]
    pub batches: Vec<u32>,
    /// Context per sequence for the context term of decode.
    #[arg(long, default_value_t = 512)]
    pub long_context: u32,
    /// Timed runs per point (the median is kept).
    #[arg(long, default_value_t = 5)]
    pub repeats: u32,
    /// Profile the video model instead (cpu backend): latency and quality
    /// of every fidelity configuration, and the coalescing cost.
    #[arg(long)]
    pub video: bool,
    /// Video: output resolution preset.
    #[arg(long, default_value = "tiny")]
    pub video_resolution: crate::video::Resolution,
    /// Video: chunks generated per prompt and configuration.
    #[arg(long, default_value_t = 6)]
    pub video_chunks: usize,
    /// Video: instead of measuring, rescale this measured video profile so
    /// the highest-fidelity configuration takes --reference-ms, under
    /// --engine-class (how the shipped emulated video profile is made).
    #[arg(long, requires = "reference_ms")]
    pub rescale: Option<PathBuf>,
    /// Video: the highest-fidelity chunk time of a rescaled profile.
    #[arg(long)]
    pub reference_ms: Option<f64>,
    /// Video: the coalescing cost of a rescaled profile (marginal cost of
    /// one more chunk in a batch).
    #[arg(long, default_value_t = 0.3)]
    pub batch_cost: f64,
    /// Profile the diffusion jobs instead (cpu or cuda backend): `T_img` per image
    /// size and batch, `T_step` per video size, decode times; sizes and
    /// step counts from the engine's diffusion profile.
    #[arg(long, conflicts_with = "video")]
    pub diffusion: bool,
    /// Backend, model and KV flags, as for serving.
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Errors of `engine profile`.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error(transparent)]
    Start(#[from] crate::StartError),
    #[error("the KV cache ({0} pages) is too small for the largest measurement; raise --kv-pages or --kv-cache-mb")]
    KvTooSmall(u32),
    #[error("writing {0}: {1}")]
    Write(String, std::io::Error),
    #[error("video profile: {0}")]
    Video(String),
}

/// Measured points, in milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub prefill: Vec<(u32, f64)>,
    pub decode: Vec<(u32, f64)>,
    pub ms_per_1k_context: f64,
    /// Per-sequence attention fitted to the mixed steps (ms per 1k²).
    pub attention_ms_per_1k2: f64,
    /// Mixed steps: long prompts beside short ones, decode at mixed contexts.
    pub checks: Vec<policies::profile::StepCheck>,
}

/// Runs `engine profile --diffusion` and writes the file.
pub fn run_diffusion(args: &ProfileArgs) -> Result<(), ProfileError> {
    let e = args.engine.clone().resolved();
    let (gpu, machine) = match e.backend() {
        BackendKind::Cpu => {
            (None, format!("{} threads", std::thread::available_parallelism().map_or(1, |n| n.get())))
        }
        BackendKind::Cuda => {
            let gpu = crate::gpu::open_diffusion(e.model_seed).map_err(crate::StartError::Gpu)?;
            let name = gpu.device_name();
            (Some(gpu), name)
        }
        BackendKind::Emulated => {
            return Err(ProfileError::Video("measuring diffusion jobs needs --backend cpu or cuda".into()))
        }
    };
    let text = match &e.diffusion_profile {
        Some(p) => std::fs::read_to_string(p).map_err(|err| {
            ProfileError::Start(crate::StartError::ReadProfile(p.display().to_string(), err))
        })?,
        None => crate::DIFFUSION_PROFILE.to_string(),
    };
    let template = policies::diffusion::DiffusionProfile::parse("template", &text)
        .map_err(|err| ProfileError::Video(err.to_string()))?;
    let toml =
        crate::diffusion::profile::measure(&template, e.model_seed, args.repeats, &machine, gpu.as_deref())
            .map_err(|err| ProfileError::Video(err.to_string()))?;
    policies::diffusion::DiffusionProfile::parse("measured", &toml)
        .map_err(|err| ProfileError::Video(err.to_string()))?;
    std::fs::write(&args.out, toml).map_err(|err| ProfileError::Write(args.out.display().to_string(), err))
}

/// Runs `engine profile --video` and writes the file; returns the number
/// of configurations.
pub fn run_video(args: &ProfileArgs) -> Result<usize, ProfileError> {
    let args = &ProfileArgs { engine: args.engine.clone().resolved(), ..args.clone() };
    let (profile, source) = match (&args.rescale, args.reference_ms) {
        (Some(from), Some(ms)) => rescaled_video(args, from, ms)?,
        _ => measured_video(args)?,
    };
    std::fs::write(&args.out, profile.to_toml(&source))
        .map_err(|err| ProfileError::Write(args.out.display().to_string(), err))?;
    Ok(profile.configs.len())
}

/// `--rescale FROM --reference-ms MS`: the profile and its source line.
fn rescaled_video(
    args: &ProfileArgs,
    from: &std::path::Path,
    ms: f64,
) -> Result<(policies::video::VideoProfile, String), ProfileError> {
    let text = std::fs::read_to_string(from)
        .map_err(|err| crate::StartError::ReadProfile(from.display().to_string(), err))?;
    let measured = policies::video::VideoProfile::parse(&from.display().to_string(), &text)
        .map_err(|err| ProfileError::Video(err.to_string()))?;
    let class = args.engine_class.clone().unwrap_or_else(|| "emulated-video".into());
    let source = format!(
        "quality from {}; chunk times from the GPU cost model of engine/src/video/profile.rs::rescale, {ms} ms at the highest fidelity, batch_cost {}",
        from.display(),
        args.batch_cost
    );
    Ok((crate::video::profile::rescale(&measured, ms, args.batch_cost, &class), source))
}

/// Every video configuration measured on the cpu backend or a GPU: the
/// profile and its source line.
fn measured_video(args: &ProfileArgs) -> Result<(policies::video::VideoProfile, String), ProfileError> {
    use crate::video::profile as vp;
    let e = &args.engine;
    let (gpu, machine) = match e.backend() {
        BackendKind::Cpu => (None, host_cpu()),
        BackendKind::Cuda => {
            let gpu = crate::gpu::open_video(e.model_seed).map_err(crate::StartError::Gpu)?;
            let name = gpu.device_name();
            (Some(gpu), name)
        }
        _ => {
            return Err(ProfileError::Video(
                "measuring the video model needs --backend cpu or --backend cuda".into(),
            ))
        }
    };
    let vargs = vp::VideoProfileArgs {
        resolution: args.video_resolution,
        latent_frames: 3,
        chunks: args.video_chunks.max(2),
        prompts: vec!["a red fox running through snow".into(), "waves breaking on a rocky shore".into()],
        threads: e.cpu_threads(),
        model_seed: e.model_seed,
        engine_class: args
            .engine_class
            .clone()
            .unwrap_or_else(|| format!("{}-{}", e.backend().as_str(), slug(&machine))),
        model: "synthetic-video".into(),
    };
    let runner = match &gpu {
        Some(g) => vp::Runner::Gpu(&**g),
        None => vp::Runner::Cpu { threads: vargs.threads },
    };
    let profile = vp::measure(&vargs, runner, |i, n, p| {
        eprintln!(
            "[{i:>2}/{n}] {:<18} {:>8.2} ms  quality {:.4}",
            p.fidelity.to_string(),
            p.chunk_ms,
            p.quality
        );
    });
    Ok((profile, format!("engine profile --video --backend {} on {machine}", e.backend().as_str())))
}

/// Runs `engine profile` and writes the file.
pub fn run(args: &ProfileArgs) -> Result<Measured, ProfileError> {
    let args = &ProfileArgs { engine: args.engine.clone().resolved(), ..args.clone() };
    let e = &args.engine;
    let kv = KvAllocator::new(e.kv_config());
    // What was measured, and the machine it ran on (the GPU for cuda).
    let (m, host) = match e.backend() {
        BackendKind::Emulated => {
            let profile = crate::load_profile(e)?;
            (measure(&mut Emulated { profile, to_max_tokens: false }, &kv, args)?, host_cpu())
        }
        BackendKind::Cpu => {
            let model = e.model_config();
            model.validate().map_err(crate::StartError::Model)?;
            let mut cpu = Cpu::new(model, e.cpu_threads(), kv.total_pages(), e.page_tokens);
            (measure(&mut cpu, &kv, args)?, host_cpu())
        }
        BackendKind::Cuda => {
            let model = e.model_config();
            model.validate().map_err(crate::StartError::Model)?;
            let (mut lm, gpu) = crate::backend::cuda::open_lm(model, kv.total_pages(), e.page_tokens)
                .map_err(crate::StartError::Gpu)?;
            (measure(&mut lm, &kv, args)?, gpu)
        }
    };
    let class =
        args.engine_class.clone().unwrap_or_else(|| format!("{}-{}", e.backend().as_str(), slug(&host)));
    let text = render(args, &class, &host, &m);
    std::fs::write(&args.out, text)
        .map_err(|err| ProfileError::Write(args.out.display().to_string(), err))?;
    Ok(m)
}

fn request(prompt_tokens: u32) -> GenerateRequest {
    // Four-character words: one token each.
    let prompt = (0..prompt_tokens).map(|i| format!("w{:03}", i % 1000)).collect::<Vec<_>>().join(" ");
    GenerateRequest {
        request_id: "profile".into(),
        model: "profile".into(),
        prompt,
        max_tokens: u32::MAX,
        temperature: Some(0.0),
        seed: None,
        stop: vec![],
        priority_key: None,
        ttft_budget_ms: None,
        priority: None,
    }
}

/// A sequence under measurement.
struct Probe<S> {
    seq: S,
    pages: PageSet,
    context: u32,
}

fn step<B: Backend>(backend: &mut B, probes: &mut [Probe<B::Seq>], decode: bool) -> Duration {
    let t0 = crate::clock::now();
    let mut slots: Vec<Slot<'_, B::Seq>> = probes
        .iter_mut()
        .map(|p| Slot { context: p.context, cached: 0, pages: p.pages.pages(), seq: &mut p.seq, out: None })
        .collect();
    let device = if decode { backend.decode(&mut slots) } else { backend.prefill(&mut slots) };
    let ended = slots.iter().any(|s| s.out == Some(Token::End));
    let took = crate::clock::since(t0) + device;
    if !ended {
        probes.iter_mut().for_each(|p| p.context += 1);
    }
    took
}

pub use crate::stats::median;

fn measure<B: Backend>(
    backend: &mut B,
    kv: &Arc<KvAllocator>,
    args: &ProfileArgs,
) -> Result<Measured, ProfileError> {
    let repeats = args.repeats.max(1) as usize;
    let steps = args.prompts.len() + 2 * args.batches.len() + mixed::MIXED_STEPS;
    let mut done = 0;
    let mut report = |label: String, ms: f64| {
        done += 1;
        eprintln!("[{done:2}/{steps}] {label}: {ms:.3} ms");
    };
    let new_probe = |backend: &mut B, prompt: u32, room: u32| -> Result<Probe<B::Seq>, ProfileError> {
        let pages = kv
            .admit_running(u64::from(prompt + room), &[])
            .map_err(|_| ProfileError::KvTooSmall(kv.total_pages()))?;
        Ok(Probe { seq: backend.start(&request(prompt), prompt), pages, context: prompt })
    };
    let decode_steps = mixed::DECODE_STEPS;
    let room = (repeats as u32 + 2) * decode_steps;

    let mut prefill = Vec::new();
    for &n in &args.prompts {
        let mut times = Vec::new();
        for i in 0..=repeats {
            let mut p = vec![new_probe(backend, n, 1)?];
            let t = step(backend, &mut p, false).as_secs_f64() * 1e3;
            if i > 0 {
                times.push(t);
            }
        }
        let ms = median(times);
        report(format!("prefill {n:5} tokens"), ms);
        prefill.push((n, ms));
    }

    // Decode at a short context (16 tokens) and at --long-context.
    let mut decode_at =
        |context: u32, report: &mut dyn FnMut(String, f64)| -> Result<Vec<(u32, f64)>, ProfileError> {
            let mut out = Vec::new();
            for &b in &args.batches {
                let mut probes =
                    (0..b).map(|_| new_probe(backend, context, room)).collect::<Result<Vec<_>, _>>()?;
                step(backend, &mut probes, false);
                let mut times = Vec::new();
                for i in 0..=repeats {
                    let t: f64 =
                        (0..decode_steps).map(|_| step(backend, &mut probes, true).as_secs_f64() * 1e3).sum();
                    if i > 0 {
                        times.push(t / f64::from(decode_steps));
                    }
                }
                let ms = median(times);
                report(format!("decode batch {b:3} context {context:5}"), ms);
                out.push((b, ms));
            }
            Ok(out)
        };
    let decode = decode_at(16, &mut report)?;
    let long = decode_at(args.long_context.max(17), &mut report)?;
    // Extra time per 1,000 tokens of batch context: the least-squares slope
    // through every batch's (extra tokens, extra time), so the big batches,
    // where context matters most, weigh most and one noisy small step little.
    let extra = |b: u32| f64::from(b) * f64::from(args.long_context.max(17) - 16) / 1000.0;
    let (xy, xx) = decode.iter().zip(&long).fold((0.0, 0.0), |(xy, xx), (&(b, short), &(_, long_ms))| {
        (xy + extra(b) * (long_ms - short), xx + extra(b) * extra(b))
    });
    let ms_per_1k_context = if xx > 0.0 { (xy / xx).max(0.0) } else { 0.0 };
    let checks = mixed::measure(backend, args, repeats, &new_probe, &mut report)?;
    let attention_ms_per_1k2 = mixed::fit_attention(&prefill, &decode, ms_per_1k_context, &checks);
    Ok(Measured { prefill, decode, ms_per_1k_context, attention_ms_per_1k2, checks })
}

fn render(args: &ProfileArgs, class: &str, host: &str, m: &Measured) -> String {
    let e = &args.engine;
    let points =
        |v: &[(u32, f64)]| v.iter().map(|(x, ms)| format!("[{x}, {ms:.3}]")).collect::<Vec<_>>().join(", ");
    let model = match e.backend() {
        BackendKind::Cuda => format!(
            "model on the GPU (bf16 weights): {} layers, hidden {}, {} heads, MLP {}, vocab {}, seed {}",
            e.model_layers, e.model_hidden, e.model_heads, e.model_ffn, e.model_vocab, e.model_seed
        ),
        BackendKind::Cpu => format!(
            "cpu model: {} layers, hidden {}, {} heads, MLP {}, vocab {}, seed {}; {} compute threads",
            e.model_layers,
            e.model_hidden,
            e.model_heads,
            e.model_ffn,
            e.model_vocab,
            e.model_seed,
            e.cpu_threads()
        ),
        BackendKind::Emulated => "emulated backend (replays its input profile)".to_string(),
    };
    format!(
        "# Latency profile measured by `engine profile --backend {backend}`.\n\
         # Host: {host}; {threads} hardware threads.\n\
         # {model}; {page} tokens per KV page.\n\
         # Each point is the median of {repeats} runs; decode points are per step at\n\
         # 16 tokens of context per sequence, the context term compares the same\n\
         # batches at {long} tokens per sequence.\n\
         model = \"{name}\"\n\
         engine_class = \"{class}\"\n\
         source = \"measured: engine profile --backend {backend} on {host}\"\n\n\
         [prefill]\n\
         # [prompt tokens, milliseconds]\n\
         points = [{prefill}]\n\
         # per-sequence attention, ms per (1,000 tokens)², fitted to the mixed batches below\n\
         attention_ms_per_1k2 = {attention:.4}\n\n\
         [decode]\n\
         # [batch size, milliseconds per decode step] at short context\n\
         batch_points = [{decode}]\n\
         # extra step time per 1,000 tokens of context summed over the batch\n\
         ms_per_1k_context = {slope:.4}\n\n\
         # Mixed steps timed on the same backend (medians of {repeats}): the model above\n\
         # must reproduce each within 15% (policies::profile tests).\n{checks}",
        backend = e.backend().as_str(),
        threads = std::thread::available_parallelism().map_or(1, |n| n.get()),
        page = e.page_tokens,
        repeats = args.repeats.max(1),
        long = args.long_context.max(17),
        name = args.model,
        prefill = points(&m.prefill),
        decode = points(&m.decode),
        slope = m.ms_per_1k_context,
        attention = m.attention_ms_per_1k2,
        checks = m
            .checks
            .iter()
            .map(|c| {
                let (key, v) =
                    if c.decode.is_empty() { ("prefill", &c.prefill) } else { ("decode", &c.decode) };
                let v = v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
                format!("\n[[checks]]\n{key} = [{v}]\nms = {:.3}\nnote = \"{}\"\n", c.ms, c.note)
            })
            .collect::<String>(),
    )
}

/// The host CPU's model name (Linux), for the profile's provenance.
fn host_cpu() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn slug(s: &str) -> String {
    let s: String =
        s.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    s.split('-').filter(|p| !p.is_empty()).collect::<Vec<_>>().join("-")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ProfileArgs,
    }

    #[test]
    fn profiling_the_emulated_backend_reproduces_its_profile_and_the_file_parses() {
        let dir = std::env::temp_dir().join(format!("engine-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("p.toml");
        let cli = Cli::parse_from([
            "x",
            "--out",
            out.to_str().unwrap(),
            "--backend",
            "emulated",
            "--prompts",
            "128,2048",
            "--batches",
            "1,8",
            "--repeats",
            "1",
            "--kv-pages",
            "4096",
        ]);
        let m = run(&cli.args).unwrap();
        let text = std::fs::read_to_string(&out).unwrap();
        let p = policies::LatencyProfile::parse("p.toml", &text).unwrap();
        let bundled = policies::LatencyProfile::parse("a100", crate::DEFAULT_PROFILE).unwrap();
        // Measured = replayed device time + a little host time.
        for (n, ms) in &m.prefill {
            let want = bundled.prefill(*n).as_secs_f64() * 1e3;
            assert!(*ms >= want && *ms < want + 5.0, "prefill {n}: {ms} vs {want}");
            assert!((p.prefill(*n).as_secs_f64() * 1e3 - ms).abs() < 0.01);
        }
        assert!(m.decode[1].1 > m.decode[0].1, "a bigger batch takes longer per step");
        // The mixed steps replay the profile's own model (no attention term
        // in the A100 profile: a batch costs the curve at its total), and
        // the written file keeps them as checks.
        assert_eq!(m.checks.len(), mixed::MIXED_STEPS);
        for c in &m.checks {
            let want = c.predicted_ms(&bundled);
            assert!(c.ms >= want * 0.97 && c.ms < want * 1.05 + 5.0, "{c:?}: replayed {} vs {want}", c.ms);
        }
        assert_eq!(p.checks.len(), mixed::MIXED_STEPS, "{text}");
        assert_eq!(m.attention_ms_per_1k2, 0.0, "a profile without the term fits none");
        assert!(text.contains("engine_class = \"emulated-"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
