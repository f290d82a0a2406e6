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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};
use bytes::Bytes;
use engine_api::LoadReport;
use http::Uri;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use policies::routing::EngineView;
use policies::LatencyProfile;
use tokio::sync::Notify;

/// hyper's client: probes and profile fetches (HTTP/2), `openai` upstreams
/// (HTTP/1.1). Requests to this project's engines go through `h2client.rs`.
pub type EngineClient = Client<EngineConnector, Full<Bytes>>;

/// How often load reports are polled.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// A load report slower than this counts as a failed probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Recently cancelled engine streams remembered per connection.
const MAX_RESET_STREAMS: usize = 4096;

pub use connect::EngineConnector;
pub use h2client::H2Body;
use h2client::{H2Client, H2Settings};

pub use policies::admission::controller::Work;
pub use slot::EngineSlot;
#[cfg(any(test, feature = "test-util"))]
pub use spec::Upstream;
pub use spec::{EngineKind, EngineSpec};

mod connect;
mod external;
mod h2client;
pub mod prefix;
mod slot;
mod spec;
pub mod telemetry;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An engine's answer: over the engines' own HTTP/2 connections
/// (`h2client.rs`), or hyper's HTTP/1.1 pool for an `openai` upstream.
pub type EngineResponse = http::Response<EngineBody>;

/// The body of an [`EngineResponse`].
#[derive(Debug)]
pub enum EngineBody {
    H2(H2Body),
    Http1(hyper::body::Incoming),
}

impl http_body::Body for EngineBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            EngineBody::H2(b) => std::pin::Pin::new(b).poll_frame(cx).map_err(Into::into),
            EngineBody::Http1(b) => std::pin::Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            EngineBody::H2(b) => b.is_end_stream(),
            EngineBody::Http1(b) => b.is_end_stream(),
        }
    }
}

/// All engines plus the clients that reach them.
#[derive(Debug)]
pub struct EnginePool {
    /// An immutable list swapped whole when an engine is added or replaced
    /// (readers take no lock); an index always names the same engine
    /// until it is retired and reused.
    slots: ArcSwap<Vec<Arc<EngineSlot>>>,
    /// Serialises the writers of `slots`.
    slots_write: Mutex<()>,
    /// Request clients (each one connection per engine), one set per
    /// connection worker (index `worker + 1`) and one for the main runtime
    /// (index 0): a worker's requests ride connections driven by its own
    /// runtime. Requests go round-robin within a set.
    clients: Vec<Vec<H2Client>>,
    next_client: AtomicU64,
    /// Probes and profile fetches: a connection of their own.
    probe_client: EngineClient,
    /// `openai` engines (HTTP/1.1, which every third-party server speaks;
    /// a pool of keep-alive connections per engine).
    upstream_client: EngineClient,
    /// `Authorization` for every engine request (the engines' API token).
    authorization: Option<http::HeaderValue>,
    /// Notified when a lease ends (a slot frees) while `gate_waiting`.
    pub slot_freed: Notify,
    /// Requests wait at the admission gate (set and cleared under the
    /// admission lock): only then does a freed slot wake the gate task,
    /// which otherwise costs a cross-thread wake-up per request.
    pub gate_waiting: AtomicBool,
    /// Where prompt prefixes are cached (routed there, and the engines'
    /// KV events).
    pub prefix: prefix::PrefixView,
}

impl EnginePool {
    /// `token`: the engines' API token, sent on every request.
    pub fn new(specs: Vec<EngineSpec>, limits: &crate::limits::Limits, token: Option<&str>) -> Arc<Self> {
        let mut connector = EngineConnector::tcp(Duration::from_secs(1));
        if specs.iter().any(|s| s.url.scheme_str() == Some("https")) {
            match connect::upstream_roots(specs.iter().filter_map(|s| s.upstream.ca.as_deref())) {
                Ok(roots) => connector = connector.with_tls(roots),
                // The https engines then fail their probes, saying why.
                Err(e) => tracing::error!(event = "upstream_tls_roots", error = %e),
            }
        }
        Self::with_connector(specs, limits, token, connector)
    }

