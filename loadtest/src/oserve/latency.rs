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

use std::collections::{BinaryHeap, VecDeque};
use std::fmt::Write as _;

use policies::batching::BatchLimits;
use policies::oserve::capacity::{CostModel, Parallel};
use policies::oserve::deploy::{evaluate, mix_capacity, search_mix, switch_plan, Deployment, Step};
use policies::oserve::route::Routes;
use policies::oserve::typing::nearest_centroid;
use policies::rng::SplitMix;
use policies::LatencyProfile;

use super::{best_static, median, p99, trace, Gpu, TYPES};
use crate::sim::engine::{EngineConfig, Out, SimEngine, SimSeq};
use crate::sim::timed::Timed;

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
}

/// The arms, in report order.
pub const ARMS: [&str; 4] = ["static", "static+reload", "oserve", "oserve, no type routing"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arm {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Loading,
    Serving,
    Draining,
    Gone,
}

#[derive(Debug)]
struct Replica {
    p: Parallel,
    cfg: usize,
    engine: SimEngine,
    state: State,
    /// Tokens (prompt + output) of its unfinished requests.
    inflight: u64,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Arrive(usize),
    Wake { k: usize, gen: u64 },
    Ready(usize),
    Segment(usize),
}

/// Per request: first token and finish, seconds.
#[derive(Debug, Clone, Copy, Default)]
struct Done {
    first: Option<f64>,
    end: Option<f64>,
}

struct Sim<'a> {
    model: &'a CostModel,
    args: &'a LatencyArgs,
    arm: Arm,
    mixes: &'a [Vec<f64>],
    rates: &'a [f64],
    reqs: &'a [Request],
    done: Vec<Done>,
    configs: Vec<(Parallel, EngineConfig)>,
    replicas: Vec<Replica>,
    free_gpus: u32,
    pending: VecDeque<Step>,
    routes: Option<Routes>,
    /// The serving replicas in the order of the routes' assignment.
    serving: Vec<usize>,
    waiting: VecDeque<usize>,
    heap: BinaryHeap<Timed<Ev>>,
    seq: u64,
    outs: Vec<Out>,
    mix: usize,
    switches: usize,
}

/// Seconds a replica of `p` takes to serve after its start: engine start
/// plus its GPUs' share of the weights at `gbs` per GPU.
fn load_s(model: &CostModel, p: Parallel, start_s: f64, gbs: f64) -> f64 {
    start_s + model.params_b * 1e9 * model.bytes_per_param / (f64::from(p.gpus()) * gbs * 1e9)
}

fn engine_config(model: &CostModel, p: Parallel) -> EngineConfig {
    let text = model.profile_toml(p, "llama-70b", &p.to_string());
    let profile = LatencyProfile::parse("generated", &text).expect("the cost model writes valid profiles");
    let room = 0.9 * model.gpu_gb * 1e9 * f64::from(p.gpus()) - model.params_b * 1e9 * model.bytes_per_param;
    EngineConfig {
        limits: BatchLimits { max_batch: model.max_batch, ..BatchLimits::default() },
        profile,
        kv_tokens: (room / model.kv_bytes_per_token).max(0.0) as u64,
        kv_low_watermark: 0.05,
        page_tokens: 16,
        prefix_cache: false,
    }
}

