//! The simulated fleet: a gateway running the production admission state
//! machine and autoscaler over simulated engines, in virtual time.
//!
//! Per request, as in the live gateway (one gateway: tenants' concurrency
//! is admission's to count, as live without Redis; per-minute rate limits
//! are not modelled): tier context ceiling and output cap
//! (`context_length_exceeded`, max_tokens clamp) -> `Controller::request`
//! over the serving engines -> start, wait at the gate, or a typed refusal.
//! Slots freed (a finish) pump the gate; every 250 ms the gate ticks
//! (brownout, expired waiters), as the gateway's loop does. Dispatched work
//! is counted against its engine exactly as `EngineLease` counts it
//! (active, expected output, prefill backlog until the first token). A
//! request with no first token within its end-to-end budget fails
//! (`engine_timeout`, as the gateway's first-event timeout) and leaves the
//! engine's queue.
//!
//! The supervisor: engines are `Starting` for the cold start, then `Warm`
//! (ready, not routed to) or `Serving`; scale-in drains an engine (no new
//! work, running sequences finish at token boundaries) before it stops or
//! returns to the warm pool. Every engine not stopped is billed.
//!
//! Time is one `f64` of seconds; events at equal times run in the order
//! they were scheduled, so a run is deterministic for its seed.

use std::collections::{BinaryHeap, HashMap};

use policies::admission::controller::{
    Admit, Controller, Grant, Outcome, Reason, Refusal, Request, WaiterId,
};
use policies::admission::{assign_long_lanes, Candidate};
use policies::autoscale::{Autoscaler, Signals};
use policies::prefix::PrefixIndex;
use policies::routing::EngineView;
use policies::PolicyDocument;

use super::engine::{EngineConfig, Out, SimEngine, SimSeq};
use crate::record::{Admission as Headers, Outcome as Done, Record};
use crate::results::{Fleet, ScaleEvent};

mod capacity;
mod serve;

/// Latency of the network and the gateway itself, per direction.
#[derive(Debug, Clone, Copy)]
pub struct Hops {
    /// Client <-> gateway, one way (TLS, HTTP/2, parsing), seconds.
    pub client_s: f64,
    /// Gateway <-> engine, one way, seconds.
    pub engine_s: f64,
}

/// The fleet's size and how it changes.
#[derive(Debug, Clone)]
pub struct FleetPlan {
    /// Engines serving at the start (the autoscaler's start too).
    pub engines: u32,
    pub autoscale: bool,
    /// Seconds from start to ready.
    pub cold_start_s: f64,
    /// Engine class name (its price) of every engine.
    pub class: String,
    /// The profile engines report (admission's prior; the engines' real
    /// timing is `EngineConfig::profile`).
    pub advertised: policies::LatencyProfile,
}

/// One request of the run.
#[derive(Debug, Clone)]
pub struct SimRequest {
    pub at_s: f64,
    pub key: String,
    pub tier: String,
    pub key_index: usize,
    pub prompt: u32,
    pub max_tokens: u32,
    /// Where the emulated model would end by itself.
    pub natural_len: u32,
    /// The prompt's full blocks (`policies::prefix` hashes).
    pub blocks: std::sync::Arc<[u64]>,
    /// The full blocks of prompt and answer when a later prompt resends the
    /// answer (`answers = "received"`), else empty.
    pub answer: std::sync::Arc<[u64]>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Starting { ready_at: f64, to_warm: bool },
    Warm,
    Serving,
    Draining { to_warm: bool },
    Stopped,
}

