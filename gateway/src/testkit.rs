//! The gateway and its engines in one process, for tests in tokio's paused
//! time (the `test-util` feature; always in this crate's own tests).
//!
//! A [`Harness`] is the real request path — the `tower` stack of
//! `stack.rs` served by hyper's HTTP/2 server, admission with its gate
//! task, dispatch, the relay — with two things swapped for in-memory
//! pipes: the client's connection and the engines'. Each engine is a
//! scripted HTTP/2 server: for every generate request it plays a
//! [`Script`] (events after delays, a refusal, silence, garbage) and counts
//! what happened to its streams ([`EngineStats`]). Nothing touches a
//! socket or the wall clock, so a test can assert *when* something
//! happened, exactly, in virtual time: a retry after the first-token
//! timeout, an error event after the engine's silence, a reset after the
//! client's stall.
//!
//! This is the layer under the process-level tests (`tests/*.rs`), which
//! keep covering what only real processes show: TLS, real sockets,
//! signals, the engine binary.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use engine_api::{ErrorBody, Event, GenerateRequest};
use http::{Request, Response, StatusCode, Uri};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use policies::PolicyDocument;
use tokio::io::DuplexStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::config::GatewayConfig;
use crate::engines::{EngineConnector, EnginePool, EngineSpec};
use crate::reload::PolicyStore;
use crate::{App, Control};

/// Bytes in flight per in-memory pipe (each direction).
const PIPE_BYTES: usize = 1 << 20;

/// The latency profile every scripted engine serves (the bundled emulated
/// A100's).
const PROFILE: &str = include_str!("../../policies/profiles/emulated-a100-8b.toml");

/// The load report every scripted engine serves: ready, a batch of 32,
/// KV to spare.
pub(crate) fn load_report(id: &str) -> engine_api::LoadReport {
    engine_api::LoadReport {
        engine_id: id.into(),
        backend: "emulated".into(),
        engine_class: "emulated-a100".into(),
        ready: true,
        kv_pages_free: 65_536,
        kv_pages_total: 65_536,
        kv_admitting: true,
        kv_page_tokens: 16,
        decode_step_ms: 10.0,
        batch_target: 32,
        ..Default::default()
    }
}

/// What an engine does with one generate request.
#[derive(Debug, Clone)]
pub enum Script {
    /// Answers `status` with an error body, before any event.
    Refuse(StatusCode, &'static str),
    /// Streams these steps, then ends the stream cleanly.
    Stream(Vec<Step>),
}

/// One step of a streamed answer.
#[derive(Debug, Clone)]
pub enum Step {
    /// Virtual time passes.
    Wait(Duration),
    /// One event line.
    Event(Event),
    /// Raw bytes (a broken or hostile engine).
    Raw(&'static [u8]),
    /// Nothing more, ever: the stream stays open and silent.
    Hang,
}

impl Script {
    /// `n` tokens ("t0", "t1", …) `every` apart after `first` (the time to
    /// the first token), then `done`.
    pub fn tokens(first: Duration, n: u32, every: Duration) -> Self {
        let mut steps = vec![Step::Wait(first)];
        for i in 0..n {
            if i > 0 {
                steps.push(Step::Wait(every));
            }
            steps.push(Step::Event(Event::Token { text: format!("t{i}") }));
        }
        steps.push(Step::Event(done(n)));
        Script::Stream(steps)
    }
}

/// A normal end after `completion_tokens` tokens.
pub fn done(completion_tokens: u32) -> Event {
    Event::Done {
        finish_reason: engine_api::FinishReason::Length,
        usage: engine_api::Usage { prompt_tokens: 8, completion_tokens, cached_tokens: 0 },
        queue_ms: 0.0,
        prefill_ms: 1.0,
    }
}

/// What happened at one scripted engine.
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Generate requests received.
    pub requests: AtomicUsize,
    /// Streams whose reader went away before the script ended (the
    /// gateway cancelled them: RST_STREAM).
    pub cancelled: AtomicUsize,
    /// `max_tokens` of the last generate request.
    pub last_max_tokens: AtomicUsize,
    /// The last request body received (a native engine's as its
    /// `GenerateRequest`).
    pub last_body: Mutex<Option<serde_json::Value>>,
}

impl EngineStats {
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    pub fn cancelled(&self) -> usize {
        self.cancelled.load(Ordering::SeqCst)
    }

