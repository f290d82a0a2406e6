//! The results file (`results.json`): one JSON object with a versioned,
//! documented schema (docs/loadtest.md). Fields are only ever added within a
//! schema version; readers ignore fields they do not know.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::record::Record;
use crate::summary::{RunSummary, Slo, TimeSeries};

/// Value of the `schema` field for this layout.
pub const SCHEMA: &str = "slo-gateway.loadtest.results/v1";

/// Everything a run produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub schema: String,
    pub run: RunInfo,
    /// The SLO each tier was judged against.
    pub slos: BTreeMap<String, Slo>,
    pub summary: RunSummary,
    pub timeseries: TimeSeries,
    pub records: Vec<Record>,
    /// The fleet over the run: engines, autoscaling decisions, GPU-seconds
    /// and cost (simulated runs; absent from plain live runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<Fleet>,
    /// The summary of the requests scheduled in a window (a burst), when
    /// the run was asked for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<Window>,
}

/// A summary of the requests scheduled in `[from_s, to_s)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub from_s: f64,
    pub to_s: f64,
    pub summary: RunSummary,
}

/// Engines over time and what they cost.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Fleet {
    /// `simulated`, or the live backend (`emulated`, `cpu`, `cuda`).
    pub backend: String,
    /// Sample spacing of the series, seconds.
    pub bin_s: f64,
    /// Engines serving (routed to), warm (ready, not routed to), starting
    /// (cold), draining, and the autoscaler's serving target, per sample.
    pub serving: Vec<f64>,
    pub warm: Vec<f64>,
    pub starting: Vec<f64>,
    pub draining: Vec<f64>,
    pub desired: Vec<f64>,
    /// The brownout level, per sample.
    #[serde(default)]
    pub brownout: Vec<f64>,
    /// The autoscaler's volatility σ of arrivals, per sample (simulated
    /// runs with autoscaling; empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volatility: Vec<f64>,
    /// Every autoscaling decision that changed the target.
    pub decisions: Vec<ScaleEvent>,
    pub cold_starts: u64,
    /// Engine-seconds from start to stop (warm and draining included).
    pub gpu_seconds: f64,
    pub cost_usd: f64,
    pub output_tokens: u64,
    pub cost_per_1m_output_tokens: Option<f64>,
    /// Device-busy seconds over GPU-seconds.
    pub device_utilization: Option<f64>,
    /// Prompt tokens the engines prefilled, and of those found in their
    /// prefix caches (not computed).
    #[serde(default)]
    pub prefix_lookup_tokens: u64,
    #[serde(default)]
    pub prefix_hit_tokens: u64,
}

/// One autoscaling decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleEvent {
    pub at_s: f64,
    pub serving: u32,
    pub warm: u32,
    pub why: String,
}

/// How the run was configured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Free-form name for reports and comparisons (`--label`).
    pub label: String,
    pub target: String,
    /// `openai` or `engine`.
    pub api: String,
    /// `h2` or `http1`.
    pub proto: String,
    pub connections: usize,
    pub workload: String,
    /// The arrival schedule in words (process, rate, burst or trace).
    pub schedule: String,
    pub duration_s: f64,
    pub seed: u64,
    pub planned: usize,
    /// Wall-clock start, seconds since 1970.
    pub started_unix_s: f64,
    pub harness_version: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    #[error("reading {0}: {1}")]
    Read(String, std::io::Error),
    #[error("{0} is not a results file: {1}")]
    Parse(String, serde_json::Error),
    #[error("{0} has schema {1:?}; this loadtest reads {SCHEMA:?}")]
    Schema(String, String),
}

impl Results {
    pub fn load(path: &Path) -> Result<Self, ResultsError> {
        let shown = path.display().to_string();
        let text = std::fs::read(path).map_err(|e| ResultsError::Read(shown.clone(), e))?;
        let r: Results = serde_json::from_slice(&text).map_err(|e| ResultsError::Parse(shown.clone(), e))?;
        if r.schema != SCHEMA {
            return Err(ResultsError::Schema(shown, r.schema));
        }
        Ok(r)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("results serialise")
    }
}
