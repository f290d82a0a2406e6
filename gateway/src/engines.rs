//! The engines this gateway routes to: addresses, readiness, profiles, and
//! the work the gateway has on each.
//!
//! HTTP/2 clients (prior knowledge, cleartext) multiplex requests to each
//! engine over `limits.engine_connections` connections, with keepalive
//! PINGs: an engine that stops answering (hung, SIGSTOPped, partitioned)
//! fails its connection and every stream on it within the ping timeout
//! instead of leaving them silent. Readiness probes and profile fetches use
//! a connection of their own, so a saturated request connection never looks
//! like an engine that is not ready. A poller reads each engine's load
//! report to track readiness (and fetches its latency profile once, the
//! estimator's prior); a dispatch that cannot reach an engine marks it not
//! ready at once, and the poller brings it back when it answers. The work
//! on each engine (sequences, expected output tokens, prompt tokens still
//! waiting for their first token, in-flight tokens) is counted here, by the
//! gateway that dispatched it, through [`EngineLease`] guards: exact and
//! immediate, unlike polling. Dropping a lease wakes whoever waits for a
//! free slot ([`EnginePool::slot_freed`]).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use engine::api::LoadReport;
use http::Uri;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use policies::routing::EngineView;
use policies::LatencyProfile;
use tokio::sync::Notify;

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
    /// Sequences dispatched and not finished.
    active: AtomicU32,
    /// Their expected output tokens.
    active_out: AtomicU64,
    /// Prompt tokens dispatched that have not produced a first token.
    prefill_backlog: AtomicU64,
    /// Prompt + expected output tokens of every lease ever taken here, and
    /// its value when the last load report was requested: the difference
    /// is work the report cannot reflect yet.
    leased_total: AtomicU64,
    leased_at_report: AtomicU64,
    last_report: Mutex<Option<LoadReport>>,
    /// The engine's latency profile, fetched once it first answers.
    profile: Mutex<Option<LatencyProfile>>,
}

