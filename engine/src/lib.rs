//! An inference engine process: one per GPU (or emulated GPU).
//!
//! Owns the internal HTTP/2 API ([`api`], [`server`]), the single-owner
//! scheduler with continuous batching and preemption ([`scheduler`]), the
//! paged KV allocator ([`kv`]), stop sequences ([`stop`]) and the execution
//! backends ([`backend`]). The gateway talks to it only over the network,
//! except that it reuses [`api`] types and [`cli`] options so the wire format
//! and the child-process flags have one definition.
// `unsafe` only in the GPU module (CUDA FFI) and the cpu backend's AVX2
// kernel, each use with its safety argument beside it.
#![deny(unsafe_code)]

pub use engine_api as api;
pub mod backend;
pub mod body;
pub mod cli;
pub mod clock;
pub mod diffusion;
#[allow(unsafe_code)]
pub mod gpu;
pub mod http;
pub mod kv;
pub mod metrics;
pub mod models;
mod openai;

/// Entry points for the fuzz targets (`fuzz/`).
pub mod fuzzing {
    pub use crate::openai::fuzz_request as openai_request;
}
pub mod registry;
mod routes;
pub mod scheduler;
pub mod server;
pub mod stats;
pub mod stop;
pub mod tools;
pub mod video;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use policies::LatencyProfile;
use tokio::io::AsyncReadExt;

use crate::backend::cpu::Cpu;
use crate::backend::emulated::Emulated;
use crate::backend::BackendKind;
use crate::cli::EngineArgs;
use crate::kv::KvAllocator;
use crate::scheduler::Scheduler;

/// The bundled default latency profile of the emulated backend.
pub const DEFAULT_PROFILE: &str = include_str!("../../policies/profiles/emulated-a100-8b.toml");
/// The bundled profile of the cpu backend's default model, measured with
/// `engine profile --backend cpu` on the development machine.
pub const CPU_PROFILE: &str = include_str!("../../policies/profiles/cpu-epyc-2core.toml");
/// The bundled video profile of the emulated backend (quality measured on
/// the cpu backend, chunk times from a GPU-class cost model).
pub const VIDEO_PROFILE: &str = include_str!("../../policies/profiles/video-emulated-h100.toml");
/// The bundled video profile of the cpu backend, measured with `engine
/// profile --video --backend cpu`.
pub const CPU_VIDEO_PROFILE: &str = include_str!("../../policies/profiles/video-cpu-epyc-2core.toml");
/// The bundled diffusion profile (GenServe's published tables).
/// The cuda backend's bundled profiles, measured on an NVIDIA H200 with
/// `scripts/gpu-verify` (`engine profile [--video|--diffusion] --backend cuda`).
pub const CUDA_PROFILE: &str = include_str!("../../policies/profiles/cuda-h200.toml");
pub const CUDA_VIDEO_PROFILE: &str = include_str!("../../policies/profiles/video-cuda-h200.toml");
pub const CUDA_DIFFUSION_PROFILE: &str = include_str!("../../policies/profiles/genserve-cuda-h200.toml");
pub const DIFFUSION_PROFILE: &str = include_str!("../../policies/profiles/genserve-emulated.toml");
/// The bundled diffusion profile of the cpu backend, measured with `engine
/// profile --diffusion --backend cpu`.
pub const CPU_DIFFUSION_PROFILE: &str = include_str!("../../policies/profiles/genserve-cpu-epyc-2core.toml");

/// How long SIGTERM waits for in-flight work before exiting anyway.
const DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// One engine's shared state.
#[derive(Debug)]
pub struct Engine {
    pub id: String,
    pub backend: BackendKind,
    pub engine_class: String,
    /// The latency profile's TOML text, served at `GET /engine/v1/profile`.
    pub profile_toml: String,
    pub scheduler: Scheduler,
    pub kv: Arc<KvAllocator>,
    /// Video sessions and their scheduler.
    pub video: video::VideoEngine,
    /// Image batches and whole-video jobs (GenServe).
    pub diffusion: diffusion::DiffusionEngine,
    /// The video profile's TOML text, served at `GET /engine/v1/video/profile`.
    pub video_profile_toml: String,
    /// Required as a bearer token on every route but health and readiness.
    pub api_token: Option<String>,
    /// Bytes of each video session's KV window (`--video-state-mib`).
    pub video_state_bytes: usize,
    /// The OpenAI surface's model name and chat default output cap.
    pub served_model: String,
    pub default_max_tokens: u32,
    /// Numbers the OpenAI surface's response ids.
    openai_ids: std::sync::atomic::AtomicU64,
    ready: AtomicBool,
    draining: AtomicBool,
    /// Origin of the times fed to the KV slope (the allocator takes time as
    /// a parameter).
    started: Instant,
    /// Names this process in its KV events (start time in microseconds
    /// and the process id): a gateway that sees it change resynchronises.
    epoch: u64,
    cold_start: std::sync::OnceLock<Duration>,
}

