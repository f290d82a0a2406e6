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

/// `[oserve]`: workload types (refit offline with `loadtest oserve-fit`
/// from recorded traffic). With none, nothing is classified.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OserveConfig {
    #[serde(default)]
    pub types: Vec<TypeCentroid>,
}

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
        Ok(())
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
