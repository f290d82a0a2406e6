//! Engine events (or an OpenAI upstream's answer) written as Anthropic's
//! `message` object or its stream events.

use bytes::BytesMut;
use engine_api::{FinishReason, Usage};
use serde_json::{json, Value};

use super::super::event;

/// Anthropic's `stop_reason` for an engine's finish.
fn stop_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "end_turn",
        FinishReason::Length => "max_tokens",
    }
}

/// Anthropic's `usage` object.
fn usage_json(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens.saturating_sub(u.cached_tokens),
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": u.completion_tokens,
    })
}

/// Anthropic's `stop_reason` for an OpenAI `finish_reason`.
fn stop_reason_of(finish: &str) -> &'static str {
    match finish {
        "tool_calls" | "function_call" => "tool_use",
        "length" => "max_tokens",
        _ => "end_turn",
    }
}

/// Writes engine events as Anthropic's message and stream events.
#[derive(Debug, Default)]
pub(crate) struct Encoder {
    pub id: String,
    pub model: String,
    pub stream: bool,
    /// The prompt's tokens as the gateway counted them: `message_start`'s
    /// usage (the engine's own count comes in `message_delta`).
    pub input_tokens: u32,
    /// An upstream's OpenAI answer (tool use) is translated
    /// ([`Encoder::upstream`], [`Encoder::complete_upstream`]).
    pub verbatim: bool,
    /// The open content block, if any (translated streams open blocks as
    /// the upstream's deltas call for them).
    open: Option<Open>,
    /// Blocks opened so far (the next block's index).
    blocks: usize,
    /// The upstream's finish reason and usage, once seen.
    finish: Option<String>,
    usage: Option<Usage>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Open {
    Text,
    /// A tool call, by the upstream's `tool_calls` index.
    Tool(u64),
}

impl Encoder {
    pub fn new(id: String, model: String, stream: bool, input_tokens: u32, verbatim: bool) -> Self {
        Self { id, model, stream, input_tokens, verbatim, ..Self::default() }
    }

    fn close(&mut self, out: &mut BytesMut) {
        if self.open.take().is_some() {
            event(
                out,
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": self.blocks - 1}),
            );
        }
    }

    fn start(&mut self, out: &mut BytesMut, open: Open, block: Value) {
        self.close(out);
        event(
            out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": self.blocks, "content_block": block}),
        );
        self.open = Some(open);
        self.blocks += 1;
    }

