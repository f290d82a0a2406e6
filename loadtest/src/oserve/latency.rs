//! `loadtest sim-oserve-latency`: OServe (issue 25) against static
//! deployments at the request level, in virtual time: P99 latency and
//! throughput per trace segment (backend `simulated`).
//!
//! Every replica is a simulated engine ([`crate::sim::engine`]: the engine
//! scheduler's turns, `policies::batching::form_prefill`, KV reserved per
//! sequence) timed by its configuration's latency profile, the one
//! `loadtest oserve-profiles` writes from the cost model and the emulated
//! backend replays live. Requests come from the same traces as
//! `loadtest sim-oserve` (four types, each segment's mix at a controlled
//! spatial CV, moving by `--shift` per segment), Poisson within a segment at
//! `--load` times the static deployment's capacity in that segment's mix,
//! sizes within ±30% of their type's centroid.
//!
//! Traces: generated (`--cv`, `--shift`, as `sim-oserve`) or the paper's
//! (`--paper T1,…,T4` for Table 2's temporal traces, `S1`-`S5` for Table
//! 1's fixed compositions), each segment at `--load` times what the
//! homogeneous deployment sustaining most of the trace's average mix
//! sustains of the segment's mix.
//!
//! Arms, on the same arrivals:
//! - `static`: the best homogeneous deployment, fixed: of the
//!   `--static-candidates` homogeneous deployments sustaining most of the
//!   trace's average mix, the one with the lowest P99 E2E in this very
//!   trace (each simulated; the paper optimises every baseline's
//!   deployment); each request to the replica with the fewest in-flight
//!   tokens per GPU (our predicted-finish routing without admission).
//! - `vllm-like static`: the same choice under a vLLM router's routing:
//!   round robin over the replicas, no SLO or load awareness; a request
//!   waits in its replica's own queue when that replica's KV is full.
//! - `static+reload`: the best homogeneous deployment for each segment's
//!   mix (the paper's vLLM (reload)), switched to at the segment's start by
//!   the same switch plan as OServe, weights over GPU links as the paper's
//!   ad hoc switching (or from storage at `--disk-gbs` per GPU).
//! - `oserve`: the flow-guided search for each segment's mix (oracle
//!   forecast), switched to by the switch planner with weights over GPU
//!   links (`link_gbs` of the cost model); each request classified into
//!   its type and sent to a class by the assignment's shares
//!   (`policies::oserve::route`), then to the class's least loaded replica.
//! - `oserve, no type routing`: OServe's deployments, routed as `static`
//!   (what type-aware routing adds).
//!
//! Both switching arms switch only for a gain of `--min-gain` in the
//! segment's mix (the live planner's hysteresis). A switch step starts a
//! replica once its GPUs are free (`--start-s` of
//! engine start plus the weights' transfer) and drains one by taking no
//! new work; its GPUs free when its last sequence ends. Requests no replica
//! has KV room for wait at the gateway in arrival order.

use std::fmt::Write as _;

use policies::oserve::capacity::CostModel;
use policies::oserve::deploy::mix_capacity;
use policies::rng::SplitMix;

use super::fleet::{Done, Sim};
use super::{best_static, homogeneous, median, p99, paper_trace, trace, Gpu, Model, TYPES};