    /// As [`EnginePool::new`], reaching the engines through `connector`.
    pub fn with_connector(
        specs: Vec<EngineSpec>,
        limits: &crate::limits::Limits,
        token: Option<&str>,
        connector: EngineConnector,
    ) -> Arc<Self> {
        let h2 = H2Settings {
            keepalive_interval: Duration::from_millis(limits.engine_keepalive_interval_ms),
            keepalive_timeout: Duration::from_millis(limits.engine_keepalive_timeout_ms),
            max_reset_streams: MAX_RESET_STREAMS,
        };
        let client = || {
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
                .build(connector.clone())
        };
        let slots = specs.into_iter().map(|spec| Arc::new(EngineSlot::new(spec, false))).collect();
        Arc::new(Self {
            slots: ArcSwap::from_pointee(slots),
            slots_write: Mutex::new(()),
            clients: (0..=limits.workers())
                .map(|_| {
                    (0..limits.engine_connections.max(1))
                        .map(|_| H2Client::new(connector.clone(), h2))
                        .collect()
                })
                .collect(),
            next_client: AtomicU64::new(0),
            probe_client: client(),
            upstream_client: Client::builder(TokioExecutor::new())
                .timer(TokioTimer::new())
                .pool_timer(TokioTimer::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .pool_max_idle_per_host(external::MAX_IDLE_PER_UPSTREAM)
                .build(connector.clone()),
            authorization: token.and_then(|t| {
                let mut v = http::HeaderValue::from_str(&format!("Bearer {t}")).ok()?;
                v.set_sensitive(true); // never indexed by HPACK, redacted in Debug
                Some(v)
            }),
            slot_freed: Notify::new(),
            gate_waiting: AtomicBool::new(false),
            prefix: prefix::PrefixView::default(),
        })
    }

    /// Every engine as of now, in index order (retired ones included): one
    /// atomic load, no lock, no copy.
    pub fn snapshot(&self) -> Guard<Arc<Vec<Arc<EngineSlot>>>> {
        self.slots.load()
    }

    /// Adds an engine found in the cluster registry; returns its index.
    /// A known id keeps its index; if it came back at another URL (a
    /// restarted engine on a new port or host) its slot is replaced so
    /// requests go to the new URL. A new id takes a retired engine's index
    /// when there is one, so the list is bounded by the engines alive at
    /// once, not by every engine ever seen.
    pub fn add(&self, spec: EngineSpec) -> usize {
        self.insert(spec, true)
    }

    /// Adds an engine this gateway's supervisor started (never retired by
    /// the registry's TTL: the supervisor retires it when it stops it).
    pub fn add_owned(&self, spec: EngineSpec) -> usize {
        self.insert(spec, false)
    }

    fn insert(&self, spec: EngineSpec, discovered: bool) -> usize {
        let _writer = self.slots_write.lock().unwrap_or_else(|p| p.into_inner());
        let mut slots = Vec::clone(&self.slots.load());
        let idx = match slots.iter().position(|s| s.spec.id == spec.id) {
            Some(i) if slots[i].spec.url == spec.url && !slots[i].is_retired() => return i,
            Some(i) => {
                tracing::info!(event = "engine_moved", engine = %spec.id, from = %slots[i].spec.url, to = %spec.url);
                slots[i] = Arc::new(EngineSlot::new(spec, discovered));
                self.prefix.forget(i);
                i
            }
            None => {
                tracing::info!(event = "engine_added", engine = %spec.id, url = %spec.url, discovered);
                let slot = Arc::new(EngineSlot::new(spec, discovered));
                match slots.iter().position(|s| s.is_retired()) {
                    Some(i) => {
                        slots[i] = slot;
                        self.prefix.forget(i);
                        i
                    }
                    None => {
                        slots.push(slot);
                        slots.len() - 1
                    }
                }
            }
        };
        self.slots.store(Arc::new(slots));
        idx
    }

    /// Retires discovered engines that are not in the registry's listing
    /// `live` and have not answered a probe for `ttl`.
    pub fn retire_gone(&self, live: &[String], ttl: Duration, now: std::time::Instant) {
        for s in self.snapshot().iter() {
            let silent =
                now.saturating_duration_since(*s.last_seen.lock().unwrap_or_else(|p| p.into_inner()));
            if s.discovered && !s.is_retired() && !s.is_ready() && !live.contains(&s.spec.id) && silent >= ttl
            {
                s.retired.store(true, Ordering::Release);
                tracing::info!(event = "engine_retired", engine = %s.spec.id, silent_s = silent.as_secs());
            }
        }
    }

    /// The specs of every engine, in slot order.
    pub fn specs(&self) -> Vec<EngineSpec> {
        self.snapshot().iter().map(|s| s.spec.clone()).collect()
    }

    /// Sends `req` to `engine` with its credential (this project's engines:
    /// the engines' API token; an `openai` engine: its own key, if any), on
    /// the next request connection (round-robin).
    pub async fn send(
        &self,
        mut req: http::Request<Bytes>,
        engine: &EngineSlot,
    ) -> Result<EngineResponse, BoxError> {
        if engine.spec.kind == EngineKind::Openai {
            let resp = self.upstream_send(req.map(Full::new), engine).await?;
            return Ok(resp.map(EngineBody::Http1));
        }
        self.authorize(&mut req);
        let set = crate::workers::current().map_or(0, |w| w + 1).min(self.clients.len() - 1);
        let clients = &self.clients[set];
        let n = self.next_client.fetch_add(1, Ordering::Relaxed) as usize;
        // Boxed: the request's state (1.4 KB: its parts for a resend, the
        // connect and send futures) lives only until the response head,
        // not inline in every stream's task for the stream's whole life.
        let request = Box::pin(clients[n % clients.len()].request(req));
        Ok(request.await?.map(EngineBody::H2))
    }

    /// As [`EnginePool::send`], on the probes' own connection.
    fn probe_send(&self, mut req: http::Request<Full<Bytes>>) -> ResponseFuture {
        self.authorize(&mut req);
        self.probe_client.request(req)
    }

    fn authorize<B>(&self, req: &mut http::Request<B>) {
        if let Some(v) = &self.authorization {
            req.headers_mut().insert(http::header::AUTHORIZATION, v.clone());
        }
    }

    pub fn len(&self) -> usize {
        self.snapshot().len()
    }

    pub fn is_empty(&self) -> bool {
        self.snapshot().is_empty()
    }

    pub fn slot(&self, idx: usize) -> Arc<EngineSlot> {
        Arc::clone(&self.snapshot()[idx])
    }

    /// What routing may know about each engine, in slot order.
    /// Engines that do not serve `model` (`openai` engines with a model
    /// list without it; with `upstream_only`, this project's engines too);
    /// empty, without allocating, when every engine serves the request.
    pub fn not_serving(&self, model: &str, upstream_only: bool) -> Vec<usize> {
        let snapshot = self.snapshot();
        let every =
            |s: &Arc<EngineSlot>| s.spec.upstream.models.is_empty() && !s.spec.upstream.discover_models;
        if !upstream_only && snapshot.iter().all(every) {
            return Vec::new();
        }
        snapshot.iter().enumerate().filter(|(_, s)| !s.serves(model, upstream_only)).map(|(i, _)| i).collect()
    }

    /// Whether some third-party engine serves `model` (ready or not).
    pub fn has_upstream_for(&self, model: &str) -> bool {
        self.snapshot().iter().any(|s| !s.is_retired() && s.serves(model, true))
    }

    pub fn views(&self) -> Vec<EngineView> {
        self.snapshot()
            .iter()
            .map(|s| EngineView {
                id: s.spec.id.clone(),
                ready: s.routable(),
                inflight_tokens: s.inflight_tokens.load(Ordering::Acquire),
                inflight_requests: s.active.load(Ordering::Acquire),
                cached_blocks: 0,
            })
            .collect()
    }

    pub fn ready_count(&self) -> usize {
        self.snapshot().iter().filter(|s| s.ready.load(Ordering::Acquire) && !s.is_retired()).count()
    }

    /// Engines new work may go to (ready, not warm standby, not draining).
    pub fn routable_count(&self) -> usize {
        self.snapshot().iter().filter(|s| s.routable()).count()
    }

    /// Takes an engine out for good (the supervisor stopped it); its index
    /// is reused by the next engine added.
    pub fn retire(&self, idx: usize) {
        let s = self.slot(idx);
        s.retired.store(true, Ordering::Release);
        s.ready.store(false, Ordering::Release);
        self.prefix.forget(idx);
        tracing::info!(event = "engine_retired", engine = %s.spec.id, why = "stopped");
    }

    /// The index of the engine with this id, if it is not retired.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.snapshot().iter().position(|s| s.spec.id == id && !s.is_retired())
    }

