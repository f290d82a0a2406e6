//! Third-party OpenAI-compatible engines (`kind = "openai"`: vLLM, SGLang,
//! TGI, llama.cpp server): what the gateway sends them and how their
//! answers become the engine events the rest of the request path reads.
//!
//! The gateway always asks an upstream for a stream (with usage), whether
//! or not its own client streams: the first chunk is the first token (the
//! gateway measures TTFT and retries before it, as with its own engines),
//! and the relay re-encodes tokens under the gateway's ids exactly as for a
//! native engine. The client's body goes up as sent (chat messages keep
//! the upstream model's own template), with `model`, `max_tokens` (after
//! admission's degradation), `temperature` (when admission made a request
//! greedy), `stream` and `stream_options` set by the gateway.

use std::collections::VecDeque;

use bytes::Bytes;
use engine_api::{Event, FinishReason, GenerateRequest, Usage};
use serde_json::{Map, Value};

use crate::openai::Kind;

/// What a request asks an upstream for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamRoute {
    Chat,
    Completion,
    Embeddings,
}

impl From<Kind> for UpstreamRoute {
    fn from(kind: Kind) -> Self {
        match kind {
            Kind::Chat => Self::Chat,
            Kind::Completion => Self::Completion,
        }
    }
}

/// The upstream path for a route.
pub fn path(route: UpstreamRoute) -> &'static str {
    match route {
        UpstreamRoute::Chat => "/v1/chat/completions",
        UpstreamRoute::Completion => "/v1/completions",
        UpstreamRoute::Embeddings => "/v1/embeddings",
    }
}

/// An embeddings request's body as sent upstream: the client's, with the
/// upstream's own model id.
pub fn embeddings_body(client: &[u8], model: &str) -> Result<Bytes, String> {
    let mut doc: Map<String, Value> =
        serde_json::from_slice(client).map_err(|e| format!("client body: {e}"))?;
    doc.insert("model".into(), Value::from(model));
    serde_json::to_vec(&doc).map(Bytes::from).map_err(|e| e.to_string())
}

/// How an answer relayed verbatim (tool calls, several choices,
/// log-probabilities) is re-stamped for the client: the gateway's id and
/// the public model name, usage only if the client asked for it.
#[derive(Debug, Clone)]
pub struct Stamp {
    pub id: String,
    pub model: String,
    /// The client streams (else the upstream is asked for one JSON answer).
    pub stream: bool,
    pub include_usage: bool,
}

impl Stamp {
    fn apply(&self, doc: &mut Value) {
        if let Some(o) = doc.as_object_mut() {
            if o.contains_key("id") {
                o.insert("id".into(), Value::from(self.id.as_str())); // answers that have one
            }
            o.insert("model".into(), Value::from(self.model.as_str()));
        }
    }
}

/// Longest whole (non-streamed) answer read from an upstream.
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// The body sent upstream: the client's, with the gateway's decisions.
/// `served_model`: the upstream's own id for the model, if it differs;
/// `stream`: ask for a stream (always, except a verbatim answer for a
/// client that does not stream).
pub fn body(
    client: &[u8],
    gen: &GenerateRequest,
    served_model: Option<&str>,
    stream: bool,
) -> Result<Bytes, String> {
    let mut doc: Map<String, Value> =
        serde_json::from_slice(client).map_err(|e| format!("client body: {e}"))?;
    doc.insert("model".into(), Value::from(served_model.unwrap_or(&gen.model)));
    doc.remove("max_completion_tokens");
    doc.insert("max_tokens".into(), Value::from(gen.max_tokens));
    if gen.temperature.is_none() && doc.get("temperature").and_then(Value::as_f64).is_some_and(|t| t > 0.0) {
        doc.insert("temperature".into(), Value::from(0.0)); // admission made it greedy
    }
    doc.insert("stream".into(), Value::Bool(stream));
    if stream {
        let mut options = Map::new();
        options.insert("include_usage".into(), Value::Bool(true));
        doc.insert("stream_options".into(), Value::Object(options));
    } else {
        doc.remove("stream_options");
    }
    serde_json::to_vec(&doc).map(Bytes::from).map_err(|e| e.to_string())
}

/// Turns an upstream's SSE lines into engine events: a token per content
/// delta, then one `Done` (with the upstream's usage, else the tokens
/// counted here) or one `Error`.
#[derive(Debug, Default)]
pub struct SseDecoder {
    ready: VecDeque<Event>,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
    tokens: u32,
    ended: bool,
    /// The upstream's time to its first event, reported as the prefill
    /// time of its `Done` (the estimator's prefill learning).
    prefill_ms: f64,
    /// Relay chunks as they are (re-stamped) instead of decoding tokens.
    stamp: Option<Stamp>,
}

/// Longest stretch of text one SSE chunk may carry as a token (bytes).
const MAX_DELTA_BYTES: usize = 64 << 10;

impl SseDecoder {
    /// A decoder that relays each chunk as it is, re-stamped.
    pub fn verbatim(stamp: Stamp) -> Self {
        Self { stamp: Some(stamp), ..Self::default() }
    }

    /// A whole (non-streamed) answer, relayed re-stamped, then its end.
    pub fn whole(stamp: Stamp, answer: &[u8]) -> Result<Self, String> {
        let mut doc: Value = serde_json::from_slice(answer).map_err(|e| format!("bad answer: {e}"))?;
        let mut d = Self::verbatim(stamp);
        if let Some(err) = doc.get("error") {
            d.ready.push_back(error_event(err));
            d.ended = true;
            return Ok(d);
        }
        d.observe(&doc);
        if let Some(stamp) = &d.stamp {
            stamp.apply(&mut doc);
        }
        d.ready.push_back(Event::Upstream { json: doc.to_string() });
        d.finish_now();
        Ok(d)
    }

