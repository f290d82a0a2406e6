//! Prometheus metrics: names, the recorder, and a per-request observer.
//!
//! Exported at `GET /metrics`:
//! - `gateway_requests_total{route,status}`: responses by route and status
//! - `gateway_errors_total{code}`: API errors by stable label
//! - `gateway_ttft_seconds{tier}`, `gateway_tlet_seconds{tier}`: time to
//!   first and last token, measured at the gateway
//! - `gateway_inflight_requests`: requests whose response is still open
//! - `gateway_ready_engines`: engines passing their readiness probe
//! - `gateway_engine_retries_total`: engine attempts that failed and moved on

use std::sync::OnceLock;
use std::time::Instant;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const REQUESTS: &str = "gateway_requests_total";
pub const ERRORS: &str = "gateway_errors_total";
pub const TTFT: &str = "gateway_ttft_seconds";
pub const TLET: &str = "gateway_tlet_seconds";
pub const INFLIGHT: &str = "gateway_inflight_requests";
pub const READY_ENGINES: &str = "gateway_ready_engines";
pub const ENGINE_RETRIES: &str = "gateway_engine_retries_total";

const LATENCY_BUCKETS: &[f64] =
    &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// Installs the process-wide recorder once and returns its handle.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
            .expect("bucket list is non-empty")
            .install_recorder()
            .expect("the metrics recorder is installed once per process")
    })
}

/// Follows one generation: TTFT at its first token, TLET at its end, and
/// the in-flight gauge for as long as it lives.
#[derive(Debug)]
pub struct RequestObserver {
    arrived: Instant,
    tier: String,
    first_seen: bool,
}

impl RequestObserver {
    pub fn new(arrived: Instant, tier: &str) -> Self {
        metrics::gauge!(INFLIGHT).increment(1.0);
        Self { arrived, tier: tier.to_string(), first_seen: false }
    }

    pub fn first_token(&mut self) {
        if !self.first_seen {
            self.first_seen = true;
            metrics::histogram!(TTFT, "tier" => self.tier.clone())
                .record(self.arrived.elapsed().as_secs_f64());
        }
    }

    pub fn finished(&self) {
        metrics::histogram!(TLET, "tier" => self.tier.clone()).record(self.arrived.elapsed().as_secs_f64());
    }
}

impl Drop for RequestObserver {
    fn drop(&mut self) {
        metrics::gauge!(INFLIGHT).decrement(1.0);
    }
}