impl EngineSlot {
    fn new(spec: EngineSpec) -> Self {
        Self {
            spec,
            ready: AtomicBool::new(false),
            inflight_tokens: AtomicU64::new(0),
            active: AtomicU32::new(0),
            active_out: AtomicU64::new(0),
            prefill_backlog: AtomicU64::new(0),
            leased_total: AtomicU64::new(0),
            leased_at_report: AtomicU64::new(0),
            last_report: Mutex::new(None),
            profile: Mutex::new(None),
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The gateway's count of sequences on this engine.
    pub fn active(&self) -> u32 {
        self.active.load(Ordering::Acquire)
    }

    pub fn active_out_tokens(&self) -> u64 {
        self.active_out.load(Ordering::Acquire)
    }

    pub fn prefill_backlog_tokens(&self) -> u64 {
        self.prefill_backlog.load(Ordering::Acquire)
    }

    /// KV tokens this gateway has sent since the last load report was asked
    /// for (the report's free pages do not include them yet).
    pub fn leased_since_report(&self) -> u64 {
        self.leased_total
            .load(Ordering::Acquire)
            .saturating_sub(self.leased_at_report.load(Ordering::Acquire))
    }

    /// The latest load report, if the last probe got one.
    pub fn report(&self) -> Option<LoadReport> {
        self.last_report.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn profile(&self) -> Option<LatencyProfile> {
        self.profile.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// What one request counts against the engine running it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Work {
    /// Prompt plus output budget (routing by in-flight tokens).
    pub tokens: u64,
    pub prompt_tokens: u64,
    /// Expected output tokens.
    pub out_tokens: u64,
}

/// All engines plus the clients that reach them.
#[derive(Debug)]
pub struct EnginePool {
    /// Append-only: engines discovered later (cluster registry) are added;
    /// an index always names the same engine.
    slots: std::sync::RwLock<Vec<Arc<EngineSlot>>>,
    /// One connection per engine each; requests go round-robin.
    clients: Vec<EngineClient>,
    next_client: AtomicU64,
    /// Probes and profile fetches: a connection of their own.
    probe_client: EngineClient,
    /// Notified whenever a lease ends (a slot frees).
    pub slot_freed: Notify,
}

impl EnginePool {
    pub fn new(specs: Vec<EngineSpec>, limits: &crate::limits::Limits) -> Arc<Self> {
        let client = || {
            let mut connector = HttpConnector::new();
            connector.set_nodelay(true);
            connector.set_connect_timeout(Some(Duration::from_secs(1)));
            Client::builder(TokioExecutor::new())
                .http2_only(true)
                .timer(TokioTimer::new())
                .http2_keep_alive_interval(Duration::from_millis(limits.engine_keepalive_interval_ms))
                .http2_keep_alive_timeout(Duration::from_millis(limits.engine_keepalive_timeout_ms))
                .http2_keep_alive_while_idle(true)
                // A client that goes away cancels its engine stream
                // (RST_STREAM) while the engine may still have frames in
                // flight for it. h2 remembers only 10 such streams by
                // default and treats frames for forgotten ones as errors,
                // counted towards closing the whole connection; remember as
                // many as can be in flight.
                .http2_max_concurrent_reset_streams(MAX_RESET_STREAMS)
                .build(connector)
        };
        let slots = specs.into_iter().map(|spec| Arc::new(EngineSlot::new(spec))).collect();
        Arc::new(Self {
            slots: std::sync::RwLock::new(slots),
            clients: (0..limits.engine_connections.max(1)).map(|_| client()).collect(),
            next_client: AtomicU64::new(0),
            probe_client: client(),
            slot_freed: Notify::new(),
        })
    }

    fn slots(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<EngineSlot>>> {
        self.slots.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds an engine found later (the cluster registry) unless one with
    /// its id is known; returns its index.
    pub fn add(&self, spec: EngineSpec) -> usize {
        let mut slots = self.slots.write().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = slots.iter().position(|s| s.spec.id == spec.id) {
            return i;
        }
        tracing::info!(event = "engine_discovered", engine = %spec.id, url = %spec.url);
        slots.push(Arc::new(EngineSlot::new(spec)));
        slots.len() - 1
    }

    /// The specs of every engine, in slot order.
    pub fn specs(&self) -> Vec<EngineSpec> {
        self.slots().iter().map(|s| s.spec.clone()).collect()
    }

    /// A client for engine requests (the next connection, round-robin).
    pub fn client(&self) -> &EngineClient {
        let n = self.next_client.fetch_add(1, Ordering::Relaxed) as usize;
        &self.clients[n % self.clients.len()]
    }

    pub fn len(&self) -> usize {
        self.slots().len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots().is_empty()
    }

    pub fn slot(&self, idx: usize) -> Arc<EngineSlot> {
        Arc::clone(&self.slots()[idx])
    }

    /// What routing may know about each engine, in slot order.
    pub fn views(&self) -> Vec<EngineView> {
        self.slots()
            .iter()
            .map(|s| EngineView {
                id: s.spec.id.clone(),
                ready: s.ready.load(Ordering::Acquire),
                inflight_tokens: s.inflight_tokens.load(Ordering::Acquire),
                inflight_requests: s.active.load(Ordering::Acquire),
            })
            .collect()
    }

    pub fn ready_count(&self) -> usize {
        self.slots().iter().filter(|s| s.ready.load(Ordering::Acquire)).count()
    }

    /// Counts `work` against engine `idx` until the lease drops.
    pub fn lease(self: &Arc<Self>, idx: usize, work: Work) -> EngineLease {
        let s = self.slot(idx);
        s.inflight_tokens.fetch_add(work.tokens, Ordering::AcqRel);
        s.active.fetch_add(1, Ordering::AcqRel);
        s.active_out.fetch_add(work.out_tokens, Ordering::AcqRel);
        s.prefill_backlog.fetch_add(work.prompt_tokens, Ordering::AcqRel);
        s.leased_total.fetch_add(work.prompt_tokens + work.out_tokens, Ordering::AcqRel);
        EngineLease { pool: Arc::clone(self), slot: s, idx, work, prefilling: true }
    }

    /// Takes an engine out of routing until its next good load report.
    pub fn mark_unreachable(&self, idx: usize) {
        let s = self.slot(idx);
        if s.ready.swap(false, Ordering::AcqRel) {
            tracing::warn!(event = "engine_unready", engine = %s.spec.id, why = "dispatch failed");
        }
        metrics::gauge!(crate::metrics::READY_ENGINES).set(self.ready_count() as f64);
    }

    /// Probes every engine once, concurrently, and updates readiness.
    /// A hung engine costs at most [`PROBE_TIMEOUT`] and never delays the
    /// others' updates.
    pub async fn poll_once(self: &Arc<Self>) {
        let mut probes = tokio::task::JoinSet::new();
        for idx in 0..self.len() {
            let pool = Arc::clone(self);
            probes.spawn(async move { pool.probe(idx).await });
        }
        while probes.join_next().await.is_some() {}
        metrics::gauge!(crate::metrics::READY_ENGINES).set(self.ready_count() as f64);
    }

    async fn probe(&self, idx: usize) {
        let slot = self.slot(idx);
        let leased = slot.leased_total.load(Ordering::Acquire);
        let report =
            tokio::time::timeout(PROBE_TIMEOUT, self.load_report(&slot.spec.url)).await.ok().flatten();
        let ready = report.as_ref().is_some_and(|r| r.ready);
        if report.is_some() && slot.profile().is_none() {
            let fetched = tokio::time::timeout(PROBE_TIMEOUT, self.fetch_profile(&slot.spec)).await;
            if let Ok(Some(p)) = fetched {
                tracing::info!(event = "engine_profile", engine = %slot.spec.id, class = %p.engine_class);
                *slot.profile.lock().unwrap_or_else(|p| p.into_inner()) = Some(p);
            }
        }
        if slot.ready.swap(ready, Ordering::AcqRel) != ready {
            tracing::info!(event = "engine_readiness", engine = %slot.spec.id, ready);
        }
        if report.is_some() {
            slot.leased_at_report.store(leased, Ordering::Release);
        }
        *slot.last_report.lock().unwrap_or_else(|p| p.into_inner()) = report;
    }

    async fn fetch_profile(&self, spec: &EngineSpec) -> Option<LatencyProfile> {
        let uri = join(&spec.url, engine::api::PROFILE_PATH)?;
        let req = http::Request::get(uri).body(Full::new(Bytes::new())).ok()?;
        let resp = self.probe_client.request(req).await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let bytes = resp.into_body().collect().await.ok()?.to_bytes();
        let text = std::str::from_utf8(&bytes).ok()?;
        match LatencyProfile::parse(&format!("engine {} profile", spec.id), text) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(event = "engine_profile_invalid", engine = %spec.id, error = %e);
                None
            }
        }
    }

    async fn load_report(&self, base: &Uri) -> Option<LoadReport> {
        let uri = join(base, engine::api::LOAD_PATH)?;
        let req = http::Request::get(uri).body(Full::new(Bytes::new())).ok()?;
        let resp = self.probe_client.request(req).await.ok()?;
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
            .slots()
            .iter()
            .map(|s| {
                serde_json::json!({
                    "id": s.spec.id,
                    "url": s.spec.url.to_string(),
                    "ready": s.ready.load(Ordering::Acquire),
                    "gateway_inflight_tokens": s.inflight_tokens.load(Ordering::Acquire),
                    "gateway_active_sequences": s.active.load(Ordering::Acquire),
                    "gateway_prefill_backlog_tokens": s.prefill_backlog.load(Ordering::Acquire),
                    "engine_class": s.profile().map(|p| p.engine_class),
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

/// One request's work counted against one engine while it runs there.
#[derive(Debug)]
pub struct EngineLease {
    pool: Arc<EnginePool>,
    slot: Arc<EngineSlot>,
    idx: usize,
    work: Work,
    /// Its prompt still counts as prefill backlog.
    prefilling: bool,
}

impl EngineLease {
    /// The first token arrived: the prompt is no longer prefill backlog.
    pub fn first_token(&mut self) {
        if std::mem::take(&mut self.prefilling) {
            self.slot.prefill_backlog.fetch_sub(self.work.prompt_tokens, Ordering::AcqRel);
        }
    }

    pub fn engine_id(&self) -> &str {
        &self.slot.spec.id
    }

    pub fn engine_idx(&self) -> usize {
        self.idx
    }
}

impl Drop for EngineLease {
    fn drop(&mut self) {
        self.first_token();
        let s = &self.slot;
        s.inflight_tokens.fetch_sub(self.work.tokens, Ordering::AcqRel);
        s.active_out.fetch_sub(self.work.out_tokens, Ordering::AcqRel);
        s.active.fetch_sub(1, Ordering::AcqRel);
        self.pool.slot_freed.notify_one();
    }
}
