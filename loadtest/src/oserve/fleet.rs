//! The simulated heterogeneous fleet of `sim-oserve-latency`: replicas
//! of several configurations (each a simulated engine timed by its
//! profile), the switch plan carried out step by step (a start once its
//! GPUs are free, a drain that frees them when its last sequence ends), and
//! each arm's routing, in virtual time.

use std::collections::{BinaryHeap, VecDeque};

use policies::batching::BatchLimits;
use policies::oserve::capacity::{CostModel, Parallel};
use policies::oserve::deploy::{evaluate, mix_capacity, search_mix, switch_plan_within, Deployment, Step};
use policies::oserve::route::{type_routing, Routes};
use policies::oserve::typing::nearest_centroid;
use policies::LatencyProfile;

use super::latency::{Arm, LatencyArgs, Request};
use super::{best_static, TYPES};
use crate::sim::engine::{EngineConfig, Out, SimEngine, SimSeq};
use crate::sim::timed::Timed;

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
    engine: SimEngine,
    state: State,
    /// Tokens (prompt + output) of its unfinished requests.
    inflight: u64,
    /// Requests bound to it that its KV has no room for yet (the
    /// `vllm-like` arm: a vLLM engine's own waiting queue).
    local: VecDeque<usize>,
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
pub(super) struct Done {
    pub first: Option<f64>,
    pub end: Option<f64>,
}

pub(super) struct Sim<'a> {
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
    /// OServe's routes and the configuration of each of their classes.
    routes: Option<(Routes, Vec<Parallel>)>,
    /// The serving replicas in the order of the routes' assignment.
    serving: Vec<usize>,
    waiting: VecDeque<usize>,
    heap: BinaryHeap<Timed<Ev>>,
    seq: u64,
    outs: Vec<Out>,
    mix: usize,
    switches: usize,
    /// The `vllm-like` arm's round-robin cursor.
    next: usize,
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
    let limits = BatchLimits { max_batch: model.max_batch, ..BatchLimits::default() };
    let kv_tokens = (room / model.kv_bytes_per_token).max(0.0) as u64;
    EngineConfig { prefix_cache: false, ..EngineConfig::new(limits, profile, kv_tokens, 16) }
}

