//! `loadtest sim-video`: TurboServe's closed-loop video fleet in virtual
//! time. Sessions arrive, go idle, resume and depart as a trace says
//! ([`trace`]); the arm under test places each activated session, may
//! rebalance and may resize the fleet at every event; engines are timed by
//! ℓ̂(n) (`policies::video::fleet::ChunkLatency`). The placement and the
//! scaler are the production code (`policies::video::fleet`).
//!
//! Measured: the worst-case per-chunk latency (the highest ℓ̂(n) an engine
//! held n sessions for at least half of, without a break, and every
//! migrated session's next chunk with its transfer stall), the chunk-weighted p99 and the share of
//! chunks within L_SLO, GPU cost (every provisioned engine, starting ones
//! included, billed per second), migrations and their stall.
//!
//! Arms (TurboServe §7.1): `base` (round robin at activation, fixed
//! engines, no migration), `lag` (least active sessions), `mag` (least
//! session-state memory), `no-autoscale` (min-max placement and
//! migration, fixed engines), `no-migration` (min-max assignment and
//! autoscaling, no moves: a leaving engine drains as its sessions idle or
//! depart), `ours` (all of it).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use policies::video::fleet::{
    self, Active, ChunkLatency, FleetConfig, Gpu, Level, Load, PlaceParams, Scaler, TransferModel,
};
use serde::Serialize;

pub mod bench;
pub mod trace;

use trace::{Kind, Trace};

/// A system under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Arm {
    Base,
    Lag,
    Mag,
    NoAutoscale,
    NoMigration,
    Ours,
}

impl Arm {
    pub const ALL: [Arm; 6] = [Arm::Base, Arm::Lag, Arm::Mag, Arm::NoAutoscale, Arm::NoMigration, Arm::Ours];

    pub fn label(self) -> &'static str {
        match self {
            Arm::Base => "base (RR, FCFS)",
            Arm::Lag => "base+LAG",
            Arm::Mag => "base+MAG",
            Arm::NoAutoscale => "ours w/o autoscaling",
            Arm::NoMigration => "ours w/o migration",
            Arm::Ours => "ours",
        }
    }

    fn migrates(self) -> bool {
        matches!(self, Arm::NoAutoscale | Arm::Ours)
    }

    pub fn autoscales(self) -> bool {
        matches!(self, Arm::NoMigration | Arm::Ours)
    }
}

/// How a migrated session's state travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Transfer {
    /// The session waits for its whole state (κ on its next chunk).
    Sync,
    /// Pre-copied while the source keeps generating; the next chunk waits
    /// for α plus the last chunk's pages only.
    Async,
}

/// The simulated fleet.
#[derive(Debug, Clone)]
pub struct Setup {
    pub latency: ChunkLatency,
    pub slo_ms: f64,
    /// D: a chunk's playout duration, seconds (a session needs one chunk
    /// per D, or per ℓ̂ when slower).
    pub chunk_s: f64,
    pub fleet: FleetConfig,
    /// A new engine serves this long after it is asked for (billed from
    /// the ask).
    pub cold_start_s: f64,
    pub gpu_hour: f64,
    /// A session's state: `state_mib` plus `growth_mib` per chunk it made,
    /// at most twice `state_mib` (a KV window filling up).
    pub state_mib: f64,
    pub growth_mib: f64,
    /// Chunks of state a window holds (async transfer's last delta is one).
    pub window_chunks: f64,
    pub transfer: Transfer,
    /// Nothing before this is measured or billed (a ramp-up).
    pub warmup_s: f64,
}

