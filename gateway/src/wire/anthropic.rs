//! Anthropic's Messages API: `POST /v1/messages` and
//! `POST /v1/messages/count_tokens`.
//!
//! A request is checked against Anthropic's schema (its parameter names in
//! every 400) and translated into an OpenAI chat request: `system` becomes
//! the first message, content blocks of type `text` their text,
//! `stop_sequences` the stop list; the same chat parser then bounds and
//! renders it. Parameters:
//! - honoured: `model`, `messages`, `max_tokens` (required), `system`,
//!   `stop_sequences`, `stream`, `temperature` (0 to 1, Anthropic's range);
//! - accepted and ignored: `top_p`, `top_k` (the engines sample with
//!   temperature only), `metadata` (`user_id` a string of at most 256
//!   bytes), `service_tier`, a block's `cache_control` (prefix caching is
//!   automatic here);
//! - tool use: `tools`, `tool_choice`, and `tool_use` / `tool_result`
//!   blocks become OpenAI's tools, tool choice, assistant `tool_calls` and
//!   `tool` messages; the chat parser then accepts them only for a model
//!   whose `passthrough` lists `tools` and `tool_choice` and that a
//!   third-party (OpenAI-speaking) engine serves, else a typed 400 naming
//!   `tools`. The upstream's answer (tool calls, text) is written back as
//!   Anthropic's `tool_use` and `text` blocks, streamed or not;
//! - `thinking` only disabled (extended thinking is refused by name);
//! - anything else: a 400 naming it, as Anthropic answers.
//!
//! Answers are Anthropic's `message` object, or its stream: `message_start`,
//! `content_block_start`, `ping`, `content_block_delta` per token,
//! `content_block_stop`, `message_delta` (stop reason and usage),
//! `message_stop`; a failure after the first bytes is an `error` event.

use http::HeaderMap;
use serde_json::{json, Map, Value};

use crate::error::ApiError;

mod encoder;

pub(crate) use encoder::Encoder;

/// The `anthropic-version` values this gateway speaks (the Messages API's
/// dated versions; the SDKs send 2023-06-01).
pub(crate) const VERSIONS: &[&str] = &["2023-06-01", "2023-01-01"];

/// Longest `metadata.user_id`, as Anthropic bounds it.
const MAX_USER_ID_BYTES: usize = 256;

/// The `anthropic-version` header: required, one of [`VERSIONS`].
pub(crate) fn check_version(headers: &HeaderMap) -> Result<(), ApiError> {
    let header = "anthropic-version";
    match headers.get(header).map(|v| v.to_str().unwrap_or("")) {
        None => Err(ApiError::InvalidHeader { header, message: "is required".into() }),
        Some(v) if VERSIONS.contains(&v) => Ok(()),
        Some(v) => Err(ApiError::InvalidHeader {
            header,
            message: format!("`{v}` is not a version this gateway speaks ({})", VERSIONS.join(", ")),
        }),
    }
}

/// A Messages request as an OpenAI chat request.
#[derive(Debug)]
pub(crate) struct Translated {
    /// The chat request's JSON body.
    pub chat: Vec<u8>,
    pub model: String,
}

