//! OpenAI's Responses API: `POST /v1/responses`, `GET` and `DELETE
//! /v1/responses/{id}`.
//!
//! A request is checked against the Responses schema (its parameter names
//! in every 400) and translated into an OpenAI chat request: `instructions`
//! becomes the first (system) message, then the stored conversation of
//! `previous_response_id` (its inputs and its answer, the prompt's prefix,
//! so prefix-aware routing keeps a conversation on the engine that caches
//! it), then `input` (a string, or message items whose content is a string
//! or `input_text` / `output_text` parts). Parameters:
//! - honoured: `model`, `input`, `instructions`, `max_output_tokens`,
//!   `temperature`, `stream`, `store` (default true),
//!   `previous_response_id`, `metadata` (echoed);
//! - accepted and ignored: `top_p`, `user`, `safety_identifier`,
//!   `prompt_cache_key`, `service_tier`, `parallel_tool_calls`,
//!   `truncation`;
//! - at their neutral values only: `tools: []`, `tool_choice` `auto` or
//!   `none`, `text.format` `text`, `reasoning` without an effort,
//!   `include: []`, `background: false`;
//! - anything else: a 400 naming it.
//!
//! Answers are `response` objects; a stream is the documented event
//! sequence (`response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`,
//! `response.output_text.delta` per token, `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`,
//! `response.completed`), each with its `sequence_number`; a failure after
//! the first bytes is `response.failed`. A stored response is kept by
//! [`ResponseStore`] when it ends.

use std::sync::Arc;

use bytes::BytesMut;
use engine_api::{FinishReason, Usage};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::event;
use crate::error::ApiError;

mod store;

pub use store::ResponsesConfig;
pub(crate) use store::{ResponseStore, Stored};

/// Most `metadata` pairs, and bytes of a key and of a value (OpenAI's).
const MAX_METADATA: usize = 16;
const MAX_METADATA_KEY: usize = 64;
const MAX_METADATA_VALUE: usize = 512;
/// Most input items in one request (as the chat parser bounds messages).
const MAX_ITEMS: usize = 4096;

/// A Responses request as an OpenAI chat request, and what its answer
/// echoes.
#[derive(Debug)]
pub(crate) struct Translated {
    /// The chat request's JSON body.
    pub chat: Vec<u8>,
    /// The conversation this request continues plus its own input (not the
    /// instructions): what a stored answer keeps for the next turn.
    pub conversation: Vec<Value>,
    pub echo: Echo,
}

/// The request's fields a `response` object echoes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Echo {
    pub model: String,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub temperature: Option<f64>,
    pub previous_response_id: Option<String>,
    pub metadata: Map<String, Value>,
    pub store: bool,
}

