//! The decision core of the gateway and the engines.
//!
//! Everything here is pure and deterministic: no I/O beyond parsing text the
//! caller read, no async runtime, no clock reads. Time, where it matters, is a
//! parameter. The live gateway, the engines and the load-test simulator call
//! the same functions, so what is measured in simulation is what runs.
//!
//! Modules:
//! - [`config`]: the policy document (tiers, tenants and their API keys, models).
//! - [`profile`]: latency profiles (prefill and decode timing curves).
//! - [`tokens`]: the shared token-count estimate for text.
//! - [`estimate`]: expected output, prefill and decode time per engine class.
//! - [`admission`]: feasibility against the tier's SLO, the degradation
//!   ladder, rejections with Retry-After, predicted-finish routing; and
//!   [`admission::Controller`], the admission state machine (brownout
//!   signal, gate, learning) the gateway and the simulator drive.
//! - [`autoscale`]: how many engines serve and how many stand warm:
//!   hysteresis target tracking, queue-latency triggers, volatility levels,
//!   warm-pool sizing, restart backoff.
//! - [`brownout`]: overload levels with hysteresis and their per-tier caps.
//! - [`fairness`]: deficit round-robin across tenants, in tokens.
//! - [`routing`]: the `[routing]` knobs and the baseline routing policies.
//! - [`batching`]: micro-batch formation for the engine scheduler.
//! - [`kv`]: the engine's paged KV cache and its prefix cache (pages,
//!   reference counts, LRU eviction, watermarks, the block event log).
//! - [`turn`]: the engine scheduler's per-turn decision (the turn rule,
//!   admission and KV growth, prefix reuse, preemption and pausing) as a
//!   state machine the engine and the simulator drive.
//! - [`text`]: key paths of a policy text: their lines, diffs between
//!   versions, tenant keys redacted.
//! - [`video`]: streaming video: playout and slack, service credit and
//!   urgency, fidelity profiles and their Pareto frontier, Bi-Modal Pareto
//!   Routing, placement and re-homing.
//! - [`oserve`]: workload-aware heterogeneous deployment (OServe): workload
//!   types and the exact lower-level assignment of types to replicas.
//! - [`rng`]: the seeded generator behind every reproducible random choice.
#![forbid(unsafe_code)]

pub mod admission;
pub mod autoscale;
pub mod batching;
pub mod brownout;
pub mod config;
pub mod diffusion;
pub mod estimate;
pub mod fairness;
pub mod kv;
pub mod oserve;
pub mod preempt;
pub mod prefix;
pub mod profile;
pub mod rng;
pub mod routing;
pub mod text;
pub mod tokens;
pub mod turn;
pub mod video;

pub use config::{Budget, PolicyDocument, PolicyError, Tenant, Tier, TokenPrice};
pub use profile::LatencyProfile;