/// `count_only`: the body of `count_tokens` (no `max_tokens`, no `stream`).
pub(crate) fn to_chat(body: &[u8], count_only: bool) -> Result<Translated, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    let Value::Object(object) = value else {
        return Err(ApiError::InvalidJson("the body must be a JSON object".into()));
    };
    let mut chat = Map::new();
    let mut messages = Vec::new();
    let mut unknown = Vec::new();
    let mut model = None;
    let mut max_tokens = None;
    for (key, value) in &object {
        match key.as_str() {
            "model" => model = Some(string(key, value)?.to_string()),
            "messages" => {} // below, after `system`
            "system" => messages.push(json!({"role": "system", "content": system(value)?})),
            "max_tokens" if !count_only => {
                let n = value.as_u64().filter(|n| *n >= 1 && *n <= u64::from(u32::MAX));
                max_tokens = Some(n.ok_or_else(|| invalid("max_tokens", "must be an integer >= 1"))?);
            }
            "stop_sequences" if !count_only => {
                chat.insert("stop".into(), stop_sequences(value)?);
            }
            "stream" if !count_only => {
                chat.insert(
                    "stream".into(),
                    Value::Bool(value.as_bool().ok_or_else(|| invalid(key, "must be a boolean"))?),
                );
            }
            "temperature" if !count_only => {
                let t = value.as_f64().filter(|t| (0.0..=1.0).contains(t));
                chat.insert(
                    "temperature".into(),
                    json!(t.ok_or_else(|| invalid(key, "must be a number in [0, 1]"))?),
                );
            }
            "top_p" | "top_k" if !count_only => {
                value.as_f64().ok_or_else(|| invalid(key, "must be a number"))?;
            }
            "metadata" if !count_only => metadata(value)?,
            "service_tier" if !count_only => {
                string(key, value)?;
            }
            "tools" if value.as_array().is_some_and(Vec::is_empty) => {}
            "tools" => {
                chat.insert("tools".into(), tools(value)?);
            }
            "tool_choice" => {
                if let Some((choice, parallel)) = tool_choice(value)? {
                    chat.insert("tool_choice".into(), choice);
                    if let Some(p) = parallel {
                        chat.insert("parallel_tool_calls".into(), Value::Bool(p));
                    }
                }
            }
            "thinking" if value.get("type").and_then(Value::as_str) == Some("disabled") => {}
            "thinking" => {
                return Err(ApiError::UnsupportedParameter {
                    param: key.clone(),
                    message: "extended thinking is not supported by the engines behind this gateway".into(),
                })
            }
            _ => unknown.push(key.clone()),
        }
    }
    if !unknown.is_empty() {
        unknown.sort();
        return Err(ApiError::UnknownParameters(unknown));
    }
    if !chat.contains_key("tools") {
        // `auto` or `none` with no tools asks for nothing.
        if chat.get("tool_choice").is_some_and(|c| c == "auto" || c == "none") {
            chat.remove("tool_choice");
            chat.remove("parallel_tool_calls");
        }
    }
    let model = model.ok_or_else(|| invalid("model", "field required"))?;
    if !count_only {
        let max_tokens = max_tokens.ok_or_else(|| invalid("max_tokens", "field required"))?;
        chat.insert("max_tokens".into(), json!(max_tokens));
    }
    let list = object.get("messages").ok_or_else(|| invalid("messages", "field required"))?;
    let Value::Array(list) = list else { return Err(invalid("messages", "must be an array")) };
    if list.is_empty() {
        return Err(invalid("messages", "must contain at least one message"));
    }
    for (i, m) in list.iter().enumerate() {
        messages.extend(message(i, m)?);
    }
    chat.insert("model".into(), Value::String(model.clone()));
    chat.insert("messages".into(), Value::Array(messages));
    let chat = serde_json::to_vec(&Value::Object(chat)).expect("a JSON value always serialises");
    Ok(Translated { chat, model })
}

fn invalid(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::InvalidField { param: param.to_string(), message: message.into() }
}

fn string<'a>(key: &str, value: &'a Value) -> Result<&'a str, ApiError> {
    value.as_str().ok_or_else(|| invalid(key, "must be a string"))
}

/// `system`: a string or a list of text blocks.
fn system(value: &Value) -> Result<String, ApiError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => text_blocks("system", blocks),
        _ => Err(invalid("system", "must be a string or a list of text blocks")),
    }
}

/// One message (`role` user or assistant, `content` a string or blocks)
/// as chat messages: an assistant's `tool_use` blocks become its
/// `tool_calls`; a user's `tool_result` blocks become `tool` messages,
/// ahead of the user's text.
fn message(i: usize, m: &Value) -> Result<Vec<Value>, ApiError> {
    let Value::Object(m) = m else { return Err(invalid(&format!("messages.{i}"), "must be an object")) };
    if let Some(k) = m.keys().find(|k| !["role", "content"].contains(&k.as_str())) {
        return Err(invalid(&format!("messages.{i}.{k}"), "extra inputs are not permitted"));
    }
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        _ => return Err(invalid(&format!("messages.{i}.role"), "must be `user` or `assistant`")),
    };
    let at = format!("messages.{i}.content");
    let blocks = match m.get("content") {
        Some(Value::String(s)) => return Ok(vec![json!({"role": role, "content": s})]),
        Some(Value::Array(blocks)) => blocks,
        _ => return Err(invalid(&at, "must be a string or a list of blocks")),
    };
    let tool = |b: &Value| matches!(b.get("type").and_then(Value::as_str), Some("tool_use" | "tool_result"));
    if !blocks.iter().any(tool) {
        return Ok(vec![json!({"role": role, "content": text_blocks(&at, blocks)?})]);
    }
    if blocks.len() > 256 {
        return Err(invalid(&at, "at most 256 blocks are allowed"));
    }
    let (mut out, mut text, mut calls) = (Vec::new(), String::new(), Vec::new());
    for (j, b) in blocks.iter().enumerate() {
        let here = format!("{at}.{j}");
        match (role, b.get("type").and_then(Value::as_str)) {
            ("assistant", Some("tool_use")) => {
                let id = b
                    .get("id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(&format!("{here}.id"), "field required"))?;
                let name = b
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(&format!("{here}.name"), "field required"))?;
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({"id": id, "type": "function",
                                  "function": {"name": name, "arguments": input.to_string()}}));
            }
            ("user", Some("tool_result")) => {
                let id = b
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(&format!("{here}.tool_use_id"), "field required"))?;
                let content = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => text_blocks(&format!("{here}.content"), parts)?,
                    Some(_) => {
                        return Err(invalid(&format!("{here}.content"), "must be a string or text blocks"))
                    }
                };
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            (_, Some("tool_use" | "tool_result")) => {
                return Err(invalid(
                    &format!("{here}.type"),
                    "tool_use blocks are the assistant's, tool_result blocks the user's",
                ))
            }
            _ => text.push_str(&text_blocks(&at, std::slice::from_ref(b))?),
        }
    }
    match role {
        "assistant" => {
            let content = if text.is_empty() { Value::Null } else { Value::String(text) };
            out.push(json!({"role": "assistant", "content": content, "tool_calls": calls}));
        }
        _ if !text.is_empty() => out.push(json!({"role": "user", "content": text})),
        _ => {}
    }
    Ok(out)
}