impl<'a> Sim<'a> {
    pub(super) fn new(
        model: &'a CostModel,
        args: &'a LatencyArgs,
        arm: Arm,
        (mixes, rates): (&'a [Vec<f64>], &'a [f64]),
        reqs: &'a [Request],
    ) -> Self {
        Sim {
            model,
            args,
            arm,
            mixes,
            rates,
            reqs,
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
            next: 0,
        }
    }

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
        self.replicas.push(Replica {
            p,
            engine: SimEngine::new(&self.configs[cfg].1),
            state,
            inflight: 0,
            local: VecDeque::new(),
        });
        self.replicas.len() - 1
    }

    /// The deployment the arm wants for segment `s`.
    fn target(&self, s: usize, fixed: &Deployment) -> Deployment {
        let (model, gpus) = (self.model, self.args.gpus);
        match self.arm {
            Arm::Static | Arm::Vllm => fixed.clone(),
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
        let plan = switch_plan_within(
            self.model,
            self.args.gpus,
            &current,
            &target,
            &TYPES,
            &need,
            self.args.max_dip,
        )
        .filter(|_| gain);

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
                    let gbs = if self.arm == Arm::Reload && self.args.disk_gbs > 0.0 {
                        self.args.disk_gbs
                    } else {
                        self.model.link_gbs
                    };
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
    /// rate they sustain in the current mix, while the segment's rate is
    /// near that (`route::type_routing`); none below it.
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
        if !type_routing(self.rates[self.mix], rate, self.args.route_above) {
            self.routes = None;
            return;
        }
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
        self.routes = Some((Routes::from_assignment(names, &class_of, TYPES.len(), &a), classes));
    }

    /// The serving replica with room for `need` KV tokens and the fewest
    /// in-flight tokens per GPU, among those `ok` accepts.
    fn least_loaded(&self, need: u64, ok: impl Fn(usize) -> bool) -> Option<usize> {
        self.serving
            .iter()
            .copied()
            .filter(|&k| ok(k))
            .filter(|&k| self.replicas[k].engine.kv_headroom() >= need)
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
        let Some((mut routes, classes)) = self.routes.take() else {
            return self.least_loaded(need, |_| true);
        };
        // The type as the gateway sees it: the prompt and the expected output
        // (its tenant's history: each type is its own tenant here).
        let j = nearest_centroid(TYPES.iter().copied(), f64::from(q.prompt), f64::from(q.max_tokens) / 1.5);
        let (replicas, serving) = (&self.replicas, &self.serving);
        let chosen = routes.pick(j, |c| serving.iter().any(|&k| replicas[k].p == classes[c]));
        self.routes = Some((routes, classes));
        let (routes, classes) = self.routes.as_ref()?;
        let of = |k: usize, c: usize| self.replicas[k].p == classes[c];
        let in_class = chosen.and_then(|c| self.least_loaded(need, |k| of(k, c)));
        // The class is full: another class with a share for the type.
        in_class.or_else(|| {
            self.least_loaded(need, |k| (0..classes.len()).any(|c| routes.shares[j][c] > 0.0 && of(k, c)))
        })
    }

    fn place(&mut self, now: f64, r: usize) -> bool {
        match self.pick(r) {
            Some(k) => self.place_on(now, r, k),
            None => false,
        }
    }

    /// The `vllm-like` arm: `r` is bound to the next serving replica in
    /// turn, and waits in that replica's queue while its KV is full.
    fn round_robin(&mut self, now: f64, r: usize) {
        if self.serving.is_empty() {
            self.waiting.push_back(r);
            return;
        }
        let k = self.serving[self.next % self.serving.len()];
        self.next += 1;
        if !self.replicas[k].local.is_empty() || !self.place_on(now, r, k) {
            self.replicas[k].local.push_back(r);
        }
    }

    fn place_on(&mut self, now: f64, r: usize, k: usize) -> bool {
        let q = self.reqs[r];
        let seq = SimSeq {
            req: r,
            prompt: q.prompt,
            out: q.out,
            max_tokens: q.out,
            key: q.at,
            enqueued_at: now,
            ttft_budget_ms: 10_000.0,
            priority: None,
            blocks: std::sync::Arc::from(Vec::new()),
            answer: std::sync::Arc::from(Vec::new()),
        };
        match self.replicas[k].engine.enqueue(now, seq) {
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
        if let Some(at) = self.replicas[k].engine.wake(now, &mut outs) {
            self.replicas[k].engine.gen += 1;
            let gen = self.replicas[k].engine.gen;
            self.push(at, Ev::Wake { k, gen });
        }
        let mut freed = false;
        for o in &outs {
            match *o {
                Out::FirstToken { req } => self.done[req].first = Some(now),
                Out::Finished { req, .. } | Out::Failed { req, .. } => {
                    // A failed request never ends: it counts at the horizon.
                    if matches!(o, Out::Finished { .. }) {
                        self.done[req].end = Some(now);
                    }
                    let q = self.reqs[req];
                    self.replicas[k].inflight -= u64::from(q.prompt) + u64::from(q.out);
                    freed = true;
                }
            }
        }
        self.outs = outs;
        if freed {
            while let Some(&r) = self.replicas[k].local.front() {
                if !self.place_on(now, r, k) {
                    break;
                }
                self.replicas[k].local.pop_front();
            }
            self.drained(k);
            self.advance(now);
            self.retry(now);
        }
    }

    /// Runs the trace to `horizon`: each request's times, the switches
    /// made, and the first deployment.
    pub(super) fn run(mut self, fixed: &Deployment, horizon: f64) -> (Vec<Done>, usize, String) {
        let first = self.target(0, fixed);
        for &p in &first.replicas {
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
                Ev::Arrive(r) if self.arm == Arm::Vllm => self.round_robin(t, r),
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
        (self.done, self.switches, first.to_string())
    }
}