#[derive(clap::Args, Debug, Clone)]
pub struct LatencyArgs {
    /// The GPU of the cost model.
    #[arg(long, value_enum, default_value_t = Gpu::H100)]
    pub gpu: Gpu,
    /// The served model of the cost model.
    #[arg(long, value_enum, default_value_t = Model::Llama70b)]
    pub model: Model,
    /// The paper's traces instead of generated ones: `T1`-`T4` (Table 2),
    /// `S1`-`S5` (Table 1's compositions, fixed); replaces `--cv`.
    #[arg(long, value_delimiter = ',')]
    pub paper: Vec<String>,
    /// Homogeneous deployments tried for the `static` arms (those
    /// sustaining most of the average mix), each simulated.
    #[arg(long, default_value_t = 4)]
    pub static_candidates: usize,
    /// How far below the forecast's floor a switch may dip while a replica
    /// moves (`switch_plan_within`; 0: never, the live planner's rule).
    #[arg(long, default_value_t = 0.0)]
    pub max_dip: f64,
    /// GPUs in the fleet.
    #[arg(long, default_value_t = 16)]
    pub gpus: u32,
    /// Trace segments (planning intervals).
    #[arg(long, default_value_t = 6)]
    pub segments: usize,
    /// Seconds per segment.
    #[arg(long, default_value_t = 120.0)]
    pub segment_s: f64,
    /// Spatial skew (CV of each segment's type shares); several values give
    /// the sensitivity table.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.3,0.5,0.7")]
    pub cv: Vec<f64>,
    /// Temporal shift between segments' mixes (0: fixed, 1: fresh).
    #[arg(long, default_value_t = 0.7)]
    pub shift: f64,
    /// Offered rate as a fraction of the static deployment's capacity in
    /// each segment's mix; several values sweep it.
    #[arg(long, value_delimiter = ',', default_value = "0.8")]
    pub load: Vec<f64>,
    /// Seeds 1..=N; medians over seeds are reported.
    #[arg(long, default_value_t = 3)]
    pub seeds: u64,
    /// Search iterations per plan.
    #[arg(long, default_value_t = 50)]
    pub iterations: usize,
    /// Seconds from a replica's start to serving, before its weights load.
    #[arg(long, default_value_t = 10.0)]
    pub start_s: f64,
    /// Storage bandwidth per GPU for `static+reload`'s weights, GB/s; 0:
    /// over GPU links as OServe (the paper's vLLM (reload) uses its ad hoc
    /// switching).
    #[arg(long, default_value_t = 0.0)]
    pub disk_gbs: f64,
    /// Switch only when the target sustains this much more of the
    /// segment's mix than the current deployment (`[oserve] min_gain`).
    #[arg(long, default_value_t = 0.1)]
    pub min_gain: f64,
    /// The `oserve` arm routes by type only while the segment's rate is at
    /// least this share of what the serving replicas sustain in its mix
    /// (`[oserve] route_above_utilization`; 0: always, as the paper).
    #[arg(long, default_value_t = 0.9)]
    pub route_above: f64,
}

/// The arms, in report order.
pub const ARMS: [&str; 5] =
    ["static", "static+reload", "oserve", "oserve, no type routing", "vllm-like static"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arm {
    Static,
    Reload,
    Oserve,
    OserveUnrouted,
    /// Round robin over a fixed deployment, per-replica queues.
    Vllm,
}

const ARM_OF: [Arm; 5] = [Arm::Static, Arm::Reload, Arm::Oserve, Arm::OserveUnrouted, Arm::Vllm];

/// One row's trace: generated at a spatial CV, or one of the paper's.
#[derive(Debug, Clone, PartialEq)]
pub enum TraceSpec {
    Generated { cv: f64 },
    Paper(String),
}

impl std::fmt::Display for TraceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TraceSpec::Generated { cv } => write!(f, "CV {cv:.1}"),
            TraceSpec::Paper(name) => write!(f, "{name}"),
        }
    }
}

/// One request of a trace.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    pub at: f64,
    pub ty: usize,
    pub prompt: u32,
    pub out: u32,
    pub max_tokens: u32,
}

/// The trace's requests: Poisson per segment at `rates[s]`, types by the
/// segment's mix.
pub fn requests(seed: u64, mixes: &[Vec<f64>], rates: &[f64], segment_s: f64) -> Vec<Request> {
    let mut rng = SplitMix(seed ^ 0x05e7_7e5e);
    let mut out = Vec::new();
    for (s, (mix, &rate)) in mixes.iter().zip(rates).enumerate() {
        let (start, end) = (s as f64 * segment_s, (s + 1) as f64 * segment_s);
        let mut t = start + rng.exponential(rate);
        while t < end {
            let u = rng.unit_f64();
            let mut acc = 0.0;
            let ty = mix.iter().position(|&m| {
                acc += m;
                u < acc
            });
            let ty = ty.unwrap_or(mix.len() - 1);
            let (i, o) = TYPES[ty];
            let jitter =
                |rng: &mut SplitMix, v: f64| (v * (0.7 + 0.6 * rng.unit_f64())).round().max(1.0) as u32;
            let (prompt, out_tokens) = (jitter(&mut rng, i), jitter(&mut rng, o));
            out.push(Request { at: t, ty, prompt, out: out_tokens, max_tokens: (1.5 * o) as u32 });
            t += rng.exponential(rate);
        }
    }
    out
}

/// One arm's run on one trace: per segment (P99 E2E, P99 TTFT, completed
/// per second), the switches it made, and its deployment (the first
/// segment's for the switching arms).
#[derive(Debug, Clone)]
pub struct ArmRun {
    pub p99_e2e: Vec<f64>,
    pub p99_ttft: Vec<f64>,
    pub throughput: Vec<f64>,
    pub switches: usize,
    pub deployment: String,
}