    /// Counts `work` against engine `idx` until the lease drops.
    pub fn lease(self: &Arc<Self>, idx: usize, work: Work) -> EngineLease {
        self.lease_as(idx, work, None)
    }

    /// [`Self::lease`] counted under a tier `class` (priority weight), which
    /// priority preemption reads ([`EngineSlot::active_below`]).
    pub fn lease_as(self: &Arc<Self>, idx: usize, work: Work, class: Option<u32>) -> EngineLease {
        let s = self.slot(idx);
        if let Some(c) = class {
            s.count_class(c, 1);
        }
        s.inflight_tokens.fetch_add(work.tokens, Ordering::AcqRel);
        s.active.fetch_add(1, Ordering::AcqRel);
        s.active_out.fetch_add(work.out_tokens, Ordering::AcqRel);
        s.prefill_backlog.fetch_add(work.prompt_tokens, Ordering::AcqRel);
        s.leased_total.fetch_add(work.prompt_tokens + work.out_tokens, Ordering::AcqRel);
        EngineLease { pool: Arc::clone(self), slot: s, idx, work, prefilling: true, class }
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
            if self.slot(idx).is_retired() {
                continue;
            }
            let pool = Arc::clone(self);
            probes.spawn(async move { pool.probe(idx).await });
        }
        while probes.join_next().await.is_some() {}
        metrics::gauge!(crate::metrics::READY_ENGINES).set(self.ready_count() as f64);
    }

    async fn probe(&self, idx: usize) {
        let slot = self.slot(idx);
        let leased = slot.leased_total.load(Ordering::Acquire);
        let report = async {
            match slot.spec.kind {
                EngineKind::Native => self.load_report(&slot.spec.url).await,
                EngineKind::Openai => self.external_report(&slot).await,
            }
        };
        let report = tokio::time::timeout(PROBE_TIMEOUT, report).await.ok().flatten();
        let ready = report.as_ref().is_some_and(|r| r.ready);
        if report.is_some() && slot.profile().is_none() {
            let fetch = async {
                match slot.spec.kind {
                    EngineKind::Native => self.fetch_profile(&slot.spec).await,
                    EngineKind::Openai => external::profile(&slot.spec),
                }
            };
            let fetched = tokio::time::timeout(PROBE_TIMEOUT, fetch).await;
            if let Ok(Some(p)) = fetched {
                tracing::info!(event = "engine_profile", engine = %slot.spec.id, class = %p.engine_class);
                slot.store_profile(p);
            }
        }
        if slot.ready.swap(ready, Ordering::AcqRel) != ready {
            tracing::info!(event = "engine_readiness", engine = %slot.spec.id, ready);
        }
        if report.is_some() && slot.spec.kind == EngineKind::Native {
            let _ = tokio::time::timeout(PROBE_TIMEOUT, self.read_kv_events(idx)).await;
        }
        if report.is_some() {
            slot.leased_at_report.store(leased, Ordering::Release);
            *slot.last_seen.lock().unwrap_or_else(|p| p.into_inner()) = crate::clock::now();
        }
        slot.store_report(report);
    }

    async fn fetch_profile(&self, spec: &EngineSpec) -> Option<LatencyProfile> {
        let uri = join(&spec.url, engine_api::PROFILE_PATH)?;
        let req = http::Request::get(uri).body(Full::new(Bytes::new())).ok()?;
        let resp = self.probe_send(req).await.ok()?;
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
        let uri = join(base, engine_api::LOAD_PATH)?;
        let req = http::Request::get(uri).body(Full::new(Bytes::new())).ok()?;
        let resp = self.probe_send(req).await.ok()?;
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
            .snapshot()
            .iter()
            .filter(|s| !s.is_retired())
            .map(|s| {
                serde_json::json!({
                    "id": s.spec.id,
                    "url": s.spec.url.to_string(),
                    "ready": s.ready.load(Ordering::Acquire),
                    "role": if s.is_draining() { "draining" } else if s.is_standby() { "warm" } else { "serving" },
                    "gateway_inflight_tokens": s.inflight_tokens.load(Ordering::Acquire),
                    "gateway_active_sequences": s.active.load(Ordering::Acquire),
                    "gateway_prefill_backlog_tokens": s.prefill_backlog.load(Ordering::Acquire),
                    "engine_class": s.profile().map(|p| p.engine_class.clone()),
                    "load": s.report().as_deref(),
                })
            })
            .collect();
        serde_json::json!({"ready_engines": self.ready_count(), "engines": engines, "prefix_index": self.prefix.detail()})
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
    /// The tier class it is counted under, if any.
    class: Option<u32>,
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
        if let Some(c) = self.class {
            s.count_class(c, -1);
        }
        if self.pool.gate_waiting.load(Ordering::Acquire) {
            self.pool.slot_freed.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str, port: u16) -> EngineSpec {
        EngineSpec::native(id, format!("http://127.0.0.1:{port}").parse().unwrap())
    }

    /// The per-class counts priority preemption reads hold one entry per
    /// class in use (a handful: the policy's tiers) and empty as leases end.
    #[test]
    fn leases_are_counted_by_class_and_the_counts_empty_with_them() {
        let pool = EnginePool::new(vec![spec("e0", 9000)], &crate::limits::Limits::default(), None);
        let work = Work { tokens: 10, prompt_tokens: 5, out_tokens: 5 };
        let gold = pool.lease_as(0, work, Some(4));
        let bronze: Vec<_> = (0..3).map(|_| pool.lease_as(0, work, Some(1))).collect();
        let plain = pool.lease(0, work);
        let slot = pool.slot(0);
        assert_eq!((slot.active(), slot.active_below(4), slot.active_below(1)), (5, 3, 0));
        drop(bronze);
        assert_eq!(slot.active_below(4), 0);
        drop((gold, plain));
        assert_eq!(slot.active(), 0);
        assert!(slot.classes.lock().unwrap().is_empty(), "no entry left behind");
        // A third-party engine cannot pause a sequence: it offers none.
        let upstream = EngineSpec { kind: EngineKind::Openai, ..spec("u", 9001) };
        let pool = EnginePool::new(vec![upstream], &crate::limits::Limits::default(), None);
        let _bronze = pool.lease_as(0, work, Some(1));
        assert_eq!(pool.slot(0).active_below(4), 0);
    }

    #[tokio::test]
    async fn an_engine_back_on_a_new_url_is_used_there_and_gone_ones_are_retired_and_reused() {
        let pool = EnginePool::new(vec![spec("static", 9000)], &crate::limits::Limits::default(), None);
        let a = pool.add(spec("a", 9001));
        assert_eq!(pool.add(spec("a", 9001)), a, "same id, same URL: same slot");
        assert_eq!(pool.add(spec("a", 9101)), a, "same id keeps its index");
        assert_eq!(pool.slot(a).spec.url.port_u16(), Some(9101), "and is reached at its new URL");
        let b = pool.add(spec("b", 9002));
        // `b` leaves the registry and stays silent past the TTL; `a` is
        // still listed; the configured engine is never retired.
        let ttl = Duration::from_secs(30);
        let later = crate::clock::now() + Duration::from_secs(31);
        pool.retire_gone(&["a".into()], ttl, crate::clock::now());
        assert!(!pool.slot(b).is_retired(), "not silent long enough yet");
        pool.retire_gone(&["a".into()], ttl, later);
        assert!(pool.slot(b).is_retired() && !pool.slot(a).is_retired() && !pool.slot(0).is_retired());
        assert_eq!(pool.detail()["engines"].as_array().unwrap().len(), 2, "retired engines are not listed");
        // The next new engine takes b's index: the list does not only grow.
        assert_eq!(pool.add(spec("c", 9003)), b);
        assert_eq!(pool.len(), 3);
    }
}
