//! The engines this gateway routes to: addresses, readiness, in-flight tokens.
//!
//! One HTTP/2 client (prior knowledge, cleartext) multiplexes all requests
//! to an engine over one connection. A poller reads each engine's load
//! report to track readiness; a dispatch that cannot reach an engine marks
//! it not ready at once, and the poller brings it back when it answers.
//! In-flight tokens are counted here, by the gateway that dispatched them,
//! through [`InflightTokens`] guards: exact and immediate, unlike polling.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use engine::api::LoadReport;
use http::Uri;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use policies::routing::EngineView;

/// The HTTP/2 client used for engine traffic.
pub type EngineClient = Client<HttpConnector, Full<Bytes>>;

/// How often load reports are polled.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// A load report slower than this counts as a failed probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Recently cancelled engine streams remembered per connection.
const MAX_RESET_STREAMS: usize = 4096;

/// Where an engine is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSpec {
    pub id: String,
    /// Base URL, e.g. `http://127.0.0.1:9000`.
    #[serde(with = "uri_string")]
    pub url: Uri,
}

mod uri_string {
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<http::Uri, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One engine as the gateway sees it.
#[derive(Debug)]
pub struct EngineSlot {
    pub spec: EngineSpec,
    ready: AtomicBool,
    inflight_tokens: AtomicU64,
    last_report: Mutex<Option<LoadReport>>,
}

/// All engines plus the client that reaches them.
#[derive(Debug)]
pub struct EnginePool {
    slots: Vec<EngineSlot>,
    client: EngineClient,
}

impl EnginePool {
    pub fn new(specs: Vec<EngineSpec>) -> Arc<Self> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(1)));
        let client = Client::builder(TokioExecutor::new())
            .http2_only(true)
            // A client that goes away cancels its engine stream (RST_STREAM)
            // while the engine may still have frames in flight for it. h2
            // remembers only 10 such streams by default and treats frames
            // for forgotten ones as errors, counted towards closing the
            // whole connection; remember as many as can be in flight.
            .http2_max_concurrent_reset_streams(MAX_RESET_STREAMS)
            .build(connector);
        let slots = specs
            .into_iter()
            .map(|spec| EngineSlot {
                spec,
                ready: AtomicBool::new(false),
                inflight_tokens: AtomicU64::new(0),
                last_report: Mutex::new(None),
            })
            .collect();
        Arc::new(Self { slots, client })
    }

    pub fn client(&self) -> &EngineClient {
        &self.client
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn slot(&self, idx: usize) -> &EngineSlot {
        &self.slots[idx]
    }

    /// What routing may know about each engine, in slot order.
    pub fn views(&self) -> Vec<EngineView> {
        self.slots
            .iter()
            .map(|s| EngineView {
                id: s.spec.id.clone(),
                ready: s.ready.load(Ordering::Acquire),
                inflight_tokens: s.inflight_tokens.load(Ordering::Acquire),
            })
            .collect()
    }

    pub fn ready_count(&self) -> usize {
        self.slots.iter().filter(|s| s.ready.load(Ordering::Acquire)).count()
    }

    /// Counts `tokens` against engine `idx` until the guard drops.
    pub fn reserve(self: &Arc<Self>, idx: usize, tokens: u64) -> InflightTokens {
        self.slots[idx].inflight_tokens.fetch_add(tokens, Ordering::AcqRel);
        InflightTokens { pool: Arc::clone(self), idx, tokens }
    }

    /// Takes an engine out of routing until its next good load report.
    pub fn mark_unreachable(&self, idx: usize) {
        if self.slots[idx].ready.swap(false, Ordering::AcqRel) {
            tracing::warn!(event = "engine_unready", engine = %self.slots[idx].spec.id, why = "dispatch failed");
        }
        metrics::gauge!(crate::metrics::READY_ENGINES).set(self.ready_count() as f64);
    }

    /// Probes every engine once, concurrently, and updates readiness.
    /// A hung engine costs at most [`PROBE_TIMEOUT`] and never delays the
    /// others' updates.
    pub async fn poll_once(self: &Arc<Self>) {
        let mut probes = tokio::task::JoinSet::new();
        for idx in 0..self.slots.len() {
            let pool = Arc::clone(self);
            probes.spawn(async move { pool.probe(idx).await });
        }
        while probes.join_next().await.is_some() {}
        metrics::gauge!(crate::metrics::READY_ENGINES).set(self.ready_count() as f64);
    }

    async fn probe(&self, idx: usize) {
        let slot = &self.slots[idx];
        let report =
            tokio::time::timeout(PROBE_TIMEOUT, self.load_report(&slot.spec.url)).await.ok().flatten();
        let ready = report.as_ref().is_some_and(|r| r.ready);
        if slot.ready.swap(ready, Ordering::AcqRel) != ready {
            tracing::info!(event = "engine_readiness", engine = %slot.spec.id, ready);
        }
        *slot.last_report.lock().unwrap_or_else(|p| p.into_inner()) = report;
    }

    async fn load_report(&self, base: &Uri) -> Option<LoadReport> {
        let uri = join(base, engine::api::LOAD_PATH)?;
        let req = http::Request::get(uri).body(Full::new(Bytes::new())).ok()?;
        let resp = self.client.request(req).await.ok()?;
        let bytes = resp.into_body().collect().await.ok()?.to_bytes();
        serde_json::from_slice(&bytes).ok()
    }

    /// Polls forever every [`POLL_INTERVAL`]; spawn it.
    pub async fn poll_forever(self: Arc<Self>) {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.poll_once().await;
        }
    }

    /// Readiness detail for `/readyz`.
    pub fn detail(&self) -> serde_json::Value {
        let engines: Vec<_> = self
            .slots
            .iter()
            .map(|s| {
                serde_json::json!({
                    "id": s.spec.id,
                    "url": s.spec.url.to_string(),
                    "ready": s.ready.load(Ordering::Acquire),
                    "gateway_inflight_tokens": s.inflight_tokens.load(Ordering::Acquire),
                    "load": *s.last_report.lock().unwrap_or_else(|p| p.into_inner()),
                })
            })
            .collect();
        serde_json::json!({"ready_engines": self.ready_count(), "engines": engines})
    }
}

/// `base` + `path` as a URI (`base` carries scheme and authority).
pub fn join(base: &Uri, path: &str) -> Option<Uri> {
    let mut parts = base.clone().into_parts();
    parts.path_and_query = Some(path.parse().ok()?);
    Uri::from_parts(parts).ok()
}

/// Tokens counted against one engine while a request runs there.
#[derive(Debug)]
pub struct InflightTokens {
    pool: Arc<EnginePool>,
    idx: usize,
    tokens: u64,
}

impl InflightTokens {
    pub fn engine_id(&self) -> &str {
        &self.pool.slots[self.idx].spec.id
    }

    pub fn engine_idx(&self) -> usize {
        self.idx
    }
}

impl Drop for InflightTokens {
    fn drop(&mut self) {
        self.pool.slots[self.idx].inflight_tokens.fetch_sub(self.tokens, Ordering::AcqRel);
    }
}