#[derive(Debug)]
struct Slot {
    engine: SimEngine,
    state: State,
    started_at: f64,
    /// The gateway's counts (EngineLease).
    active: u32,
    active_out: u64,
    backlog: u64,
    inflight_tokens: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Ev {
    Arrive(usize),
    Dispatch(usize),
    Wake {
        engine: usize,
        gen: u64,
    },
    /// What an engine's token boundary produced, reaching the gateway.
    Engine(Out),
    FirstTimeout(usize),
    GateTick,
    ScaleTick,
    Ready(usize),
}

type Scheduled = super::timed::Timed<Ev>;

/// Where one request is.
#[derive(Debug, Clone)]
struct Live {
    admit: Option<Admit>,
    engine: Option<usize>,
    /// When the gateway saw it (its TTFT clock), seconds.
    arrived: f64,
    first_at: Option<f64>,
    done: bool,
    tenant: String,
    /// Engines tried before the current one (first-event timeouts), as the
    /// gateway's dispatcher retries: at most `MAX_ATTEMPTS` in all.
    tried: Vec<usize>,
}

/// The gateway's dispatch attempts per request (`dispatch::MAX_ATTEMPTS`).
const MAX_ATTEMPTS: usize = 3;

/// An engine sequence's tag: the request and which attempt it is, so a
/// late event of an abandoned attempt is recognised.
fn tag(r: usize, attempt: usize) -> usize {
    r * 4 + attempt
}

fn untag(t: usize) -> (usize, usize) {
    (t / 4, t % 4)
}

/// What one run produced.
pub struct RunOutput {
    pub records: Vec<Record>,
    pub fleet: Fleet,
    /// Events processed (for the speed figure).
    pub events: u64,
}

/// The simulation's state.
pub struct Sim<'a> {
    policy: &'a PolicyDocument,
    cfg: &'a EngineConfig,
    hops: Hops,
    plan: FleetPlan,
    reqs: &'a [SimRequest],
    records: Vec<Record>,
    live: Vec<Live>,
    slots: Vec<Slot>,
    heap: BinaryHeap<Scheduled>,
    seq: u64,
    ctl: Controller,
    class: usize,
    waiters: HashMap<WaiterId, usize>,
    scaler: Autoscaler,
    arrivals: u64,
    outs: Vec<Out>,
    fleet: Fleet,
    output_tokens: u64,
    end_s: f64,
    events: u64,
    /// (start, stop) of every engine life that ended: billed at the end,
    /// up to the end of the run.
    lives: Vec<(f64, f64)>,
    /// Requests not finished yet: ticks stop once none is left after the end.
    open_requests: usize,
    /// Where prompt prefixes are cached, as the gateway knows it.
    index: PrefixIndex,
    /// Highest time any request can still be in flight (the last arrival
    /// plus its budgets): ticks stop after it.
    horizon: f64,
}

impl<'a> Sim<'a> {
    pub fn new(
        policy: &'a PolicyDocument,
        cfg: &'a EngineConfig,
        hops: Hops,
        plan: FleetPlan,
        reqs: &'a [SimRequest],
        duration_s: f64,
    ) -> Self {
        let mut ctl = Controller::new();
        let class = ctl.class_of(&plan.advertised);
        let max_e2e = policy.tiers.iter().map(|t| t.e2e.as_secs_f64()).fold(0.0, f64::max);
        let horizon = reqs.last().map_or(0.0, |r| r.at_s) + 2.0 * max_e2e + 5.0;
        let mut sim = Self {
            policy,
            cfg,
            hops,
            plan,
            reqs,
            records: Vec::with_capacity(reqs.len()),
            live: Vec::with_capacity(reqs.len()),
            slots: Vec::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            ctl,
            class,
            waiters: HashMap::new(),
            scaler: Autoscaler::new(),
            arrivals: 0,
            outs: Vec::new(),
            fleet: Fleet { backend: "simulated".into(), bin_s: 1.0, ..Fleet::default() },
            output_tokens: 0,
            end_s: duration_s,
            events: 0,
            lives: Vec::new(),
            open_requests: reqs.len(),
            index: PrefixIndex::new(policy.routing.prefix.index_blocks),
            horizon,
        };
        for _ in 0..sim.plan.engines {
            sim.slots.push(Slot::new(cfg, State::Serving, 0.0));
        }
        for (i, r) in reqs.iter().enumerate() {
            let mut rec =
                Record::planned(i as u64, &r.tier, r.key_index, r.at_s * 1e3, r.prompt, r.max_tokens);
            rec.sent_at_ms = rec.scheduled_at_ms;
            sim.records.push(rec);
            sim.live.push(Live {
                admit: None,
                engine: None,
                arrived: 0.0,
                first_at: None,
                done: false,
                tenant: String::new(),
                tried: Vec::new(),
            });
            sim.push(r.at_s + hops.client_s, Ev::Arrive(i));
        }
        sim.push(0.25, Ev::GateTick);
        sim.push(0.0, Ev::ScaleTick);
        sim
    }

