//! Workload-aware heterogeneous deployment (OServe, seed 002; issue 25):
//! the pure planning pieces.
//!
//! - [`typing`]: workload types by k-means over (input, output) lengths of
//!   history, and the classification of a request into its type.
//! - [`assign`]: the lower level. Given a deployment (replicas, each with a
//!   per-type capacity `n_kj` and edge capacity `e_kj`), the flow network
//!   source → type `j` (capacity `λ_j`) → replica `k` (`e_kj`) → sink, with
//!   the node-sharing constraint C3 (`Σ_j x_kj / n_kj ≤ 1`, the paper's LCM
//!   normalisation `Σ_j x_kj · M_k / n_kj ≤ M_k` divided by `M_k`), solved
//!   exactly for the assignment `x_kj` that serves the most requests.
//! - [`capacity`]: `n_kj` per parallel configuration (TP × PP) from a
//!   documented cost model (compute, HBM, links).
//! - [`deploy`]: the upper level, a flow-guided search over deployments,
//!   and the switch planner.
//! - [`forecast`]: per-type arrival forecasts (LSTM, moving average,
//!   Holt-Winters) and RRMSE.
//! - [`route`]: the assignment as each type's shares over engine classes,
//!   and the weighted round robin that routes by them.
//!
//! Everything here is deterministic and takes its inputs as parameters: the
//! gateway, the control plane and the simulator call the same functions.

pub mod assign;
pub mod capacity;
pub mod deploy;
pub mod forecast;
pub mod route;
pub mod typing;

#[cfg(test)]
mod tests;

/// One workload type of `[oserve]`: its name and centroid.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypeCentroid {
    pub name: String,
    /// Prompt tokens at the centroid.
    pub input: f64,
    /// Output tokens at the centroid.
    pub output: f64,
}

/// One parallel configuration the control plane may deploy: the engine
/// class its engines report (their profile's `engine_class`), its TP × PP
/// split, and the profile a new engine of it starts with.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Configuration {
    pub class: String,
    pub tp: u32,
    pub pp: u32,
    /// Latency profile path (relative to the gateway's working directory),
    /// given to engines started in this configuration.
    pub profile: String,
    /// Engine flags of this configuration (`--kv-pages=…`, a real engine's
    /// parallelism flags), each replacing the launch's flag of the same name.
    #[serde(default)]
    pub engine_args: Vec<String>,
}

impl Configuration {
    pub fn parallel(&self) -> capacity::Parallel {
        capacity::Parallel { tp: self.tp, pp: self.pp }
    }
}

/// `[oserve] forecast`: the live forecaster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Forecaster {
    /// The mean of the last `forecast_intervals` intervals.
    MovingAverage,
    /// The LSTMs of `lstm_models` (per type, over the last 50 intervals),
    /// the moving average until 8 intervals are known or if the file is
    /// unusable (the paper's choice, and the default).
    #[default]
    Lstm,
}

/// `[oserve] lstm_models` by default: LSTMs fitted to the generated
/// trace of `loadtest sim-oserve` for the default policy's four types
/// (`loadtest oserve-train --out policies/oserve-lstm.json`), shipped so
/// that the paper's forecaster runs out of the box; each window is scaled
/// by its own mean, so the weights carry shapes, not a fleet's rates.
pub const DEFAULT_LSTM_MODELS: &str = "policies/oserve-lstm.json";

/// `[oserve] gpu`: the cost model's GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CostGpu {
    H100,
    #[default]
    H200,
}

impl CostGpu {
    pub fn model(self) -> capacity::CostModel {
        match self {
            CostGpu::H100 => capacity::CostModel::LLAMA70B_H100,
            CostGpu::H200 => capacity::CostModel::LLAMA70B_H200,
        }
    }
}

/// `[oserve]`: workload types (refit offline with `loadtest oserve-fit`
/// from recorded traffic; with none, nothing is classified) and the live
/// planning loop (off while `plan_interval_s` is 0).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OserveConfig {
    #[serde(default)]
    pub types: Vec<TypeCentroid>,
    /// Seconds between plans: the per-type arrival rates of the last
    /// intervals (moving average of `forecast_intervals`) give the forecast,
    /// the assignment on the serving engines gives the routes. 0: off.
    #[serde(default)]
    pub plan_interval_s: u32,
    #[serde(default = "default_forecast_intervals")]
    pub forecast_intervals: u32,
    #[serde(default)]
    pub forecast: Forecaster,
    /// `loadtest oserve-train`'s model file (relative to the gateway's
    /// working directory), for `forecast = "lstm"`.
    #[serde(default = "default_lstm_models")]
    pub lstm_models: String,
    /// Also switch the deployment (embedded mode, leader only): the
    /// flow-guided search for the forecast mix on the fleet's GPUs, carried
    /// out by the switch planner one step at a time (drain, start).
    #[serde(default)]
    pub switch: bool,
    /// GPUs the deployment may use; 0: those of the engines at the first plan.
    #[serde(default)]
    pub gpus: u32,
    #[serde(default = "default_search_iterations")]
    pub search_iterations: u32,
    /// A switch only when the target sustains at least this much more of
    /// the forecast mix than the current deployment (0.1: 10%): a switch
    /// drains engines, and a forecast that wobbles must not flip the fleet.
    #[serde(default = "default_min_gain")]
    pub min_gain: f64,
    /// Route by type only while the forecast is at least this share of what
    /// the serving deployment sustains in its mix; below it, admission
    /// places requests as without OServe (`route::type_routing`). 0: always.
    #[serde(default = "default_route_above_utilization")]
    pub route_above_utilization: f64,
    #[serde(default)]
    pub gpu: CostGpu,
    /// The configurations engines of which the planner routes over and
    /// deploys; engines of other classes are left alone.
    #[serde(default)]
    pub configurations: Vec<Configuration>,
}

