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
//! Arms, on the same arrivals:
//! - `static`: the best homogeneous deployment for the trace's average mix,
//!   fixed; each request to the replica with the fewest in-flight tokens
//!   per GPU (our predicted-finish routing without admission).
//! - `static+reload`: the best homogeneous deployment for each segment's
//!   mix, switched to at the segment's start by the same safe switch plan
//!   as OServe but loading weights from storage (`--disk-gbs` per GPU).
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
use super::{best_static, median, p99, trace, Gpu, TYPES};

#[derive(clap::Args, Debug, Clone)]
pub struct LatencyArgs {
    /// The GPU of the cost model.
    #[arg(long, value_enum, default_value_t = Gpu::H100)]
    pub gpu: Gpu,
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
    /// Storage bandwidth per GPU for a reload, GB/s.
    #[arg(long, default_value_t = 2.0)]
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
pub const ARMS: [&str; 4] = ["static", "static+reload", "oserve", "oserve, no type routing"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arm {
    Static,
    Reload,
    Oserve,
    OserveUnrouted,
}

const ARM_OF: [Arm; 4] = [Arm::Static, Arm::Reload, Arm::Oserve, Arm::OserveUnrouted];

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
/// per second), and the switches it made.
#[derive(Debug, Clone)]
pub struct ArmRun {
    pub p99_e2e: Vec<f64>,
    pub p99_ttft: Vec<f64>,
    pub throughput: Vec<f64>,
    pub switches: usize,
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
        (cv, shift): (f64, f64),
        seed: u64,
        load: f64,
    ) -> Trace {
        let mixes = trace(seed, segments, cv, shift);
        let n = mixes.len() as f64;
        let avg: Vec<f64> = (0..TYPES.len()).map(|j| mixes.iter().map(|m| m[j]).sum::<f64>() / n).collect();
        let (fixed, _) = best_static(model, gpus, &avg);
        let rates: Vec<f64> = mixes.iter().map(|m| load * mix_capacity(model, &fixed, &TYPES, m)).collect();
        let reqs = requests(seed, &mixes, &rates, segment_s);
        Trace { mixes, fixed, rates, reqs }
    }
}

/// The four arms on one trace (cv, seed) at `load`.
pub fn run_arms(model: &CostModel, args: &LatencyArgs, cv: f64, seed: u64, load: f64) -> Vec<ArmRun> {
    let Trace { mixes, fixed, rates, reqs } =
        Trace::new(model, args.gpus, (args.segments, args.segment_s), (cv, args.shift), seed, load);
    let end = args.segment_s * mixes.len() as f64;
    let horizon = end + 30.0 * args.segment_s;
    ARM_OF
        .iter()
        .map(|&arm| {
            let sim = Sim::new(model, args, arm, (&mixes, &rates), &reqs);
            let (done, switches) = sim.run(&fixed, horizon);
            summarise(&reqs, &done, (mixes.len(), args.segment_s, horizon), switches)
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
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Runs the experiment; returns the Markdown report.
pub fn main(args: &LatencyArgs) -> Result<String, String> {
    let model = args.gpu.model();
    if policies::oserve::deploy::min_gpus(&model).is_none_or(|g| g > args.gpus)
        || args.segments == 0
        || args.seeds == 0
        || args.segment_s <= 0.0
        || args.load.iter().any(|&l| !(0.05..=3.0).contains(&l))
    {
        return Err(
            "need GPUs for one replica, a segment, a seed, --segment-s > 0, --load in [0.05, 3]".into()
        );
    }
    let segments = format!("{} segments of {} s", args.segments, args.segment_s);
    let mut md = super::header(args.gpu, args.gpus, &segments, args.shift, args.seeds, "request level");
    md.push_str("Per arm: the mean over segments of the P99 E2E latency (s), and of the segment's P99 E2E speed-up over `static` (static P99 / arm P99); throughput = completed requests per second, mean over segments.\n\n");
    md.push_str("| spatial CV | load | static P99 E2E | static+reload | oserve | oserve, no type routing | oserve speed-up (P99 E2E) | oserve speed-up (P99 TTFT) | throughput static → oserve | switches reload / oserve |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    let mut bar = crate::progress::Progress::new(args.cv.len() * args.load.len() * args.seeds as usize);
    for &cv in &args.cv {
        for &load in &args.load {
            let runs: Vec<Vec<ArmRun>> = (1..=args.seeds)
                .map(|seed| {
                    let r = run_arms(&model, args, cv, seed, load);
                    bar.tick();
                    r
                })
                .collect();
            let col = |a: usize| median(runs.iter().map(|r| mean(&r[a].p99_e2e)).collect());
            let speedup = |a: usize, f: fn(&ArmRun) -> &Vec<f64>| {
                median(
                    runs.iter()
                        .map(|r| mean(&f(&r[0]).iter().zip(f(&r[a])).map(|(s, o)| s / o).collect::<Vec<_>>()))
                        .collect(),
                )
            };
            let tput = |a: usize| median(runs.iter().map(|r| mean(&r[a].throughput)).collect());
            let switches = |a: usize| median(runs.iter().map(|r| r[a].switches as f64).collect());
            let _ = writeln!(
                md,
                "| {cv:.1} | {load:.2} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2}x | {:.2}x | {:.1} → {:.1} req/s | {:.0} / {:.0} |",
                col(0),
                col(1),
                col(2),
                col(3),
                speedup(2, |r| &r.p99_e2e),
                speedup(2, |r| &r.p99_ttft),
                tput(0),
                tput(2),
                switches(1),
                switches(2),
            );
        }
    }
    bar.done();
    if let (Some(&cv), Some(&load)) = (args.cv.first(), args.load.first()) {
        let runs = run_arms(&model, args, cv, 1, load);
        let _ = write!(
            md,
            "\nSeed 1 at CV {cv}, load {load}, segment by segment: P99 E2E s (P99 TTFT s)\n\n| segment | {} |\n|---:|{}\n",
            ARMS.join(" | "),
            "---:|".repeat(ARMS.len())
        );
        for s in 0..args.segments {
            let cells: Vec<String> =
                runs.iter().map(|r| format!("{:.1} ({:.1})", r.p99_e2e[s], r.p99_ttft[s])).collect();
            let _ = writeln!(md, "| {} | {} |", s + 1, cells.join(" | "));
        }
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> LatencyArgs {
        LatencyArgs {
            gpu: Gpu::H100,
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
        let runs = run_arms(&CostModel::LLAMA70B_H100, &args(), 0.6, 3, 0.5);
        assert_eq!(runs.len(), 4);
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
        let pooled = run_arms(h100, &LatencyArgs { route_above: 0.9, ..args() }, 0.3, 3, 0.6);
        assert_eq!(pooled[2].p99_e2e, pooled[3].p99_e2e);
        let routed = run_arms(h100, &args(), 0.3, 3, 0.6);
        assert_ne!(routed[2].p99_e2e, routed[3].p99_e2e);
        assert_eq!(routed[3].p99_e2e, pooled[3].p99_e2e, "the unrouted arm does not depend on the bar");
    }
}