    pub fn last_max_tokens(&self) -> usize {
        self.last_max_tokens.load(Ordering::SeqCst)
    }
}

/// The protocol a scripted engine speaks.
#[derive(Debug, Clone)]
pub enum Speaks {
    /// This project's engine API over HTTP/2 (NDJSON events).
    Native,
    /// An OpenAI-compatible server over HTTP/1.1 (SSE), as vLLM, SGLang,
    /// TGI and llama.cpp server are: `/health`, `/metrics` (this text),
    /// `/v1/chat/completions` and `/v1/completions`, and `/v1/models`
    /// listing `models`.
    OpenAi { metrics: String, models: Vec<String> },
}

type Engine = (Speaks, Arc<Mutex<Vec<Script>>>, Arc<EngineStats>);
type Scripts = Arc<Mutex<HashMap<String, Engine>>>;

/// The scripted engines, by the host of their URL (`http://<id>.scripted`).
#[derive(Clone, Default)]
pub struct Scripted {
    engines: Scripts,
}

impl Scripted {
    /// An engine named `id` playing `scripts` in turn (the last one for
    /// every request after).
    pub fn add(&self, id: &str, speaks: Speaks, scripts: Vec<Script>) -> Arc<EngineStats> {
        let stats = Arc::new(EngineStats::default());
        let entry = (speaks, Arc::new(Mutex::new(scripts)), Arc::clone(&stats));
        self.engines.lock().unwrap_or_else(|p| p.into_inner()).insert(format!("{id}.scripted"), entry);
        stats
    }

    /// A new connection to the engine at `uri`, if it is scripted.
    pub(crate) fn connect(&self, uri: &Uri) -> Option<DuplexStream> {
        let engines = self.engines.lock().unwrap_or_else(|p| p.into_inner());
        let (speaks, scripts, stats) = engines.get(uri.host()?)?.clone();
        let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
        let http1 = matches!(speaks, Speaks::OpenAi { .. });
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            // Generation requests take the next script; probes none.
            let script = match req.uri().path() {
                engine_api::GENERATE_PATH | "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings" => {
                    let mut s = scripts.lock().unwrap_or_else(|p| p.into_inner());
                    if s.len() > 1 {
                        s.remove(0)
                    } else {
                        s.first().cloned().unwrap_or(Script::Stream(vec![Step::Hang]))
                    }
                }
                _ => Script::Stream(vec![]),
            };
            play(req, speaks.clone(), script, Arc::clone(&stats))
        });
        if http1 {
            tokio::spawn(
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(theirs), service),
            );
        } else {
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .serve_connection(TokioIo::new(theirs), service),
            );
        }
        Some(ours)
    }
}

async fn play(
    req: Request<Incoming>,
    speaks: Speaks,
    script: Script,
    stats: Arc<EngineStats>,
) -> Result<Response<ScriptBody>, Infallible> {
    if let Speaks::OpenAi { metrics, models } = speaks {
        return Ok(play_openai(req, (&metrics, &models), script, stats).await);
    }
    match req.uri().path() {
        engine_api::GENERATE_PATH => {}
        engine_api::LOAD_PATH => {
            let id = req.uri().host().unwrap_or("").trim_end_matches(".scripted");
            let report = serde_json::to_vec(&load_report(id)).unwrap_or_default();
            return Ok(answer(StatusCode::OK, Bytes::from(report)));
        }
        engine_api::PROFILE_PATH => {
            return Ok(answer(StatusCode::OK, Bytes::from_static(PROFILE.as_bytes())))
        }
        _ => return Ok(answer(StatusCode::NOT_FOUND, Bytes::new())),
    }
    stats.requests.fetch_add(1, Ordering::SeqCst);
    let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    match serde_json::from_slice::<GenerateRequest>(&body) {
        Ok(gen) => {
            stats.last_max_tokens.store(gen.max_tokens as usize, Ordering::SeqCst);
            *stats.last_body.lock().unwrap_or_else(|p| p.into_inner()) = serde_json::to_value(&gen).ok();
        }
        Err(_) => return Ok(answer(StatusCode::BAD_REQUEST, Bytes::new())),
    }
    let steps = match script {
        Script::Refuse(status, code) => {
            let body = ErrorBody { code: code.into(), message: "scripted refusal".into() };
            return Ok(answer(status, Bytes::from(serde_json::to_vec(&body).unwrap_or_default())));
        }
        Script::Stream(steps) => steps,
    };
    let mut resp = Response::new(stream(steps, stats, |e| Bytes::from(e.to_line())));
    resp.headers_mut()
        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/x-ndjson"));
    Ok(resp)
}