fn default_lstm_models() -> String {
    DEFAULT_LSTM_MODELS.into()
}

fn default_forecast_intervals() -> u32 {
    3
}

fn default_search_iterations() -> u32 {
    30
}

fn default_min_gain() -> f64 {
    0.1
}

fn default_route_above_utilization() -> f64 {
    0.9
}

impl Default for OserveConfig {
    fn default() -> Self {
        Self {
            types: Vec::new(),
            plan_interval_s: 0,
            forecast_intervals: default_forecast_intervals(),
            forecast: Forecaster::default(),
            lstm_models: default_lstm_models(),
            switch: false,
            gpus: 0,
            search_iterations: default_search_iterations(),
            min_gain: default_min_gain(),
            route_above_utilization: default_route_above_utilization(),
            gpu: CostGpu::default(),
            configurations: Vec::new(),
        }
    }
}

/// Most configurations `[oserve]` takes.
pub const MAX_CONFIGURATIONS: usize = 16;

/// Most types `[oserve]` takes.
pub const MAX_TYPES: usize = 16;

impl OserveConfig {
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.types.len() > MAX_TYPES {
            return Err(("oserve.types".into(), format!("at most {MAX_TYPES} types")));
        }
        for (i, t) in self.types.iter().enumerate() {
            let key = |k: &str| format!("oserve.types[{i}].{k}");
            if t.name.is_empty() || t.name.len() > 64 || self.types[..i].iter().any(|o| o.name == t.name) {
                return Err((key("name"), "1-64 bytes, unique".into()));
            }
            for (k, v) in [("input", t.input), ("output", t.output)] {
                if !(0.0..=10_000_000.0).contains(&v) || !v.is_finite() {
                    return Err((key(k), "tokens in [0, 10000000]".into()));
                }
            }
        }
        let range = |key: &str, v: u32, lo: u32, hi: u32| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err((format!("oserve.{key}"), format!("in [{lo}, {hi}]")))
            }
        };
        range("plan_interval_s", self.plan_interval_s, 0, 86_400)?;
        range("forecast_intervals", self.forecast_intervals, 1, 64)?;
        range("gpus", self.gpus, 0, 4096)?;
        range("search_iterations", self.search_iterations, 1, 1000)?;
        if self.forecast == Forecaster::Lstm && (self.lstm_models.is_empty() || self.lstm_models.len() > 4096)
        {
            return Err(("oserve.lstm_models".into(), "a model file path for forecast = \"lstm\"".into()));
        }
        if !(0.0..=10.0).contains(&self.min_gain) {
            return Err(("oserve.min_gain".into(), "in [0, 10]".into()));
        }
        if !(0.0..=10.0).contains(&self.route_above_utilization) {
            return Err(("oserve.route_above_utilization".into(), "in [0, 10]".into()));
        }
        if self.configurations.len() > MAX_CONFIGURATIONS {
            return Err(("oserve.configurations".into(), format!("at most {MAX_CONFIGURATIONS}")));
        }
        for (i, c) in self.configurations.iter().enumerate() {
            let key = |k: &str| format!("oserve.configurations[{i}].{k}");
            if c.class.is_empty()
                || c.class.len() > 128
                || self.configurations[..i].iter().any(|o| o.class == c.class)
            {
                return Err((key("class"), "1-128 bytes, unique".into()));
            }
            if !(1..=capacity::MAX_TP).contains(&c.tp)
                || c.pp == 0
                || c.tp * c.pp > capacity::MAX_REPLICA_GPUS
            {
                return Err((key("tp"), "tp in [1, 8], pp ≥ 1, tp × pp ≤ 16 GPUs".into()));
            }
            if c.profile.is_empty() || c.profile.len() > 4096 {
                return Err((key("profile"), "a profile path".into()));
            }
            if c.engine_args.len() > 32 || c.engine_args.iter().any(|a| !a.starts_with("--") || a.len() > 256)
            {
                return Err((
                    key("engine_args"),
                    "at most 32 flags, each `--name[=value]`, ≤ 256 bytes".into(),
                ));
            }
        }
        if self.plan_interval_s > 0 && (self.types.is_empty() || self.configurations.is_empty()) {
            return Err(("oserve.plan_interval_s".into(), "planning needs types and configurations".into()));
        }
        Ok(())
    }

    /// The configuration of engine class `class`.
    pub fn configuration(&self, class: &str) -> Option<&Configuration> {
        self.configurations.iter().find(|c| c.class == class)
    }

    /// The type (index and name) of a request of `input` prompt tokens
    /// expected to produce `output`; `None` without types.
    pub fn classify(&self, input: f64, output: f64) -> Option<(usize, &str)> {
        if self.types.is_empty() {
            return None;
        }
        let j = typing::nearest_centroid(self.types.iter().map(|t| (t.input, t.output)), input, output);
        Some((j, self.types[j].name.as_str()))
    }
}
