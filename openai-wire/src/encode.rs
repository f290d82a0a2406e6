//! Engine events to OpenAI response bytes: the streamed chunks (SSE) and
//! the whole (non-streaming) body of chat and text completions. Used by
//! the gateway's relay and by the engine's own OpenAI surface, so both
//! write the same bytes.

use bytes::{BufMut, BytesMut};
use engine_api::{FinishReason, Usage};
use serde_json::{json, Value};

use crate::request::Kind;

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
    pub fn object(&self, stream: bool) -> &'static str {
        match (self.kind, stream) {
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Completion, _) => "text_completion",
        }
    }

    pub fn chunk(&self, choice: Option<Value>) -> Value {
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
    pub fn opening(&self, out: &mut BytesMut) {
        if self.kind == Kind::Chat && !self.verbatim {
            self.framed(out, |out| {
                out.put_slice(br#"{"delta":{"content":"","role":"assistant"},"finish_reason":null,"index":0,"logprobs":null}"#)
            });
        }
    }

    /// A token chunk.
    pub fn token(&self, out: &mut BytesMut, text: &str) {
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

    pub fn finish(&self, out: &mut BytesMut, reason: FinishReason, usage: Usage) {
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

pub fn usage_json(u: Usage) -> Value {
    serde_json::to_value(UsageOut::from(u)).expect("usage always serialises")
}

/// `v` as JSON onto `out`.
fn json_to(out: &mut BytesMut, v: &(impl serde::Serialize + ?Sized)) {
    serde_json::to_writer(out.writer(), v).expect("what the encoder writes always serialises");
}

pub fn sse(out: &mut BytesMut, v: &Value) {
    out.put_slice(b"data: ");
    json_to(out, v);
    out.put_slice(b"\n\n");
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