/// An OpenAI-compatible server's side of one request.
async fn play_openai(
    req: Request<Incoming>,
    (metrics, models): (&str, &[String]),
    script: Script,
    stats: Arc<EngineStats>,
) -> Response<ScriptBody> {
    let req_path = req.uri().path().to_string();
    match req_path.as_str() {
        "/health" => return answer(StatusCode::OK, Bytes::from_static(b"{\"status\":\"ok\"}")),
        "/metrics" => return answer(StatusCode::OK, Bytes::from(metrics.to_string())),
        "/v1/models" => {
            let data: Vec<_> =
                models.iter().map(|id| serde_json::json!({"id": id, "object": "model"})).collect();
            let listing = serde_json::json!({"object": "list", "data": data});
            return answer(StatusCode::OK, Bytes::from(listing.to_string()));
        }
        "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings" => {}
        _ => return answer(StatusCode::NOT_FOUND, Bytes::new()),
    }
    stats.requests.fetch_add(1, Ordering::SeqCst);
    let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return answer(StatusCode::BAD_REQUEST, Bytes::new());
    };
    let max_tokens = doc.get("max_tokens").and_then(serde_json::Value::as_u64).unwrap_or(0);
    let whole =
        req_path == "/v1/embeddings" || doc.get("stream").and_then(serde_json::Value::as_bool) == Some(false);
    stats.last_max_tokens.store(max_tokens as usize, Ordering::SeqCst);
    *stats.last_body.lock().unwrap_or_else(|p| p.into_inner()) = Some(doc);
    let steps = match script {
        Script::Refuse(status, code) => {
            let body = serde_json::json!({"error": {"message": "scripted refusal", "type": code, "code": status.as_u16()}});
            return answer(status, Bytes::from(body.to_string()));
        }
        Script::Stream(steps) => steps,
    };
    if whole {
        // A whole answer: the script's raw bytes, after its waits.
        let mut body = Vec::new();
        for step in steps {
            match step {
                Step::Wait(d) => tokio::time::sleep(d).await,
                Step::Raw(b) => body.extend_from_slice(b),
                Step::Event(_) | Step::Hang => {}
            }
        }
        let mut resp = answer(StatusCode::OK, Bytes::from(body));
        resp.headers_mut()
            .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
        return resp;
    }
    let mut resp = Response::new(stream(steps, stats, sse_chunk));
    resp.headers_mut()
        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("text/event-stream"));
    resp
}

/// An event as an OpenAI server streams it.
fn sse_chunk(e: Event) -> Bytes {
    let data = |v: serde_json::Value| format!("data: {v}\n\n");
    let text = match e {
        Event::Token { text } => data(serde_json::json!({
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}],
        })),
        Event::Done { finish_reason, usage, .. } => {
            let reason = match finish_reason {
                engine_api::FinishReason::Length => "length",
                engine_api::FinishReason::Stop => "stop",
            };
            let usage = serde_json::json!({
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            });
            data(serde_json::json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}))
                + &data(serde_json::json!({"choices": [], "usage": usage}))
                + "data: [DONE]\n\n"
        }
        Event::Error { code, message } => {
            data(serde_json::json!({"error": {"message": message, "code": code}}))
        }
        Event::Upstream { json } => format!("data: {json}\n\n"),
    };
    Bytes::from(text)
}

