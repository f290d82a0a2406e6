//! The control plane's capacity loop: every second, per engine class, the
//! gateway's own measurements go to `policies::autoscale` and its decision
//! is exported (metrics, `/readyz`, the admin API) and, in the embedded
//! mode, carried out by the [`Supervisor`]. GPU-seconds and their cost are
//! counted here too.
//!
//! Signals per class: serving engines (ready, not warm standby, not
//! draining) and their decode slots (the engines' reported batch target),
//! demand = sequences the gateway has running there plus requests waiting
//! at the gate, the p95 of predicted queue latency over the TTFT budget
//! (admission's window), the brownout level, arrivals (for volatility),
//! and the supervisor's measured cold start.
//!
//! Video streams (`[video.fleet] autoscale = true`) have their own
//! controller, TurboServe's (`policies::video::fleet::Scaler`): ρ_max of
//! the live placement against the volatility level's ρ̂, the scale-in test
//! of Equation 5. Text and video share the primary class, so the class
//! serves the larger of the two answers (`policies::video::fleet::joint`):
//! either scales out, both must agree to scale in. Scale-in drains the
//! engines holding the fewest streams; the video control tick moves their
//! streams off, and the supervisor stops an engine only once it holds none.
//!
//! Only the fleet's leader (the cluster lease; a lone gateway always)
//! acts; every gateway computes and exports, so a new leader starts from a
//! warm state. On Kubernetes nobody here acts: KEDA scales the engine
//! Deployment to `gateway_autoscale_desired_engines{class}`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use policies::autoscale::{AutoscaleConfig, Autoscaler, Decision, Signals, Why};
use policies::video::fleet::{self as video_fleet, ScaleDecision};
use policies::PolicyDocument;
use serde_json::json;

use crate::admission::Admission;
use crate::engines::EnginePool;
use crate::metrics as m;
use crate::reload::PolicyStore;
use crate::supervisor::Supervisor;

/// What the whole gateway observes in a tick, shared by every class.
struct GatewaySignals {
    waiting: f64,
    queue_ratio_p95: Option<f64>,
    brownout_level: usize,
    arrivals: u64,
    cold_start_s: Option<f64>,
}

/// Decisions kept for the admin API and `/readyz`.
const HISTORY: usize = 64;

/// One decision that changed a class's target.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Change {
    /// Seconds since the gateway started.
    pub at_s: f64,
    pub class: String,
    pub serving: u32,
    pub warm: u32,
    pub why: &'static str,
    pub utilization: f64,
    pub target_utilization: f64,
}

#[derive(Debug, Default)]
struct State {
    scalers: BTreeMap<String, Autoscaler>,
    last: BTreeMap<String, Decision>,
    changes: VecDeque<Change>,
    /// Engine-seconds counted so far, per class, and their cost.
    gpu_seconds: BTreeMap<String, f64>,
    cost_usd: BTreeMap<String, f64>,
    /// The video controller (primary class) and its last answer.
    video: video_fleet::Scaler,
    video_last: Option<ScaleDecision>,
}

/// The capacity loop's state; one per gateway.
#[derive(Debug)]
pub struct FleetControl {
    state: Mutex<State>,
    pool: Arc<EnginePool>,
    admission: Arc<Admission>,
    supervisor: Option<Arc<Supervisor>>,
    started: Instant,
    /// `gateway up --min-engines/--max-engines`: autoscaling on with these
    /// bounds, whatever the policy document says.
    bounds: Option<(u32, u32)>,
    /// OServe's planning loop (`[oserve] plan_interval_s`).
    oserve: crate::oserve::Planner,
    /// The live video streams (the video controller's load).
    streams: Option<Arc<crate::video::Streams>>,
}

