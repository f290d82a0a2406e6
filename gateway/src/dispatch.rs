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
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;

use crate::engines::{join, EngineLease, EnginePool, Work};
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

/// Newline-delimited engine events read from a response body.
#[derive(Debug)]
pub struct EventStream {
    body: Incoming,
    lines: EventLines,
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
        match self.buf[self.scanned..].iter().position(|b| *b == b'\n') {
            Some(pos) => {
                let line = self.buf.split_to(self.scanned + pos + 1);
                self.scanned = 0;
                Some(serde_json::from_slice(&line).map_err(|e| format!("bad event line: {e}")))
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

impl EventStream {
    /// Polls the next complete event line. `Ready(None)` is a clean end of
    /// the body; a partial trailing line is an error.
    pub fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Event, String>>> {
        loop {
            if let Some(event) = self.lines.next_event() {
                return Poll::Ready(Some(event));
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.lines.push(&data);
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.to_string()))),
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

/// Starts `req` on the engine admission chose (`first`, already counted
/// against it), then, while attempts remain, on the ready engine with the
/// fewest in-flight tokens among those not tried yet. `work` is what the
/// request counts against an engine; `first_event_timeout` bounds the wait
/// for the first token.
pub async fn start(
    pool: &Arc<EnginePool>,
    req: &GenerateRequest,
    mut first: Option<EngineLease>,
    work: Work,
    first_event_timeout: Duration,
    attempts: &mut Attempts,
) -> Result<Started, ApiError> {
    let body = Bytes::from(serde_json::to_vec(req).expect("generate requests always serialise"));
    while !attempts.exhausted(pool) {
        let mut inflight = match first.take().filter(|l| !attempts.tried.contains(&l.engine_idx())) {
            Some(lease) => lease,
            None => match policies::routing::least_inflight_tokens(&pool.views(), &attempts.tried) {
                Some(idx) => pool.lease(idx, work),
                None => break,
            },
        };
        let idx = inflight.engine_idx();
        match tokio::time::timeout(first_event_timeout, try_engine(pool, idx, body.clone())).await {
            Ok(Ok((first, events))) => {
                inflight.first_token();
                return Ok(Started { first, events, inflight });
            }
            Ok(Err(e)) => {
                if matches!(e, EngineError::Unreachable { .. }) {
                    pool.mark_unreachable(idx);
                }
                tracing::warn!(event = "engine_attempt_failed", error = %e);
                attempts.last_error = Some(e);
            }
            Err(_) => {
                let engine = pool.slot(idx).spec.id.clone();
                attempts.last_error = Some(EngineError::Timeout { engine, timeout: first_event_timeout });
            }
        }
        attempts.tried.push(idx);
        metrics::counter!(crate::metrics::ENGINE_RETRIES).increment(1);
    }
    Err(std::mem::take(attempts).into_error())
}

async fn try_engine(pool: &EnginePool, idx: usize, body: Bytes) -> Result<(Event, EventStream), EngineError> {
    let slot = pool.slot(idx);
    let engine = slot.spec.id.clone();
    let uri = join(&slot.spec.url, engine_api::GENERATE_PATH).ok_or_else(|| EngineError::Unreachable {
        engine: engine.clone(),
        message: "bad engine URL".into(),
    })?;
    let req = http::Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .expect("static request parts are valid");
    let resp = pool
        .send(req)
        .await
        .map_err(|e| EngineError::Unreachable { engine: engine.clone(), message: error_chain(&e) })?;
    let status = resp.status();
    if status != StatusCode::OK {
        let bytes = Limited::new(resp.into_body(), 64 << 10).collect().await.map(|c| c.to_bytes());
        let parsed = bytes.ok().and_then(|b| serde_json::from_slice::<ErrorBody>(&b).ok());
        let (code, message) =
            parsed.map_or_else(|| ("unknown".into(), String::new()), |b| (b.code, b.message));
        return Err(EngineError::Refused { engine, status, code, message });
    }
    let mut events = EventStream { body: resp.into_body(), lines: EventLines::default() };
    match events.next().await {
        Some(Ok(Event::Error { code, message })) => {
            Err(EngineError::Stream { engine, message: format!("{code}: {message}") })
        }
        Some(Ok(first)) => Ok((first, events)),
        Some(Err(message)) => Err(EngineError::Stream { engine, message }),
        None => Err(EngineError::Stream { engine, message: "stream ended before the first event".into() }),
    }
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
