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

use bytes::BytesMut;
use engine_api::{Event, FinishReason, Usage};
pub use openai_wire::encode::Encoder;

use crate::dispatch::{self, Attempts, Started};
use crate::engines::{EngineLease, EnginePool, Work};
use crate::error::ApiError;
use crate::outbox::{outbox, Outbox, OutboxBody, Stall, Stop};
use crate::permit::Permit;
use crate::wire::Wire;

/// What a streamed generation needs to go on on another engine when its
/// engine fails after the first tokens (its connection breaks, or it falls
/// silent past the event timeout): the request, what it counts against an
/// engine, and the wait for a first token. The relay sends the rest of the
/// generation as a [`continuation`](dispatch::Outbound::continuation) (the
/// prompt followed by the text already relayed) to this project's engines,
/// while attempts remain, and the client's stream goes on where it was.
#[derive(Debug)]
pub struct Resume {
    pub out: dispatch::Outbound,
    pub work: Work,
    pub first_event_timeout: Duration,
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
/// With `resume`, an engine failure after the first tokens moves the rest
/// of the generation to another engine ([`Resume`]).
pub fn spawn_sse(
    encoder: Wire,
    started: Started,
    mut permit: Permit,
    pool: Arc<EnginePool>,
    bounds: StreamBounds,
    resume: Option<Resume>,
) -> OutboxBody {
    let (out, body) = outbox(bounds.buffer_bytes);
    permit.first_token();
    let first = started.first.clone();
    let engine_id = started.inflight.engine_id().to_string();
    let mut relay = SseRelay {
        encoder,
        engine: Some((started, permit)),
        engine_id,
        pool,
        pending: BytesMut::new(),
        resume,
        attempts: Attempts::default(),
        text: String::new(),
        tokens: 0,
        carried: 0,
        client_prompt_tokens: None,
        broken: None,
    };
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
    encoder: Wire,
    /// What the engine side holds (the event stream, the engine lease, the
    /// admission ticket, tenant hold and metrics in the permit) until it ends.
    engine: Option<(Started, Permit)>,
    engine_id: String,
    pool: Arc<EnginePool>,
    /// Encoded bytes not yet in the outbox.
    pending: BytesMut,
    /// How to go on elsewhere after a mid-stream failure (None: end the
    /// stream with an error event).
    resume: Option<Resume>,
    /// Engines this generation has failed on.
    attempts: Attempts,
    /// What has been relayed (kept only while `resume` is set).
    text: String,
    /// Tokens relayed, and of them those relayed before the engine now
    /// serving it started (its usage counts from there).
    tokens: u32,
    carried: u32,
    /// Once resumed: the client's prompt in tokens.
    client_prompt_tokens: Option<u32>,
    /// The engine side broke: why, and whether its connection did.
    broken: Option<(String, bool)>,
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
            if let Some((message, transport)) = self.broken.take() {
                match self.go_on_elsewhere(&message, transport, &out).await {
                    Ok(true) => {}
                    Ok(false) => self.fail(message, transport),
                    Err(stop) => return self.stopped(out, stop),
                }
                continue;
            }
            let Some((started, _)) = &mut self.engine else { break };
            let event = tokio::select! {
                e = tokio::time::timeout(bounds.event_timeout, started.events.next()) => e,
                () = out.gone() => return self.stopped(out, Stop::Gone),
            };
            match event {
                Ok(Some(e)) => self.on_event(e),
                Ok(None) => self.broken = Some(("engine closed the stream before finishing".into(), true)),
                Err(_) => {
                    self.broken =
                        Some((format!("no event from the engine for {:?}", bounds.event_timeout), false))
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
                self.tokens += 1;
                if self.resume.is_some() {
                    self.text.push_str(&text);
                }
                if let Some((_, permit)) = &mut self.engine {
                    permit.token();
                }
            }
            Ok(Event::Done { finish_reason, mut usage, prefill_ms, .. }) => {
                // A continuation's prompt held the text relayed before it:
                // that is the client's output, and its prompt is the one
                // it sent (as the gateway counts it for admission).
                if let Some(prompt_tokens) = self.client_prompt_tokens {
                    usage.prompt_tokens = prompt_tokens;
                    usage.completion_tokens += self.carried;
                    usage.cached_tokens = usage.cached_tokens.min(prompt_tokens);
                }
                self.encoder.finish(&mut self.pending, finish_reason, usage);
                if let Some((started, permit)) = &mut self.engine {
                    permit.finished(started.inflight.engine_idx(), usage, prefill_ms);
                }
                self.engine = None;
            }
            Ok(Event::Error { code, message }) => self.fail(format!("{code}: {message}"), false),
            Ok(Event::Upstream { json }) => {
                // Verbatim chunks carry text the relay does not track.
                self.resume = None;
                self.encoder.upstream(&mut self.pending, &json)
            }
            Err(message) => self.broken = Some((message, true)),
        }
    }

