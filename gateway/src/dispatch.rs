//! Sending one generation to an engine, with retries before the first byte.
//!
//! A generation is *started* once the chosen engine has produced its first
//! event. Until then nothing has reached the client, so any failure
//! (connection refused, engine refused, engine died during prefill) moves
//! the request to the next-best engine. After that, failures are the
//! caller's to report: the stream relay ends the SSE stream with an error
//! event. Dropping a [`Started`] (client gone) drops the engine's response
//! body, which makes the HTTP/2 client send RST_STREAM to the engine.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use engine_api::{ErrorBody, Event, GenerateRequest};
use http::StatusCode;
use http_body::Body;
use http_body_util::{BodyExt, Limited};

use crate::engines::{join, EngineBody, EngineKind, EngineLease, EnginePool, EngineSpec, Work};
use crate::error::ApiError;

/// At most this many engines are tried for one request.
const MAX_ATTEMPTS: usize = 3;

/// Why one attempt on one engine failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    #[error("engine {engine}: unreachable: {message}")]
    Unreachable { engine: String, message: String },
    #[error("engine {engine}: refused with {status} {code}: {message}")]
    Refused { engine: String, status: StatusCode, code: String, message: String },
    #[error("engine {engine}: stream failed: {message}")]
    Stream { engine: String, message: String },
    #[error("engine {engine}: no first token within {timeout:?}")]
    Timeout { engine: String, timeout: Duration },
}

/// Engine events read from a response body: newline-delimited JSON from
/// this project's engines, OpenAI SSE from `openai` ones (`upstream.rs`).
#[derive(Debug)]
pub struct EventStream {
    /// `None` once a whole answer has been read.
    body: Option<EngineBody>,
    lines: EventLines,
    /// `Some` for an `openai` engine.
    sse: Option<crate::upstream::SseDecoder>,
}

/// Longest engine event line accepted: an engine that sends more without a
/// newline is broken or hostile, and its stream fails instead of growing
/// the gateway's buffer.
pub const MAX_EVENT_LINE: usize = 1 << 20;

/// Splits bytes into event lines. Each byte is scanned for a newline once,
/// however the engine slices its frames (a byte per frame must not cost
/// quadratic time), and at most [`MAX_EVENT_LINE`] bytes wait for one.
#[derive(Debug, Default)]
pub struct EventLines {
    buf: BytesMut,
    /// Bytes of `buf` already known to hold no newline.
    scanned: usize,
}

impl EventLines {
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Bytes waiting for a newline.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// The next complete event line, if there is one. `Some(Err)` for a
    /// line that is not an event, or past [`MAX_EVENT_LINE`] bytes without
    /// a newline.
    pub fn next_event(&mut self) -> Option<Result<Event, String>> {
        self.next_line().map(|line| line.and_then(|l| parse_event(&l)))
    }

    /// The next complete line (with its newline), if there is one.
    fn next_line(&mut self) -> Option<Result<BytesMut, String>> {
        match self.buf[self.scanned..].iter().position(|b| *b == b'\n') {
            Some(pos) => {
                let line = self.buf.split_to(self.scanned + pos + 1);
                self.scanned = 0;
                Some(Ok(line))
            }
            None if self.buf.len() > MAX_EVENT_LINE => {
                self.buf.clear();
                self.scanned = 0;
                Some(Err(format!("an event line longer than {MAX_EVENT_LINE} bytes")))
            }
            None => {
                self.scanned = self.buf.len();
                None
            }
        }
    }
}

/// One event line. A token line in the shape the engine writes it (most
/// lines) has only its text parsed: serde's tagged-enum path buffers every
/// field of every line before choosing the variant. Anything else takes
/// that path.
pub(crate) fn parse_event(line: &[u8]) -> Result<Event, String> {
    const TOKEN: &[u8] = br#"{"event":"token","text":"#;
    let body = line.strip_suffix(b"\n").unwrap_or(line);
    if let Some(text) = body.strip_prefix(TOKEN).and_then(|r| r.strip_suffix(b"}")) {
        if let Ok(text) = serde_json::from_slice::<String>(text) {
            return Ok(Event::Token { text });
        }
    }
    serde_json::from_slice(line).map_err(|e| format!("bad event line: {e}"))
}

