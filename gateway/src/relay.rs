//! Engine events to OpenAI responses: the SSE relay and the collected body.
//!
//! Streaming: a task per response turns each engine event into SSE bytes
//! at once and hands them to the client through a bounded [`outbox`], so
//! tokens reach the client as they arrive and the engine side is released
//! when the engine finishes, whether or not the client reads. Non-streaming: events are collected into one JSON body; because
//! nothing has reached the client yet, an engine failure at any point moves
//! the whole request to another engine.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use engine_api::{Event, FinishReason, Usage};
use serde_json::{json, Value};

use crate::dispatch::{self, Attempts, Started};
use crate::engines::{EngineLease, EnginePool, Work};
use crate::error::ApiError;
use crate::openai::Kind;
use crate::outbox::{outbox, Outbox, OutboxBody, Stall, Stop};
use crate::permit::Permit;

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
    /// The engine's chunks are relayed as it wrote them (`upstream.rs`):
    /// no opening chunk and no finish chunk of the gateway's own.
    pub verbatim: bool,
    /// What follows the choice in every streamed chunk of this response
    /// (its id, model, ... and the event's end), rendered once (see
    /// [`Encoder::framed`]).
    pub tail: std::sync::OnceLock<Vec<u8>>,
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

    /// A chunk's choice as a JSON tree: what the framed chunks must
    /// render byte for byte (the tests' oracle).
    #[cfg(test)]
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
        if self.kind == Kind::Chat && !self.verbatim {
            self.framed(out, |out| {
                out.put_slice(br#"{"delta":{"content":"","role":"assistant"},"finish_reason":null,"index":0,"logprobs":null}"#)
            });
        }
    }

    /// A token chunk.
    fn token(&self, out: &mut BytesMut, text: &str) {
        self.framed(out, |out| {
            out.put_slice(match self.kind {
                Kind::Chat => br#"{"delta":{"content":"#,
                Kind::Completion => br#"{"finish_reason":null,"index":0,"logprobs":null,"text":"#,
            });
            json_to(out, text);
            out.put_slice(match self.kind {
                Kind::Chat => br#"},"finish_reason":null,"index":0,"logprobs":null}"#,
                Kind::Completion => b"}",
            });
        });
    }

    /// One streamed chunk: its choice written by `choice` between the
    /// chunk's fixed opening and this response's tail. Byte for byte what
    /// rendering the chunk's JSON tree gives ([`Encoder::chunk`]: keys in
    /// order, as serde_json writes a map), without building a tree per
    /// token.
    fn framed(&self, out: &mut BytesMut, choice: impl FnOnce(&mut BytesMut)) {
        out.put_slice(br#"data: {"choices":["#);
        choice(out);
        out.put_slice(self.tail.get_or_init(|| self.render_tail()));
    }

    fn render_tail(&self) -> Vec<u8> {
        let mut tail = BytesMut::new();
        tail.put_slice(br#"],"created":"#);
        json_to(&mut tail, &self.created);
        tail.put_slice(br#","id":"#);
        json_to(&mut tail, &self.id);
        tail.put_slice(br#","model":"#);
        json_to(&mut tail, &self.model);
        tail.put_slice(br#","object":"#);
        json_to(&mut tail, self.object(true));
        tail.put_slice(br#","system_fingerprint":null"#);
        if self.include_usage {
            tail.put_slice(br#","usage":null"#);
        }
        tail.put_slice(b"}\n\n");
        tail.to_vec()
    }

    fn finish(&self, out: &mut BytesMut, reason: FinishReason, usage: Usage) {
        if self.verbatim {
            out.put_slice(b"data: [DONE]\n\n"); // the engine's own chunks said the rest
            return;
        }
        self.framed(out, |out| {
            out.put_slice(match self.kind {
                Kind::Chat => br#"{"delta":{},"finish_reason":"#,
                Kind::Completion => br#"{"finish_reason":"#,
            });
            json_to(out, &reason);
            out.put_slice(match self.kind {
                Kind::Chat => br#","index":0,"logprobs":null}"#,
                Kind::Completion => br#","index":0,"logprobs":null,"text":""}"#,
            });
        });
        if self.include_usage {
            let mut last = self.chunk(None);
            last["usage"] = usage_json(usage);
            sse(out, &last);
        }
        out.put_slice(b"data: [DONE]\n\n");
    }

    /// The non-streaming response body, serialised from typed values (no
    /// JSON tree, the text borrowed): the bytes a `json!` tree would give.
    pub fn complete(&self, text: &str, reason: FinishReason, usage: Usage) -> Vec<u8> {
        let choice = match self.kind {
            Kind::Chat => ChoiceOut::Chat {
                finish_reason: reason,
                index: 0,
                logprobs: (),
                message: MessageOut { content: text, refusal: (), role: "assistant" },
            },
            Kind::Completion => ChoiceOut::Text { finish_reason: reason, index: 0, logprobs: (), text },
        };
        let body = CompleteOut {
            choices: [choice],
            created: self.created,
            id: &self.id,
            model: &self.model,
            object: self.object(false),
            system_fingerprint: (),
            usage: usage.into(),
        };
        let mut out = Vec::with_capacity(text.len() + self.id.len() + self.model.len() + 256);
        serde_json::to_writer(&mut out, &body).expect("what the encoder writes always serialises");
        out
    }
}

// The non-streaming body's shapes. Keys are declared in the order
// serde_json's maps write them (sorted), so the bytes are those of the JSON
// tree they replace (tested). `()` is written as `null`.

#[derive(serde::Serialize)]
struct CompleteOut<'a> {
    choices: [ChoiceOut<'a>; 1],
    created: u64,
    id: &'a str,
    model: &'a str,
    object: &'static str,
    system_fingerprint: (),
    usage: UsageOut,
}

#[derive(serde::Serialize)]
#[serde(untagged)]
enum ChoiceOut<'a> {
    Chat { finish_reason: FinishReason, index: u32, logprobs: (), message: MessageOut<'a> },
    Text { finish_reason: FinishReason, index: u32, logprobs: (), text: &'a str },
}

#[derive(serde::Serialize)]
struct MessageOut<'a> {
    content: &'a str,
    refusal: (),
    role: &'static str,
}

/// OpenAI's `usage` object.
#[derive(serde::Serialize)]
struct UsageOut {
    completion_tokens: u32,
    prompt_tokens: u32,
    /// OpenAI's field for prompt tokens served from a prompt cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_tokens_details: Option<CachedOut>,
    total_tokens: u32,
}

#[derive(serde::Serialize)]
struct CachedOut {
    cached_tokens: u32,
}

impl From<Usage> for UsageOut {
    fn from(u: Usage) -> Self {
        UsageOut {
            completion_tokens: u.completion_tokens,
            prompt_tokens: u.prompt_tokens,
            prompt_tokens_details: (u.cached_tokens > 0)
                .then_some(CachedOut { cached_tokens: u.cached_tokens }),
            total_tokens: u.prompt_tokens + u.completion_tokens,
        }
    }
}

fn usage_json(u: Usage) -> Value {
    serde_json::to_value(UsageOut::from(u)).expect("usage always serialises")
}

/// `v` as JSON onto `out`.
fn json_to(out: &mut BytesMut, v: &(impl serde::Serialize + ?Sized)) {
    serde_json::to_writer(out.writer(), v).expect("what the encoder writes always serialises");
}

fn sse(out: &mut BytesMut, v: &Value) {
    out.put_slice(b"data: ");
    json_to(out, v);
    out.put_slice(b"\n\n");
}

/// What a streamed response may cost: its buffer and stall rule for the
/// client, and the longest engine silence after the first token.
#[derive(Debug, Clone, Copy)]
pub struct StreamBounds {
    pub buffer_bytes: usize,
    pub stall: Stall,
    pub event_timeout: Duration,
}

/// Relays one started generation as SSE: a task reads the engine's events
/// into a bounded [`outbox`] and the returned body hands them to hyper.
/// The engine lease, the admission ticket and the tenant's hold (all in
/// `permit` and `started`) are released the moment the engine finishes,
/// fails, falls silent past `event_timeout`, or the client goes away or
/// stalls, whichever comes first; a stalled client's stream is reset.
pub fn spawn_sse(
    encoder: Encoder,
    started: Started,
    mut permit: Permit,
    pool: Arc<EnginePool>,
    bounds: StreamBounds,
) -> OutboxBody {
    let (out, body) = outbox(bounds.buffer_bytes);
    permit.first_token();
    let first = started.first.clone();
    let engine_id = started.inflight.engine_id().to_string();
    let mut relay =
        SseRelay { encoder, engine: Some((started, permit)), engine_id, pool, pending: BytesMut::new() };
    relay.encoder.opening(&mut relay.pending);
    relay.on_event(Ok(first));
    // The first token is in the body before hyper first polls it, so the
    // response's HEADERS and first DATA frame leave in one write (pushed
    // from the task, they took two writes and two task wake-ups).
    let _ = out.push(&relay.pending.split());
    // The relay logs under the request's span.
    tokio::spawn(tracing::Instrument::in_current_span(relay.run(out, bounds)));
    body
}

/// The relay task's state.
#[derive(Debug)]
struct SseRelay {
    encoder: Encoder,
    /// What the engine side holds (the event stream, the engine lease, the
    /// admission ticket, tenant hold and metrics in the permit) until it ends.
    engine: Option<(Started, Permit)>,
    engine_id: String,
    pool: Arc<EnginePool>,
    /// Encoded bytes not yet in the outbox.
    pending: BytesMut,
}

impl SseRelay {
    async fn run(mut self, out: Outbox, bounds: StreamBounds) {
        loop {
            if !self.pending.is_empty() {
                if let Err(stop) = out.room(bounds.stall).await {
                    return self.stopped(out, stop);
                }
                if out.push(&self.pending.split()).is_err() {
                    return self.stopped(out, Stop::Gone);
                }
            }
            let Some((started, _)) = &mut self.engine else { break };
            let event = tokio::select! {
                e = tokio::time::timeout(bounds.event_timeout, started.events.next()) => e,
                () = out.gone() => return self.stopped(out, Stop::Gone),
            };
            match event {
                Ok(Some(e)) => self.on_event(e),
                Ok(None) => self.fail("engine closed the stream before finishing".into(), true),
                Err(_) => {
                    self.fail(format!("no event from the engine for {:?}", bounds.event_timeout), false)
                }
            }
        }
        // The engine side is released. The stream ends with its last bytes
        // (their frame carries END_STREAM); the client still has them to
        // read, under the same stall rule.
        out.finish();
        if let Err(stop) = out.drained(bounds.stall).await {
            self.stopped(out, stop);
        }
    }

    fn on_event(&mut self, event: Result<Event, String>) {
        match event {
            Ok(Event::Token { text }) => {
                self.encoder.token(&mut self.pending, &text);
                if let Some((_, permit)) = &mut self.engine {
                    permit.token();
                }
            }
            Ok(Event::Done { finish_reason, usage, prefill_ms, .. }) => {
                self.encoder.finish(&mut self.pending, finish_reason, usage);
                if let Some((started, permit)) = &mut self.engine {
                    permit.finished(started.inflight.engine_idx(), usage, prefill_ms);
                }
                self.engine = None;
            }
            Ok(Event::Error { code, message }) => self.fail(format!("{code}: {message}"), false),
            Ok(Event::Upstream { json }) => {
                self.pending.put_slice(b"data: ");
                self.pending.put_slice(json.as_bytes());
                self.pending.put_slice(b"\n\n");
            }
            Err(message) => self.fail(message, true),
        }
    }

    /// Ends the stream with an OpenAI-style error event (no `[DONE]`) and
    /// cancels the engine side. `transport`: the engine connection failed,
    /// so the engine leaves rotation until its next good probe.
    fn fail(&mut self, message: String, transport: bool) {
        tracing::warn!(event = "stream_failed", engine = %self.engine_id, error = %message);
        metrics::counter!(crate::metrics::ERRORS, "code" => "engine_failed_mid_stream").increment(1);
        if let (true, Some((started, _))) = (transport, &self.engine) {
            self.pool.mark_unreachable(started.inflight.engine_idx());
        }
        let err = ApiError::EngineFailed(format!("engine {} failed mid-stream: {message}", self.engine_id));
        sse(&mut self.pending, &err.body());
        // Dropping the event stream resets it at the engine; the lease and
        // the holds go with it.
        self.engine = None;
    }

    /// The client went away or stalled: the engine side is cancelled and
    /// released as `self` drops, and the client's stream is reset.
    fn stopped(self, out: Outbox, stop: Stop) {
        if stop == Stop::Stalled {
            tracing::info!(event = "stream_reset", engine = %self.engine_id, why = "write_stall");
            metrics::counter!(crate::metrics::STREAM_RESETS, "why" => "write_stall").increment(1);
        }
        out.reset();
    }
}

/// A collected (non-streaming) generation.
#[derive(Debug)]
pub struct Collected {
    pub text: String,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub engine_id: String,
    pub engine_idx: usize,
    /// A verbatim answer (re-stamped JSON), sent to the client as it is.
    pub verbatim: Option<String>,
}

/// Runs a generation to its end, retrying on other engines while attempts
/// remain (nothing has reached the client yet).
pub async fn collect(
    pool: &Arc<EnginePool>,
    req: &dispatch::Outbound,
    mut first: Option<EngineLease>,
    work: Work,
    timeout: Duration,
    event_timeout: Duration,
    permit: &mut Permit,
) -> Result<Collected, ApiError> {
    let mut attempts = Attempts::default();
    loop {
        let mut started = dispatch::start(pool, req, first.take(), work, timeout, &mut attempts).await?;
        permit.first_token();
        let mut text = String::new();
        let mut verbatim = None;
        let mut next = Some(Ok(started.first.clone()));
        let failure = loop {
            match next {
                Some(Ok(Event::Token { text: t })) => {
                    text.push_str(&t);
                    permit.token();
                }
                Some(Ok(Event::Upstream { json })) => verbatim = Some(json),
                Some(Ok(Event::Done { finish_reason, usage, prefill_ms, .. })) => {
                    permit.finished(started.inflight.engine_idx(), usage, prefill_ms);
                    let engine_id = started.inflight.engine_id().to_string();
                    let engine_idx = started.inflight.engine_idx();
                    return Ok(Collected { text, finish_reason, usage, engine_id, engine_idx, verbatim });
                }
                Some(Ok(Event::Error { code, message })) => break format!("{code}: {message}"),
                Some(Err(message)) => break message,
                None => break "engine closed the stream before finishing".to_string(),
            }
            next = match tokio::time::timeout(event_timeout, started.events.next()).await {
                Ok(n) => n,
                Err(_) => break format!("no event from the engine for {event_timeout:?}"),
            };
        };
        tracing::warn!(event = "collect_failed", error = %failure);
        attempts.failed_after_start(&started, failure);
        if attempts.exhausted(pool) {
            return Err(attempts.into_error());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_complete_body_is_the_json_tree_byte_for_byte() {
        // The tree the typed body replaced (serde_json's maps sort keys).
        let tree = |e: &Encoder, text: &str, reason: FinishReason, u: Usage| {
            let choice = match e.kind {
                Kind::Chat => {
                    json!({"index": 0, "message": {"role": "assistant", "content": text, "refusal": null},
                                     "logprobs": null, "finish_reason": reason})
                }
                Kind::Completion => {
                    json!({"index": 0, "text": text, "logprobs": null, "finish_reason": reason})
                }
            };
            let mut usage = json!({"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                                   "total_tokens": u.prompt_tokens + u.completion_tokens});
            if u.cached_tokens > 0 {
                usage["prompt_tokens_details"] = json!({"cached_tokens": u.cached_tokens});
            }
            json!({"id": e.id, "object": e.object(false), "created": e.created, "model": e.model,
                   "system_fingerprint": null, "choices": [choice], "usage": usage})
            .to_string()
        };
        for kind in [Kind::Chat, Kind::Completion] {
            let e = Encoder {
                kind,
                id: "chatcmpl-req_\"1\"".into(),
                created: 1_700_000_000,
                model: "synthetic-small/é".into(),
                stream: false,
                include_usage: false,
                verbatim: false,
                tail: Default::default(),
            };
            for (text, reason, cached) in [
                ("hello world", FinishReason::Stop, 0),
                ("quote \" \\ line\nbreak é漢字🙂 \u{1}", FinishReason::Length, 7),
                ("", FinishReason::Stop, 0),
            ] {
                let u = Usage { prompt_tokens: 12, completion_tokens: 5, cached_tokens: cached };
                let typed = String::from_utf8(e.complete(text, reason, u)).unwrap();
                assert_eq!(typed, tree(&e, text, reason, u));
            }
        }
    }

    #[test]
    fn chunks_from_the_tail_are_the_rendered_chunks_byte_for_byte() {
        for (kind, include_usage) in [(Kind::Chat, false), (Kind::Chat, true), (Kind::Completion, false)] {
            let e = Encoder {
                kind,
                id: "chatcmpl-req_\"1\"".into(),
                created: 1_700_000_000,
                model: "synthetic-small/é".into(),
                stream: true,
                include_usage,
                verbatim: false,
                tail: Default::default(),
            };
            let rendered = |text: Option<&str>, finish: Option<FinishReason>, first: bool| {
                let mut out = BytesMut::new();
                sse(&mut out, &e.chunk(Some(e.choice(text, finish, first))));
                out
            };
            for text in
                ["hello", " world", "quote \" and \\ backslash", "line\nbreak\t", "é漢字🙂", "\u{1}", ""]
            {
                let mut templated = BytesMut::new();
                e.token(&mut templated, text);
                assert_eq!(templated, rendered(Some(text), None, false), "{kind:?} {text:?}");
            }
            let mut opening = BytesMut::new();
            e.opening(&mut opening);
            match kind {
                Kind::Chat => assert_eq!(opening, rendered(None, None, true)),
                Kind::Completion => assert!(opening.is_empty(), "completions open with no chunk"),
            }
            for reason in [FinishReason::Stop, FinishReason::Length] {
                let mut finish = BytesMut::new();
                e.finish(&mut finish, reason, Usage::default());
                let mut want = rendered(None, Some(reason), false);
                if include_usage {
                    let mut last = e.chunk(None);
                    last["usage"] = usage_json(Usage::default());
                    sse(&mut want, &last);
                }
                want.put_slice(b"data: [DONE]\n\n");
                assert_eq!(finish, want, "{kind:?} {reason:?}");
            }
        }
    }
}