/// A trace with what the arms need of it.
pub(super) struct Trace {
    /// Each segment's type shares.
    pub mixes: Vec<Vec<f64>>,
    /// The static deployment: the best homogeneous one for the average mix.
    pub fixed: policies::oserve::deploy::Deployment,
    /// Requests per second per segment: `load` × `fixed`'s capacity in its mix.
    pub rates: Vec<f64>,
    pub reqs: Vec<Request>,
}

impl Trace {
    pub(super) fn new(
        model: &CostModel,
        gpus: u32,
        (segments, segment_s): (usize, f64),
        (spec, shift): (&TraceSpec, f64),
        seed: u64,
        load: f64,
    ) -> Trace {
        let mixes = match spec {
            TraceSpec::Generated { cv } => trace(seed, segments, *cv, shift),
            TraceSpec::Paper(name) => paper_trace(name, segments).unwrap_or_default(),
        };
        let n = mixes.len() as f64;
        let avg: Vec<f64> = (0..TYPES.len()).map(|j| mixes.iter().map(|m| m[j]).sum::<f64>() / n).collect();
        let (fixed, _) = best_static(model, gpus, &avg);
        let rates: Vec<f64> = mixes.iter().map(|m| load * mix_capacity(model, &fixed, &TYPES, m)).collect();
        let reqs = requests(seed, &mixes, &rates, segment_s);
        Trace { mixes, fixed, rates, reqs }
    }
}

/// The arms on one trace (spec, seed) at `load`.
pub fn run_arms(
    model: &CostModel,
    args: &LatencyArgs,
    spec: &TraceSpec,
    seed: u64,
    load: f64,
) -> Vec<ArmRun> {
    let Trace { mixes, fixed, rates, reqs } =
        Trace::new(model, args.gpus, (args.segments, args.segment_s), (spec, args.shift), seed, load);
    let end = args.segment_s * mixes.len() as f64;
    let horizon = end + 30.0 * args.segment_s;
    let run = |arm: Arm, dep: &policies::oserve::deploy::Deployment| {
        let sim = Sim::new(model, args, arm, (&mixes, &rates), &reqs);
        let (done, switches, first) = sim.run(dep, horizon);
        summarise(&reqs, &done, (mixes.len(), args.segment_s, horizon), switches, first)
    };
    // The static arms' deployment: the lowest P99 E2E among the
    // homogeneous deployments sustaining most of the average mix.
    let n = mixes.len() as f64;
    let avg: Vec<f64> = (0..TYPES.len()).map(|j| mixes.iter().map(|m| m[j]).sum::<f64>() / n).collect();
    let mut candidates: Vec<(policies::oserve::deploy::Deployment, f64)> = homogeneous(model, args.gpus)
        .into_iter()
        .map(|d| {
            let c = mix_capacity(model, &d, &TYPES, &avg);
            (d, c)
        })
        .collect();
    candidates.sort_by(|a, b| b.1.total_cmp(&a.1));
    candidates.truncate(args.static_candidates.max(1));
    let best_of = |arm: Arm| {
        candidates
            .iter()
            .map(|(d, _)| run(arm, d))
            .min_by(|a, b| mean(&a.p99_e2e).total_cmp(&mean(&b.p99_e2e)))
            .unwrap_or_else(|| run(arm, &fixed))
    };
    ARM_OF
        .iter()
        .map(|&arm| match arm {
            Arm::Static | Arm::Vllm => best_of(arm),
            _ => run(arm, &fixed),
        })
        .collect()
}