impl FleetControl {
    pub fn new(
        pool: Arc<EnginePool>,
        admission: Arc<Admission>,
        supervisor: Option<Arc<Supervisor>>,
        bounds: Option<(u32, u32)>,
        streams: Option<Arc<crate::video::Streams>>,
    ) -> Arc<Self> {
        if let (Some(sup), Some(v)) = (&supervisor, &streams) {
            let v = Arc::clone(v);
            sup.watch_holds(crate::supervisor::Holds(Arc::new(move || v.homed())));
        }
        Arc::new(Self {
            streams,
            state: Mutex::default(),
            pool,
            admission,
            supervisor,
            started: crate::clock::now(),
            bounds,
            oserve: crate::oserve::Planner::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs every second under the active policy version; spawn it.
    pub async fn run(self: Arc<Self>, store: Arc<PolicyStore>, cluster: Arc<crate::cluster::Cluster>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = crate::clock::now();
        loop {
            tick.tick().await;
            let dt = crate::clock::since(last).as_secs_f64();
            last = crate::clock::now();
            let (policy, leader, me) = (store.current(), cluster.is_leader(), Arc::clone(&self));
            // A tick may plan (OServe's deployment search: tens of
            // milliseconds of CPU): off the async worker threads.
            if let Err(e) = tokio::task::spawn_blocking(move || me.tick(&policy, leader, dt)).await {
                tracing::error!(event = "fleet_tick_failed", error = %e);
            }
        }
    }

    /// The engine classes in the pool, with each class's engine indices
    /// (not retired), the class of the first engine first (the primary).
    fn classes(&self) -> Vec<(String, Vec<usize>)> {
        let mut out: Vec<(String, Vec<usize>)> = Vec::new();
        for idx in 0..self.pool.len() {
            let slot = self.pool.slot(idx);
            if slot.is_retired() {
                continue;
            }
            let class = slot.profile().map_or_else(|| "unknown".to_string(), |p| p.engine_class.clone());
            match out.iter_mut().find(|(c, _)| *c == class) {
                Some((_, v)) => v.push(idx),
                None => out.push((class, vec![idx])),
            }
        }
        out
    }

    /// One tick: signals, decisions, metrics, and (leader, embedded mode)
    /// the supervisor's reconciliation. `dt`: seconds since the last tick.
    pub fn tick(&self, policy: &PolicyDocument, leader: bool, dt: f64) {
        let now = crate::clock::since(self.started).as_secs_f64();
        let cfg = &self.autoscale_config(policy);
        let parts = (&*self.pool, &*self.admission);
        self.oserve.tick(&policy.oserve, now, leader, parts, self.supervisor.as_ref());
        if let Some(sup) = &self.supervisor {
            sup.configure(cfg); // restart backoff applies with autoscaling off too
        }
        let tokens: u64 = self.pool.views().iter().map(|v| v.inflight_tokens).sum();
        ::metrics::gauge!(m::TOKENS_IN_FLIGHT).set(tokens as f64);
        let gateway = self.gateway_signals(policy);
        let classes = self.classes();
        let mut st = self.lock();
        account_cost(&mut st, policy, &classes, dt);
        for (i, (class, engines)) in classes.iter().enumerate() {
            let serving: Vec<usize> =
                engines.iter().copied().filter(|&e| self.pool.slot(e).routable()).collect();
            let warm = engines.iter().filter(|&&e| self.pool.slot(e).is_standby()).count();
            ::metrics::gauge!(m::ENGINES_SERVING, "class" => class.clone()).set(serving.len() as f64);
            ::metrics::gauge!(m::ENGINES_WARM, "class" => class.clone()).set(warm as f64);
            // Requests waiting at the gate count toward the primary class.
            let text = cfg.enabled.then(|| {
                let signals = self.class_signals(&serving, &gateway, i == 0);
                st.scalers.entry(class.clone()).or_default().tick(now, &signals, cfg)
            });
            // Video streams run on the primary class only.
            let video = if i == 0 { self.video_decision(&mut st, now, policy, serving.len()) } else { None };
            let Some(d) = video_fleet::joint(text, video) else {
                ::metrics::gauge!(m::AUTOSCALE_DESIRED, "class" => class.clone()).set(engines.len() as f64);
                continue;
            };
            record(&mut st, now, class, &d);
            st.last.insert(class.clone(), d);
            match &self.supervisor {
                Some(sup) if leader && i == 0 => sup.apply(&d, &with_video_bounds(cfg, policy)),
                Some(_) => {}
                // Discovered engines (Kubernetes scales them): route to
                // the decided number and keep the rest as warm standby.
                None => self.hold_warm(engines, d.serving as usize),
            }
        }
    }

    /// The policy's `[autoscale]`, with `--min/--max-engines` (when given)
    /// turning it on between those bounds.
    fn autoscale_config(&self, policy: &PolicyDocument) -> AutoscaleConfig {
        let mut cfg = policy.autoscale.clone();
        if let Some((min, max)) = self.bounds {
            cfg.enabled = true;
            cfg.min_engines = min;
            cfg.max_engines = max;
        }
        cfg
    }

    /// What the whole gateway observes, the same for every class.
    fn gateway_signals(&self, policy: &PolicyDocument) -> GatewaySignals {
        GatewaySignals {
            waiting: self.admission.waiting() as f64,
            queue_ratio_p95: self.admission.queue_ratio_p95(policy),
            brownout_level: self.admission.brownout_level(),
            arrivals: self.admission.arrivals(),
            cold_start_s: self.supervisor.as_ref().and_then(|s| s.cold_start_s()),
        }
    }

    /// The autoscaler's input for one class: its `serving` engines' slots,
    /// demand and KV pressure, beside the gateway's signals (`primary`: the
    /// class the requests waiting at the gate count toward).
    fn class_signals(&self, serving: &[usize], g: &GatewaySignals, primary: bool) -> Signals {
        let slots = serving
            .iter()
            .filter_map(|&e| self.pool.slot(e).report().map(|r| r.batch_target))
            .max()
            .unwrap_or(8);
        let demand: f64 = serving.iter().map(|&e| f64::from(self.pool.slot(e).active())).sum::<f64>()
            + if primary { g.waiting } else { 0.0 };
        // KV pressure: what this gateway leased there over the largest
        // engine's KV capacity in tokens.
        let in_flight: u64 = serving.iter().map(|&e| self.pool.slot(e).inflight_tokens()).sum();
        let kv_tokens = serving
            .iter()
            .filter_map(|&e| self.pool.slot(e).report())
            .map(|r| u64::from(r.kv_pages_total) * u64::from(r.kv_page_tokens))
            .max()
            .unwrap_or(0);
        Signals {
            serving: serving.len() as u32,
            slots_per_engine: slots,
            demand,
            queue_ratio_p95: g.queue_ratio_p95,
            brownout_level: g.brownout_level,
            arrivals: g.arrivals,
            cold_start_s: g.cold_start_s,
            tokens_in_flight: in_flight as f64,
            kv_tokens_per_engine: kv_tokens as f64,
        }
    }

    /// The video controller's answer for the primary class (`serving`
    /// engines route to it now), or `None` when video autoscaling is off
    /// or no engine's video profile is known yet. The load is the live
    /// placement: ρ_max over the engines that take streams, active streams,
    /// the budget M (serving plus engines still starting, which take the
    /// excess as the simulator's do), K from the profile.
    fn video_decision(
        &self,
        st: &mut State,
        now: f64,
        policy: &PolicyDocument,
        serving: usize,
    ) -> Option<ScaleDecision> {
        let vcfg = &policy.video;
        if !vcfg.fleet.autoscale {
            st.video_last = None;
            return None;
        }
        let streams = self.streams.as_ref()?;
        let (_, gpus, load) = streams.placed_load(vcfg)?;
        let open = gpus.iter().find(|g| g.open)?;
        let capacity = gpus.iter().filter(|g| g.open).map(|g| g.capacity).min().unwrap_or(1);
        let required: u32 = load.iter().sum();
        let starting = self.supervisor.as_ref().map_or(0, |s| s.counts().starting);
        let budget = (serving as u32 + starting).max(1);
        let mut rho = video_fleet::rho_max(&gpus, &load);
        if starting > 0 {
            rho = rho.min(f64::from(required) / (f64::from(budget) * f64::from(capacity.max(1))));
        }
        let chunk_s = f64::from(vcfg.default_frames_per_chunk) / f64::from(vcfg.default_fps);
        let latency = open.latency;
        let d = st.video.decide(
            now,
            &video_fleet::Load {
                rho_max: rho,
                required,
                engines: budget,
                capacity,
                activations: streams.activations(),
            },
            vcfg.fleet.slo_ms(chunk_s),
            |m| video_fleet::bottleneck_on(latency, m, required),
            &vcfg.fleet,
        );
        ::metrics::gauge!(m::VIDEO_RHO_MAX).set(rho);
        ::metrics::gauge!(m::VIDEO_DESIRED_ENGINES).set(f64::from(d.engines));
        st.video_last = Some(d);
        Some(d)
    }

    /// Of `engines` (one class, discovered), routes to `serving` and keeps
    /// the other ready ones as warm standby: the least loaded leave
    /// routing first (they finish what they run), standbys return first.
    fn hold_warm(&self, engines: &[usize], serving: usize) {
        let ready: Vec<usize> = engines
            .iter()
            .copied()
            .filter(|&e| self.pool.slot(e).is_ready() && !self.pool.slot(e).is_draining())
            .collect();
        let mut routed: Vec<usize> =
            ready.iter().copied().filter(|&e| !self.pool.slot(e).is_standby()).collect();
        let want = serving.max(1).min(ready.len());
        if routed.len() > want {
            // Those holding the fewest video streams leave first (the
            // control tick moves theirs off), then the least busy.
            let homed = self.streams.as_ref().map(|s| s.homed()).unwrap_or_default();
            routed.sort_by_key(|&e| (homed.get(e).copied().unwrap_or(0), self.pool.slot(e).active()));
            for &e in &routed[..routed.len() - want] {
                self.pool.slot(e).set_standby(true);
            }
        } else {
            let mut need = want - routed.len();
            for &e in ready.iter().filter(|&&e| self.pool.slot(e).is_standby()) {
                if need == 0 {
                    break;
                }
                self.pool.slot(e).set_standby(false);
                need -= 1;
            }
        }
    }

    /// Desired vs actual engines and the recent decisions, for `/readyz`
    /// and `GET /admin/v1/fleet`.
    pub fn detail(&self) -> serde_json::Value {
        let st = self.lock();
        let classes: BTreeMap<&String, serde_json::Value> = st
            .last
            .iter()
            .map(|(c, d)| {
                (
                    c,
                    json!({
                        "desired_serving": d.serving,
                        "desired_warm": d.warm,
                        "utilization": d.utilization,
                        "target_utilization": d.target_utilization,
                        "m_target": d.m_target,
                        "volatility_level": d.level,
                        "last_reason": d.why.label(),
                    }),
                )
            })
            .collect();
        let video = st.video_last.map(|d| {
            json!({
                "desired_engines": d.engines,
                "rho_max": d.utilization,
                "target_utilization": d.target_utilization,
                "m_target": d.m_target,
                "volatility": d.volatility,
                "volatility_level": d.level,
                "last_reason": format!("{:?}", d.why).to_lowercase(),
            })
        });
        let sup = self.supervisor.as_ref().map(|s| {
            json!({
                "engines": s.counts(),
                "cold_starts": s.cold_starts.load(std::sync::atomic::Ordering::Relaxed),
                "restarts": s.restarts.load(std::sync::atomic::Ordering::Relaxed),
                "cold_start_s": s.cold_start_s(),
            })
        });
        json!({
            "now_s": crate::clock::since(self.started).as_secs_f64(),
            "output_tokens": m::OUTPUT_TOKENS_SO_FAR.load(std::sync::atomic::Ordering::Relaxed),
            "video_minutes": m::video_minutes(),
            "cost_usd": st.cost_usd,
            "classes": classes,
            "video": video,
            "supervisor": sup,
            "gpu_seconds": st.gpu_seconds,
            "decisions": st.changes,
            "oserve": self.oserve.detail(&self.admission),
        })
    }
}

/// Accrues each class's engine-seconds and cost over `dt` (every live
/// engine, serving or warm, holds its device) and exports the fleet's cost
/// per 1M output tokens and per video minute so far.
fn account_cost(st: &mut State, policy: &PolicyDocument, classes: &[(String, Vec<usize>)], dt: f64) {
    for (class, engines) in classes {
        let alive = engines.len() as f64;
        *st.gpu_seconds.entry(class.clone()).or_default() += alive * dt;
        *st.cost_usd.entry(class.clone()).or_default() += alive * dt * policy.cost.price(class) / 3600.0;
        ::metrics::counter!(m::GPU_SECONDS, "class" => class.clone()).absolute(st.gpu_seconds[class] as u64);
        ::metrics::gauge!(m::COST_USD, "class" => class.clone()).set(st.cost_usd[class]);
    }
    let cost: f64 = st.cost_usd.values().sum();
    let tokens = m::OUTPUT_TOKENS_SO_FAR.load(std::sync::atomic::Ordering::Relaxed);
    if tokens > 0 {
        ::metrics::gauge!(m::COST_PER_1M).set(cost / tokens as f64 * 1e6);
    }
    let minutes = m::video_minutes();
    if minutes > 0.0 {
        ::metrics::gauge!(m::COST_PER_VIDEO_MINUTE).set(cost / minutes);
    }
}

/// Exports a class's decision, and keeps it in the history when it changed
/// the target.
fn record(st: &mut State, now: f64, class: &str, d: &Decision) {
    let class = class.to_string();
    ::metrics::gauge!(m::AUTOSCALE_DESIRED, "class" => class.clone()).set(f64::from(d.serving + d.warm));
    ::metrics::gauge!(m::AUTOSCALE_SERVING, "class" => class.clone()).set(f64::from(d.serving));
    ::metrics::gauge!(m::AUTOSCALE_WARM, "class" => class.clone()).set(f64::from(d.warm));
    ::metrics::gauge!(m::AUTOSCALE_UTILIZATION, "class" => class.clone()).set(d.utilization);
    if d.why != Why::Hold {
        ::metrics::counter!(m::AUTOSCALE_DECISIONS, "class" => class.clone(), "why" => d.why.label())
            .increment(1);
        tracing::info!(event = "autoscale", class = %class, serving = d.serving, warm = d.warm,
            why = d.why.label(), utilization = d.utilization, target = d.target_utilization,
            burst_factor = d.burst_factor);
        if st.changes.len() >= HISTORY {
            st.changes.pop_front();
        }
        st.changes.push_back(Change {
            at_s: now,
            class: class.clone(),
            serving: d.serving,
            warm: d.warm,
            why: d.why.label(),
            utilization: d.utilization,
            target_utilization: d.target_utilization,
        });
    }
}

/// The `[autoscale]` knobs the supervisor applies a joint decision with:
/// the fleet's bounds widened to video's when its controller runs.
fn with_video_bounds(cfg: &AutoscaleConfig, policy: &PolicyDocument) -> AutoscaleConfig {
    let mut out = cfg.clone();
    let v = &policy.video.fleet;
    if v.autoscale {
        (out.min_engines, out.max_engines) = if cfg.enabled {
            (cfg.min_engines.min(v.min_engines), cfg.max_engines.max(v.max_engines))
        } else {
            (v.min_engines, v.max_engines)
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::{EngineSpec, Work};

    #[tokio::test]
    async fn discovered_engines_beyond_the_decision_stand_by_warm_and_come_back_first() {
        let specs = (0..4)
            .map(|i| {
                EngineSpec::native(format!("k{i}"), format!("http://127.0.0.1:{}", 9100 + i).parse().unwrap())
            })
            .collect();
        let pool = EnginePool::new(specs, &crate::limits::Limits::default(), None);
        for i in 0..4 {
            pool.slot(i).set_ready(true);
        }
        let busy = pool.lease(3, Work { tokens: 10, prompt_tokens: 5, out_tokens: 5 });
        let fleet = FleetControl::new(Arc::clone(&pool), Admission::new(Arc::clone(&pool)), None, None, None);
        let all = [0, 1, 2, 3];
        fleet.hold_warm(&all, 2);
        assert_eq!(pool.routable_count(), 2);
        assert!(pool.slot(3).routable(), "the busy engine keeps serving; idle ones stand by first");
        let standby: Vec<usize> = all.iter().copied().filter(|&e| pool.slot(e).is_standby()).collect();
        assert_eq!(standby.len(), 2);
        fleet.hold_warm(&all, 3);
        assert_eq!(pool.routable_count(), 3, "a standby is promoted");
        fleet.hold_warm(&all, 0);
        assert_eq!(pool.routable_count(), 1, "never below one serving engine");
        drop(busy);
    }
}