impl EventStream {
    /// Polls the next complete event line. `Ready(None)` is a clean end of
    /// the body; a partial trailing line is an error.
    pub fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Event, String>>> {
        loop {
            match &mut self.sse {
                None => {
                    if let Some(event) = self.lines.next_event() {
                        return Poll::Ready(Some(event));
                    }
                }
                Some(sse) => {
                    if let Some(event) = sse.pop() {
                        return Poll::Ready(Some(Ok(event)));
                    }
                    if sse.ended() {
                        return Poll::Ready(None); // what follows the end is not read
                    }
                    if let Some(line) = self.lines.next_line() {
                        let fed = line.and_then(|l| sse.line(l.strip_suffix(b"\n").unwrap_or(&l[..])));
                        if let Err(e) = fed {
                            return Poll::Ready(Some(Err(e)));
                        }
                        continue;
                    }
                }
            }
            let frame = match self.body.as_mut() {
                Some(body) => Pin::new(body).poll_frame(cx),
                None => Poll::Ready(None),
            };
            match frame {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.lines.push(&data);
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.to_string()))),
                Poll::Ready(None) if self.sse.is_some() && self.lines.pending() > 0 => self.lines.push(b"\n"),
                Poll::Ready(None) if self.sse.as_ref().is_some_and(|s| !s.ended()) => {
                    return Poll::Ready(Some(Err("the upstream's stream ended without [DONE]".into())))
                }
                Poll::Ready(None) if self.lines.pending() == 0 => return Poll::Ready(None),
                Poll::Ready(None) => return Poll::Ready(Some(Err("stream ended mid-line".into()))),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    pub async fn next(&mut self) -> Option<Result<Event, String>> {
        poll_fn(|cx| self.poll_event(cx)).await
    }
}

/// A generation running on an engine that has produced its first event.
#[derive(Debug)]
pub struct Started {
    pub first: Event,
    pub events: EventStream,
    /// Keeps the request's tokens counted against its engine.
    pub inflight: EngineLease,
    /// The attempt's span, ended with the stream (held for its drop).
    #[allow(dead_code)]
    pub span: crate::trace::Child,
}

/// Engines already tried for one request, and why the last one failed.
#[derive(Debug, Default)]
pub struct Attempts {
    tried: Vec<usize>,
    last_error: Option<EngineError>,
}

impl Attempts {
    /// Records that `started` failed after its first event (only callers
    /// that have sent nothing to the client yet may then try again).
    pub fn failed_after_start(&mut self, started: &Started, message: String) {
        let engine = started.inflight.engine_id().to_string();
        self.tried.push(started.inflight.engine_idx());
        self.last_error = Some(EngineError::Stream { engine, message });
    }

    pub fn exhausted(&self, pool: &EnginePool) -> bool {
        self.tried.len() >= MAX_ATTEMPTS.min(pool.len())
    }

    pub fn into_error(self) -> ApiError {
        match self.last_error {
            // Engines that refused for capacity (KV watermark, draining) are
            // healthy but full: a retryable 503, not a failure.
            Some(e @ EngineError::Refused { status: StatusCode::SERVICE_UNAVAILABLE, .. }) => {
                ApiError::EnginesAtCapacity(e.to_string())
            }
            Some(e) => ApiError::EngineFailed(e.to_string()),
            None => ApiError::NoReadyEngine,
        }
    }
}

/// One generation as each kind of engine is sent it: this project's
/// engines get the rendered [`GenerateRequest`], `openai` engines the
/// client's own body with the gateway's decisions (`upstream.rs`).
#[derive(Debug)]
pub struct Outbound {
    pub gen: GenerateRequest,
    /// The client's route and body.
    pub client: (crate::upstream::UpstreamRoute, Bytes),
    /// Only third-party engines may serve it (a passthrough parameter).
    pub upstream_only: bool,
    /// The answer is relayed as the engine wrote it, re-stamped (a
    /// passthrough parameter that changes its shape).
    pub verbatim: Option<crate::upstream::Stamp>,
    /// The prompt's block hashes: recorded in the prefix index against the
    /// engine it is sent to.
    pub prefix: Vec<u64>,
    /// The request's trace: each attempt is a span below it, sent to the
    /// engine as `traceparent`.
    pub trace: crate::trace::RequestTrace,
    /// Only this project's engines may serve it (a continuation: see
    /// [`Outbound::continuation`]).
    native_only: bool,
    native: std::sync::OnceLock<Bytes>,
}

impl Outbound {
    pub fn new(
        gen: GenerateRequest,
        (kind, client_body): (crate::upstream::UpstreamRoute, Bytes),
        upstream_only: bool,
        verbatim: Option<crate::upstream::Stamp>,
    ) -> Self {
        Self {
            gen,
            client: (kind, client_body),
            upstream_only,
            verbatim,
            prefix: Vec::new(),
            trace: crate::trace::RequestTrace::default(),
            native_only: false,
            native: std::sync::OnceLock::new(),
        }
    }

    /// Whether a generation cut short after its first tokens may go on
    /// elsewhere as a [`continuation`](Outbound::continuation): a request
    /// this project's engines serve from the rendered prompt (not one
    /// bound to third-party engines or relayed verbatim).
    pub fn resumable(&self) -> bool {
        !self.upstream_only
            && self.verbatim.is_none()
            && self.client.0 != crate::upstream::UpstreamRoute::Embeddings
    }

