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
//!
//! Everything here is deterministic and takes its inputs as parameters: the
//! gateway, the control plane and the simulator call the same functions.

pub mod assign;
pub mod capacity;
pub mod deploy;
pub mod forecast;
pub mod typing;

#[cfg(test)]
mod tests;
