//! OServe live (issue 25): the control plane's planning loop.
//!
//! Every `[oserve] plan_interval_s` seconds (called from the fleet's
//! one-second tick):
//! 1. the forecast: each type's admitted requests per second over the
//!    last interval (admission counts them), averaged over the last
//!    `forecast_intervals` intervals, or with `forecast = "lstm"` the
//!    per-type LSTMs of `loadtest oserve-train`'s model file over the last
//!    50 intervals (once 8 are known);
//! 2. the routes: the lower level's assignment (`policies::oserve::assign`)
//!    on the serving engines of the configured classes, at the highest rate
//!    they sustain in the forecast mix, becomes each type's shares over
//!    classes, which admission's controller routes by
//!    (`policies::oserve::route`) — admission's SLO checks run unchanged
//!    inside the chosen class — while the forecast is at least
//!    `route_above_utilization` of that rate; below it, no routes
//!    (admission places requests as without OServe: pooling wins there);
//! 3. with `switch = true` (embedded mode, the fleet's leader): the upper
//!    level's search for the forecast mix on the deployment's GPUs — taken
//!    only when it sustains `min_gain` more of the mix than the current
//!    deployment — and the switch planner's steps, carried out one at
//!    a time through the supervisor (drain an engine of a class and let it
//!    finish; start one with a configuration's profile once its GPUs are
//!    free), a step only after the previous one completed.
//!
//! Engines of classes `[oserve]` does not configure are left alone (they
//! get no share, so a typed request goes to them only when its type has no
//! share on a ready class). Bounds: the history holds at most 64 intervals,
//! a plan at most the switch planner's steps (each replica once).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use policies::oserve::capacity::Parallel;
use policies::oserve::deploy::{evaluate, mix_capacity, search_mix, switch_plan, Deployment, Step};
use policies::oserve::forecast::LstmModels;
use policies::oserve::route::{type_routing, Routes};
use policies::oserve::{Forecaster, OserveConfig};
use serde_json::json;

use crate::admission::Admission;
use crate::engines::EnginePool;
use crate::supervisor::Supervisor;

/// Intervals of per-type rates kept.
const HISTORY: usize = 64;
/// Intervals known before the LSTM forecasts (the moving average until then).
const LSTM_MIN_HISTORY: usize = 8;
/// Largest LSTM model file read.
const MAX_MODEL_BYTES: u64 = 1 << 20;

#[derive(Debug, Default)]
struct State {
    last_plan_s: Option<f64>,
    counts: Vec<u64>,
    /// Per-type requests per second, one entry per interval, newest last.
    history: VecDeque<Vec<f64>>,
    forecast: Vec<f64>,
    gpus: u32,
    pending: VecDeque<Step>,
    target: Option<String>,
    switches: u64,
    steps_done: u64,
    /// Milliseconds the last deployment search took.
    search_ms: Option<f64>,
    /// The LSTM model file read for `forecast = "lstm"`: its path and the
    /// models, or why they cannot be used.
    lstm: Option<(String, Result<LstmModels, String>)>,
    /// What made the last forecast.
    forecaster: String,
    /// The forecast over the rate the serving deployment sustains in its
    /// mix, at the last plan.
    utilization: Option<f64>,
}

/// The planning loop's state; one per gateway.
#[derive(Debug, Default)]
pub struct Planner {
    state: Mutex<State>,
}

