//! Command-line options of an engine process, shared by the `engine` binary
//! and the gateway's embedded supervisor (which runs engines as children).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use policies::batching::{BatchLimits, BatchMode};
use policies::LatencyProfile;

use crate::backend::cpu::ModelConfig;
use crate::backend::{BackendChoice, BackendKind};
use crate::kv::KvConfig;
use crate::scheduler::SchedulerConfig;

/// `--batching`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Batching {
    Continuous,
    Static,
}

/// An on/off flag value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Toggle {
    On,
    Off,
}

/// Options of one engine process.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// Address to listen on (port 0 picks a free port; the chosen address is
    /// printed on the ready line).
    #[arg(long, default_value = "127.0.0.1:9000")]
    pub listen: SocketAddr,
    /// Engine id reported in load reports and the gateway's `x-engine`.
    #[arg(long, default_value = "engine-0")]
    pub id: String,
    /// Execution backend.
    #[arg(long = "backend", value_enum, default_value_t = BackendChoice::Emulated)]
    pub backend_choice: BackendChoice,
    /// `backend_choice` resolved on this machine ([`EngineArgs::resolved`]).
    #[arg(skip)]
    resolved_backend: Option<BackendKind>,
    /// Latency profile (TOML): the emulated backend replays it, batch
    /// formation predicts prefill time with it. Bundled default:
    /// `emulated-a100-8b` (emulated) or `cpu-epyc-2core` (cpu).
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Emulated answers run to `max_tokens` instead of ending by themselves
    /// after 16-272 tokens (load tests replaying a trace's output lengths).
    #[arg(long)]
    pub emulated_to_max_tokens: bool,
    /// KV cache pages [default: 16384 for emulated; for cpu, as many as fit
    /// in --kv-cache-mb].
    #[arg(long)]
    pub kv_pages: Option<u32>,
    /// Host memory for the cpu backend's K/V arena, MiB (sizes the page
    /// count when --kv-pages is not given).
    #[arg(long, default_value_t = 512)]
    pub kv_cache_mb: u32,
    /// Tokens per KV page (also the prefix cache's block: keep it equal to
    /// the gateway's `[routing.prefix] block_tokens`).
    #[arg(long, default_value_t = 16)]
    pub page_tokens: u32,
    /// The prefix cache: prompts' full pages are kept after their sequence
    /// ends and shared by later prompts with the same prefix (`off`: every
    /// prompt is computed whole; the benchmarks' baseline).
    #[arg(long, value_enum, default_value_t = Toggle::On)]
    pub prefix_cache: Toggle,
    /// Stop admitting when fewer than this fraction of KV pages would stay free.
    #[arg(long, default_value_t = 0.05)]
    pub kv_low_watermark: f64,
    /// Admit again once this fraction of KV pages is free.
    #[arg(long, default_value_t = 0.15)]
    pub kv_high_watermark: f64,
    /// Output tokens reserved at admission (the output over-estimate; capped by max_tokens).
    #[arg(long, default_value_t = 64)]
    pub kv_output_reserve: u32,
    /// KV pages added at a time when a sequence outgrows its reservation.
    #[arg(long, default_value_t = 2)]
    pub kv_extend_pages: u32,
    /// Batch formation: `continuous` (sequences join and leave at token
    /// boundaries) or `static` (a batch runs to completion before the next;
    /// the naive baseline of the admission benchmark).
    #[arg(long, value_enum, default_value_t = Batching::Continuous)]
    pub batching: Batching,
    /// Most sequences decoding at once (continuous batching slots).
    #[arg(long, default_value_t = 64)]
    pub max_batch: u32,
    /// Most prompt tokens in one prefill batch.
    #[arg(long, default_value_t = 8192)]
    pub max_prefill_tokens: u32,
    /// Prompts of at least this many tokens go to the long lane.
    #[arg(long, default_value_t = 1024)]
    pub long_prompt_tokens: u32,
    /// Most long prompts in one prefill batch.
    #[arg(long, default_value_t = 1)]
    pub max_long_per_prefill: u32,
    /// Split a prefill batch when longest/median prompt exceeds this.
    #[arg(long, default_value_t = 8.0)]
    pub split_ratio: f64,
    /// Slots kept for long prompts while they wait (no starvation).
    #[arg(long, default_value_t = 2)]
    pub reserved_long_slots: u32,
    /// Longest time (ms) running streams may go without a token while prefill
    /// batches run back to back; then a decode step comes first.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_decode_stall_ms: u32,
    /// TTFT budget (ms) for requests that carry none.
    #[arg(long, default_value_t = 2000)]
    pub default_ttft_ms: u64,
    /// Most times one sequence may be preempted.
    #[arg(long, default_value_t = 2)]
    pub max_preemptions: u32,
    /// Tokens a sequence produces after (re)starting before it may be preempted.
    #[arg(long, default_value_t = 16)]
    pub min_quantum_tokens: u32,
    /// cpu model: transformer layers.
    #[arg(long, default_value_t = 4)]
    pub model_layers: usize,
    /// cpu model: hidden size.
    #[arg(long, default_value_t = 512)]
    pub model_hidden: usize,
    /// cpu model: attention heads (must divide the hidden size).
    #[arg(long, default_value_t = 8)]
    pub model_heads: usize,
    /// cpu model: MLP inner width.
    #[arg(long, default_value_t = 1536)]
    pub model_ffn: usize,
    /// cpu model: vocabulary size.
    #[arg(long, default_value_t = 8192)]
    pub model_vocab: usize,
    /// cpu model: seed the weights are generated from.
    #[arg(long, default_value_t = 0)]
    pub model_seed: u64,
    /// cpu backend: threads for large matrix products [default: all
    /// hardware threads].
    #[arg(long)]
    pub cpu_threads: Option<usize>,
    /// Video profile (TOML; latency and quality per fidelity
    /// configuration). Bundled default: `video-emulated-h100` (emulated) or
    /// `video-cpu-epyc-2core` (cpu).
    #[arg(long)]
    pub video_profile: Option<PathBuf>,
    /// Diffusion profile (TOML; `T_img` per image batch, `T_step` per video
    /// step and SP degree) the emulated backend replays and the gateway's
    /// diffusion scheduler plans with. Bundled default: `genserve-emulated`
    /// (emulated, cuda) or `genserve-cpu-epyc-2core` (cpu, measured).
    #[arg(long)]
    pub diffusion_profile: Option<PathBuf>,
    /// Video streams whose state may be resident at once (the state arena);
    /// more are suspended to host memory, highest credit first.
    #[arg(long, default_value_t = 8)]
    pub video_arena_slots: u32,
    /// Most chunks in one coalesced video batch.
    #[arg(long, default_value_t = 8)]
    pub video_max_batch: u32,
    /// Each video session's paged KV window, MiB (rewritten a page per
    /// chunk; what a migration moves besides the model state). 0: none.
    #[arg(long, default_value_t = 0.0)]
    pub video_state_mib: f64,
    /// Register in this fleet's Redis (`redis://host:port`, over TLS
    /// `rediss://host:port[?ca_file=PATH]`, or Sentinel:
    /// `redis+sentinel://host:port,host:port/master`) so every
    /// gateway of the fleet discovers this engine. A URL with a password
    /// belongs in the `ENGINE_REDIS_URL` environment variable instead.
    #[arg(long)]
    pub redis: Option<String>,
    /// Emulated backend: wait this long before warm-up, as a real engine
    /// loads its weights (cold-start experiments; the ready line and
    /// `cold_start_ms` include it).
    #[arg(long, default_value_t = 0)]
    pub emulate_load_ms: u64,
    /// The base URL gateways reach this engine at, as registered in Redis
    /// (default `http://<listen address>`; behind Kubernetes, the pod's
    /// address: `--advertise=http://$(POD_IP):9000`).
    #[arg(long)]
    pub advertise: Option<String>,
    /// File holding the API token every route but /healthz and /readyz
    /// requires (or the `ENGINE_API_TOKEN` environment variable). Without a
    /// token the engine refuses to listen on a non-loopback address.
    #[arg(long)]
    pub api_token_file: Option<PathBuf>,
    /// Exit when standard input closes. A supervising parent holds the other
    /// end of the pipe, so the engine never outlives it, even on SIGKILL.
    #[arg(long)]
    pub exit_on_stdin_eof: bool,
    /// Open client connections at most; past it a new connection is closed
    /// at once. Gateways multiplex over a few HTTP/2 connections each; a
    /// proxy speaking HTTP/1.1 upstream (nginx) needs one per request in
    /// flight, so put such a proxy in front with this raised (and the
    /// process's file-descriptor limit with it).
    #[arg(long, default_value_t = crate::server::MAX_CONNECTIONS,
          value_parser = clap::builder::TypedValueParser::map(clap::value_parser!(u32).range(1..=1_048_576), |n| n as usize))]
    pub max_connections: usize,
    /// New HTTP/2 streams per second one connection may open (a bucket of
    /// `MAX_STREAMS`); past it the connection is closed as abusive, as it is
    /// when more than half of its last 100 streams were reset before their
    /// response head (rapid reset). 0: unbounded.
    #[arg(long, default_value_t = crate::server::MAX_NEW_STREAMS_PER_S)]
    pub max_new_streams_per_s: u32,
    /// The model name the OpenAI surface (`/v1/chat/completions`,
    /// `/v1/completions`, `/v1/models`) serves, as vLLM's flag of the same
    /// name; a request naming another model is a 404 `model_not_found`.
    #[arg(long, default_value = "synthetic-small")]
    pub served_model_name: String,
    /// Output tokens of an OpenAI chat request that sets no `max_tokens`
    /// (text completions default to 16, as OpenAI's do).
    #[arg(long, default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(engine_api::bounds::MAX_TOKENS)))]
    pub default_max_tokens: u32,
}

