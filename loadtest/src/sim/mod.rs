//! `loadtest sim`: the discrete-event fleet simulator.
//!
//! The same workload, arrivals and seed as `loadtest run` (the schedule
//! flags are shared), sent to a simulated fleet instead of a gateway: the
//! production admission state machine (`policies::admission::Controller`),
//! routing, batch formation (`policies::batching`) and autoscaler
//! (`policies::autoscale`) run unchanged in virtual time against engines
//! timed by the latency profile the emulated backend replays ([`engine`]).
//! Results are written as `results.json` + `report.html` in the format of
//! live runs, so `loadtest compare` and `loadtest table` read both; the
//! `fleet` part adds engines over time, autoscaling decisions, GPU-seconds
//! and cost. Labelled backend `simulated`.
//!
//! Arms (`--arm`): `ours` runs the policy document as given; `b0` and `b1`
//! are the baselines of the admission benchmark (scripts/bench-admission)
//! applied to it: admission, brownout and the product's routing off, FCFS,
//! and B0 with static micro-batches of 4 round robin, B1 with
//! length-oblivious continuous batching capped at 8, least loaded.

use std::path::PathBuf;

use policies::batching::{BatchLimits, BatchMode};
use policies::rng::SplitMix;
use policies::routing::{QueueOrder, RoutePolicy};
use policies::{LatencyProfile, PolicyDocument};

use crate::arrival::plan;
use crate::results::{Results, RunInfo, SCHEMA};
use crate::run::{schedule, tier_slos, RunError, ScheduleArgs};
use crate::summary::{summarise, time_series};
use crate::workload::Workload;

pub mod engine;
pub mod fleet;
pub mod timed;
pub mod video;

use engine::EngineConfig;
use fleet::{FleetPlan, Hops, Sim, SimRequest};

/// Which system the simulated gateway runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Arm {
    /// The policy document as given.
    Ours,
    /// FCFS, round robin, no admission, static micro-batches of 4.
    B0,
    /// FCFS, least loaded, no admission, length-oblivious continuous
    /// batching capped at 8.
    B1,
}

/// An on/off flag value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Toggle {
    On,
    Off,
}

/// `--route`: a `[routing] policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Route {
    PredictedFinish,
    LeastLoaded,
    RoundRobin,
    CacheAware,
}

impl Route {
    pub fn policy(self) -> RoutePolicy {
        match self {
            Route::PredictedFinish => RoutePolicy::PredictedFinish,
            Route::LeastLoaded => RoutePolicy::LeastLoaded,
            Route::RoundRobin => RoutePolicy::RoundRobin,
            Route::CacheAware => RoutePolicy::CacheAware,
        }
    }
}