impl Planner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One fleet tick at `now_s` (seconds since the gateway started).
    pub fn tick(
        &self,
        cfg: &OserveConfig,
        now_s: f64,
        leader: bool,
        (pool, admission): (&EnginePool, &Admission),
        supervisor: Option<&Arc<Supervisor>>,
    ) {
        if cfg.plan_interval_s == 0 {
            if admission.routes().is_some() {
                admission.set_routes(None);
            }
            return;
        }
        if let Some(sup) = supervisor {
            sup.finish_drains_now();
        }
        let mut st = self.lock();
        let due = st.last_plan_s.is_none_or(|t| now_s - t >= f64::from(cfg.plan_interval_s));
        if due {
            self.plan(&mut st, cfg, now_s, pool, admission);
        }
        let Some(sup) = supervisor.filter(|_| cfg.switch && leader) else { return };
        let (classes, busy) = sup.child_classes();
        if due && !busy {
            self.replan(&mut st, cfg, &classes);
        }
        if !busy {
            self.step(&mut st, cfg, sup, &classes);
        }
    }

    /// The forecast and the routes.
    fn plan(&self, st: &mut State, cfg: &OserveConfig, now_s: f64, pool: &EnginePool, admission: &Admission) {
        let counts: Vec<u64> = admission.type_arrivals().into_iter().take(cfg.types.len()).collect();
        if st.counts.len() != counts.len() {
            // The types changed (a reload): their history starts over.
            st.history.clear();
            st.last_plan_s = None;
        }
        if let Some(last) = st.last_plan_s {
            let dt = (now_s - last).max(1e-3);
            let rates = counts
                .iter()
                .enumerate()
                .map(|(j, &c)| c.saturating_sub(st.counts.get(j).copied().unwrap_or(0)) as f64 / dt)
                .collect();
            if st.history.len() >= HISTORY {
                st.history.pop_front();
            }
            st.history.push_back(rates);
        }
        st.last_plan_s = Some(now_s);
        st.counts = counts;
        let window = (cfg.forecast_intervals as usize).min(st.history.len());
        if window == 0 {
            return;
        }
        st.forecast = (0..cfg.types.len())
            .map(|j| st.history.iter().rev().take(window).map(|r| r[j]).sum::<f64>() / window as f64)
            .collect();
        st.forecaster = "moving_average".into();
        if cfg.forecast == Forecaster::Lstm {
            lstm_forecast(st, cfg);
        }
        let serving = serving(cfg, pool);
        if serving.is_empty() || st.forecast.iter().sum::<f64>() <= 0.0 {
            return; // no evidence: the routes in force stay
        }
        let model = cfg.gpu.model();
        let types = centroids(cfg);
        let dep = Deployment { replicas: serving.iter().map(|(_, p)| *p).collect() };
        let rate = mix_capacity(&model, &dep, &types, &st.forecast);
        let total: f64 = st.forecast.iter().sum();
        st.utilization = Some(total / rate);
        if !type_routing(total, rate, cfg.route_above_utilization) {
            admission.set_routes(None);
            return;
        }
        let lambda: Vec<f64> = st.forecast.iter().map(|f| f / total * rate).collect();
        let a = evaluate(&model, &dep, &types, &lambda);
        let names: Vec<String> = cfg.configurations.iter().map(|c| c.class.clone()).collect();
        let class_of: Vec<usize> = serving.iter().map(|(c, _)| *c).collect();
        admission.set_routes(Some(Routes::from_assignment(names, &class_of, cfg.types.len(), &a)));
    }

    /// A new switch plan toward the search's deployment for the forecast,
    /// unless one is being carried out (`classes`: the children's, none
    /// starting or draining).
    fn replan(&self, st: &mut State, cfg: &OserveConfig, classes: &[Option<String>]) {
        if !st.pending.is_empty() || st.forecast.iter().sum::<f64>() <= 0.0 {
            return;
        }
        let current: Vec<Parallel> =
            classes.iter().flatten().filter_map(|c| cfg.configuration(c)).map(|c| c.parallel()).collect();
        if st.gpus == 0 {
            st.gpus = if cfg.gpus > 0 { cfg.gpus } else { current.iter().map(|p| p.gpus()).sum() };
        }
        let model = cfg.gpu.model();
        let types = centroids(cfg);
        let started = crate::clock::now();
        let plan = search_mix(&model, st.gpus, &types, &st.forecast, cfg.search_iterations as usize);
        st.search_ms = Some(crate::clock::since(started).as_secs_f64() * 1e3);
        let Some(plan) = plan else { return };
        // Only the configured configurations can be started.
        if plan.deployment.replicas.iter().any(|p| config_of(cfg, *p).is_none()) {
            return;
        }
        let current = Deployment { replicas: current };
        // Hysteresis: only a clear gain in the forecast mix is worth a switch.
        if plan.score < mix_capacity(&model, &current, &types, &st.forecast) * (1.0 + cfg.min_gain) {
            return;
        }
        let steps = switch_plan(&model, st.gpus, &current, &plan.deployment, &types, &st.forecast);
        if let Some(steps) = steps.filter(|s| !s.is_empty()) {
            tracing::info!(event = "oserve_switch", from = %current, to = %plan.deployment, steps = steps.len());
            st.target = Some(plan.deployment.to_string());
            st.switches += 1;
            st.pending = steps.into();
        }
    }

    /// Carries out the next step (the previous one is complete: no child
    /// starts or drains); `classes`: the children's classes.
    fn step(&self, st: &mut State, cfg: &OserveConfig, sup: &Arc<Supervisor>, classes: &[Option<String>]) {
        let Some(&next) = st.pending.front() else { return };
        let in_use: u32 = classes
            .iter()
            .map(|c| c.as_deref().and_then(|c| cfg.configuration(c)).map_or(0, |c| c.parallel().gpus()))
            .sum();
        match next {
            Step::Start(p) => {
                let Some(c) = config_of(cfg, p) else { return };
                if in_use + p.gpus() > st.gpus {
                    return; // its GPUs are not free yet
                }
                sup.start_with_profile(c.profile.clone().into(), c.engine_args.clone());
            }
            Step::Drain(p) => {
                if let Some(c) = config_of(cfg, p) {
                    sup.drain_class(&c.class);
                }
            }
        }
        st.pending.pop_front();
        st.steps_done += 1;
    }

    /// The loop's state for the admin API.
    pub fn detail(&self, admission: &Admission) -> serde_json::Value {
        let st = self.lock();
        let routes =
            admission.routes().map(|(classes, shares)| json!({ "classes": classes, "shares": shares }));
        json!({
            "forecast_rps": st.forecast,
            "routes": routes,
            "gpus": st.gpus,
            "target": st.target,
            "pending_steps": st.pending.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>(),
            "switches": st.switches,
            "steps_done": st.steps_done,
            "search_ms": st.search_ms,
            "forecaster": st.forecaster,
            "utilization": st.utilization,
        })
    }
}