    /// The next decoded event, if one is waiting.
    pub fn pop(&mut self) -> Option<Event> {
        self.ready.pop_front()
    }

    /// Records the upstream's time to first event (its queue and prefill,
    /// as the gateway saw them).
    pub fn set_prefill_ms(&mut self, ms: f64) {
        self.prefill_ms = ms;
    }

    /// Whether the upstream's stream has ended (`[DONE]`, or an error).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Feeds one line (without its newline).
    pub fn line(&mut self, line: &[u8]) -> Result<(), String> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return Ok(()); // blank separators, comments, `event:` and `id:` lines
        };
        if self.ended {
            return Err("data after the end of the stream".into());
        }
        let data = data.strip_prefix(b" ").unwrap_or(data);
        if data == b"[DONE]" {
            self.finish_now();
            return Ok(());
        }
        if data.len() > MAX_DELTA_BYTES {
            return Err(format!("a chunk longer than {MAX_DELTA_BYTES} bytes"));
        }
        let chunk: Value = serde_json::from_slice(data).map_err(|e| format!("bad SSE chunk: {e}"))?;
        if let Some(err) = chunk.get("error") {
            self.ready.push_back(error_event(err));
            self.ended = true;
            return Ok(());
        }
        if self.stamp.is_some() {
            self.relay(chunk);
            return Ok(());
        }
        if let Some(choice) = chunk.get("choices").and_then(Value::as_array).and_then(|c| c.first()) {
            let text = choice.get("delta").and_then(|d| d.get("content")).or_else(|| choice.get("text"));
            if let Some(text) = text.and_then(Value::as_str).filter(|t| !t.is_empty()) {
                if text.len() > MAX_DELTA_BYTES {
                    return Err(format!("a delta longer than {MAX_DELTA_BYTES} bytes"));
                }
                self.tokens += 1;
                self.ready.push_back(Event::Token { text: text.to_string() });
            }
            match choice.get("finish_reason").and_then(Value::as_str) {
                Some("length") => self.finish = Some(FinishReason::Length),
                Some(_) => self.finish = Some(FinishReason::Stop),
                None => {}
            }
        }
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(usage_of(u));
        }
        Ok(())
    }

    /// A verbatim chunk: noted, re-stamped, queued (the usage chunk only if
    /// the client asked for usage).
    fn relay(&mut self, mut chunk: Value) {
        self.observe(&chunk);
        let Some(stamp) = &self.stamp else { return };
        let usage_only = chunk.get("choices").and_then(Value::as_array).is_some_and(Vec::is_empty);
        if !stamp.include_usage {
            if usage_only {
                return; // asked for by the gateway, not the client
            }
            if let Some(o) = chunk.as_object_mut() {
                o.remove("usage");
            }
        }
        stamp.apply(&mut chunk);
        self.ready.push_back(Event::Upstream { json: chunk.to_string() });
    }

    /// Notes a verbatim chunk's (or answer's) finish reason, usage and
    /// token count.
    fn observe(&mut self, doc: &Value) {
        let choices = doc.get("choices").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        if !choices.is_empty() {
            self.tokens += 1;
        }
        for c in choices {
            match c.get("finish_reason").and_then(Value::as_str) {
                Some("length") => self.finish = Some(FinishReason::Length),
                Some(_) => self.finish = self.finish.or(Some(FinishReason::Stop)),
                None => {}
            }
        }
        if let Some(u) = doc.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(usage_of(u));
        }
    }

    fn finish_now(&mut self) {
        if self.ended {
            return;
        }
        let usage = self.usage.unwrap_or(Usage {
            prompt_tokens: 0,
            completion_tokens: self.tokens,
            cached_tokens: 0,
        });
        self.ready.push_back(Event::Done {
            finish_reason: self.finish.unwrap_or(FinishReason::Stop),
            usage,
            queue_ms: 0.0,
            prefill_ms: self.prefill_ms,
        });
        self.ended = true;
    }
}

/// An OpenAI-style error answer (`{"error": {"message", "type", "code"}}`)
/// as an engine's error body.
pub fn error_body(bytes: &[u8]) -> Option<engine_api::ErrorBody> {
    let doc: Value = serde_json::from_slice(bytes).ok()?;
    let err = doc.get("error")?;
    let message = err.get("message").and_then(Value::as_str).unwrap_or_default().to_string();
    let code =
        err.get("type").or_else(|| err.get("code")).map_or_else(|| "upstream_error".into(), value_text);
    Some(engine_api::ErrorBody { code, message })
}

/// An upstream's OpenAI `usage`, with its prompt-cache hits
/// (`prompt_tokens_details.cached_tokens`, as vLLM and SGLang report them).
fn usage_of(u: &Value) -> Usage {
    let at = |v: Option<&Value>| v.and_then(Value::as_u64).map_or(0, |v| v.min(u64::from(u32::MAX)) as u32);
    Usage {
        prompt_tokens: at(u.get("prompt_tokens")),
        completion_tokens: at(u.get("completion_tokens")),
        cached_tokens: at(u.pointer("/prompt_tokens_details/cached_tokens")),
    }
}

fn error_event(err: &Value) -> Event {
    let message = err.get("message").and_then(Value::as_str).unwrap_or("upstream error").to_string();
    let code = err.get("code").map_or_else(|| "upstream_error".to_string(), value_text);
    Event::Error { code, message }
}

fn value_text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

#[cfg(test)]
mod tests;