impl Setup {
    pub fn capacity(&self) -> u32 {
        self.latency.capacity(self.slo_ms)
    }
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub arm: Arm,
    /// Fixed engines, or `None` when autoscaled.
    pub engines: Option<u32>,
    pub worst_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    /// Chunks within L_SLO.
    pub pass_rate: f64,
    pub gpu_seconds: f64,
    pub cost: f64,
    pub mean_engines: f64,
    pub peak_engines: u32,
    pub migrations: u64,
    pub migration_stall_ms_mean: f64,
    pub scale_outs: u64,
    pub scale_ins: u64,
    /// Wall time of each placement event (assign + rebalance), µs.
    #[serde(skip)]
    pub place_us: Vec<f64>,
    /// Once a second: (t, engines billed, engines serving, active
    /// sessions, the busiest engine's sessions).
    pub timeline: Vec<(f64, u32, u32, u32, u32)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum GpuState {
    Starting {
        ready_at: f64,
    },
    Ready,
    /// Leaving: takes nothing new; removed once empty.
    Draining,
    Gone,
}

#[derive(Debug, Clone)]
struct SimGpu {
    state: GpuState,
    active: u32,
    bytes: f64,
    /// `held[k]`: since when the engine has had more than k sessions
    /// without a break (the worst-case measure: a load counts once it
    /// lasted half a chunk at its latency).
    held: Vec<f64>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Session {
    gpu: Option<usize>,
    present: bool,
    chunks: f64,
    /// Since when it runs on `gpu` (chunks are counted per stint).
    since: f64,
}

struct Run<'a> {
    setup: &'a Setup,
    arm: Arm,
    gpus: Vec<SimGpu>,
    sessions: Vec<Session>,
    rr: usize,
    scaler: Scaler,
    activations: u64,
    last: f64,
    /// Chunk latencies: ms (rounded to 0.1) → chunks.
    hist: BTreeMap<u64, f64>,
    worst_ms: f64,
    gpu_seconds: f64,
    peak: u32,
    /// Active sessions no engine could take yet (all starting), since when.
    waiting: Vec<(usize, f64)>,
    migrations: u64,
    stall_ms: f64,
    scale_outs: u64,
    scale_ins: u64,
    place_us: Vec<f64>,
    timeline: Vec<(f64, u32, u32, u32, u32)>,
    wakeups: BinaryHeap<Reverse<(u64, usize)>>,
}

/// Runs `arm` on `trace`; `fixed` engines for the arms that do not
/// autoscale (autoscaled ones start from it).
pub fn run(setup: &Setup, trace: &Trace, arm: Arm, fixed: u32, time_placement: bool) -> Outcome {
    let start = fixed.max(1);
    let mut r = Run {
        setup,
        arm,
        gpus: (0..start)
            .map(|_| SimGpu { state: GpuState::Ready, active: 0, bytes: 0.0, held: Vec::new() })
            .collect(),
        sessions: vec![Session::default(); trace.sessions],
        rr: 0,
        scaler: Scaler::new(),
        activations: 0,
        last: 0.0,
        hist: BTreeMap::new(),
        worst_ms: 0.0,
        gpu_seconds: 0.0,
        waiting: Vec::new(),
        peak: start,
        migrations: 0,
        stall_ms: 0.0,
        scale_outs: 0,
        scale_ins: 0,
        place_us: Vec::new(),
        timeline: Vec::new(),
        wakeups: BinaryHeap::new(),
    };
    let mut events = trace.events.iter().peekable();
    loop {
        let next_trace = events.peek().map(|e| e.at);
        let next_wake = r.wakeups.peek().map(|Reverse((t, _))| *t as f64 / 1e6);
        let (at, from_trace) = match (next_trace, next_wake) {
            (None, None) => break,
            (Some(t), Some(w)) if w < t => (w, false),
            (Some(t), _) => (t, true),
            (None, Some(w)) => (w, false),
        };
        if at > trace.duration_s {
            break;
        }
        r.account(at);
        if from_trace {
            let e = *events.next().expect("peeked");
            r.event(e.session, e.kind);
        } else {
            let Reverse((_, g)) = r.wakeups.pop().expect("peeked");
            if let GpuState::Starting { .. } = r.gpus[g].state {
                r.gpus[g].state = GpuState::Ready;
            }
        }
        let began = time_placement.then(crate::clock::now);
        r.control(at);
        if let Some(b) = began {
            r.place_us.push(crate::clock::since(b).as_secs_f64() * 1e6);
        }
        if r.timeline.last().is_none_or(|l| at - l.0 >= 1.0) {
            let serving = r.gpus.iter().filter(|g| g.state == GpuState::Ready).count() as u32;
            let active = r.gpus.iter().map(|g| g.active).sum::<u32>() + r.waiting.len() as u32;
            let busiest = r.gpus.iter().map(|g| g.active).max().unwrap_or(0);
            r.timeline.push((at, r.billed(), serving, active, busiest));
        }
    }
    r.account(trace.duration_s);
    for g in 0..r.gpus.len() {
        while !r.gpus[g].held.is_empty() {
            r.release(g, trace.duration_s);
        }
    }
    r.finish(trace.duration_s, fixed)
}

impl Run<'_> {
    fn billed(&self) -> u32 {
        self.gpus.iter().filter(|g| g.state != GpuState::Gone).count() as u32
    }