/// Replaces the moving average with the LSTMs' forecasts once enough
/// intervals are known, reading the model file when its path changes; an
/// unusable file leaves the moving average (and says why).
fn lstm_forecast(st: &mut State, cfg: &OserveConfig) {
    let path = cfg.lstm_models.as_str();
    if st.lstm.as_ref().is_none_or(|(p, _)| p != path) {
        let names: Vec<&str> = cfg.types.iter().map(|t| t.name.as_str()).collect();
        let read = read_models(path, &names);
        if let Err(e) = &read {
            tracing::error!(event = "oserve_lstm_unusable", error = %e);
        }
        st.lstm = Some((path.to_string(), read));
    }
    let Some((_, read)) = &st.lstm else { return };
    let models = match read {
        Ok(m) => m,
        Err(e) => {
            st.forecaster = format!("moving_average (lstm: {e})");
            return;
        }
    };
    if st.history.len() < LSTM_MIN_HISTORY {
        st.forecaster = format!("moving_average (lstm after {LSTM_MIN_HISTORY} intervals)");
        return;
    }
    let forecast = models
        .models
        .iter()
        .enumerate()
        .map(|(j, m)| m.forecast(&st.history.iter().map(|r| r[j]).collect::<Vec<f64>>()))
        .collect();
    st.forecast = forecast;
    st.forecaster = "lstm".into();
}