    /// One OpenAI chunk of an upstream's stream, as Anthropic's events:
    /// content as `text_delta`s, each tool call as a `tool_use` block whose
    /// arguments arrive as `input_json_delta`s.
    pub fn upstream(&mut self, out: &mut BytesMut, chunk: &str) {
        let Ok(c) = serde_json::from_str::<Value>(chunk) else { return };
        if let Some(u) = c.get("usage").filter(|u| u.is_object()) {
            let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0) as u32;
            self.usage = Some(Usage {
                prompt_tokens: n("prompt_tokens"),
                completion_tokens: n("completion_tokens"),
                cached_tokens: 0,
            });
        }
        let Some(choice) = c.pointer("/choices/0") else { return };
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_string());
        }
        let delta = &choice["delta"];
        if let Some(text) = delta.get("content").and_then(Value::as_str).filter(|t| !t.is_empty()) {
            if self.open != Some(Open::Text) {
                self.start(out, Open::Text, json!({"type": "text", "text": ""}));
            }
            let index = self.blocks - 1;
            event(
                out,
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "text_delta", "text": text}}),
            );
        }
        for call in delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            let at = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            if self.open != Some(Open::Tool(at)) {
                let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
                let name = call.pointer("/function/name").and_then(Value::as_str).unwrap_or_default();
                self.start(
                    out,
                    Open::Tool(at),
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                );
            }
            if let Some(args) =
                call.pointer("/function/arguments").and_then(Value::as_str).filter(|a| !a.is_empty())
            {
                let index = self.blocks - 1;
                event(
                    out,
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": args}}),
                );
            }
        }
    }

    /// An upstream's whole OpenAI answer as Anthropic's message.
    pub fn complete_upstream(&mut self, answer: &str) -> Vec<u8> {
        let doc: Value = serde_json::from_str(answer).unwrap_or(Value::Null);
        let message = &doc["choices"][0]["message"];
        let mut content = Vec::new();
        if let Some(t) = message.get("content").and_then(Value::as_str).filter(|t| !t.is_empty()) {
            content.push(json!({"type": "text", "text": t}));
        }
        for call in message.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            let args = call.pointer("/function/arguments").and_then(Value::as_str).unwrap_or("{}");
            let input = serde_json::from_str::<Value>(args).unwrap_or_else(|_| json!({}));
            content.push(json!({"type": "tool_use", "id": call.get("id").cloned().unwrap_or_default(),
                                "name": call.pointer("/function/name").cloned().unwrap_or_default(), "input": input}));
        }
        let finish = doc["choices"][0]["finish_reason"].as_str().unwrap_or("stop");
        let n = |k: &str| doc["usage"][k].as_u64().unwrap_or(0);
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
            "stop_reason": stop_reason_of(finish), "stop_sequence": null,
            "usage": {"input_tokens": n("prompt_tokens"), "cache_read_input_tokens": 0,
                      "cache_creation_input_tokens": 0, "output_tokens": n("completion_tokens")},
        });
        serde_json::to_vec(&message).expect("a JSON value always serialises")
    }

    pub fn opening(&mut self, out: &mut BytesMut) {
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.input_tokens, "cache_read_input_tokens": 0,
                      "cache_creation_input_tokens": 0, "output_tokens": 0},
        });
        event(out, "message_start", &json!({"type": "message_start", "message": message}));
        if !self.verbatim {
            // The one text block, opened at once (as Anthropic's API does).
            self.start(out, Open::Text, json!({"type": "text", "text": ""}));
        }
        event(out, "ping", &json!({"type": "ping"}));
    }

    pub fn token(&mut self, out: &mut BytesMut, text: &str) {
        event(
            out,
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        );
    }

    pub fn finish(&mut self, out: &mut BytesMut, reason: FinishReason, usage: Usage) {
        self.close(out);
        let stop = match &self.finish {
            Some(f) => stop_reason_of(f),
            None => stop_reason(reason),
        };
        let usage = self.usage.unwrap_or(usage);
        event(
            out,
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": null},
                    "usage": usage_json(usage)}),
        );
        event(out, "message_stop", &json!({"type": "message_stop"}));
    }

    pub fn complete(&mut self, text: &str, reason: FinishReason, usage: Usage) -> Vec<u8> {
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": stop_reason(reason), "stop_sequence": null,
            "usage": usage_json(usage),
        });
        serde_json::to_vec(&message).expect("a JSON value always serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_anthropics_event_sequence() {
        let mut e = Encoder::new("msg_1".into(), "m".into(), true, 7, false);
        let mut out = BytesMut::new();
        e.opening(&mut out);
        e.token(&mut out, "Hel");
        e.token(&mut out, "lo \"x\"");
        e.finish(
            &mut out,
            FinishReason::Length,
            Usage { prompt_tokens: 7, completion_tokens: 2, cached_tokens: 0 },
        );
        let text = String::from_utf8(out.to_vec()).unwrap();
        let events: Vec<(&str, Value)> = text
            .split("\n\n")
            .filter(|b| !b.is_empty())
            .map(|b| {
                let (name, data) = b.split_once('\n').unwrap();
                (
                    name.strip_prefix("event: ").unwrap(),
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap(),
                )
            })
            .collect();
        let names: Vec<_> = events.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "ping",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        for (name, data) in &events {
            assert_eq!(data["type"], *name, "each event's type is its name");
        }
        assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 7);
        assert_eq!(events[4].1["delta"]["text"], "lo \"x\"");
        assert_eq!(events[6].1["delta"]["stop_reason"], "max_tokens");
        assert_eq!(events[6].1["usage"]["output_tokens"], 2);
        let whole: Value =
            serde_json::from_slice(&e.complete("Hello", FinishReason::Stop, Usage::default())).unwrap();
        assert_eq!(
            (&whole["type"], &whole["stop_reason"], &whole["content"][0]["text"]),
            (&json!("message"), &json!("end_turn"), &json!("Hello"))
        );
    }
}