impl EngineArgs {
    /// The API token: `--api-token-file`, else `ENGINE_API_TOKEN`, else none.
    pub fn api_token(&self) -> Result<Option<String>, String> {
        let token = match &self.api_token_file {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .map_err(|e| format!("reading {}: {e}", p.display()))?
                    .trim()
                    .to_string(),
            ),
            None => std::env::var(crate::api::TOKEN_ENV).ok().map(|t| t.trim().to_string()),
        };
        match token {
            Some(t) if t.len() < crate::api::MIN_TOKEN_LEN => {
                Err(format!("the API token must be at least {} characters", crate::api::MIN_TOKEN_LEN))
            }
            t => Ok(t),
        }
    }

    /// The fleet's Redis URL: `--redis`, else `ENGINE_REDIS_URL`.
    pub fn redis_url(&self) -> Option<String> {
        self.redis.clone().or_else(|| std::env::var(crate::api::REDIS_ENV).ok().filter(|u| !u.is_empty()))
    }

    /// These options with `--backend auto` resolved to this machine's
    /// backend; logs which and why.
    pub fn resolved(mut self) -> Self {
        let (kind, why) = self.backend_choice.resolve();
        if self.backend_choice == BackendChoice::Auto {
            tracing::warn!(event = "backend_selected", engine = %self.id, backend = kind.as_str(), why = %why);
        } else {
            tracing::info!(event = "backend_selected", engine = %self.id, backend = kind.as_str(), why = %why);
        }
        self.resolved_backend = Some(kind);
        self
    }

    /// The backend this engine runs: as resolved at start, or (before
    /// [`EngineArgs::resolved`]) the choice resolved now.
    pub fn backend(&self) -> BackendKind {
        self.resolved_backend.unwrap_or_else(|| self.backend_choice.resolve().0)
    }

    /// The cpu backend's model shape.
    pub fn model_config(&self) -> ModelConfig {
        ModelConfig {
            layers: self.model_layers,
            hidden: self.model_hidden,
            heads: self.model_heads,
            ffn: self.model_ffn,
            vocab: self.model_vocab,
            seed: self.model_seed,
        }
    }

    /// Compute threads of the cpu backend.
    pub fn cpu_threads(&self) -> usize {
        self.cpu_threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1)
    }

    /// KV pages: the flag, or the backend's default.
    pub fn kv_pages(&self) -> u32 {
        self.kv_pages.unwrap_or_else(|| match self.backend() {
            BackendKind::Emulated => 16384,
            BackendKind::Cpu | BackendKind::Cuda => {
                let page_bytes =
                    self.model_config().kv_bytes_per_token() as u64 * u64::from(self.page_tokens.max(1));
                let budget = u64::from(self.kv_cache_mb) << 20;
                u32::try_from(budget / page_bytes.max(1)).unwrap_or(u32::MAX).max(1)
            }
        })
    }

    pub fn kv_config(&self) -> KvConfig {
        KvConfig {
            total_pages: self.kv_pages(),
            page_tokens: self.page_tokens,
            low_watermark: self.kv_low_watermark,
            high_watermark: self.kv_high_watermark,
            prefix_cache: self.prefix_cache == Toggle::On,
        }
    }

    /// Scheduler settings from the flags and the latency profile.
    pub fn scheduler_config(&self, profile: LatencyProfile) -> SchedulerConfig {
        SchedulerConfig {
            limits: BatchLimits {
                mode: match self.batching {
                    Batching::Continuous => BatchMode::Continuous,
                    Batching::Static => BatchMode::Static,
                },
                max_batch: self.max_batch.max(1),
                max_prefill_tokens: self.max_prefill_tokens,
                long_prompt_tokens: self.long_prompt_tokens,
                max_long_per_prefill: self.max_long_per_prefill,
                split_ratio: self.split_ratio,
                reserved_long_slots: self.reserved_long_slots,
                ttft_fraction: 0.4,
                max_decode_stall_ms: self.max_decode_stall_ms,
            },
            profile,
            output_reserve_tokens: self.kv_output_reserve,
            extend_pages: self.kv_extend_pages,
            default_ttft: Duration::from_millis(self.default_ttft_ms),
            max_preemptions: self.max_preemptions,
            min_quantum_tokens: self.min_quantum_tokens,
        }
    }
}