fn read_models(path: &str, names: &[&str]) -> Result<LstmModels, String> {
    let size = std::fs::metadata(path).map_err(|e| format!("{path}: {e}"))?.len();
    if size > MAX_MODEL_BYTES {
        return Err(format!("{path}: {size} bytes, more than {MAX_MODEL_BYTES}"));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let models: LstmModels = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    models.check(names).map_err(|e| format!("{path}: {e}"))?;
    Ok(models)
}

/// The serving engines of configured classes: (configuration index, split).
fn serving(cfg: &OserveConfig, pool: &EnginePool) -> Vec<(usize, Parallel)> {
    (0..pool.len())
        .map(|i| pool.slot(i))
        .filter(|s| s.routable())
        .filter_map(|s| {
            let class = s.profile()?.engine_class.clone();
            let c = cfg.configurations.iter().position(|c| c.class == class)?;
            Some((c, cfg.configurations[c].parallel()))
        })
        .collect()
}

fn centroids(cfg: &OserveConfig) -> Vec<(f64, f64)> {
    cfg.types.iter().map(|t| (t.input, t.output)).collect()
}

fn config_of(cfg: &OserveConfig, p: Parallel) -> Option<&policies::oserve::Configuration> {
    cfg.configurations.iter().find(|c| c.parallel() == p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::EngineSpec;
    use policies::oserve::{Configuration, TypeCentroid};

    fn profile(class: &str) -> policies::LatencyProfile {
        let model = policies::oserve::capacity::CostModel::LLAMA70B_H200;
        let p = if class.ends_with("tp2") { Parallel { tp: 2, pp: 1 } } else { Parallel { tp: 4, pp: 1 } };
        policies::LatencyProfile::parse("p.toml", &model.profile_toml(p, "m", class)).unwrap()
    }

    /// Three ready engines (two of class `c-tp2`, one `c-tp4`) and a
    /// planning config over both classes with two types.
    fn fixture() -> (Arc<EnginePool>, Arc<Admission>, OserveConfig) {
        let specs = (0..3)
            .map(|i| {
                EngineSpec::native(format!("e{i}"), format!("http://127.0.0.1:{}", 9300 + i).parse().unwrap())
            })
            .collect();
        let pool = EnginePool::new(specs, &crate::limits::Limits::default(), None);
        for (i, class) in ["c-tp2", "c-tp2", "c-tp4"].iter().enumerate() {
            pool.slot(i).set_ready(true);
            pool.slot(i).set_profile(profile(class));
        }
        let admission = Admission::new(Arc::clone(&pool));
        let conf = |class: &str, tp: u32| Configuration {
            class: class.into(),
            tp,
            pp: 1,
            profile: "p".into(),
            engine_args: Vec::new(),
        };
        let cfg = OserveConfig {
            types: vec![t("short", 200.0, 100.0), t("long", 6000.0, 1500.0)],
            plan_interval_s: 1,
            configurations: vec![conf("c-tp2", 2), conf("c-tp4", 4)],
            route_above_utilization: 0.0, // routes at any load
            ..Default::default()
        };
        (pool, admission, cfg)
    }

    fn t(name: &str, input: f64, output: f64) -> TypeCentroid {
        TypeCentroid { name: name.into(), input, output }
    }

    #[test]
    fn routes_follow_the_counted_mix_and_the_history_stays_bounded() {
        let (pool, admission, cfg) = fixture();
        let planner = Planner::default();
        // No traffic yet: no evidence, no routes.
        planner.tick(&cfg, 0.0, true, (&pool, &admission), None);
        assert_eq!(admission.routes(), None);
        for s in 1..=100 {
            admission.type_arrivals[0].fetch_add(10, std::sync::atomic::Ordering::Relaxed);
            admission.type_arrivals[1].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            planner.tick(&cfg, f64::from(s), true, (&pool, &admission), None);
        }
        let st = planner.lock();
        assert_eq!(st.history.len(), HISTORY, "at most {HISTORY} intervals kept");
        assert!(
            (st.forecast[0] - 10.0).abs() < 1e-9 && (st.forecast[1] - 1.0).abs() < 1e-9,
            "{:?}",
            st.forecast
        );
        drop(st);
        let (classes, shares) = admission.routes().expect("routes from the assignment");
        assert_eq!(classes, ["c-tp2", "c-tp4"]);
        for row in &shares {
            assert!(
                (row.iter().sum::<f64>() - 1.0).abs() < 1e-9,
                "every type assigned somewhere: {shares:?}"
            );
        }
        // Below the utilization bar (here: 10x what the engines sustain):
        // no routes, admission pools; the fleet view says how far below.
        let high = OserveConfig { route_above_utilization: 10.0, ..cfg.clone() };
        admission.type_arrivals[0].fetch_add(10, std::sync::atomic::Ordering::Relaxed);
        planner.tick(&high, 101.0, true, (&pool, &admission), None);
        assert_eq!(admission.routes(), None);
        let u = planner.detail(&admission)["utilization"].as_f64().unwrap();
        assert!(u > 0.0 && u < 10.0, "{u}");
        admission.type_arrivals[0].fetch_add(10, std::sync::atomic::Ordering::Relaxed);
        planner.tick(&cfg, 102.0, true, (&pool, &admission), None);
        assert!(admission.routes().is_some(), "back above the bar");
        // A reload that adds a type: its history starts over, no panic.
        let mut three = cfg.clone();
        three.types.push(t("third", 1000.0, 10.0));
        planner.tick(&three, 111.0, true, (&pool, &admission), None);
        planner.tick(&three, 112.0, true, (&pool, &admission), None);
        assert_eq!(planner.lock().history.len(), 1);
        assert_eq!(planner.lock().history[0].len(), 3);
        // Planning off: the routes go.
        let off = OserveConfig { plan_interval_s: 0, ..cfg.clone() };
        planner.tick(&off, 113.0, true, (&pool, &admission), None);
        assert_eq!(admission.routes(), None);
    }

    /// One LSTM trained on a wave, written for both fixture types to `dir`.
    fn model_file(dir: &std::path::Path) -> (policies::oserve::forecast::Lstm, std::path::PathBuf) {
        let series: Vec<f64> = (0..120).map(|t| 10.0 + 5.0 * (f64::from(t) / 6.0).sin()).collect();
        let lstm = policies::oserve::forecast::Lstm::train(&series, 2, 1);
        let file = LstmModels {
            interval_s: 1.0,
            types: vec!["short".into(), "long".into()],
            models: vec![lstm.clone(), lstm.clone()],
        };
        let path = dir.join("lstm.json");
        std::fs::write(&path, serde_json::to_string(&file).unwrap()).unwrap();
        (lstm, path)
    }

    #[test]
    fn the_lstm_forecasts_once_enough_is_known_and_an_unusable_file_leaves_the_average() {
        let (pool, admission, cfg) = fixture();
        let dir = std::env::temp_dir().join(format!("oserve-lstm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (lstm, good) = model_file(&dir);
        let with_lstm = |path: &std::path::Path| OserveConfig {
            forecast: Forecaster::Lstm,
            lstm_models: path.display().to_string(),
            ..cfg.clone()
        };
        let planner = Planner::default();
        let lstm_cfg = with_lstm(&good);
        for s in 0..12u32 {
            admission.type_arrivals[0].fetch_add(10 + u64::from(s % 3), std::sync::atomic::Ordering::Relaxed);
            planner.tick(&lstm_cfg, f64::from(200 + s), true, (&pool, &admission), None);
            let st = planner.lock();
            let known = st.history.len();
            assert_eq!(st.forecaster == "lstm", known >= LSTM_MIN_HISTORY, "{known}: {}", st.forecaster);
            if known >= LSTM_MIN_HISTORY {
                let history: Vec<f64> = st.history.iter().map(|r| r[0]).collect();
                // (serde_json parses floats to within an ulp or two.)
                let want = lstm.forecast(&history);
                assert!(
                    (st.forecast[0] - want).abs() < 1e-9 * want.abs().max(1.0),
                    "{} vs {want}",
                    st.forecast[0]
                );
            }
        }
        // A file for other types, or past the size bound: the moving average.
        let unusable = |name: &str, bytes: Vec<u8>| {
            let path = dir.join(name);
            std::fs::write(&path, bytes).unwrap();
            let planner = Planner::default();
            (0..10)
                .for_each(|s| planner.tick(&with_lstm(&path), f64::from(s), true, (&pool, &admission), None));
            let why = planner.lock().forecaster.clone();
            why
        };
        let other =
            unusable("other.json", br#"{"interval_s": 1, "types": ["other"], "models": []}"#.to_vec());
        assert!(other.starts_with("moving_average (lstm:"), "{other}");
        let big = unusable("big.json", vec![b' '; MAX_MODEL_BYTES as usize + 1]);
        assert!(big.contains("more than 1048576"), "{big}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