    /// Time passes from `self.last` to `now` at the current loads.
    fn account(&mut self, now: f64) {
        let dt = now - self.last.max(self.setup.warmup_s);
        if dt <= 0.0 {
            self.last = self.last.max(now);
            return;
        }
        let billed = self.billed();
        self.gpu_seconds += f64::from(billed) * dt;
        for g in &self.gpus {
            if g.active == 0 || !matches!(g.state, GpuState::Ready | GpuState::Draining) {
                continue;
            }
            let ms = self.setup.latency.ms(g.active);
            let per_chunk_s = (ms / 1e3).max(self.setup.chunk_s);
            let chunks = f64::from(g.active) * dt / per_chunk_s;
            *self.hist.entry((ms * 10.0).round() as u64).or_default() += chunks;
        }
        self.last = now;
    }

    /// Engine `g` lost its top load level at `now`: if that level lasted
    /// half a chunk at its latency, a chunk ran at it.
    fn release(&mut self, g: usize, now: f64) {
        let Some(since) = self.gpus[g].held.pop() else { return };
        let n = self.gpus[g].held.len() as u32 + 1;
        let ms = self.setup.latency.ms(n);
        if (now - since.max(self.setup.warmup_s)) * 1e3 >= 0.5 * ms {
            self.worst_ms = self.worst_ms.max(ms);
        }
    }

    /// One chunk that took `ms` (a migrated session's, a late start's).
    fn chunk(&mut self, now: f64, ms: f64) {
        if now >= self.setup.warmup_s {
            self.worst_ms = self.worst_ms.max(ms);
            *self.hist.entry((ms * 10.0).round() as u64).or_default() += 1.0;
        }
    }

    fn state_bytes(&self, s: usize, now: f64) -> f64 {
        let sess = &self.sessions[s];
        let chunks = sess.chunks + sess.gpu.map_or(0.0, |_| (now - sess.since) / self.setup.chunk_s);
        let mib = (self.setup.state_mib + self.setup.growth_mib * chunks).min(2.0 * self.setup.state_mib);
        mib * 1024.0 * 1024.0
    }

    fn gpus_view(&self) -> Vec<Gpu> {
        let k = self.setup.capacity();
        self.gpus
            .iter()
            .map(|g| Gpu { latency: self.setup.latency, capacity: k, open: g.state == GpuState::Ready })
            .collect()
    }

    fn load(&self) -> Vec<u32> {
        self.gpus.iter().map(|g| g.active).collect()
    }

    fn place(&mut self, s: usize, gpu: usize, now: f64) {
        let bytes = self.state_bytes(s, now);
        let sess = &mut self.sessions[s];
        sess.gpu = Some(gpu);
        sess.since = now;
        self.gpus[gpu].active += 1;
        self.gpus[gpu].held.push(now);
        self.gpus[gpu].bytes += bytes;
    }

    fn unplace(&mut self, s: usize, now: f64) {
        let bytes = self.state_bytes(s, now);
        let sess = &mut self.sessions[s];
        if let Some(g) = sess.gpu.take() {
            sess.chunks += (now - sess.since) / self.setup.chunk_s;
            self.gpus[g].active -= 1;
            self.release(g, now);
            self.gpus[g].bytes = (self.gpus[g].bytes - bytes).max(0.0);
        }
    }