/// `previous`: the stored conversation of `previous_response_id` for the
/// caller's tenant (`None`: no such response, or another tenant's).
pub(crate) fn to_chat(
    body: &[u8],
    previous: impl FnOnce(&str) -> Option<Vec<Value>>,
) -> Result<Translated, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    let Value::Object(object) = value else {
        return Err(ApiError::InvalidJson("the body must be a JSON object".into()));
    };
    let mut chat = Map::new();
    let mut echo = Echo { store: true, ..Echo::default() };
    let mut unknown = Vec::new();
    for (key, value) in &object {
        if value.is_null() {
            continue;
        }
        match key.as_str() {
            "model" => echo.model = string(key, value)?.to_string(),
            "input" => {} // below
            "instructions" => echo.instructions = Some(string(key, value)?.to_string()),
            "max_output_tokens" => {
                let n = value.as_u64().filter(|n| *n >= 1 && *n <= u64::from(u32::MAX));
                let n = n.ok_or_else(|| invalid(key, "must be an integer >= 1"))? as u32;
                echo.max_output_tokens = Some(n);
                chat.insert("max_tokens".into(), json!(n));
            }
            "temperature" => {
                let t = value.as_f64().filter(|t| (0.0..=2.0).contains(t));
                let t = t.ok_or_else(|| invalid(key, "must be a number in [0, 2]"))?;
                echo.temperature = Some(t);
                chat.insert("temperature".into(), json!(t));
            }
            "stream" => {
                chat.insert("stream".into(), Value::Bool(boolean(key, value)?));
            }
            "store" => echo.store = boolean(key, value)?,
            "previous_response_id" => echo.previous_response_id = Some(string(key, value)?.to_string()),
            "metadata" => echo.metadata = metadata(value)?,
            "top_p" => {
                value.as_f64().ok_or_else(|| invalid(key, "must be a number"))?;
            }
            "user" | "safety_identifier" | "prompt_cache_key" | "service_tier" => {
                string(key, value)?;
            }
            "parallel_tool_calls" => {
                boolean(key, value)?;
            }
            "truncation" if matches!(value.as_str(), Some("auto" | "disabled")) => {}
            "tools" | "include" if value.as_array().is_some_and(Vec::is_empty) => {}
            "tool_choice" if matches!(value.as_str(), Some("auto" | "none")) => {}
            "text" if value.pointer("/format/type").is_none_or(|t| t == "text") => {}
            "reasoning" if value.get("effort").is_none_or(Value::is_null) => {}
            "background" if value == &Value::Bool(false) => {}
            "truncation" | "tools" | "include" | "tool_choice" | "text" | "reasoning" | "background" => {
                return Err(ApiError::UnsupportedParameter {
                    param: key.clone(),
                    message: "is not supported by this gateway (tools, structured output, reasoning and \
                              background responses are not served on this route)"
                        .into(),
                })
            }
            _ => unknown.push(key.clone()),
        }
    }
    if !unknown.is_empty() {
        unknown.sort();
        return Err(ApiError::UnknownParameters(unknown));
    }
    if echo.model.is_empty() {
        return Err(invalid("model", "you must provide a model parameter"));
    }
    let input =
        object.get("input").filter(|v| !v.is_null()).ok_or_else(|| invalid("input", "is required"))?;
    let mut conversation = match &echo.previous_response_id {
        Some(id) => previous(id).ok_or_else(|| ApiError::ResponseNotFound(id.clone()))?,
        None => Vec::new(),
    };
    conversation.extend(items(input)?);
    if conversation.len() > MAX_ITEMS {
        return Err(invalid("input", format!("at most {MAX_ITEMS} items in a conversation")));
    }
    let mut messages = Vec::with_capacity(conversation.len() + 1);
    if let Some(i) = &echo.instructions {
        messages.push(json!({"role": "system", "content": i}));
    }
    messages.extend(conversation.iter().cloned());
    chat.insert("model".into(), Value::String(echo.model.clone()));
    chat.insert("messages".into(), Value::Array(messages));
    let chat = serde_json::to_vec(&Value::Object(chat)).expect("a JSON value always serialises");
    Ok(Translated { chat, conversation, echo })
}

fn invalid(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::InvalidField { param: param.to_string(), message: message.into() }
}

fn string<'a>(key: &str, value: &'a Value) -> Result<&'a str, ApiError> {
    value.as_str().ok_or_else(|| invalid(key, "must be a string"))
}

fn boolean(key: &str, value: &Value) -> Result<bool, ApiError> {
    value.as_bool().ok_or_else(|| invalid(key, "must be a boolean"))
}

fn metadata(value: &Value) -> Result<Map<String, Value>, ApiError> {
    let Value::Object(m) = value else { return Err(invalid("metadata", "must be an object")) };
    if m.len() > MAX_METADATA {
        return Err(invalid("metadata", format!("at most {MAX_METADATA} pairs")));
    }
    for (k, v) in m {
        let ok = k.len() <= MAX_METADATA_KEY && v.as_str().is_some_and(|s| s.len() <= MAX_METADATA_VALUE);
        if !ok {
            return Err(invalid(
                &format!("metadata.{k}"),
                format!("keys are at most {MAX_METADATA_KEY} bytes, values strings of at most {MAX_METADATA_VALUE}"),
            ));
        }
    }
    Ok(m.clone())
}

