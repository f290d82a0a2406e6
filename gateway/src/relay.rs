//! Engine events to OpenAI responses: the SSE relay and the collected body.
//!
//! Streaming: each engine frame becomes SSE bytes immediately (no batching
//! beyond what already arrived together), so tokens reach the client as they
//! arrive. Non-streaming: events are collected into one JSON body; because
//! nothing has reached the client yet, an engine failure at any point moves
//! the whole request to another engine.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use engine::api::{Event, FinishReason, GenerateRequest, Usage};
use http_body::{Body, Frame};
use serde_json::{json, Value};

use crate::dispatch::{self, Attempts, EventStream, Started};
use crate::engines::{EngineLease, EnginePool, Work};
use crate::error::ApiError;
use crate::metrics::RequestObserver;
use crate::openai::Kind;

/// Flush what has been gathered once it reaches this size.
const MAX_FRAME: usize = 16 << 10;

/// Builds OpenAI's response objects for one request.
#[derive(Debug, Clone)]
pub struct Encoder {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
    /// SSE (`stream: true`) or one JSON body.
    pub stream: bool,
    pub include_usage: bool,
}

impl Encoder {
    fn object(&self, stream: bool) -> &'static str {
        match (self.kind, stream) {
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn chunk(&self, choice: Option<Value>) -> Value {
        let mut v = json!({
            "id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
            "system_fingerprint": null,
            "choices": choice.map_or_else(Vec::new, |c| vec![c]),
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    fn choice(&self, text: Option<&str>, finish: Option<FinishReason>, first: bool) -> Value {
        match self.kind {
            Kind::Chat => {
                let delta = match (first, text) {
                    (true, _) => json!({"role": "assistant", "content": ""}),
                    (false, Some(t)) => json!({"content": t}),
                    (false, None) => json!({}),
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            Kind::Completion => {
                json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish})
            }
        }
    }

    /// Chat streams open with a chunk carrying the assistant role.
    fn opening(&self, out: &mut BytesMut) {
        if self.kind == Kind::Chat {
            sse(out, &self.chunk(Some(self.choice(None, None, true))));
        }
    }

    fn token(&self, out: &mut BytesMut, text: &str) {
        sse(out, &self.chunk(Some(self.choice(Some(text), None, false))));
    }

    fn finish(&self, out: &mut BytesMut, reason: FinishReason, usage: Usage) {
        sse(out, &self.chunk(Some(self.choice(None, Some(reason), false))));
        if self.include_usage {
            let mut last = self.chunk(None);
            last["usage"] = usage_json(usage);
            sse(out, &last);
        }
        out.put_slice(b"data: [DONE]\n\n");
    }

    /// The non-streaming response body.
    pub fn complete(&self, text: &str, reason: FinishReason, usage: Usage) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                json!({"index": 0, "message": {"role": "assistant", "content": text, "refusal": null},
                                 "logprobs": null, "finish_reason": reason})
            }
            Kind::Completion => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": reason}),
        };
        json!({
            "id": self.id, "object": self.object(false), "created": self.created, "model": self.model,
            "system_fingerprint": null, "choices": [choice], "usage": usage_json(usage),
        })
    }
}

fn usage_json(u: Usage) -> Value {
    json!({"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
           "total_tokens": u.prompt_tokens + u.completion_tokens})
}

fn sse(out: &mut BytesMut, v: &Value) {
    out.put_slice(b"data: ");
    serde_json::to_writer((&mut *out).writer(), v).expect("JSON values always serialise");
    out.put_slice(b"\n\n");
}

/// The SSE response body relaying one started generation.
#[derive(Debug)]
pub struct SseRelay {
    encoder: Encoder,
    events: EventStream,
    pending: BytesMut,
    /// Ends (in-flight gauge down) with the generation, like `inflight`.
    observer: Option<RequestObserver>,
    /// Released as soon as the generation ends, not when hyper drops us.
    inflight: Option<EngineLease>,
    done: bool,
}

impl SseRelay {
    pub fn new(encoder: Encoder, started: Started, mut observer: RequestObserver) -> Self {
        let Started { first, events, inflight } = started;
        observer.first_token();
        let mut relay = Self {
            encoder,
            events,
            pending: BytesMut::new(),
            observer: Some(observer),
            inflight: Some(inflight),
            done: false,
        };
        relay.encoder.opening(&mut relay.pending);
        relay.on_event(Ok(first));
        relay
    }