/// A response body playing `steps`, each event encoded by `encode`.
fn stream(steps: Vec<Step>, stats: Arc<EngineStats>, encode: fn(Event) -> Bytes) -> ScriptBody {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        for step in steps {
            let sent = tokio::select! {
                () = tx.closed() => false,
                sent = async {
                    match step {
                        Step::Wait(d) => {
                            tokio::time::sleep(d).await;
                            true
                        }
                        Step::Event(e) => tx.send(encode(e)).await.is_ok(),
                        Step::Raw(b) => tx.send(Bytes::from_static(b)).await.is_ok(),
                        Step::Hang => std::future::pending().await,
                    }
                } => sent,
            };
            if !sent {
                stats.cancelled.fetch_add(1, Ordering::SeqCst);
                return;
            }
        }
    });
    ScriptBody(rx)
}

fn answer(status: StatusCode, body: Bytes) -> Response<ScriptBody> {
    let (tx, rx) = mpsc::channel(1);
    let _ = tx.try_send(body);
    let mut resp = Response::new(ScriptBody(rx));
    *resp.status_mut() = status;
    resp
}

/// A scripted engine's response body: the bytes its task sends.
pub struct ScriptBody(mpsc::Receiver<Bytes>);

impl http_body::Body for ScriptBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

/// One scripted engine of a [`Harness`].
#[derive(Debug, Clone)]
pub struct TestEngine {
    pub spec: EngineSpec,
    pub speaks: Speaks,
    pub scripts: Vec<Script>,
}

impl TestEngine {
    /// This project's engine.
    pub fn native(id: &str, scripts: Vec<Script>) -> Self {
        let spec = EngineSpec::native(id, format!("http://{id}.scripted").parse().expect("a valid URL"));
        Self { spec, speaks: Speaks::Native, scripts }
    }

    /// An OpenAI-compatible server (`kind = "openai"`) with these upstream
    /// settings, serving `metrics` at `/metrics`.
    pub fn openai(id: &str, upstream: crate::engines::Upstream, metrics: &str, scripts: Vec<Script>) -> Self {
        let mut spec = EngineSpec::native(id, format!("http://{id}.scripted").parse().expect("a valid URL"));
        spec.kind = crate::engines::EngineKind::Openai;
        spec.upstream = upstream;
        Self { spec, speaks: Speaks::OpenAi { metrics: metrics.to_string(), models: Vec::new() }, scripts }
    }

    /// The ids its `/v1/models` lists (an OpenAI-compatible engine).
    pub fn listing(mut self, ids: &[&str]) -> Self {
        if let Speaks::OpenAi { models, .. } = &mut self.speaks {
            *models = ids.iter().map(|id| id.to_string()).collect();
        }
        self
    }
}

/// The gateway in-process over scripted engines, and an HTTP/2 client
/// connected to it.
pub struct Harness {
    pub app: Arc<App>,
    /// Each engine's counters, in the order given.
    pub engines: Vec<Arc<EngineStats>>,
    client: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    /// What the gateway wrote to the client (the first 4 MiB).
    written: Arc<Mutex<Vec<u8>>>,
    _tasks: JoinSet<()>,
}

impl Harness {
    /// `policy`: a policy document's text; `engines`: each engine's id and
    /// scripts (each serves the bundled emulated A100 profile and a load
    /// report of a ready engine with a batch of 32);
    /// `configure` adjusts the gateway's config (limits) first.
    pub async fn start(
        policy: &str,
        engines: Vec<(&str, Vec<Script>)>,
        configure: impl FnOnce(&mut GatewayConfig),
    ) -> Self {
        let engines = engines.into_iter().map(|(id, scripts)| TestEngine::native(id, scripts)).collect();
        Self::start_with(policy, engines, configure).await
    }