/// `input` as chat messages: a string is one user message; a list holds
/// message items (`role` and `content`, `type: "message"` optional).
fn items(input: &Value) -> Result<Vec<Value>, ApiError> {
    match input {
        Value::String(s) => Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(list) => {
            if list.len() > MAX_ITEMS {
                return Err(invalid("input", format!("at most {MAX_ITEMS} items are allowed")));
            }
            list.iter().enumerate().map(|(i, item)| message_item(i, item)).collect()
        }
        _ => Err(invalid("input", "must be a string or a list of items")),
    }
}

fn message_item(i: usize, item: &Value) -> Result<Value, ApiError> {
    let at = |k: &str| format!("input[{i}].{k}");
    match item.get("type").and_then(Value::as_str) {
        None | Some("message") => {}
        Some(other) => {
            return Err(ApiError::UnsupportedParameter {
                param: at("type"),
                message: format!("input items of type `{other}` are not supported; send messages"),
            })
        }
    }
    let role = match item.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant" | "system" | "developer")) => r,
        _ => return Err(invalid(&at("role"), "must be `user`, `assistant`, `system` or `developer`")),
    };
    let content = match item.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            if parts.len() > 256 {
                return Err(invalid(&at("content"), "at most 256 parts are allowed"));
            }
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("input_text" | "output_text"), Some(t)) => text.push_str(t),
                    (Some("input_text" | "output_text"), None) => {
                        return Err(invalid(&at(&format!("content[{j}].text")), "must be a string"))
                    }
                    (Some(other), _) => {
                        return Err(ApiError::UnsupportedParameter {
                            param: at(&format!("content[{j}].type")),
                            message: format!("content of type `{other}` is not supported; use `input_text`"),
                        })
                    }
                    (None, _) => return Err(invalid(&at(&format!("content[{j}].type")), "is required")),
                }
            }
            text
        }
        _ => return Err(invalid(&at("content"), "must be a string or a list of parts")),
    };
    Ok(json!({"role": role, "content": content}))
}

/// Where a stored answer goes when it ends.
#[derive(Debug)]
pub(crate) struct Saver {
    pub store: Arc<ResponseStore>,
    pub tenant: String,
    /// The conversation up to this answer (the answer is appended).
    pub conversation: Vec<Value>,
}

/// Writes engine events as a `response` object and its stream events.
#[derive(Debug)]
pub(crate) struct Encoder {
    pub id: String,
    pub stream: bool,
    pub created_at: u64,
    pub echo: Echo,
    /// The output message item's id.
    pub item_id: String,
    /// Set when `store` is on.
    pub saver: Option<Saver>,
    /// The text so far (the `done` events and the stored answer repeat it).
    text: String,
    sequence: u64,
}

impl Encoder {
    pub fn new(id: String, stream: bool, echo: Echo, saver: Option<Saver>) -> Self {
        let item_id = format!("msg_{}", id.trim_start_matches("resp_"));
        Self {
            id,
            stream,
            created_at: super::unix_now(),
            echo,
            item_id,
            saver,
            text: String::new(),
            sequence: 0,
        }
    }

    fn emit(&mut self, out: &mut BytesMut, name: &str, mut data: Value) {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        event(out, name, &data);
    }

    /// The output message item.
    fn item(&self, done: bool) -> Value {
        let content = if done { vec![self.part()] } else { Vec::new() };
        json!({"type": "message", "id": self.item_id, "status": if done { "completed" } else { "in_progress" },
               "role": "assistant", "content": content})
    }

    fn part(&self) -> Value {
        json!({"type": "output_text", "text": self.text, "annotations": [], "logprobs": []})
    }