/// Per segment (by arrival) P99 E2E and TTFT, and completions per second
/// (by finish); a request unfinished by the horizon counts at the horizon.
fn summarise(
    reqs: &[Request],
    done: &[Done],
    (segs, segment_s, horizon): (usize, f64, f64),
    switches: usize,
    deployment: String,
) -> ArmRun {
    let mut e2e = vec![Vec::new(); segs];
    let mut ttft = vec![Vec::new(); segs];
    let mut completed = vec![0usize; segs];
    for (q, d) in reqs.iter().zip(done) {
        let s = ((q.at / segment_s) as usize).min(segs - 1);
        e2e[s].push(d.end.unwrap_or(horizon) - q.at);
        ttft[s].push(d.first.unwrap_or(horizon) - q.at);
        if let Some(s) = d.end.map(|t| (t / segment_s) as usize).filter(|&s| s < segs) {
            completed[s] += 1;
        }
    }
    ArmRun {
        p99_e2e: e2e.into_iter().map(p99).collect(),
        p99_ttft: ttft.into_iter().map(p99).collect(),
        throughput: completed.iter().map(|&c| c as f64 / segment_s).collect(),
        switches,
        deployment,
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// The rows of the report: the paper's traces, else generated ones.
fn specs(args: &LatencyArgs) -> Result<Vec<TraceSpec>, String> {
    if args.paper.is_empty() {
        return Ok(args.cv.iter().map(|&cv| TraceSpec::Generated { cv }).collect());
    }
    args.paper
        .iter()
        .map(|n| match paper_trace(n, args.segments) {
            Some(_) => Ok(TraceSpec::Paper(n.clone())),
            None => Err(format!("--paper {n}: one of T1-T4, S1-S5")),
        })
        .collect()
}

/// Runs the experiment; returns the Markdown report.
pub fn main(args: &LatencyArgs) -> Result<String, String> {
    let model = args.gpu.cost(args.model);
    if policies::oserve::deploy::min_gpus(&model).is_none_or(|g| g > args.gpus)
        || args.segments == 0
        || args.seeds == 0
        || args.segment_s <= 0.0
        || args.load.iter().any(|&l| !(0.05..=3.0).contains(&l))
        || !(0.0..=1.0).contains(&args.max_dip)
    {
        return Err(
            "need GPUs for one replica, a segment, a seed, --segment-s > 0, --load in [0.05, 3], --max-dip in [0, 1]"
                .into(),
        );
    }
    let specs = specs(args)?;
    let segments = format!("{} segments of {} s", args.segments, args.segment_s);
    let mut md =
        super::header((args.gpu, args.model), args.gpus, &segments, args.shift, args.seeds, "request level");
    md.push_str("Per arm: the mean over segments of the P99 E2E latency (s); speed-ups are per segment (the other arm's P99 E2E / OServe's), averaged over segments; throughput = completed requests per second, mean over segments; medians over seeds.\n\n");
    md.push_str("| trace | load | static P99 E2E | vllm-like static | static+reload | oserve | oserve, no type routing | oserve vs static | vs vllm-like | vs static+reload | (P99 TTFT vs static) | throughput static → oserve | switches reload / oserve | static deployment |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    let mut bar = crate::progress::Progress::new(specs.len() * args.load.len() * args.seeds as usize);
    for spec in &specs {
        for &load in &args.load {
            let runs: Vec<Vec<ArmRun>> = (1..=args.seeds)
                .map(|seed| {
                    let r = run_arms(&model, args, spec, seed, load);
                    bar.tick();
                    r
                })
                .collect();
            let col = |a: usize| median(runs.iter().map(|r| mean(&r[a].p99_e2e)).collect());
            let speedup = |base: usize, f: fn(&ArmRun) -> &Vec<f64>| {
                median(
                    runs.iter()
                        .map(|r| {
                            mean(&f(&r[base]).iter().zip(f(&r[2])).map(|(s, o)| s / o).collect::<Vec<_>>())
                        })
                        .collect(),
                )
            };
            let tput = |a: usize| median(runs.iter().map(|r| mean(&r[a].throughput)).collect());
            let switches = |a: usize| median(runs.iter().map(|r| r[a].switches as f64).collect());
            let _ = writeln!(
                md,
                "| {spec} | {load:.2} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2}x | {:.2}x | {:.2}x | {:.2}x | {:.2} → {:.2} req/s | {:.0} / {:.0} | {} |",
                col(0),
                col(4),
                col(1),
                col(2),
                col(3),
                speedup(0, |r| &r.p99_e2e),
                speedup(4, |r| &r.p99_e2e),
                speedup(1, |r| &r.p99_e2e),
                speedup(0, |r| &r.p99_ttft),
                tput(0),
                tput(2),
                switches(1),
                switches(2),
                runs[0][0].deployment,
            );
        }
    }
    bar.done();
    if let (Some(spec), Some(&load)) = (specs.first(), args.load.first()) {
        let runs = run_arms(&model, args, spec, 1, load);
        let _ = write!(
            md,
            "\nSeed 1, {spec}, load {load}, segment by segment: P99 E2E s (P99 TTFT s)\n\n| segment | {} |\n|---:|{}\n",
            ARMS.join(" | "),
            "---:|".repeat(ARMS.len())
        );
        for s in 0..args.segments {
            let cells: Vec<String> =
                runs.iter().map(|r| format!("{:.1} ({:.1})", r.p99_e2e[s], r.p99_ttft[s])).collect();
            let _ = writeln!(md, "| {} | {} |", s + 1, cells.join(" | "));
        }
        md.push_str(&plans(&model, args, spec));
    }
    Ok(md)
}

/// Capacity level, seed 1 of `spec`: each segment's mix, OServe's plan
/// for it, and what it and the best homogeneous deployment sustain of it.
fn plans(model: &CostModel, args: &LatencyArgs, spec: &TraceSpec) -> String {
    let t = Trace::new(model, args.gpus, (args.segments, args.segment_s), (spec, args.shift), 1, 1.0);
    let mut md = String::from("\nOServe's plan per segment (capacity level, seed 1; shares SISO / SILO / LISO / LILO):\n\n| segment | mix | oserve deployment | best homogeneous | req/s homogeneous → oserve |\n|---:|---|---|---|---:|\n");
    for (s, mix) in t.mixes.iter().enumerate() {
        let plan = policies::oserve::deploy::search_mix(model, args.gpus, &TYPES, mix, args.iterations);
        let (stat, cap) = best_static(model, args.gpus, mix);
        let shares: Vec<String> = mix.iter().map(|v| format!("{v:.2}")).collect();
        let (dep, own) = plan.map_or(("-".to_string(), 0.0), |p| (p.deployment.to_string(), p.score));
        let _ = writeln!(md, "| {} | {} | {dep} | {stat} | {cap:.2} → {own:.2} |", s + 1, shares.join(" / "));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> LatencyArgs {
        LatencyArgs {
            gpu: Gpu::H100,
            model: Model::Llama70b,
            paper: Vec::new(),
            static_candidates: 1,
            max_dip: 0.0,
            gpus: 16,
            segments: 3,
            segment_s: 30.0,
            cv: vec![0.6],
            shift: 0.7,
            load: vec![0.7],
            seeds: 1,
            iterations: 20,
            start_s: 10.0,
            disk_gbs: 2.0,
            min_gain: 0.0,
            route_above: 0.0,
        }
    }

    #[test]
    fn trace_requests_follow_each_segments_rate_and_mix() {
        let mixes = vec![vec![1.0, 0.0, 0.0, 0.0], vec![0.0, 0.0, 0.5, 0.5]];
        let reqs = requests(1, &mixes, &[50.0, 10.0], 100.0);
        let first: Vec<&Request> = reqs.iter().filter(|r| r.at < 100.0).collect();
        assert!((first.len() as f64 - 5000.0).abs() < 300.0, "{}", first.len());
        assert!(first.iter().all(|r| r.ty == 0 && (140..=260).contains(&r.prompt)));
        let second = reqs.len() - first.len();
        assert!((second as f64 - 1000.0).abs() < 120.0, "{second}");
        assert!(reqs.windows(2).all(|w| w[0].at <= w[1].at));
    }

    #[test]
    fn every_arm_finishes_every_request_below_capacity_and_oserve_switches() {
        let runs = run_arms(&CostModel::LLAMA70B_H100, &args(), &TraceSpec::Generated { cv: 0.6 }, 3, 0.5);
        assert_eq!(runs.len(), ARMS.len());
        for (a, r) in runs.iter().enumerate() {
            // Unfinished requests would count at the horizon (900 s later).
            assert!(r.p99_e2e.iter().all(|&p| p.is_finite() && p < 200.0), "{}: {:?}", ARMS[a], r.p99_e2e);
        }
        assert_eq!(runs[0].switches, 0, "static never switches");
        assert!(runs[2].switches >= 1, "this trace's mix moves enough for OServe to switch");
    }

    #[test]
    fn below_the_utilization_bar_oserve_places_requests_as_without_routes() {
        // Load 0.6 of static's capacity at spatial CV 0.3 (OServe deploys
        // two classes): under a 0.9 bar OServe's arm is its deployments
        // placed least-loaded (the unrouted arm, exactly); with the bar at
        // 0 the shares route and the latencies differ.
        let h100 = &CostModel::LLAMA70B_H100;
        let cv3 = TraceSpec::Generated { cv: 0.3 };
        let pooled = run_arms(h100, &LatencyArgs { route_above: 0.9, ..args() }, &cv3, 3, 0.6);
        assert_eq!(pooled[2].p99_e2e, pooled[3].p99_e2e);
        let routed = run_arms(h100, &args(), &cv3, 3, 0.6);
        assert_ne!(routed[2].p99_e2e, routed[3].p99_e2e);
        assert_eq!(routed[3].p99_e2e, pooled[3].p99_e2e, "the unrouted arm does not depend on the bar");
    }
}