/// Options of `loadtest sim`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    #[command(flatten)]
    pub load: ScheduleArgs,
    /// Engines serving at the start (with --autoscale: where it starts).
    #[arg(long, default_value_t = 4)]
    pub engines: u32,
    /// Latency profile of every engine (the emulated backend's).
    #[arg(long, default_value = "policies/profiles/emulated-a100-8b.toml")]
    pub profile: PathBuf,
    #[arg(long, value_enum, default_value_t = Arm::Ours)]
    pub arm: Arm,
    /// Engine decode slots (`engine --max-batch`; the arms b0/b1 set their own).
    #[arg(long, default_value_t = 8)]
    pub max_batch: u32,
    /// KV pages per engine and tokens per page (`engine --kv-pages`, `--page-tokens`).
    #[arg(long, default_value_t = 16384)]
    pub kv_pages: u32,
    #[arg(long, default_value_t = 16)]
    pub page_tokens: u32,
    /// The engines' prefix cache (`engine --prefix-cache`).
    #[arg(long, value_enum, default_value_t = Toggle::On)]
    pub prefix_cache: Toggle,
    /// Routing over the arm's (`[routing] policy`): `cache-aware` is the
    /// prefix scorer with admission off (with `--arm b1`), the benchmark's
    /// routing arms.
    #[arg(long, value_enum)]
    pub route: Option<Route>,
    /// Run the policy's autoscaler (`[autoscale]`, turned on) with these bounds.
    #[arg(long)]
    pub autoscale: bool,
    #[arg(long)]
    pub min_engines: Option<u32>,
    #[arg(long)]
    pub max_engines: Option<u32>,
    /// Seconds from an engine's start to ready (weights, kernels, warm-up).
    #[arg(long, default_value_t = 20.0)]
    pub cold_start_s: f64,
    /// Scale the warm pool the autoscaler asks for (1 = as sized; 0.5 = the
    /// paper's "pool −50%" sensitivity).
    #[arg(long, default_value_t = 1.0)]
    pub warm_scale: f64,
    /// Override the estimator's guard factor γ.
    #[arg(long)]
    pub gamma: Option<f64>,
    /// Predictor error: engines run this much slower than the profile
    /// admission is given (0.25 = +25%); the estimator must learn it online.
    #[arg(long, default_value_t = 0.0)]
    pub predictor_error: f64,
    /// Override the bronze tier's output cap (tokens).
    #[arg(long)]
    pub bronze_output_cap: Option<u32>,
    /// One-way client <-> gateway latency, ms (TLS, HTTP/2, parsing). The
    /// default and --engine-ms's are fitted to live runs on loopback
    /// (docs/benchmarks/fleet.md, calibration): 0.8 ms per request in all.
    #[arg(long, default_value_t = 0.25)]
    pub client_ms: f64,
    /// One-way gateway <-> engine latency, ms.
    #[arg(long, default_value_t = 0.15)]
    pub engine_ms: f64,
    /// Requests slower than this (scheduled send to last token) count as
    /// failed `timeout`, as the live client's --timeout.
    #[arg(long, default_value = "120s", value_parser = crate::run::parse_duration)]
    pub timeout: std::time::Duration,
    /// Directory for results.json and report.html.
    #[arg(long, default_value = "sim-out")]
    pub out: PathBuf,
    #[arg(long)]
    pub label: Option<String>,
    /// Per-request records in results.json: `auto` keeps them up to
    /// 200,000 requests (summaries and plots are always complete).
    #[arg(long, value_enum, default_value_t = Records::Auto)]
    pub records: Records,
    #[arg(long)]
    pub quiet: bool,
    /// Also summarise the requests scheduled in this window, seconds from
    /// the start: `FROM,TO` (a burst); written as `window` in results.json.
    #[arg(long, value_parser = crate::run::parse_window)]
    pub window: Option<(f64, f64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Records {
    Auto,
    Always,
    Never,
}

/// What a simulation produced, with its speed.
pub struct SimRun {
    pub results: Results,
    pub wall_s: f64,
    pub events: u64,
}

/// The policy and engine limits of `arm` over `policy`.
pub fn arm_setup(arm: Arm, mut policy: PolicyDocument, max_batch: u32) -> (PolicyDocument, BatchLimits) {
    // The engines' flags as shipped, with the policy's `[batching]` hints
    // (and routing's long lane) over them, as the gateway sends them.
    let mut limits = policy.engine_hints().apply(&BatchLimits { max_batch, ..BatchLimits::default() });
    if arm != Arm::Ours {
        policy.admission.mode = policies::admission::AdmissionMode::Off;
        policy.routing.order = QueueOrder::Fcfs;
        policy.brownout.enabled = false;
    }
    match arm {
        Arm::Ours => {}
        Arm::B0 => {
            policy.routing.policy = RoutePolicy::RoundRobin;
            limits.mode = BatchMode::Static;
            limits.max_batch = 4;
        }
        Arm::B1 => {
            policy.routing.policy = RoutePolicy::LeastLoaded;
            limits.max_batch = 8;
            limits.split_ratio = 1e6;
            limits.reserved_long_slots = 0;
            limits.max_long_per_prefill = 8;
        }
    }
    (policy, limits)
}

/// The arm's policy with the command line's overrides (routing, prefix
/// cache, γ, bronze's output cap, autoscaling bounds and warm pool).
fn with_overrides(a: &SimArgs, mut policy: PolicyDocument) -> PolicyDocument {
    if let Some(route) = a.route {
        policy.routing.policy = route.policy();
    }
    if a.prefix_cache == Toggle::Off {
        policy.routing.prefix.enabled = false; // nothing cached to route to
    }
    policy.routing.prefix.block_tokens = a.page_tokens;
    if let Some(g) = a.gamma {
        policy.estimator.guard_factor = g;
    }
    if let Some(cap) = a.bronze_output_cap {
        if let (Some(t), Some(c)) =
            (policy.tiers.iter_mut().find(|t| t.name == "bronze"), std::num::NonZeroU32::new(cap))
        {
            t.max_output_tokens = c;
        }
    }
    if a.autoscale {
        policy.autoscale.enabled = true;
        if let Some(m) = a.min_engines {
            policy.autoscale.min_engines = m;
        }
        if let Some(m) = a.max_engines {
            policy.autoscale.max_engines = m;
        }
        policy.autoscale.warm_margin *= a.warm_scale.max(0.0);
        if a.warm_scale <= 0.0 {
            policy.autoscale.warm_pool = false;
        }
    }
    policy
}

/// The planned requests as the simulated engines see them: each with its
/// natural length and prefix blocks (and, for conversations resending
/// received answers, the blocks of its answer).
fn requests(a: &SimArgs, workload: &Workload, planned: &[crate::arrival::Planned]) -> Vec<SimRequest> {
    // The emulated model ends by itself after 16..=272 tokens (a hash of
    // the prompt; here the same distribution from the seed).
    let mut natural = SplitMix(a.load.seed ^ 0x5EED_0000_0001);
    // A conversation resending received answers: each answer is planned as
    // its turn's max_tokens of the conversation's stream (the next prompt
    // continues it), and the engine that wrote it names its pages.
    let received = workload.conversation.is_some_and(|c| c.answers == crate::workload::Answers::Received);
    planned
        .iter()
        .map(|p| {
            let natural_len = match received {
                true => p.max_tokens,
                false => 16 + (natural.next_u64() % 257) as u32,
            };
            let answer = match (received, p.prefix) {
                (true, Some((key, _))) => policies::prefix::block_hashes(
                    &crate::workload::synth_prompt(p.input_tokens + p.max_tokens, key),
                    a.page_tokens,
                )
                .into(),
                _ => std::sync::Arc::from(Vec::new()),
            };
            let m = &workload.mix[p.mix];
            SimRequest {
                at_s: p.at_s,
                key: m.key.clone(),
                tier: m.tier.clone(),
                key_index: p.mix,
                prompt: p.input_tokens,
                max_tokens: p.max_tokens.max(1),
                natural_len: natural_len.min(p.max_tokens.max(1)),
                blocks: policies::prefix::block_hashes(&p.prompt(a.load.seed), a.page_tokens).into(),
                answer,
            }
        })
        .collect()
}

/// Runs `run` with a progress bar over virtual time (none when `quiet`).
fn with_progress<T>(quiet: bool, duration_s: f64, run: impl FnOnce(&mut dyn FnMut(f64)) -> T) -> T {
    let mut bar = crate::progress::Progress::new(100);
    let mut shown_pct = 0;
    let out = run(&mut |t| {
        let pct = ((t / duration_s.max(1e-9)) * 100.0).min(100.0) as usize;
        while !quiet && shown_pct < pct {
            bar.tick();
            shown_pct += 1;
        }
    });
    if !quiet {
        while shown_pct < 100 {
            bar.tick();
            shown_pct += 1;
        }
        bar.done();
    }
    out
}

/// Runs the simulation and writes its outputs.
pub fn run(a: &SimArgs) -> Result<SimRun, RunError> {
    let workload = Workload::load(&a.load.workload)?;
    let slos = tier_slos(&a.load.policies)?;
    let text = std::fs::read_to_string(&a.load.policies)
        .map_err(|e| RunError::Policies(format!("{}: {e}", a.load.policies.display())))?;
    let policy = PolicyDocument::parse(&a.load.policies.display().to_string(), &text)
        .map_err(|e| RunError::Policies(e.to_string()))?;
    let shown = a.profile.display().to_string();
    let profile_text =
        std::fs::read_to_string(&a.profile).map_err(|e| RunError::Args(format!("{shown}: {e}")))?;
    let profile = LatencyProfile::parse(&shown, &profile_text).map_err(|e| RunError::Args(e.to_string()))?;
    let (policy, limits) = arm_setup(a.arm, policy, a.max_batch);
    let policy = with_overrides(a, policy);
    let (sched, words) = schedule(&a.load)?;
    let planned = plan(&workload, &sched, a.load.seed);
    let reqs = requests(a, &workload, &planned);
    let kv_tokens = u64::from(a.kv_pages) * u64::from(a.page_tokens);
    let cfg = EngineConfig {
        prefix_cache: a.prefix_cache == Toggle::On,
        ..EngineConfig::new(limits, profile.scaled(1.0 + a.predictor_error), kv_tokens, a.page_tokens)
    };
    let hops = Hops { client_s: a.client_ms / 1e3, engine_s: a.engine_ms / 1e3 };
    let fleet_plan = FleetPlan {
        engines: a.engines,
        autoscale: a.autoscale,
        cold_start_s: a.cold_start_s,
        class: profile.engine_class.clone(),
        advertised: profile.clone(),
    };
    let duration_s = a.load.duration.as_secs_f64();
    let started = crate::clock::now();
    let sim = Sim::new(&policy, &cfg, hops, fleet_plan, &reqs, duration_s);
    let out = with_progress(a.quiet, duration_s, |tick| sim.run(tick));
    let wall_s = crate::clock::since(started).as_secs_f64();
    let mut records = out.records;
    let timeout_ms = a.timeout.as_secs_f64() * 1e3;
    for r in &mut records {
        if r.outcome == crate::record::Outcome::Ok && r.tlet_ms.is_some_and(|t| t > timeout_ms) {
            r.outcome = crate::record::Outcome::Failed;
            r.reason = Some("timeout".into());
        }
    }
    let summary = summarise(&records, planned.len(), duration_s, &slos);
    let window = a.window.map(|w| crate::summary::window(&records, w, &slos));
    let timeseries = time_series(&records, duration_s);
    let keep = match a.records {
        Records::Always => true,
        Records::Never => false,
        Records::Auto => records.len() <= 200_000,
    };
    let arm = format!("{:?}", a.arm).to_lowercase();
    let results = Results {
        schema: SCHEMA.into(),
        run: RunInfo {
            label: a.label.clone().unwrap_or_else(|| format!("sim {arm}")),
            target: format!(
                "simulated: {} x {} ({arm}{})",
                a.engines,
                profile.engine_class,
                if a.autoscale { ", autoscale" } else { "" }
            ),
            api: "openai".into(),
            proto: "simulated".into(),
            connections: 0,
            workload: workload.name.clone(),
            schedule: words,
            duration_s,
            seed: a.load.seed,
            planned: planned.len(),
            started_unix_s: 0.0,
            harness_version: env!("CARGO_PKG_VERSION").into(),
        },
        slos,
        summary,
        timeseries,
        records: if keep { records } else { Vec::new() },
        fleet: Some(out.fleet),
        window,
    };
    std::fs::create_dir_all(&a.out).map_err(|e| RunError::Write(a.out.display().to_string(), e))?;
    let write = |name: &str, text: String| {
        let path = a.out.join(name);
        std::fs::write(&path, text).map_err(|e| RunError::Write(path.display().to_string(), e))
    };
    write("results.json", results.to_json())?;
    write("report.html", crate::report::html(&results))?;
    Ok(SimRun { results, wall_s, events: out.events })
}