    /// The `response` object: in progress (no output yet), or ended.
    fn response(&self, ended: Option<(FinishReason, Usage)>) -> Value {
        let (status, incomplete, output, usage) = match ended {
            None => ("in_progress", Value::Null, Vec::new(), Value::Null),
            Some((reason, u)) => {
                let (status, incomplete) = match reason {
                    FinishReason::Stop => ("completed", Value::Null),
                    FinishReason::Length => ("incomplete", json!({"reason": "max_output_tokens"})),
                };
                let usage = json!({
                    "input_tokens": u.prompt_tokens,
                    "input_tokens_details": {"cached_tokens": u.cached_tokens},
                    "output_tokens": u.completion_tokens,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": u.prompt_tokens + u.completion_tokens,
                });
                (status, incomplete, vec![self.item(true)], usage)
            }
        };
        let e = &self.echo;
        json!({
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "error": null, "incomplete_details": incomplete, "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens, "model": e.model, "output": output,
            "parallel_tool_calls": true, "previous_response_id": e.previous_response_id,
            "reasoning": {"effort": null, "summary": null}, "store": e.store,
            "temperature": e.temperature.unwrap_or(1.0), "text": {"format": {"type": "text"}},
            "tool_choice": "auto", "tools": [], "top_p": 1.0, "truncation": "disabled",
            "usage": usage, "metadata": e.metadata,
        })
    }

    pub fn opening(&mut self, out: &mut BytesMut) {
        let response = self.response(None);
        self.emit(out, "response.created", json!({"response": response}));
        self.emit(out, "response.in_progress", json!({"response": response}));
        let item = self.item(false);
        self.emit(out, "response.output_item.added", json!({"output_index": 0, "item": item}));
        let part = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
        let id = self.item_id.clone();
        self.emit(
            out,
            "response.content_part.added",
            json!({"item_id": id, "output_index": 0, "content_index": 0, "part": part}),
        );
    }

    pub fn token(&mut self, out: &mut BytesMut, text: &str) {
        self.text.push_str(text);
        let id = self.item_id.clone();
        self.emit(
            out,
            "response.output_text.delta",
            json!({"item_id": id, "output_index": 0, "content_index": 0, "delta": text, "logprobs": []}),
        );
    }

    pub fn finish(&mut self, out: &mut BytesMut, reason: FinishReason, usage: Usage) {
        let id = self.item_id.clone();
        let (text, part, item) = (self.text.clone(), self.part(), self.item(true));
        self.emit(
            out,
            "response.output_text.done",
            json!({"item_id": id, "output_index": 0, "content_index": 0, "text": text, "logprobs": []}),
        );
        self.emit(
            out,
            "response.content_part.done",
            json!({"item_id": id, "output_index": 0, "content_index": 0, "part": part}),
        );
        self.emit(out, "response.output_item.done", json!({"output_index": 0, "item": item}));
        let response = self.response(Some((reason, usage)));
        self.save(&response);
        let name = if reason == FinishReason::Stop { "response.completed" } else { "response.incomplete" };
        self.emit(out, name, json!({"response": response}));
    }

    pub fn complete(&mut self, text: &str, reason: FinishReason, usage: Usage) -> Vec<u8> {
        self.text = text.to_string();
        let response = self.response(Some((reason, usage)));
        self.save(&response);
        serde_json::to_vec(&response).expect("a JSON value always serialises")
    }

    pub fn failed(&mut self, out: &mut BytesMut, error: &ApiError) {
        let mut response = self.response(None);
        response["status"] = json!("failed");
        response["error"] = json!({"code": "server_error", "message": error.to_string()});
        self.emit(out, "response.failed", json!({"response": response}));
    }

    fn save(&mut self, response: &Value) {
        let Some(saver) = self.saver.take() else { return };
        let mut conversation = saver.conversation;
        conversation.push(json!({"role": "assistant", "content": self.text}));
        saver.store.save(&saver.tenant, Stored { response: response.clone(), conversation });
    }
}