    /// As [`Harness::start`], with engines of either kind.
    pub async fn start_with(
        policy: &str,
        engines: Vec<TestEngine>,
        configure: impl FnOnce(&mut GatewayConfig),
    ) -> Self {
        let mut config = GatewayConfig::default();
        configure(&mut config);
        let scripted = Scripted::default();
        let stats =
            engines.iter().map(|e| scripted.add(&e.spec.id, e.speaks.clone(), e.scripts.clone())).collect();
        let specs = engines.into_iter().map(|e| e.spec).collect();
        let connector = EngineConnector::tcp(Duration::from_secs(1))
            .with_dial(Arc::new(move |uri| scripted.connect(uri)));
        let pool = EnginePool::with_connector(specs, &config.limits, None, connector);
        // Readiness, profiles and load reports as in production: the poller.
        pool.poll_once().await;
        assert_eq!(pool.ready_count(), pool.len(), "every scripted engine answers its probe");
        let mut tasks = JoinSet::new();
        tasks.spawn(Arc::clone(&pool).poll_forever());
        let doc = PolicyDocument::parse("test.toml", policy).expect("the test's policy parses");
        let store = Arc::new(PolicyStore::new(doc, policy, None, None));
        let control = Control { supervisor: None, bounds: None };
        let app = Arc::new(App::new(config, Arc::clone(&store), pool, None, control));
        let gate = Arc::clone(&app.admission).run(store.subscribe());
        tasks.spawn(async move {
            let _store = store; // the gate stops when the store goes
            gate.await;
        });
        let (client_io, server_io) = tokio::io::duplex(PIPE_BYTES);
        let written = Arc::new(Mutex::new(Vec::new()));
        let server_io = tap::Tap { io: server_io, written: Arc::clone(&written) };
        let public = crate::stack::public(Arc::clone(&app));
        let service = hyper::service::service_fn(move |req| tower::ServiceExt::oneshot(public.clone(), req));
        let server = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .serve_connection(TokioIo::new(server_io), service);
        tasks.spawn(async move {
            let _ = server.await;
        });
        // A client with HTTP/2's default 64 KiB stream window and no
        // adaptive growth: one that stops reading stalls the gateway soon.
        let (client, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .initial_stream_window_size(65_535)
            .adaptive_window(false)
            .handshake(TokioIo::new(client_io))
            .await
            .expect("the in-memory handshake succeeds");
        tasks.spawn(async move {
            let _ = conn.await;
        });
        Self { app, engines: stats, client, written, _tasks: tasks }
    }

    /// Sends `body` to `path` with `Authorization: Bearer <key>`.
    pub async fn post(&self, path: &str, key: &str, body: &serde_json::Value) -> Response<Incoming> {
        self.post_with(path, key, body, &[]).await
    }

    /// As [`Harness::post`], with these request headers too.
    pub async fn post_with(
        &self,
        path: &str,
        key: &str,
        body: &serde_json::Value,
        headers: &[(&str, &str)],
    ) -> Response<Incoming> {
        let mut req = Request::post(format!("http://gateway.test{path}"))
            .header(http::header::AUTHORIZATION, format!("Bearer {key}"))
            .header(http::header::CONTENT_TYPE, "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body.to_string()))).expect("a valid request");
        let mut client = self.client.clone();
        client.ready().await.expect("the connection is up");
        client.send_request(req).await.expect("the gateway answers")
    }

    /// The HTTP/2 frames the gateway has written to the client so far.
    pub fn frames(&self) -> Vec<tap::Frame> {
        tap::frames(&self.written.lock().expect("tap lock"))
    }

    /// Sequences the gateway counts on engine `idx` (its leases).
    pub fn engine_sequences(&self, idx: usize) -> u32 {
        self.app.engines.slot(idx).active()
    }
}

/// Reads the next data frame of `body` (None at its end, Err on a reset).
pub async fn next_chunk(body: &mut Incoming) -> Option<Result<Bytes, hyper::Error>> {
    loop {
        match body.frame().await? {
            Ok(frame) => match frame.into_data() {
                Ok(data) => return Some(Ok(data)),
                Err(_) => continue, // trailers
            },
            Err(e) => return Some(Err(e)),
        }
    }
}

pub mod tap;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod upstream_tests;