    /// What a stream keeps to resume with: the rendered request without
    /// the client's body or its serialised form (a continuation goes to
    /// this project's engines only, which read neither).
    pub fn for_resume(mut self) -> Self {
        self.client.1 = Bytes::new();
        self.native = std::sync::OnceLock::new();
        self
    }

    /// The rest of this generation after `text` (`tokens` tokens) was
    /// produced: the rendered prompt followed by that text, the token cap
    /// less what was spent, for this project's engines only (a third-party
    /// engine is sent the client's messages and would start over).
    pub fn continuation(&self, text: &str, tokens: u32) -> Self {
        let mut gen = self.gen.clone();
        gen.prompt.push_str(text);
        gen.max_tokens = gen.max_tokens.saturating_sub(tokens).max(1);
        Self {
            gen,
            client: self.client.clone(),
            upstream_only: false,
            verbatim: None,
            prefix: self.prefix.clone(),
            trace: self.trace.clone(),
            native_only: true,
            native: std::sync::OnceLock::new(),
        }
    }

    /// The path and body for `engine`.
    fn for_engine(&self, engine: &EngineSpec) -> Result<(&'static str, Bytes), String> {
        match engine.kind {
            EngineKind::Native if self.client.0 == crate::upstream::UpstreamRoute::Embeddings => {
                Err("this project's engines compute no embeddings".into())
            }
            EngineKind::Native => {
                let body = self.native.get_or_init(|| {
                    Bytes::from(serde_json::to_vec(&self.gen).expect("generate requests always serialise"))
                });
                Ok((engine_api::GENERATE_PATH, body.clone()))
            }
            EngineKind::Openai if self.client.0 == crate::upstream::UpstreamRoute::Embeddings => {
                let model = engine.upstream.served_model.as_deref().unwrap_or(&self.gen.model);
                let body = crate::upstream::embeddings_body(&self.client.1, model)?;
                Ok((crate::upstream::path(self.client.0), body))
            }
            EngineKind::Openai => {
                let (kind, client) = &self.client;
                let stream = self.verbatim.as_ref().is_none_or(|s| s.stream);
                let served = engine.upstream.served_model.as_deref();
                let body = crate::upstream::body(client, &self.gen, served, stream)?;
                Ok((crate::upstream::path(*kind), body))
            }
        }
    }
}

/// Starts `req` on the engine admission chose (`first`, already counted
/// against it), then, while attempts remain, on the ready engine with the
/// fewest in-flight tokens among those not tried yet. `work` is what the
/// request counts against an engine; `first_event_timeout` bounds the wait
/// for the first token.
pub async fn start(
    pool: &Arc<EnginePool>,
    req: &Outbound,
    mut first: Option<EngineLease>,
    work: Work,
    first_event_timeout: Duration,
    attempts: &mut Attempts,
) -> Result<Started, ApiError> {
    let mut not_serving = pool.not_serving(&req.gen.model, req.upstream_only);
    if req.native_only {
        let snapshot = pool.snapshot();
        not_serving.extend((0..snapshot.len()).filter(|&i| snapshot[i].spec.kind != EngineKind::Native));
    }
    while !attempts.exhausted(pool) {
        let usable = |idx: usize| !attempts.tried.contains(&idx) && !not_serving.contains(&idx);
        let mut inflight = match first.take().filter(|l| usable(l.engine_idx())) {
            Some(lease) => lease,
            None => {
                let exclude: Vec<usize> = attempts.tried.iter().chain(&not_serving).copied().collect();
                match policies::routing::least_inflight_tokens(&pool.views(), &exclude) {
                    Some(idx) => pool.lease(idx, work),
                    None => break,
                }
            }
        };
        let idx = inflight.engine_idx();
        pool.prefix.record(idx, &req.prefix); // the next prompt with this prefix may follow it
        let span = attempt_span(pool, req, idx, attempts.tried.len() + 1);
        match tokio::time::timeout(first_event_timeout, try_engine(pool, idx, req, &span)).await {
            Ok(Ok((first, events))) => {
                inflight.first_token();
                return Ok(Started { first, events, inflight, span });
            }
            Ok(Err(e)) => {
                if matches!(e, EngineError::Unreachable { .. }) {
                    pool.mark_unreachable(idx);
                }
                tracing::warn!(event = "engine_attempt_failed", error = %e);
                span.fail(e.to_string());
                attempts.last_error = Some(e);
            }
            Err(_) => {
                let engine = pool.slot(idx).spec.id.clone();
                let e = EngineError::Timeout { engine, timeout: first_event_timeout };
                span.fail(e.to_string());
                attempts.last_error = Some(e);
            }
        }
        attempts.tried.push(idx);
        metrics::counter!(crate::metrics::ENGINE_RETRIES).increment(1);
    }
    Err(std::mem::take(attempts).into_error())
}