    fn push(&mut self, t: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Scheduled { t, seq: self.seq, ev });
    }

    /// Runs every event; `progress` is called with the virtual time now and then.
    pub fn run(mut self, mut progress: impl FnMut(f64)) -> RunOutput {
        let mut next_report = 0.0;
        while let Some(Scheduled { t, ev, .. }) = self.heap.pop() {
            self.events += 1;
            if t >= next_report {
                progress(t);
                next_report = t + self.end_s.max(1.0) / 100.0;
            }
            match ev {
                Ev::Arrive(r) => self.arrive(t, r),
                Ev::Dispatch(r) => self.dispatch(t, r),
                Ev::Wake { engine, gen } => self.wake(t, engine, gen),
                Ev::Engine(Out::FirstToken { req }) => self.first_token(t, req),
                Ev::Engine(Out::Finished { req, tokens, prefill_ms, decode_ms, batch, cached }) => {
                    self.finished(t, req, tokens, (prefill_ms, cached), decode_ms, batch)
                }
                Ev::Engine(Out::Failed { req, code }) => self.engine_error(t, req, code),
                Ev::FirstTimeout(r) => self.first_timeout(t, r),
                Ev::GateTick => {
                    let (_, expired) = self.ctl.tick(t, self.policy);
                    self.deliver(t, expired);
                    self.pump(t);
                    if self.ticking(t) {
                        self.push(t + 0.25, Ev::GateTick);
                    }
                }
                Ev::ScaleTick => {
                    self.scale(t);
                    if self.ticking(t) {
                        self.push(t + 1.0, Ev::ScaleTick);
                    }
                }
                Ev::Ready(e) => self.ready(t, e),
            }
        }
        let end = self.fleet_end();
        self.bill(end);
        self.fleet.output_tokens = self.output_tokens;
        self.fleet.cost_usd = self.fleet.gpu_seconds * self.policy.cost.price(&self.plan.class) / 3600.0;
        self.fleet.cost_per_1m_output_tokens =
            (self.output_tokens > 0).then(|| self.fleet.cost_usd / self.output_tokens as f64 * 1e6);
        let busy: f64 = self.slots.iter().map(|s| s.engine.busy_s).sum();
        self.fleet.prefix_lookup_tokens += self.slots.iter().map(|s| s.engine.lookup_tokens()).sum::<u64>();
        self.fleet.prefix_hit_tokens += self.slots.iter().map(|s| s.engine.hit_tokens()).sum::<u64>();
        self.fleet.device_utilization = (self.fleet.gpu_seconds > 0.0).then(|| busy / self.fleet.gpu_seconds);
        RunOutput { records: self.records, fleet: self.fleet, events: self.events }
    }

    fn close(&mut self, r: usize) {
        if !self.live[r].done {
            self.live[r].done = true;
            self.open_requests -= 1;
        }
    }

    /// Ticks go on while the schedule runs or requests are open.
    fn ticking(&self, t: f64) -> bool {
        (t < self.end_s || self.open_requests > 0) && t < self.horizon
    }

    fn candidates(&self) -> Vec<Candidate> {
        let mut out: Vec<Candidate> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state == State::Serving)
            .map(|(idx, s)| Candidate {
                idx,
                class: self.class,
                slots: self.cfg.limits.max_batch.max(1),
                active: s.active,
                active_out_tokens: s.active_out,
                prefill_backlog_tokens: s.backlog,
                kv_headroom_tokens: s.engine.kv_headroom(),
                long_lane: false,
                cached_tokens: 0,
                preemptible: 0,
            })
            .collect();
        assign_long_lanes(&mut out, self.policy.routing.long_lane_engines);
        out
    }

    fn views(&self) -> Vec<EngineView> {
        self.slots
            .iter()
            .enumerate()
            .map(|(i, s)| EngineView {
                id: format!("s{i}"),
                ready: s.state == State::Serving,
                inflight_tokens: s.inflight_tokens,
                inflight_requests: s.active,
                cached_blocks: 0,
            })
            .collect()
    }

    fn arrive(&mut self, now: f64, r: usize) {
        self.arrivals += 1;
        let req = &self.reqs[r];
        let Some((tenant, tier)) = self.policy.authenticate(&req.key) else {
            return self.refuse_plain(now, r, 401, "invalid_api_key");
        };
        self.live[r].arrived = now;
        self.live[r].tenant = tenant.name.clone();
        if req.prompt > tier.max_context_tokens.get() {
            return self.refuse_plain(now, r, 400, "context_length_exceeded");
        }
        let max_tokens = req.max_tokens.min(tier.max_output_tokens.get());
        let request = Request {
            tenant: &tenant.name,
            tier,
            model: "m",
            prompt_tokens: req.prompt,
            max_tokens,
            sampling: false,
            ttft_hint_ms: None,
            e2e_hint_ms: None,
            prefix_blocks: req.blocks.len() as u32,
        };
        let off = self.policy.admission.mode == policies::admission::AdmissionMode::Off;
        // The tier's concurrency limit holds whatever the admission mode:
        // the gateway counts it in its tenant limits before admission
        // (admission `on` counts it itself).
        if off && tier.max_concurrency.is_some_and(|l| self.ctl.open(&tenant.name) >= l.get()) {
            self.refuse_plain(now, r, 429, "tenant_concurrency");
            let rec = &mut self.records[r];
            rec.admission.decision = Some("rejected".into());
            rec.admission.reason = Some("tenant_concurrency".into());
            return;
        }
        let affinity = &self.policy.routing.prefix;
        let matched = match affinity.enabled {
            true => self.index.matched(&req.blocks, self.slots.len()),
            false => Vec::new(),
        };
        let (mut engines, mut loads) =
            if off { (Vec::new(), self.views()) } else { (self.candidates(), Vec::new()) };
        let sizes = (req.blocks.len() as u32, req.prompt);
        policies::admission::credit_prefix(&mut engines, &mut loads, &matched, sizes, affinity);
        match self.ctl.request(now, self.policy, &request, &engines, &loads) {
            Outcome::Refuse(refusal) => self.refuse(now, r, &refusal),
            Outcome::Start { engine, admit } => {
                self.admitted(r, admit);
                self.lease(now, r, engine);
            }
            Outcome::Wait { id, admit, .. } => {
                self.admitted(r, admit);
                self.waiters.insert(id, r);
                self.pump(now);
            }
            Outcome::Anywhere { admit } => {
                self.admitted(r, admit);
                self.fail(now, r, "no_ready_engine");
            }
        }
    }

    fn admitted(&mut self, r: usize, admit: Admit) {
        let rec = &mut self.records[r];
        rec.admission = Headers {
            decision: Some(admit.decision().into()),
            reason: Some(admit.reason()),
            predicted_ttft_ms: admit.predicted_ttft_ms,
            predicted_e2e_ms: admit.predicted_e2e_ms,
            engine_class: Some(self.plan.class.clone()),
            policy_version: Some(self.policy.version.clone()),
            retry_after_s: None,
        };
        rec.max_tokens = admit.max_tokens;
        self.live[r].admit = Some(admit);
    }

    fn refuse_plain(&mut self, now: f64, r: usize, status: u16, reason: &str) {
        let rec = &mut self.records[r];
        rec.outcome = Done::Rejected;
        rec.status = status;
        rec.reason = Some(reason.into());
        rec.done_ms = Some((now + self.hops.client_s) * 1e3 - rec.scheduled_at_ms);
        self.close(r);
    }

    fn refuse(&mut self, now: f64, r: usize, refusal: &Refusal) {
        let status = if refusal.reason == Reason::TenantConcurrency { 429 } else { 503 };
        self.refuse_plain(now, r, status, refusal.reason.label());
        let rec = &mut self.records[r];
        rec.admission.decision = Some("rejected".into());
        rec.admission.reason = Some(refusal.reason.label().into());
        rec.admission.predicted_ttft_ms = refusal.predicted_ttft_ms;
        rec.admission.retry_after_s = Some(f64::from(refusal.retry_after_s));
    }

    /// An admitted request that will not run: the tenant's hold is released.
    fn fail(&mut self, now: f64, r: usize, why: &str) {
        let rec = &mut self.records[r];
        rec.outcome = Done::Failed;
        rec.reason = Some(why.into());
        rec.done_ms = Some((now + self.hops.client_s) * 1e3 - rec.scheduled_at_ms);
        self.close(r);
        let tenant = std::mem::take(&mut self.live[r].tenant);
        self.ctl.release(&tenant);
    }

    /// The engine's evictions since the last call reach the prefix index
    /// (its KV events; what it stored the index learnt when routing).
    fn kv_events(&mut self, engine: usize) {
        let Ok(e) = u16::try_from(engine) else { return };
        for h in self.slots[engine].engine.evicted.drain(..) {
            self.index.remove(e, h);
        }
    }

    /// The engine named the pages `r`'s answer of `tokens` filled: its KV
    /// events tell the prefix index (every position but the last token's).
    fn learn_answer(&mut self, r: usize, engine: Option<usize>, tokens: u32) {
        let req = &self.reqs[r];
        let (Some(e), true) =
            (engine.and_then(|e| u16::try_from(e).ok()), self.policy.routing.prefix.enabled)
        else {
            return;
        };
        let n = (req.prompt + tokens).saturating_sub(1) / self.cfg.page_tokens.max(1);
        if self.cfg.prefix_cache && !req.answer.is_empty() {
            self.index.record(e, &req.answer[..req.answer.len().min(n as usize)]);
        }
    }

    /// Counts `r` against `engine` and sends it there.
    fn lease(&mut self, now: f64, r: usize, engine: usize) {
        if let (true, Ok(e)) = (self.policy.routing.prefix.enabled, u16::try_from(engine)) {
            self.index.record(e, &self.reqs[r].blocks);
        }
        let work = self.live[r].admit.as_ref().expect("admitted").work;
        let s = &mut self.slots[engine];
        s.active += 1;
        s.active_out += work.out_tokens;
        s.backlog += work.prompt_tokens;
        s.inflight_tokens += work.tokens;
        self.live[r].engine = Some(engine);
        let t = tag(r, self.live[r].tried.len());
        self.push(now + self.hops.engine_s, Ev::Dispatch(t));
        let budget = self.live[r].admit.as_ref().map_or(0.0, |a| a.e2e_budget_ms / 1e3);
        let tier_e2e = self.policy.tier(&self.reqs[r].tier).map_or(budget, |t| t.e2e.as_secs_f64());
        self.push(now + budget.max(tier_e2e), Ev::FirstTimeout(t));
    }

    /// Takes `r`'s counts off its engine (EngineLease drop); a slot freed.
    fn unlease(&mut self, r: usize) {
        let Some(engine) = self.live[r].engine.take() else { return };
        let work = self.live[r].admit.as_ref().expect("admitted").work;
        let first = self.live[r].first_at.is_some();
        let s = &mut self.slots[engine];
        s.active -= 1;
        s.active_out -= work.out_tokens;
        if !first {
            s.backlog -= work.prompt_tokens;
        }
        s.inflight_tokens -= work.tokens;
    }
}

impl Slot {
    fn new(cfg: &EngineConfig, state: State, started_at: f64) -> Self {
        Self {
            engine: SimEngine::new(cfg),
            state,
            started_at,
            active: 0,
            active_out: 0,
            backlog: 0,
            inflight_tokens: 0,
        }
    }
}