/// Most tools in one request.
const MAX_TOOLS: usize = 128;

/// Anthropic's tools as OpenAI's functions.
fn tools(value: &Value) -> Result<Value, ApiError> {
    let Value::Array(list) = value else { return Err(invalid("tools", "must be a list of tools")) };
    if list.len() > MAX_TOOLS {
        return Err(invalid("tools", format!("at most {MAX_TOOLS} tools are allowed")));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let name = t
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(&format!("tools.{i}.name"), "field required"))?;
        if t.get("type").and_then(Value::as_str).is_some_and(|ty| ty != "custom") {
            return Err(ApiError::UnsupportedParameter {
                param: format!("tools.{i}.type"),
                message: "only client tools (with an input_schema) are supported".into(),
            });
        }
        let schema = t
            .get("input_schema")
            .cloned()
            .ok_or_else(|| invalid(&format!("tools.{i}.input_schema"), "field required"))?;
        let mut function = json!({"name": name, "parameters": schema});
        if let Some(d) = t.get("description").and_then(Value::as_str) {
            function["description"] = json!(d);
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(out))
}

/// Anthropic's `tool_choice` as OpenAI's (and `parallel_tool_calls` from
/// `disable_parallel_tool_use`); `None` for `auto` without options.
fn tool_choice(value: &Value) -> Result<Option<(Value, Option<bool>)>, ApiError> {
    let parallel = value.get("disable_parallel_tool_use").and_then(Value::as_bool).map(|d| !d);
    let choice = match value.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = value
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("tool_choice.name", "field required"))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => return Err(invalid("tool_choice.type", "must be auto, any, tool or none")),
    };
    Ok(Some((choice, parallel)))
}

/// Blocks of type `text`, joined; other block types are refused by name.
fn text_blocks(at: &str, blocks: &[Value]) -> Result<String, ApiError> {
    let most = 256; // as the chat parser bounds content parts
    if blocks.len() > most {
        return Err(invalid(at, format!("at most {most} blocks are allowed")));
    }
    let mut text = String::new();
    for (j, b) in blocks.iter().enumerate() {
        let kind = b.get("type").and_then(Value::as_str);
        match (kind, b.get("text")) {
            (Some("text"), Some(Value::String(t))) => text.push_str(t),
            (Some("text"), _) => return Err(invalid(&format!("{at}.{j}.text"), "must be a string")),
            (Some(other), _) => {
                return Err(ApiError::UnsupportedParameter {
                    param: format!("{at}.{j}.type"),
                    message: format!("content blocks of type `{other}` are not supported; use `text`"),
                })
            }
            (None, _) => return Err(invalid(&format!("{at}.{j}.type"), "field required")),
        }
        if let Some(k) = b.as_object().and_then(|o| {
            o.keys().find(|k| !["type", "text", "cache_control", "citations"].contains(&k.as_str()))
        }) {
            return Err(invalid(&format!("{at}.{j}.{k}"), "extra inputs are not permitted"));
        }
    }
    Ok(text)
}