impl<'a> Sim<'a> {
    fn push(&mut self, t: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Timed { t, seq: self.seq, ev });
    }

    fn cfg_index(&mut self, p: Parallel) -> usize {
        match self.configs.iter().position(|(q, _)| *q == p) {
            Some(i) => i,
            None => {
                self.configs.push((p, engine_config(self.model, p)));
                self.configs.len() - 1
            }
        }
    }

    fn add_replica(&mut self, p: Parallel, state: State) -> usize {
        let cfg = self.cfg_index(p);
        self.free_gpus -= p.gpus();
        self.replicas.push(Replica { p, cfg, engine: SimEngine::default(), state, inflight: 0 });
        self.replicas.len() - 1
    }

    /// The deployment the arm wants for segment `s`.
    fn target(&self, s: usize, fixed: &Deployment) -> Deployment {
        let (model, gpus) = (self.model, self.args.gpus);
        match self.arm {
            Arm::Static => fixed.clone(),
            Arm::Reload => best_static(model, gpus, &self.mixes[s]).0,
            Arm::Oserve | Arm::OserveUnrouted => {
                search_mix(model, gpus, &TYPES, &self.mixes[s], self.args.iterations)
                    .map_or_else(|| fixed.clone(), |p| p.deployment)
            }
        }
    }

    /// Replicas serving or loading: what a new plan switches from.
    fn committed(&self) -> Deployment {
        let replicas = self
            .replicas
            .iter()
            .filter(|r| matches!(r.state, State::Serving | State::Loading))
            .map(|r| r.p)
            .collect();
        Deployment { replicas }
    }

    fn segment(&mut self, now: f64, s: usize, fixed: &Deployment) {
        self.mix = s;
        let target = self.target(s, fixed);
        let need: Vec<f64> = self.mixes[s].iter().map(|m| m * self.rates[s]).collect();
        let current = self.committed();
        let mix = &self.mixes[s];
        let gain = mix_capacity(self.model, &target, &TYPES, mix)
            >= mix_capacity(self.model, &current, &TYPES, mix) * (1.0 + self.args.min_gain);
        let plan = switch_plan(self.model, self.args.gpus, &current, &target, &TYPES, &need).filter(|_| gain);

        if let Some(steps) = plan.filter(|st| !st.is_empty()) {
            self.switches += 1;
            self.pending = steps.into();
        }
        self.advance(now);
        self.reroute();
    }

    /// Carries out the switch plan's steps in order, as far as free GPUs
    /// allow.
    fn advance(&mut self, now: f64) {
        while let Some(&step) = self.pending.front() {
            match step {
                Step::Start(p) => {
                    if self.free_gpus < p.gpus() {
                        return;
                    }
                    let gbs = if self.arm == Arm::Reload { self.args.disk_gbs } else { self.model.link_gbs };
                    let k = self.add_replica(p, State::Loading);
                    self.push(now + load_s(self.model, p, self.args.start_s, gbs), Ev::Ready(k));
                }
                Step::Drain(p) => {
                    let victim = (0..self.replicas.len())
                        .filter(|&k| self.replicas[k].p == p && self.replicas[k].state == State::Serving)
                        .min_by_key(|&k| self.replicas[k].inflight);
                    if let Some(k) = victim {
                        self.replicas[k].state = State::Draining;
                        self.replicas[k].engine.draining = true;
                        self.reroute();
                        self.drained(k);
                    }
                }
            }
            self.pending.pop_front();
        }
    }

    /// A draining replica with nothing left frees its GPUs.
    fn drained(&mut self, k: usize) {
        let r = &mut self.replicas[k];
        if r.state == State::Draining && r.engine.is_empty() {
            r.state = State::Gone;
            self.free_gpus += r.p.gpus();
        }
    }

    /// The routes for the serving replicas: the assignment at the highest
    /// rate they sustain in the current mix.
    fn reroute(&mut self) {
        self.serving =
            (0..self.replicas.len()).filter(|&k| self.replicas[k].state == State::Serving).collect();
        if self.arm != Arm::Oserve || self.serving.is_empty() {
            self.routes = None;
            return;
        }
        let dep = Deployment { replicas: self.serving.iter().map(|&k| self.replicas[k].p).collect() };
        let mix = &self.mixes[self.mix];
        let rate = mix_capacity(self.model, &dep, &TYPES, mix);
        let lambda: Vec<f64> = mix.iter().map(|m| m * rate).collect();
        let a = evaluate(self.model, &dep, &TYPES, &lambda);
        let mut classes: Vec<Parallel> = Vec::new();
        let class_of: Vec<usize> = dep
            .replicas
            .iter()
            .map(|p| match classes.iter().position(|q| q == p) {
                Some(c) => c,
                None => {
                    classes.push(*p);
                    classes.len() - 1
                }
            })
            .collect();
        let names = classes.iter().map(ToString::to_string).collect();
        self.routes = Some(Routes::from_assignment(names, &class_of, TYPES.len(), &a));
    }

    /// The serving replica with room for `need` KV tokens and the fewest
    /// in-flight tokens per GPU, among those `ok` accepts.
    fn least_loaded(&self, need: u64, ok: impl Fn(usize) -> bool) -> Option<usize> {
        self.serving
            .iter()
            .copied()
            .filter(|&k| ok(k))
            .filter(|&k| self.replicas[k].engine.kv_headroom(&self.configs[self.replicas[k].cfg].1) >= need)
            .min_by(|&a, &b| {
                let per_gpu =
                    |k: usize| self.replicas[k].inflight as f64 / f64::from(self.replicas[k].p.gpus());
                per_gpu(a).total_cmp(&per_gpu(b))
            })
    }

    /// Where request `r` goes now, if anywhere.
    fn pick(&mut self, r: usize) -> Option<usize> {
        let q = self.reqs[r];
        let need = u64::from(q.prompt) + u64::from(q.out);
        let Some(mut routes) = self.routes.take() else { return self.least_loaded(need, |_| true) };
        // The type as the gateway sees it: the prompt and the expected output
        // (its tenant's history: each type is its own tenant here).
        let j = nearest_centroid(TYPES.iter().copied(), f64::from(q.prompt), f64::from(q.max_tokens) / 1.5);
        let names: Vec<String> = routes.classes.clone();
        let class_ok = |k: usize, c: usize| self.replicas[k].p.to_string() == names[c];
        let has = |c: usize| self.serving.iter().any(|&k| class_ok(k, c));
        let chosen = routes.pick(j, has);
        let shares = routes.shares[j].clone();
        self.routes = Some(routes);
        let in_class = chosen.and_then(|c| self.least_loaded(need, |k| class_ok(k, c)));
        // The class is full: another class with a share for the type.
        in_class.or_else(|| {
            self.least_loaded(need, |k| (0..names.len()).any(|c| shares[c] > 0.0 && class_ok(k, c)))
        })
    }

    fn place(&mut self, now: f64, r: usize) -> bool {
        let Some(k) = self.pick(r) else { return false };
        let q = self.reqs[r];
        let seq = SimSeq {
            req: r,
            prompt: q.prompt,
            out: q.out,
            key: q.at,
            enqueued_at: now,
            ttft_budget_ms: 10_000.0,
            blocks: std::sync::Arc::from(Vec::new()),
            cached: 0,
        };
        let cfg = &self.configs[self.replicas[k].cfg].1;
        match self.replicas[k].engine.enqueue(now, seq, cfg) {
            Ok(wake) => {
                self.replicas[k].inflight += u64::from(q.prompt) + u64::from(q.out);
                if let Some(at) = wake {
                    let gen = self.replicas[k].engine.gen;
                    self.push(at, Ev::Wake { k, gen });
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Requests waiting at the gateway, oldest first, go where room is now
    /// (the first 64 are tried).
    fn retry(&mut self, now: f64) {
        let mut kept = VecDeque::new();
        let mut tried = 0;
        while let Some(r) = self.waiting.pop_front() {
            tried += 1;
            if tried > 64 || !self.place(now, r) {
                kept.push_back(r);
            }
        }
        self.waiting = kept;
    }

    fn wake(&mut self, now: f64, k: usize, gen: u64) {
        if self.replicas[k].engine.gen != gen {
            return;
        }
        let mut outs = std::mem::take(&mut self.outs);
        outs.clear();
        let cfg = &self.configs[self.replicas[k].cfg].1;
        if let Some(at) = self.replicas[k].engine.wake(now, cfg, &mut outs) {
            self.replicas[k].engine.gen += 1;
            let gen = self.replicas[k].engine.gen;
            self.push(at, Ev::Wake { k, gen });
        }
        let mut freed = false;
        for o in &outs {
            match *o {
                Out::FirstToken { req } => self.done[req].first = Some(now),
                Out::Finished { req, .. } => {
                    self.done[req].end = Some(now);
                    let q = self.reqs[req];
                    self.replicas[k].inflight -= u64::from(q.prompt) + u64::from(q.out);
                    freed = true;
                }
            }
        }
        self.outs = outs;
        if freed {
            self.drained(k);
            self.advance(now);
            self.retry(now);
        }
    }

    fn run(mut self, fixed: &Deployment, horizon: f64) -> (Vec<Done>, usize) {
        for &p in &self.target(0, fixed).replicas {
            self.add_replica(p, State::Serving);
        }
        self.reroute();
        for s in 1..self.mixes.len() {
            self.push(s as f64 * self.args.segment_s, Ev::Segment(s));
        }
        for (r, q) in self.reqs.iter().enumerate() {
            self.seq += 1;
            self.heap.push(Timed { t: q.at, seq: self.seq, ev: Ev::Arrive(r) });
        }
        while let Some(Timed { t, ev, .. }) = self.heap.pop() {
            if t > horizon {
                break;
            }
            match ev {
                Ev::Arrive(r) => {
                    if !self.waiting.is_empty() || !self.place(t, r) {
                        self.waiting.push_back(r);
                    }
                }
                Ev::Wake { k, gen } => self.wake(t, k, gen),
                Ev::Ready(k) => {
                    self.replicas[k].state = State::Serving;
                    self.reroute();
                    self.advance(t);
                    self.retry(t);
                }
                Ev::Segment(s) => self.segment(t, s, fixed),
            }
        }
        (self.done, self.switches)
    }
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

/// The four arms on one trace (cv, seed) at `load`.
pub fn run_arms(model: &CostModel, args: &LatencyArgs, cv: f64, seed: u64, load: f64) -> Vec<ArmRun> {
    let mixes = trace(seed, args.segments, cv, args.shift);
    let n = mixes.len() as f64;
    let avg: Vec<f64> = (0..TYPES.len()).map(|j| mixes.iter().map(|m| m[j]).sum::<f64>() / n).collect();
    let (fixed, _) = best_static(model, args.gpus, &avg);
    let rates: Vec<f64> = mixes.iter().map(|m| load * mix_capacity(model, &fixed, &TYPES, m)).collect();
    let reqs = requests(seed, &mixes, &rates, args.segment_s);
    let end = args.segment_s * mixes.len() as f64;
    let horizon = end + 30.0 * args.segment_s;
    ARM_OF
        .iter()
        .map(|&arm| {
            let sim = Sim {
                model,
                args,
                arm,
                mixes: &mixes,
                rates: &rates,
                reqs: &reqs,
                done: vec![Done::default(); reqs.len()],
                configs: Vec::new(),
                replicas: Vec::new(),
                free_gpus: args.gpus,
                pending: VecDeque::new(),
                routes: None,
                serving: Vec::new(),
                waiting: VecDeque::new(),
                heap: BinaryHeap::new(),
                seq: 0,
                outs: Vec::new(),
                mix: 0,
                switches: 0,
            };
            let (done, switches) = sim.run(&fixed, horizon);
            let segs = mixes.len();
            let mut e2e = vec![Vec::new(); segs];
            let mut ttft = vec![Vec::new(); segs];
            let mut completed = vec![0usize; segs];
            for (q, d) in reqs.iter().zip(&done) {
                let s = ((q.at / args.segment_s) as usize).min(segs - 1);
                // Unfinished by the horizon: counted at the horizon.
                e2e[s].push(d.end.unwrap_or(horizon) - q.at);
                ttft[s].push(d.first.unwrap_or(horizon) - q.at);
                if let Some(t) = d.end {
                    let s = (t / args.segment_s) as usize;
                    if s < segs {
                        completed[s] += 1;
                    }
                }
            }
            ArmRun {
                p99_e2e: e2e.into_iter().map(p99).collect(),
                p99_ttft: ttft.into_iter().map(p99).collect(),
                throughput: completed.iter().map(|&c| c as f64 / args.segment_s).collect(),
                switches,
            }
        })
        .collect()
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
}