impl Engine {
    /// Ready and not draining.
    pub fn accepting(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && !self.draining.load(Ordering::SeqCst)
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Stops taking new work; running sequences finish.
    pub fn start_drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.scheduler.start_drain();
    }

    pub async fn load_report(&self) -> api::LoadReport {
        self.kv.sample(crate::clock::since(self.started).as_secs_f64());
        let kv = self.kv.snapshot();
        let s = self.scheduler.snapshot().await;
        api::LoadReport {
            engine_id: self.id.clone(),
            backend: self.backend.as_str().to_string(),
            engine_class: self.engine_class.clone(),
            ready: self.accepting(),
            draining: self.is_draining(),
            queued_sequences: s.queued_sequences,
            queued_tokens: s.queued_tokens,
            inflight_sequences: s.inflight_sequences,
            inflight_tokens: s.inflight_tokens,
            kv_pages_free: kv.free,
            kv_pages_total: kv.total,
            kv_admitting: kv.admitting,
            kv_consumption_pages_per_s: kv.slope,
            decode_step_ms: s.decode_step_ms,
            batch_achieved: s.batch_achieved,
            batch_target: s.batch_target,
            preemptions: s.preemptions,
            cold_start_ms: self.cold_start.get().map_or(0.0, |d| d.as_secs_f64() * 1e3),
            kv_page_tokens: kv.page_tokens,
            kv_low_watermark_pages: kv.low_pages,
            prefix_cached_pages: kv.cached_pages,
            prefix_lookup_tokens: s.prompt_tokens,
            prefix_hit_tokens: s.cached_tokens,
        }
    }

    /// The prefix cache's events after `after` (see [`api::KvEvents`]).
    pub fn kv_events(&self, after: u64) -> api::KvEvents {
        let mut out = api::KvEvents {
            engine_id: self.id.clone(),
            epoch: self.epoch,
            page_tokens: self.kv.page_tokens(),
            last_seq: 0,
            more: false,
            events: Vec::new(),
            snapshot: None,
        };
        match self.kv.events_since(after, api::KV_EVENTS_MAX) {
            kv::KvEventsSince::Events { events, last_seq, more } => {
                out.events = events
                    .into_iter()
                    .map(|e| api::KvEvent { seq: e.seq, stored: e.stored, evicted: e.evicted })
                    .collect();
                (out.last_seq, out.more) = (last_seq, more);
            }
            kv::KvEventsSince::Snapshot { hashes, last_seq } => {
                (out.snapshot, out.last_seq) = (Some(hashes), last_seq);
            }
        }
        out
    }
}

/// Errors starting an engine.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("reading profile {0}: {1}")]
    ReadProfile(String, std::io::Error),
    #[error("diffusion profile: {0}")]
    DiffusionProfile(String),
    #[error(transparent)]
    Profile(#[from] policies::profile::ProfileError),
    #[error("binding {0}: {1}")]
    Bind(std::net::SocketAddr, std::io::Error),
    #[error("cpu model: {0}")]
    Model(String),
    #[error("cuda backend: {0}")]
    Gpu(String),
    #[error("tracing: {0}")]
    Tracing(String),
    #[error(transparent)]
    VideoProfile(#[from] policies::video::fidelity::VideoProfileError),
    #[error("warm-up failed: {0}")]
    WarmUp(String),
    #[error("API token: {0}")]
    Token(String),
    #[error("refusing to listen on {0} without an API token: set ENGINE_API_TOKEN or --api-token-file, or listen on loopback")]
    InsecureBind(std::net::SocketAddr),
}

/// The latency profile an engine uses: `--profile`, or its backend's bundled one.
pub fn load_profile(args: &EngineArgs) -> Result<LatencyProfile, StartError> {
    let (name, text) = profile_source(args)?;
    Ok(LatencyProfile::parse(&name, &text)?)
}

/// The profile's name (for errors) and TOML text.
fn profile_source(args: &EngineArgs) -> Result<(String, String), StartError> {
    let (name, text) = match &args.profile {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| StartError::ReadProfile(p.display().to_string(), e))?;
            (p.display().to_string(), text)
        }
        None => match args.backend() {
            BackendKind::Emulated => {
                ("bundled emulated-a100-8b.toml".to_string(), DEFAULT_PROFILE.to_string())
            }
            BackendKind::Cuda => ("bundled cuda-h200.toml".to_string(), CUDA_PROFILE.to_string()),
            BackendKind::Cpu => ("bundled cpu-epyc-2core.toml".to_string(), CPU_PROFILE.to_string()),
        },
    };
    Ok((name, text))
}

