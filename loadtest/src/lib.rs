//! Load generation and measurement against the gateway (and, for
//! baselines, against engines and other proxies).
//!
//! - [`workload`]: workload files (prompt/output sizes, tenant mix) and
//!   prompt synthesis.
//! - [`arrival`]: open-loop schedules (Poisson, constant, bursts, trace
//!   replay) and the per-run request plan.
//! - [`client`]: HTTP/2 (or HTTP/1.1) over TLS, or HTTP/2 cleartext.
//! - [`sse`]: a Server-Sent Events parser; [`stream`]: token events in a
//!   streamed body (SSE or NDJSON).
//! - [`runner`]: sends the plan on time and records each request.
//! - [`record`], [`summary`], [`results`]: per-request records, the summary
//!   math, and the results file with its stable schema.
//! - [`report`], [`svg`], [`text`]: the HTML report with plots, and the
//!   text summary and comparison.
//! - [`progress`]: progress bar or periodic lines.
//! - [`prom`]: checks on Prometheus text (help lines).
//! - [`sink`]: a trivial endpoint for measuring the harness itself.
//! - [`sweep`]: several targets at stepped rates (proxy overhead, capacity).
//! - [`overhead`]: the interleaved gateway-vs-engine latency benchmark.
//! - [`stats`]: percentiles over samples.
//! - [`decision_cost`]: how long admission, autoscaling and placement
//!   decisions take at fleet scale.
//! - [`watch`]: a live gateway's fleet sampled during a run.
//! - [`sim`]: the discrete-event fleet simulator over the production
//!   policy code, in virtual time.
#![forbid(unsafe_code)]

pub mod arrival;
pub mod calibration;
pub mod chaos;
pub mod client;
pub mod clock;
pub mod cpu;
pub mod decision_cost;
pub mod diffusion;
pub mod oserve;
pub mod overhead;
pub mod progress;
pub mod prom;
pub mod record;
pub mod regimes;
pub mod report;
pub mod results;
pub mod run;
pub mod runner;
pub mod sim;
pub mod sink;
pub mod sse;
pub mod stats;
pub mod stream;
pub mod streams;
pub mod summary;
pub mod svg;
pub mod sweep;
pub mod text;
pub mod video;
pub mod watch;
pub mod workload;