    /// After the engine side broke mid-stream: starts the rest of the
    /// generation on another of this project's engines, when it may
    /// ([`Resume`]) and attempts remain. `Ok(true)`: the stream goes on
    /// from the new engine's first event; `Ok(false)`: it cannot.
    async fn go_on_elsewhere(&mut self, message: &str, transport: bool, out: &Outbox) -> Result<bool, Stop> {
        let (Some((started, _)), Some(resume)) = (&self.engine, &self.resume) else { return Ok(false) };
        let failed = started.inflight.engine_idx();
        if self.pool.slot(failed).spec.kind != crate::engines::EngineKind::Native {
            return Ok(false); // a third-party engine was sent the client's messages
        }
        self.attempts.failed_after_start(started, message.to_string());
        if self.attempts.exhausted(&self.pool) {
            metrics::counter!(crate::metrics::STREAM_RESUMES, "outcome" => "failed").increment(1);
            return Ok(false);
        }
        if transport {
            self.pool.mark_unreachable(failed);
        }
        let rest = resume.out.continuation(&self.text, self.tokens);
        let (work, timeout) = (resume.work, resume.first_event_timeout);
        // Dropping the old event stream resets it at its engine; the
        // permit (admission ticket, tenant hold) stays with the stream.
        let Some((_, permit)) = self.engine.take() else { return Ok(false) };
        let started = tokio::select! {
            s = dispatch::start(&self.pool, &rest, None, work, timeout, &mut self.attempts) => s,
            () = out.gone() => return Err(Stop::Gone),
        };
        let started = match started {
            Ok(started) => started,
            Err(e) => {
                metrics::counter!(crate::metrics::STREAM_RESUMES, "outcome" => "failed").increment(1);
                tracing::warn!(event = "stream_resume_failed", error = %e);
                return Ok(false);
            }
        };
        let to = started.inflight.engine_id().to_string();
        tracing::warn!(event = "stream_resumed", from = %self.engine_id, engine = %to, tokens = self.tokens, error = %message);
        metrics::counter!(crate::metrics::STREAM_RESUMES, "outcome" => "resumed").increment(1);
        self.engine_id = to;
        self.carried = self.tokens;
        self.client_prompt_tokens = Some(policies::tokens::count(&resume.out.gen.prompt));
        let first = started.first.clone();
        self.engine = Some((started, permit));
        self.on_event(Ok(first));
        Ok(true)
    }

    /// Ends the stream with an error event in the answer's format (OpenAI's:
    /// no `[DONE]`) and
    /// cancels the engine side. `transport`: the engine connection failed,
    /// so the engine leaves rotation until its next good probe.
    fn fail(&mut self, message: String, transport: bool) {
        tracing::warn!(event = "stream_failed", engine = %self.engine_id, error = %message);
        metrics::counter!(crate::metrics::ERRORS, "code" => "engine_failed_mid_stream").increment(1);
        if let (true, Some((started, _))) = (transport, &self.engine) {
            self.pool.mark_unreachable(started.inflight.engine_idx());
        }
        let err = ApiError::EngineFailed(format!("engine {} failed mid-stream: {message}", self.engine_id));
        self.encoder.failed(&mut self.pending, &err);
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