/// Builds the engine (backend, KV cache, scheduler) without serving it.
pub fn build(args: &EngineArgs) -> Result<Arc<Engine>, StartError> {
    let (name, profile_toml) = profile_source(args)?;
    let profile = LatencyProfile::parse(&name, &profile_toml)?;
    let kv = KvAllocator::new(args.kv_config());
    let cfg = args.scheduler_config(profile.clone());
    let engine_class = profile.engine_class.clone();
    let (mut gpu_video, mut gpu_diffusion) = (None, None);
    let scheduler = match args.backend() {
        BackendKind::Emulated => {
            let emulated = Emulated { profile, to_max_tokens: args.emulated_to_max_tokens };
            Scheduler::spawn(emulated, Arc::clone(&kv), cfg)
        }
        BackendKind::Cuda => {
            let model = args.model_config();
            model.validate().map_err(StartError::Model)?;
            let (lm, video, diffusion) = backend::cuda::start_cuda(
                model,
                kv.total_pages(),
                args.page_tokens,
                args.model_seed,
                &engine_class,
            )
            .map_err(StartError::Gpu)?;
            gpu_video = Some(video);
            gpu_diffusion = Some(diffusion);
            Scheduler::spawn(lm, Arc::clone(&kv), cfg)
        }
        BackendKind::Cpu => {
            let model = args.model_config();
            model.validate().map_err(StartError::Model)?;
            let cpu = Cpu::new(model, args.cpu_threads(), kv.total_pages(), args.page_tokens);
            Scheduler::spawn(cpu, Arc::clone(&kv), cfg)
        }
    };
    let (video_name, video_profile_toml) = match &args.video_profile {
        Some(p) => (
            p.display().to_string(),
            std::fs::read_to_string(p).map_err(|e| StartError::ReadProfile(p.display().to_string(), e))?,
        ),
        None => match args.backend() {
            BackendKind::Emulated => {
                ("bundled video-emulated-h100.toml".to_string(), VIDEO_PROFILE.to_string())
            }
            BackendKind::Cuda => ("bundled video-cuda-h200.toml".to_string(), CUDA_VIDEO_PROFILE.to_string()),
            BackendKind::Cpu => {
                ("bundled video-cpu-epyc-2core.toml".to_string(), CPU_VIDEO_PROFILE.to_string())
            }
        },
    };
    let video_profile = policies::video::VideoProfile::parse(&video_name, &video_profile_toml)?;
    let video_state_bytes = (args.video_state_mib.clamp(0.0, 2048.0) * 1048576.0) as usize;
    let video = video::VideoEngine::spawn(video::VideoConfig {
        backend: args.backend(),
        profile: video_profile,
        arena_slots: args.video_arena_slots.max(1),
        max_batch: args.video_max_batch.max(1),
        threads: args.cpu_threads(),
        model_seed: args.model_seed,
        gpu: gpu_video,
        state_bytes: video_state_bytes,
    });
    let (diffusion_name, diffusion_toml) = match &args.diffusion_profile {
        Some(p) => (
            p.display().to_string(),
            std::fs::read_to_string(p).map_err(|e| StartError::ReadProfile(p.display().to_string(), e))?,
        ),
        None => match args.backend() {
            BackendKind::Cpu => {
                ("bundled genserve-cpu-epyc-2core.toml".to_string(), CPU_DIFFUSION_PROFILE.to_string())
            }
            BackendKind::Cuda => {
                ("bundled genserve-cuda-h200.toml".to_string(), CUDA_DIFFUSION_PROFILE.to_string())
            }
            BackendKind::Emulated => {
                ("bundled genserve-emulated.toml".to_string(), DIFFUSION_PROFILE.to_string())
            }
        },
    };
    let diffusion_profile = policies::diffusion::DiffusionProfile::parse(&diffusion_name, &diffusion_toml)
        .map_err(|e| StartError::DiffusionProfile(e.to_string()))?;
    let diffusion =
        diffusion::DiffusionEngine::new(args.backend(), diffusion_profile, diffusion_toml, args.model_seed)
            .with_gpu(gpu_diffusion);
    Ok(Arc::new(Engine {
        id: args.id.clone(),
        diffusion,
        backend: args.backend(),
        engine_class,
        profile_toml,
        scheduler,
        kv,
        video,
        video_profile_toml,
        api_token: args.api_token().map_err(StartError::Token)?,
        video_state_bytes,
        served_model: args.served_model_name.clone(),
        default_max_tokens: args.default_max_tokens,
        openai_ids: std::sync::atomic::AtomicU64::new(0),
        ready: AtomicBool::new(false),
        draining: AtomicBool::new(false),
        started: crate::clock::now(),
        epoch: ((crate::clock::unix_s() * 1e6) as u64) ^ (u64::from(std::process::id()) << 48),
        cold_start: std::sync::OnceLock::new(),
    }))
}