/// The `previous_response_id` of a request body, if it names one (read
/// before the stored conversation is fetched).
pub(crate) fn previous_id(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Peek {
        previous_response_id: Option<String>,
    }
    serde_json::from_slice::<Peek>(body).ok()?.previous_response_id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value, previous: Option<Vec<Value>>) -> Result<(Value, Translated), ApiError> {
        let t = to_chat(body.to_string().as_bytes(), |_| previous)?;
        Ok((serde_json::from_slice(&t.chat).unwrap(), t))
    }

    #[test]
    fn input_instructions_and_the_previous_conversation_become_one_chat_request() {
        let (c, t) = chat(
            json!({"model": "m", "input": "hello", "instructions": "be brief", "max_output_tokens": 9,
                   "temperature": 0.2, "stream": true, "store": false, "top_p": 0.5, "tools": [], "text": {"format": {"type": "text"}}}),
            None,
        )
        .unwrap();
        assert_eq!(
            c,
            json!({"model": "m", "max_tokens": 9, "temperature": 0.2, "stream": true,
                   "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]})
        );
        assert!(!t.echo.store);
        let before =
            vec![json!({"role": "user", "content": "hello"}), json!({"role": "assistant", "content": "hi!"})];
        let (c, t) = chat(
            json!({"model": "m", "previous_response_id": "resp_1",
                   "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and?"}]}]}),
            Some(before),
        )
        .unwrap();
        assert_eq!(c["messages"].as_array().unwrap().len(), 3, "{c}");
        assert_eq!(t.conversation.len(), 3);
        let e =
            chat(json!({"model": "m", "input": "x", "previous_response_id": "resp_gone"}), None).unwrap_err();
        assert_eq!((e.status().as_u16(), e.code()), (404, "response_not_found"));
    }

    #[test]
    fn refusals_name_the_responses_parameters() {
        let cases = [
            (json!({"input": "x"}), "model", "invalid_value"),
            (json!({"model": "m"}), "input", "invalid_value"),
            (
                json!({"model": "m", "input": "x", "max_output_tokens": 0}),
                "max_output_tokens",
                "invalid_value",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}),
                "tools",
                "unsupported_parameter",
            ),
            (
                json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}),
                "input[0].content[0].type",
                "unsupported_parameter",
            ),
            (
                json!({"model": "m", "input": [{"type": "function_call_output", "output": "x"}]}),
                "input[0].type",
                "unsupported_parameter",
            ),
            (json!({"model": "m", "input": "x", "frobnicate": 1}), "frobnicate", "unknown_parameter"),
            (json!({"model": "m", "input": "x", "metadata": {"k": 1}}), "metadata.k", "invalid_value"),
        ];
        for (body, param, code) in cases {
            let e = chat(body.clone(), None).unwrap_err();
            assert_eq!((e.param(), e.code()), (Some(param), code), "{body}: {e}");
        }
    }

    #[test]
    fn the_stream_is_the_documented_event_sequence_and_the_answer_is_stored() {
        let store = Arc::new(ResponseStore::new(ResponsesConfig::default()));
        let saver = Saver {
            store: Arc::clone(&store),
            tenant: "acme".into(),
            conversation: vec![json!({"role": "user", "content": "hi"})],
        };
        let echo = Echo { model: "m".into(), store: true, ..Echo::default() };
        let mut e = Encoder::new("resp_1".into(), true, echo, Some(saver));
        let mut out = BytesMut::new();
        e.opening(&mut out);
        e.token(&mut out, "Hel");
        e.token(&mut out, "lo");
        e.finish(
            &mut out,
            FinishReason::Stop,
            Usage { prompt_tokens: 4, completion_tokens: 2, cached_tokens: 0 },
        );
        let text = String::from_utf8(out.to_vec()).unwrap();
        let events: Vec<Value> = text
            .split("\n\n")
            .filter(|b| !b.is_empty())
            .map(|b| serde_json::from_str(b.split_once("\ndata: ").unwrap().1).unwrap())
            .collect();
        let names: Vec<_> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        let seq: Vec<_> = events.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
        assert_eq!(seq, (0..10).collect::<Vec<_>>());
        let done = &events[9]["response"];
        assert_eq!(
            (&done["status"], &done["output"][0]["content"][0]["text"]),
            (&json!("completed"), &json!("Hello"))
        );
        assert_eq!(done["usage"]["total_tokens"], 6);
        let stored = store.get("acme", "resp_1").unwrap();
        assert_eq!(stored.conversation.last().unwrap(), &json!({"role": "assistant", "content": "Hello"}));
        assert!(store.get("other-tenant", "resp_1").is_none(), "tenant-scoped");
    }
}