fn stop_sequences(value: &Value) -> Result<Value, ApiError> {
    let Value::Array(items) = value else {
        return Err(invalid("stop_sequences", "must be a list of strings"));
    };
    let (most, bytes) = (engine_api::bounds::MAX_STOPS, engine_api::bounds::MAX_STOP_BYTES);
    if items.len() > most {
        return Err(invalid("stop_sequences", format!("at most {most} stop sequences are allowed")));
    }
    for (i, s) in items.iter().enumerate() {
        match s.as_str() {
            Some(s) if s.len() <= bytes => {}
            Some(_) => return Err(invalid(&format!("stop_sequences.{i}"), format!("at most {bytes} bytes"))),
            None => return Err(invalid(&format!("stop_sequences.{i}"), "must be a string")),
        }
    }
    Ok(value.clone())
}

fn metadata(value: &Value) -> Result<(), ApiError> {
    let Value::Object(m) = value else { return Err(invalid("metadata", "must be an object")) };
    for (k, v) in m {
        match (k.as_str(), v) {
            ("user_id", Value::Null) => {}
            ("user_id", Value::String(s)) if s.len() <= MAX_USER_ID_BYTES => {}
            ("user_id", _) => {
                return Err(invalid(
                    "metadata.user_id",
                    format!("must be a string of at most {MAX_USER_ID_BYTES} bytes"),
                ))
            }
            _ => return Err(invalid(&format!("metadata.{k}"), "extra inputs are not permitted")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Result<Value, ApiError> {
        to_chat(body.to_string().as_bytes(), false).map(|t| serde_json::from_slice(&t.chat).unwrap())
    }

    #[test]
    fn a_messages_request_becomes_the_chat_request_it_means() {
        let c = chat(json!({
            "model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": [{"type": "text", "text": "yes?"}]},
                         {"role": "user", "content": "more"}],
            "stop_sequences": ["END"], "temperature": 0.5, "top_k": 40, "top_p": 0.9,
            "metadata": {"user_id": "u-1"}, "stream": true, "tools": [], "tool_choice": {"type": "auto"},
        }))
        .unwrap();
        assert_eq!(
            c,
            json!({"model": "m", "max_tokens": 9, "stop": ["END"], "temperature": 0.5, "stream": true,
                   "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                                {"role": "assistant", "content": "yes?"}, {"role": "user", "content": "more"}]})
        );
        // The same prompt the chat route renders for the same conversation.
        let parsed =
            openai_wire::request::parse(openai_wire::request::Kind::Chat, c.to_string().as_bytes()).unwrap();
        assert_eq!(
            parsed.prompt,
            "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\nyes?\n<|user|>\nmore\n<|assistant|>\n"
        );
    }

    #[test]
    fn refusals_name_anthropics_parameters() {
        let user = json!([{"role": "user", "content": "x"}]);
        let cases = [
            (json!({"model": "m", "messages": user}), "max_tokens", "invalid_value"),
            (json!({"model": "m", "max_tokens": 0, "messages": user}), "max_tokens", "invalid_value"),
            (json!({"max_tokens": 5, "messages": user}), "model", "invalid_value"),
            (json!({"model": "m", "max_tokens": 5, "messages": []}), "messages", "invalid_value"),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user, "temperature": 1.5}),
                "temperature",
                "invalid_value",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}),
                "messages.0.role",
                "invalid_value",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user, "stop_sequences": ["a", "b", "c", "d", "e"]}),
                "stop_sequences",
                "invalid_value",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "tools.0.type",
                "unsupported_parameter",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user, "tools": [{"name": "t"}]}),
                "tools.0.input_schema",
                "invalid_value",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user, "thinking": {"type": "enabled", "budget_tokens": 1024}}),
                "thinking",
                "unsupported_parameter",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                "messages.0.content.0.type",
                "unsupported_parameter",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user, "frequency_penalty": 1}),
                "frequency_penalty",
                "unknown_parameter",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user, "metadata": {"user_id": "u".repeat(300)}}),
                "metadata.user_id",
                "invalid_value",
            ),
        ];
        for (body, param, code) in cases {
            let e = chat(body.clone()).unwrap_err();
            assert_eq!((e.param(), e.code()), (Some(param), code), "{body}: {e}");
            assert_eq!(e.body_as(super::super::Dialect::Anthropic)["error"]["type"], "invalid_request_error");
        }
        assert_eq!(to_chat(b"[1]", false).unwrap_err().code(), "invalid_json");
        // count_tokens takes no max_tokens.
        let t = to_chat(json!({"model": "m", "messages": user}).to_string().as_bytes(), true).unwrap();
        assert_eq!(t.model, "m");
    }
}