    fn on_event(&mut self, event: Result<Event, String>) {
        match event {
            Ok(Event::Token { text }) => self.encoder.token(&mut self.pending, &text),
            Ok(Event::Done { finish_reason, usage, prefill_ms, .. }) => {
                self.encoder.finish(&mut self.pending, finish_reason, usage);
                if let (Some(o), Some(l)) = (&mut self.observer, &self.inflight) {
                    o.finished(l.engine_idx(), usage, prefill_ms);
                }
                self.end();
            }
            Ok(Event::Error { code, message }) => self.fail(format!("{code}: {message}")),
            Err(message) => self.fail(message),
        }
    }

    /// Ends the stream with an OpenAI-style error event (no `[DONE]`).
    fn fail(&mut self, message: String) {
        let engine = self.inflight.as_ref().map_or("?", |i| i.engine_id()).to_string();
        tracing::warn!(event = "stream_failed", engine = %engine, error = %message);
        metrics::counter!(crate::metrics::ERRORS, "code" => "engine_failed_mid_stream").increment(1);
        let err = ApiError::EngineFailed(format!("engine {engine} failed mid-stream: {message}"));
        sse(&mut self.pending, &err.body());
        self.end();
    }

    fn end(&mut self) {
        self.done = true;
        self.inflight = None;
        self.observer = None;
    }
}

impl Body for SseRelay {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        while !this.done && this.pending.len() < MAX_FRAME {
            match this.events.poll_event(cx) {
                Poll::Ready(Some(event)) => this.on_event(event),
                Poll::Ready(None) => this.fail("engine closed the stream before finishing".into()),
                Poll::Pending => break,
            }
        }
        if !this.pending.is_empty() {
            return Poll::Ready(Some(Ok(Frame::data(this.pending.split().freeze()))));
        }
        if this.done {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.pending.is_empty()
    }
}

/// A collected (non-streaming) generation.
#[derive(Debug)]
pub struct Collected {
    pub text: String,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub engine_id: String,
}

/// Runs a generation to its end, retrying on other engines while attempts
/// remain (nothing has reached the client yet).
pub async fn collect(
    pool: &Arc<EnginePool>,
    req: &GenerateRequest,
    mut first: Option<EngineLease>,
    work: Work,
    timeout: Duration,
    observer: &mut RequestObserver,
) -> Result<Collected, ApiError> {
    let mut attempts = Attempts::default();
    loop {
        let mut started = dispatch::start(pool, req, first.take(), work, timeout, &mut attempts).await?;
        observer.first_token();
        let mut text = String::new();
        let mut next = Some(Ok(started.first.clone()));
        let failure = loop {
            match next {
                Some(Ok(Event::Token { text: t })) => text.push_str(&t),
                Some(Ok(Event::Done { finish_reason, usage, prefill_ms, .. })) => {
                    observer.finished(started.inflight.engine_idx(), usage, prefill_ms);
                    let engine_id = started.inflight.engine_id().to_string();
                    return Ok(Collected { text, finish_reason, usage, engine_id });
                }
                Some(Ok(Event::Error { code, message })) => break format!("{code}: {message}"),
                Some(Err(message)) => break message,
                None => break "engine closed the stream before finishing".to_string(),
            }
            next = started.events.next().await;
        };
        tracing::warn!(event = "collect_failed", request_id = %req.request_id, error = %failure);
        attempts.failed_after_start(&started, failure);
        if attempts.exhausted(pool) {
            return Err(attempts.into_error());
        }
    }
}