    /// Where the arm puts an activated session.
    fn choose(&mut self) -> Option<usize> {
        let open: Vec<usize> =
            (0..self.gpus.len()).filter(|&j| self.gpus[j].state == GpuState::Ready).collect();
        if open.is_empty() {
            return None;
        }
        Some(match self.arm {
            Arm::Base => {
                self.rr = (self.rr + 1) % open.len();
                open[self.rr]
            }
            Arm::Lag => *open.iter().min_by_key(|&&j| (self.gpus[j].active, j)).expect("non-empty"),
            Arm::Mag => *open
                .iter()
                .min_by(|&&a, &&b| self.gpus[a].bytes.total_cmp(&self.gpus[b].bytes).then(a.cmp(&b)))
                .expect("non-empty"),
            _ => fleet::assign(&self.gpus_view(), &self.load())?,
        })
    }

    fn event(&mut self, s: usize, kind: Kind) {
        let now = self.last;
        match kind {
            Kind::Arrive | Kind::Resume => {
                self.sessions[s].present = true;
                self.activations += 1;
                match self.choose() {
                    Some(g) => self.place(s, g, now),
                    None => self.waiting.push((s, now)),
                }
            }
            Kind::Idle => {
                self.waiting.retain(|w| w.0 != s);
                self.unplace(s, now);
            }
            Kind::Depart => {
                self.waiting.retain(|w| w.0 != s);
                self.unplace(s, now);
                self.sessions[s].present = false;
            }
        }
    }

    /// After each event: rebalance and resize (Algorithm 1).
    fn control(&mut self, now: f64) {
        // Sessions that found nothing open run once something is: their
        // first chunk waited that long.
        while let Some(&(s, since)) = self.waiting.first() {
            let Some(g) = self.choose() else { break };
            self.waiting.remove(0);
            self.place(s, g, now);
            let ms = (now - since) * 1e3 + self.setup.latency.ms(self.gpus[g].active);
            self.chunk(now, ms);
        }
        if self.arm.migrates() {
            self.rebalance(now);
        }
        if self.arm.autoscales() {
            self.autoscale(now);
        }
        // Drained engines with nothing left go.
        for g in &mut self.gpus {
            if g.state == GpuState::Draining && g.active == 0 {
                g.state = GpuState::Gone;
            }
        }
    }

    fn params(&self) -> PlaceParams {
        self.setup.fleet.params()
    }