/// Runs one short generation through the whole path; the engine is ready
/// only after it (and, for real backends, weights and kernels) is done.
pub async fn warm_up(engine: &Engine) -> Result<Duration, StartError> {
    let req = api::GenerateRequest {
        request_id: "warm-up".into(),
        model: "warm-up".into(),
        prompt: "warm up the engine".into(),
        max_tokens: 2,
        temperature: None,
        seed: None,
        stop: vec![],
        priority_key: None,
        ttft_budget_ms: None,
        priority: None,
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    engine.scheduler.enqueue(req, 4, tx).await.map_err(|e| StartError::WarmUp(e.to_string()))?;
    let mut done = false;
    while let Some(line) = rx.recv().await {
        done = matches!(serde_json::from_slice(&line), Ok(api::Event::Done { .. }));
    }
    if !done {
        return Err(StartError::WarmUp("the warm-up sequence did not finish".into()));
    }
    let cold = crate::clock::since(engine.started);
    let _ = engine.cold_start.set(cold);
    ::metrics::gauge!(metrics::COLD_START).set(cold.as_secs_f64());
    ::metrics::gauge!(metrics::KV_TOTAL).set(f64::from(engine.kv.snapshot().total));
    engine.ready.store(true, Ordering::SeqCst);
    Ok(cold)
}

/// Runs an engine until SIGINT/SIGTERM (drain first) or, with
/// `--exit-on-stdin-eof`, stdin EOF (the supervisor is gone: exit now).
/// Prints one ready line on stdout once it accepts work:
/// `engine ready id=<id> listen=<addr> backend=<backend> cold_start_ms=<ms>`;
/// supervisors parse `listen=` from it.
pub async fn run(args: EngineArgs) -> Result<(), StartError> {
    metrics::handle(); // install the recorder before the first metric
    let args = args.resolved(); // `--backend auto`: probe for a GPU
    let engine = build(&args)?;
    if engine.api_token.is_none() && !args.listen.ip().is_loopback() {
        return Err(StartError::InsecureBind(args.listen));
    }
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.map_err(|e| StartError::Bind(args.listen, e))?;
    let addr = listener.local_addr().map_err(|e| StartError::Bind(args.listen, e))?;
    if args.emulate_load_ms > 0 {
        tokio::time::sleep(Duration::from_millis(args.emulate_load_ms)).await; // "loading weights"
    }
    let cold = warm_up(&engine).await?;
    if let Some(url) = args.redis_url() {
        let base = args.advertise.clone().unwrap_or_else(|| format!("http://{addr}"));
        tokio::spawn(registry::register(url, engine.id.clone(), base));
    }
    let signal = shutdown_signal(args.exit_on_stdin_eof);
    println!(
        "engine ready id={} listen={} backend={} cold_start_ms={:.1}",
        engine.id,
        addr,
        engine.backend.as_str(),
        cold.as_secs_f64() * 1e3
    );
    tracing::info!(event = "engine_ready", id = %engine.id, %addr, backend = engine.backend.as_str(), class = %engine.engine_class, cold_start_ms = cold.as_secs_f64() * 1e3);
    let stop = {
        let engine = Arc::clone(&engine);
        async move {
            if signal.await == Shutdown::Drain {
                engine.start_drain();
                tracing::info!(event = "drain_started", engine = %engine.id, why = "signal");
                if tokio::time::timeout(DRAIN_DEADLINE, engine.scheduler.drain()).await.is_err() {
                    tracing::warn!(event = "drain_timeout", engine = %engine.id);
                }
            }
        }
    };
    let limits = server::Limits {
        max_connections: args.max_connections,
        max_new_streams_per_s: args.max_new_streams_per_s,
    };
    server::serve(engine, listener, limits, stop).await;
    Ok(())
}

/// How a process was asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// SIGINT/SIGTERM: finish in-flight work first.
    Drain,
    /// The supervisor's pipe closed: it is gone, stop now.
    Orphaned,
}

/// Resolves on SIGINT, SIGTERM, or (when asked) standard input closing.
/// The signal handlers are installed by this call, not when the future is
/// first polled: a signal sent right after the `ready` line (which callers
/// print after calling this) must stop the process gracefully, not kill it
/// with the default disposition. Call it inside the runtime.
pub fn shutdown_signal(watch_stdin: bool) -> impl std::future::Future<Output = Shutdown> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler installs");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler installs");
    async move {
        let stdin_closed = async {
            if watch_stdin {
                let mut buf = [0u8; 64];
                let mut stdin = tokio::io::stdin();
                while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = int.recv() => Shutdown::Drain,
            _ = term.recv() => Shutdown::Drain,
            () = stdin_closed => Shutdown::Orphaned,
        }
    }
}
