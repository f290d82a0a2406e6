//! The wire formats of the generation routes: OpenAI's Chat Completions
//! and Completions (`openai-wire`), Anthropic's Messages ([`anthropic`])
//! and OpenAI's Responses ([`responses`]).
//!
//! One request path, several wire formats: a Messages or Responses request
//! is translated into an OpenAI chat request (so the same parser bounds and
//! validates it, the same chat template renders it, and an OpenAI-speaking
//! upstream is sent a chat request), goes through the same tenant limits,
//! admission, gate, dispatch and relay, and its answer is written back in
//! its own format by a [`Wire`] encoder. Errors take the format's shape in
//! the stack's error layer ([`Dialect`]).

use bytes::{BufMut, BytesMut};
use engine_api::{FinishReason, Usage};
use openai_wire::encode::{sse, Encoder};

use crate::error::ApiError;

pub(crate) mod anthropic;
pub mod responses;

pub(crate) use crate::error::Dialect;

/// Writes a generation's answer in the format its request came in.
#[derive(Debug)]
pub(crate) enum Wire {
    OpenAi(Encoder),
    Anthropic(anthropic::Encoder),
    Responses(Box<responses::Encoder>),
}

impl Wire {
    /// Whether the client asked for a stream (SSE).
    pub fn stream(&self) -> bool {
        match self {
            Wire::OpenAi(e) => e.stream,
            Wire::Anthropic(e) => e.stream,
            Wire::Responses(e) => e.stream,
        }
    }

    /// What a streamed answer opens with, before the first token.
    pub fn opening(&mut self, out: &mut BytesMut) {
        match self {
            Wire::OpenAi(e) => e.opening(out),
            Wire::Anthropic(e) => e.opening(out),
            Wire::Responses(e) => e.opening(out),
        }
    }

    /// A streamed token.
    pub fn token(&mut self, out: &mut BytesMut, text: &str) {
        match self {
            Wire::OpenAi(e) => e.token(out, text),
            Wire::Anthropic(e) => e.token(out, text),
            Wire::Responses(e) => e.token(out, text),
        }
    }

    /// The end of a streamed answer.
    pub fn finish(&mut self, out: &mut BytesMut, reason: FinishReason, usage: Usage) {
        match self {
            Wire::OpenAi(e) => e.finish(out, reason, usage),
            Wire::Anthropic(e) => e.finish(out, reason, usage),
            Wire::Responses(e) => e.finish(out, reason, usage),
        }
    }

    /// A chunk of an upstream's answer relayed verbatim (an OpenAI chunk,
    /// re-stamped): as it is on OpenAI's routes, translated on Anthropic's.
    pub fn upstream(&mut self, out: &mut BytesMut, json: &str) {
        match self {
            Wire::Anthropic(e) if e.verbatim => e.upstream(out, json),
            _ => {
                out.put_slice(b"data: ");
                out.put_slice(json.as_bytes());
                out.put_slice(b"\n\n");
            }
        }
    }

    /// An upstream's whole answer relayed verbatim: as it is on OpenAI's
    /// routes, translated on Anthropic's.
    pub fn complete_upstream(&mut self, answer: String) -> Vec<u8> {
        match self {
            Wire::Anthropic(e) => e.complete_upstream(&answer),
            _ => answer.into_bytes(),
        }
    }

    /// A whole (non-streamed) answer's body.
    pub fn complete(&mut self, text: &str, reason: FinishReason, usage: Usage) -> Vec<u8> {
        match self {
            Wire::OpenAi(e) => e.complete(text, reason, usage),
            Wire::Anthropic(e) => e.complete(text, reason, usage),
            Wire::Responses(e) => e.complete(text, reason, usage),
        }
    }

    /// A stream that fails after its first bytes ends with an error event
    /// in the format's shape (OpenAI: a `data:` error object and no
    /// `[DONE]`; Anthropic: an `error` event; Responses: `response.failed`).
    pub fn failed(&mut self, out: &mut BytesMut, error: &ApiError) {
        match self {
            Wire::OpenAi(_) => sse(out, &error.body()),
            Wire::Anthropic(_) => event(out, "error", &error.body_as(Dialect::Anthropic)),
            Wire::Responses(e) => e.failed(out, error),
        }
    }

    /// How a verbatim upstream answer is re-stamped (OpenAI's routes, and
    /// Anthropic's tool use; the Responses API refuses the parameters that
    /// make an answer verbatim).
    pub fn stamp(&self) -> Option<crate::upstream::Stamp> {
        match self {
            Wire::OpenAi(e) if e.verbatim => Some(crate::upstream::Stamp {
                id: e.id.clone(),
                model: e.model.clone(),
                stream: e.stream,
                include_usage: e.include_usage,
            }),
            // The usage chunk is kept: it becomes `message_delta`'s usage.
            Wire::Anthropic(e) if e.verbatim => Some(crate::upstream::Stamp {
                id: e.id.clone(),
                model: e.model.clone(),
                stream: e.stream,
                include_usage: true,
            }),
            _ => None,
        }
    }
}

/// A named SSE event (`event: NAME` + `data: JSON`), as Anthropic's and
/// the Responses API's streams write every event.
pub(crate) fn event(out: &mut BytesMut, name: &str, data: &serde_json::Value) {
    out.put_slice(b"event: ");
    out.put_slice(name.as_bytes());
    out.put_slice(b"\ndata: ");
    serde_json::to_writer(out.writer(), data).expect("a JSON value always serialises");
    out.put_slice(b"\n\n");
}

/// Seconds since the epoch (the `created` / `created_at` fields).
pub(crate) fn unix_now() -> u64 {
    crate::clock::wall().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