/// The span of attempt number `attempt` of `req`, on engine `idx` (its
/// context goes to the engine as `traceparent`).
fn attempt_span(pool: &EnginePool, req: &Outbound, idx: usize, attempt: usize) -> crate::trace::Child {
    req.trace.child("engine", telemetry::SpanKind::Client, || {
        let slot = pool.slot(idx);
        vec![
            telemetry::KeyValue::new("slo.engine", slot.spec.id.clone()),
            telemetry::KeyValue::new("server.address", slot.spec.url.to_string()),
            telemetry::KeyValue::new("slo.attempt", attempt as i64),
        ]
    })
}

async fn try_engine(
    pool: &EnginePool,
    idx: usize,
    out: &Outbound,
    span: &crate::trace::Child,
) -> Result<(Event, EventStream), EngineError> {
    let slot = pool.slot(idx);
    let engine = slot.spec.id.clone();
    let (path, body) = out.for_engine(&slot.spec).map_err(|message| EngineError::Refused {
        engine: engine.clone(),
        status: StatusCode::BAD_REQUEST,
        code: "invalid_request".into(),
        message,
    })?;
    let uri = join(&slot.spec.url, path).ok_or_else(|| EngineError::Unreachable {
        engine: engine.clone(),
        message: "bad engine URL".into(),
    })?;
    let mut req = http::Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)
        .expect("static request parts are valid");
    if let Ok(id) = http::HeaderValue::from_str(&out.gen.request_id) {
        req.headers_mut().insert(crate::headers::X_REQUEST_ID, crate::headers::unique(id));
    }
    span.inject(req.headers_mut()); // the engine's spans hang below this attempt
    let sent_at = crate::clock::now();
    let resp = pool
        .send(req, &slot)
        .await
        .map_err(|e| EngineError::Unreachable { engine: engine.clone(), message: error_chain(&*e) })?;
    let status = resp.status();
    if status != StatusCode::OK {
        let bytes = Limited::new(resp.into_body(), 64 << 10).collect().await.map(|c| c.to_bytes());
        // This project's engines answer an `ErrorBody`; OpenAI servers
        // `{"error": {"message", "type", "code"}}`.
        let parsed = bytes.ok().and_then(|b| {
            serde_json::from_slice::<ErrorBody>(&b).ok().or_else(|| crate::upstream::error_body(&b))
        });
        let (code, message) =
            parsed.map_or_else(|| ("unknown".into(), String::new()), |b| (b.code, b.message));
        return Err(EngineError::Refused { engine, status, code, message });
    }
    let mut events = open_events(&slot.spec, out, resp.into_body(), &engine).await?;
    let first = events.next().await;
    if let Some(sse) = &mut events.sse {
        sse.set_prefill_ms(crate::clock::since(sent_at).as_secs_f64() * 1e3);
    }
    match first {
        Some(Ok(Event::Error { code, message })) => {
            Err(EngineError::Stream { engine, message: format!("{code}: {message}") })
        }
        Some(Ok(first)) => Ok((first, events)),
        Some(Err(message)) => Err(EngineError::Stream { engine, message }),
        None => Err(EngineError::Stream { engine, message: "stream ended before the first event".into() }),
    }
}

/// The engine events of an answer: NDJSON from this project's engines,
/// SSE (or, for a verbatim answer to a client that does not stream, one
/// JSON answer read whole, bounded) from an `openai` engine.
async fn open_events(
    spec: &EngineSpec,
    out: &Outbound,
    body: EngineBody,
    engine: &str,
) -> Result<EventStream, EngineError> {
    Ok(match (spec.kind, &out.verbatim) {
        (EngineKind::Native, _) => EventStream { body: Some(body), lines: EventLines::default(), sse: None },
        (EngineKind::Openai, Some(stamp)) if !stamp.stream => {
            // One JSON answer, read whole (bounded) and relayed re-stamped.
            let answer = Limited::new(body, crate::upstream::MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| EngineError::Stream { engine: engine.to_string(), message: e.to_string() })?
                .to_bytes();
            let sse = crate::upstream::SseDecoder::whole(stamp.clone(), &answer)
                .map_err(|message| EngineError::Stream { engine: engine.to_string(), message })?;
            EventStream { body: None, lines: EventLines::default(), sse: Some(sse) }
        }
        (EngineKind::Openai, stamp) => {
            let sse = stamp.clone().map_or_else(Default::default, crate::upstream::SseDecoder::verbatim);
            EventStream { body: Some(body), lines: EventLines::default(), sse: Some(sse) }
        }
    })
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