    fn rebalance(&mut self, now: f64) {
        let gpus: Vec<Gpu> = self
            .gpus
            .iter()
            .map(|g| Gpu {
                latency: self.setup.latency,
                capacity: self.setup.capacity(),
                open: g.state == GpuState::Ready,
            })
            .collect();
        let active: Vec<Active> = self
            .sessions
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let g = s.gpu?;
                // Only serving engines' sessions take part; a draining
                // engine's sessions must leave (its view is closed).
                matches!(self.gpus[g].state, GpuState::Ready | GpuState::Draining).then(|| Active {
                    id: i as u64,
                    gpu: g,
                    state_bytes: self.state_bytes(i, now) as u64,
                    movable: true,
                })
            })
            .collect();
        let plan = fleet::rebalance(&gpus, &active, &self.params());
        for m in plan.moves {
            let s = m.session as usize;
            let bytes = self.state_bytes(s, now);
            self.unplace(s, now);
            self.place(s, m.to, now);
            let stall = match self.setup.transfer {
                Transfer::Sync => m.cost_ms,
                Transfer::Async => {
                    let t: TransferModel = self.params().transfer;
                    t.ms((bytes / self.setup.window_chunks) as u64)
                }
            };
            self.migrations += 1;
            self.stall_ms += stall;
            let ms = self.setup.latency.ms(self.gpus[m.to].active) + stall;
            self.chunk(now, ms);
        }
    }

    fn autoscale(&mut self, now: f64) {
        let cfg = &self.setup.fleet;
        let gpus = self.gpus_view();
        let load = self.load();
        let required: u32 = self.gpus.iter().map(|g| g.active).sum();
        let budget = self
            .gpus
            .iter()
            .filter(|g| matches!(g.state, GpuState::Ready | GpuState::Starting { .. }))
            .count() as u32;
        let rho = if gpus.iter().any(|g| g.open) {
            fleet::rho_max(&gpus, &load)
        } else {
            f64::from(required) / f64::from(self.setup.capacity().max(1))
        };
        // Engines still starting take the excess: ρ under the decided budget.
        let starting =
            self.gpus.iter().filter(|g| matches!(g.state, GpuState::Starting { .. })).count() as u32;
        let rho = if starting > 0 {
            rho.min(f64::from(required) / (f64::from(budget) * f64::from(self.setup.capacity())))
        } else {
            rho
        };
        let latency = self.setup.latency;
        let d = self.scaler.decide(
            now,
            &Load {
                rho_max: rho,
                required,
                engines: budget,
                capacity: self.setup.capacity(),
                activations: self.activations,
            },
            self.setup.slo_ms,
            |m| fleet::bottleneck_on(latency, m, required),
            cfg,
        );
        if d.engines > budget {
            // Scale-out, then (when they are ready) rebalance.
            for _ in budget..d.engines {
                let ready_at = now + self.setup.cold_start_s;
                self.gpus.push(SimGpu {
                    state: GpuState::Starting { ready_at },
                    active: 0,
                    bytes: 0.0,
                    held: Vec::new(),
                });
                self.wakeups.push(Reverse(((ready_at * 1e6) as u64, self.gpus.len() - 1)));
            }
            self.scale_outs += 1;
        } else if d.engines < budget {
            // Rebalance off the leaving engines first, then scale-in. The
            // least loaded ready engines leave (starting ones first).
            let mut leave = budget - d.engines;
            for g in self.gpus.iter_mut().filter(|g| matches!(g.state, GpuState::Starting { .. })) {
                if leave == 0 {
                    break;
                }
                g.state = GpuState::Gone;
                leave -= 1;
            }
            let mut ready: Vec<usize> =
                (0..self.gpus.len()).filter(|&j| self.gpus[j].state == GpuState::Ready).collect();
            ready.sort_by_key(|&j| (self.gpus[j].active, std::cmp::Reverse(j)));
            for &j in ready.iter().take(leave as usize) {
                self.gpus[j].state = GpuState::Draining;
            }
            if self.arm.migrates() {
                self.rebalance(now);
            }
            self.scale_ins += 1;
        }
        self.peak = self.peak.max(self.billed());
    }

    fn finish(self, duration_s: f64, fixed: u32) -> Outcome {
        let total: f64 = self.hist.values().sum();
        let quantile = |q: f64| {
            let mut acc = 0.0;
            for (&k, &n) in &self.hist {
                acc += n;
                if acc >= q * total {
                    return k as f64 / 10.0;
                }
            }
            0.0
        };
        let mean = if total > 0.0 {
            self.hist.iter().map(|(&k, &n)| k as f64 / 10.0 * n).sum::<f64>() / total
        } else {
            0.0
        };
        let within: f64 =
            self.hist.iter().filter(|(&k, _)| k as f64 / 10.0 <= self.setup.slo_ms).map(|(_, n)| n).sum();
        Outcome {
            arm: self.arm,
            engines: (!self.arm.autoscales()).then_some(fixed),
            worst_ms: self.worst_ms,
            p99_ms: quantile(0.99),
            mean_ms: mean,
            pass_rate: if total > 0.0 { within / total } else { 1.0 },
            gpu_seconds: self.gpu_seconds,
            cost: self.gpu_seconds / 3600.0 * self.setup.gpu_hour,
            mean_engines: self.gpu_seconds / (duration_s - self.setup.warmup_s).max(1e-9),
            peak_engines: self.peak,
            migrations: self.migrations,
            migration_stall_ms_mean: if self.migrations > 0 {
                self.stall_ms / self.migrations as f64
            } else {
                0.0
            },
            scale_outs: self.scale_outs,
            scale_ins: self.scale_ins,
            place_us: self.place_us,
            timeline: self.timeline,
        }
    }
}

/// A fleet config whose every level targets `rho` (with λ kept).
pub fn with_rho(cfg: &FleetConfig, rho: f64) -> FleetConfig {
    let mut c = cfg.clone();
    c.levels = vec![Level { above: 0.0, target_utilization: rho, lambda: cfg.levels[0].lambda, engines: 0 }];
    c
}

#[cfg(test)]
mod tests;
