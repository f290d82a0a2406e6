//! The OpenAI-compatible request schema: parsing, validation, prompt
//! rendering. The gateway's public routes and the engine's OpenAI surface
//! parse with this one function, so both have the same bounds and answer
//! the same typed 400s.
//!
//! Every top-level parameter of a request is in exactly one class:
//! - honoured: it changes what the gateway does (model, messages/prompt,
//!   max_tokens, max_completion_tokens, temperature, seed, stop, stream,
//!   stream_options);
//! - accepted and ignored (documented in docs/api.md): sampling knobs the
//!   engines do not implement yet, and bookkeeping fields;
//! - unsupported: accepted only at its neutral value (`n: 1`, `logprobs:
//!   false`, `tools: []`, ...), anything else is a 400 naming it;
//! - unknown: a 400 naming it, as OpenAI itself answers.
//!
//! The engine's surface ([`parse_engine`]) also takes the extensions that
//! routers built for vLLM and SGLang add to every request they forward
//! (SGLang's model gateway sends `ignore_eos: false`, `skip_special_tokens:
//! true`, ...), at the values that leave the answer unchanged; any other
//! value is a 400 naming it.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::ParseError;

/// Which endpoint a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `POST /v1/chat/completions`
    Chat,
    /// `POST /v1/completions`
    Completion,
}

/// A validated completion request, endpoint differences resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    pub kind: Kind,
    pub model: String,
    /// The prompt text the engine sees (chat messages rendered by the template).
    pub prompt: String,
    /// Requested output cap, before the tier's clamp.
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// A parameter of the model's `passthrough` list the request uses: only
    /// third-party engines may serve it (the first such parameter, named in
    /// errors).
    pub upstream_param: Option<String>,
    /// One of them changes the answer's shape (tools, several choices,
    /// log-probabilities): the engine's answer is relayed as it wrote it.
    pub verbatim: bool,
}

impl CompletionRequest {
    /// The engine's request for this one: `max_tokens` as decided by the
    /// caller (a tier's clamp, an engine's default); admission's fields
    /// (ordering key, TTFT budget, priority) unset.
    pub fn into_generate(self, request_id: String, max_tokens: u32) -> engine_api::GenerateRequest {
        engine_api::GenerateRequest {
            request_id,
            model: self.model,
            prompt: self.prompt,
            max_tokens,
            temperature: self.temperature,
            seed: self.seed,
            stop: self.stop,
            priority_key: None,
            ttft_budget_ms: None,
            priority: None,
        }
    }
}

const CHAT_HONOURED: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "seed",
    "stop",
    "stream",
    "stream_options",
];
const COMPLETION_HONOURED: &[&str] =
    &["model", "prompt", "max_tokens", "temperature", "seed", "stop", "stream", "stream_options"];
const CHAT_IGNORED: &[&str] = &[
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "user",
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
    "reasoning_effort",
];
const COMPLETION_IGNORED: &[&str] = &["top_p", "presence_penalty", "frequency_penalty", "logit_bias", "user"];

/// Unsupported parameters with the values that mean "not used".
fn neutral_values(kind: Kind, key: &str) -> Option<Vec<Value>> {
    let v = match (kind, key) {
        (_, "n") => vec![json!(1)],
        (Kind::Chat, "logprobs") => vec![json!(false)],
        (Kind::Chat, "top_logprobs") => vec![json!(0)],
        (Kind::Chat, "tools" | "functions") => vec![json!([])],
        (Kind::Chat, "tool_choice" | "function_call") => vec![json!("none")],
        (Kind::Chat, "response_format") => vec![json!({"type": "text"})],
        (Kind::Chat, "modalities") => vec![json!(["text"])],
        (Kind::Chat, "audio" | "prediction" | "web_search_options") => vec![],
        (Kind::Completion, "best_of") => vec![json!(1)],
        (Kind::Completion, "logprobs") => vec![json!(0)],
        (Kind::Completion, "echo") => vec![json!(false)],
        (Kind::Completion, "suffix") => vec![json!("")],
        _ => return None,
    };
    Some(v)
}

/// The vLLM and SGLang request extensions the engine's surface accepts,
/// with the values that leave the answer unchanged. `separate_reasoning`,
/// `stream_reasoning` and `include_reasoning` (the vLLM router's) only
/// matter to reasoning models (ours is not one): either value is neutral.
fn engine_extension_values(key: &str) -> Option<Vec<Value>> {
    let v = match key {
        "ignore_eos" | "no_stop_trim" | "continue_final_message" | "return_hidden_states" | "echo" => {
            vec![json!(false)]
        }
        "include_stop_str_in_output" => vec![json!(false)],
        "skip_special_tokens" | "spaces_between_special_tokens" | "add_generation_prompt" => {
            vec![json!(true)]
        }
        "separate_reasoning" | "stream_reasoning" | "include_reasoning" => vec![json!(true), json!(false)],
        "min_tokens" => vec![json!(0)],
        "top_k" => vec![json!(-1), json!(0)],
        "min_p" => vec![json!(0), json!(0.0)],
        "repetition_penalty" => vec![json!(1), json!(1.0)],
        _ => return None,
    };
    Some(v)
}

/// Which surface parses: the gateway's public API (OpenAI's parameters
/// only) or an engine's (also the vLLM/SGLang extensions at neutral values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Surface {
    Gateway,
    Engine,
}

#[derive(Deserialize)]
struct RawRequest {
    model: Option<String>,
    messages: Option<Vec<Message>>,
    prompt: Option<Value>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    temperature: Option<f32>,
    seed: Option<i64>,
    stop: Option<Value>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
struct Message {
    role: Role,
    #[serde(default)]
    content: Option<Value>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

fn field(param: impl Into<String>, message: impl Into<String>) -> ParseError {
    ParseError::InvalidField { param: param.into(), message: message.into() }
}

/// Parses and validates a request body for `kind` (no model passes
/// parameters through).
pub fn parse(kind: Kind, body: &[u8]) -> Result<CompletionRequest, ParseError> {
    parse_for(kind, body, &[])
}

/// As [`parse`], for an engine's OpenAI surface: also the vLLM/SGLang
/// extensions routers add, at their neutral values.
pub fn parse_engine(kind: Kind, body: &[u8]) -> Result<CompletionRequest, ParseError> {
    parse_on(Surface::Engine, kind, body, &[])
}

/// As [`parse`], accepting the parameters the requested model's
/// `passthrough` list names (of `models`, the policy's).
pub fn parse_for(
    kind: Kind,
    body: &[u8],
    models: &[policies::config::Model],
) -> Result<CompletionRequest, ParseError> {
    parse_on(Surface::Gateway, kind, body, models)
}

fn parse_on(
    surface: Surface,
    kind: Kind,
    body: &[u8],
    models: &[policies::config::Model],
) -> Result<CompletionRequest, ParseError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| ParseError::InvalidJson(e.to_string()))?;
    let Value::Object(object) = value else {
        return Err(ParseError::InvalidJson("the body must be a JSON object".into()));
    };
    let requested = object.get("model").and_then(Value::as_str);
    let passthrough = models
        .iter()
        .find(|m| Some(m.id.as_str()) == requested)
        .map_or(&[][..], |m| m.passthrough.as_slice());
    let (raw, mut upstream_param, verbatim) = classify(surface, kind, object, passthrough)?;
    let model = raw.model.ok_or_else(|| field("model", "you must provide a model parameter"))?;
    if model.len() > engine_api::bounds::MAX_ID_BYTES {
        return Err(field("model", "is too long"));
    }
    let prompt = match kind {
        Kind::Chat => render_chat(
            raw.messages.ok_or_else(|| field("messages", "`messages` is required"))?,
            passthrough,
            &mut upstream_param,
        )?,
        Kind::Completion => prompt_text(raw.prompt.ok_or_else(|| field("prompt", "`prompt` is required"))?)?,
    };
    let max_tokens = raw.max_completion_tokens.or(raw.max_tokens).or(match kind {
        Kind::Completion => Some(16), // OpenAI's default for /v1/completions
        Kind::Chat => None,
    });
    if max_tokens == Some(0) {
        let p = if raw.max_completion_tokens.is_some() { "max_completion_tokens" } else { "max_tokens" };
        return Err(field(p, "must be at least 1"));
    }
    if let Some(t) = raw.temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(field("temperature", format!("{t} is not in [0, 2]")));
        }
    }
    let stream = raw.stream.unwrap_or(false);
    if raw.stream_options.is_some() && !stream {
        return Err(field("stream_options", "only allowed when `stream` is true"));
    }
    Ok(CompletionRequest {
        kind,
        model,
        prompt,
        max_tokens,
        temperature: raw.temperature,
        seed: raw.seed.map(|s| s as u64),
        stop: stop_list(raw.stop)?,
        stream,
        include_usage: raw.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
        upstream_param,
        verbatim,
    })
}

/// Sorts top-level keys into their classes and deserialises the honoured
/// ones; also returns the first `passthrough` parameter used, and whether
/// one changes the answer's shape.
fn classify(
    surface: Surface,
    kind: Kind,
    object: Map<String, Value>,
    passthrough: &[String],
) -> Result<(RawRequest, Option<String>, bool), ParseError> {
    let (honoured, ignored) = match kind {
        Kind::Chat => (CHAT_HONOURED, CHAT_IGNORED),
        Kind::Completion => (COMPLETION_HONOURED, COMPLETION_IGNORED),
    };
    let mut kept = Map::new();
    let mut unknown = Vec::new();
    let mut upstream_param = None;
    let mut verbatim = false;
    for (key, value) in object {
        if value.is_null() || ignored.contains(&key.as_str()) {
            continue;
        }
        if passthrough.contains(&key) {
            verbatim |= policies::config::SHAPE_CHANGING.contains(&key.as_str());
            upstream_param.get_or_insert(key); // goes up in the client's body
            continue;
        }
        if honoured.contains(&key.as_str()) {
            kept.insert(key, value);
        } else if let Some(neutral) = neutral_values(kind, &key)
            .or_else(|| engine_extension_values(&key).filter(|_| surface == Surface::Engine))
        {
            if !neutral.contains(&value) {
                return Err(ParseError::UnsupportedParameter {
                    param: key,
                    message: "is not supported by this gateway".into(),
                });
            }
        } else {
            unknown.push(key);
        }
    }
    if !unknown.is_empty() {
        unknown.sort();
        return Err(ParseError::UnknownParameters(unknown));
    }
    let raw = serde_path_to_error::deserialize(Value::Object(kept)).map_err(|e| {
        let param = e.path().to_string();
        field(param.trim_start_matches('.'), e.into_inner().to_string())
    })?;
    Ok((raw, upstream_param, verbatim))
}

/// Most chat messages, and content parts per message, in one request (the
/// body size bounds their total; these bound the work per element).
const MAX_MESSAGES: usize = 4096;
const MAX_PARTS: usize = 256;

/// The chat template applied to `messages`. Content parts whose type the
/// model's `passthrough` list names (`image_url`, `input_audio`) go up to a
/// third-party engine as sent; they stand in the rendered prompt as a
/// marker (their tokens are the engine's to count) and set `upstream_param`.
fn render_chat(
    messages: Vec<Message>,
    passthrough: &[String],
    upstream_param: &mut Option<String>,
) -> Result<String, ParseError> {
    if messages.is_empty() {
        return Err(field("messages", "must contain at least one message"));
    }
    if messages.len() > MAX_MESSAGES {
        return Err(field("messages", format!("at most {MAX_MESSAGES} messages are allowed")));
    }
    let mut prompt = String::new();
    for (i, m) in messages.into_iter().enumerate() {
        let text = match m.content {
            None => String::new(),
            Some(Value::String(s)) => s,
            Some(Value::Array(parts)) => content_parts(i, parts, passthrough, upstream_param)?,
            Some(_) => {
                return Err(field(format!("messages[{i}].content"), "must be a string or an array of parts"))
            }
        };
        prompt.push_str(&format!("<|{}|>\n{}\n", m.role.as_str(), text));
    }
    prompt.push_str("<|assistant|>\n");
    Ok(prompt)
}

fn content_parts(
    i: usize,
    parts: Vec<Value>,
    passthrough: &[String],
    upstream_param: &mut Option<String>,
) -> Result<String, ParseError> {
    if parts.len() > MAX_PARTS {
        return Err(field(
            format!("messages[{i}].content"),
            format!("at most {MAX_PARTS} parts are allowed"),
        ));
    }
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
            (Some("text"), Some(t)) => text.push_str(t),
            (Some("text"), None) => {
                return Err(field(format!("messages[{i}].content[{j}].text"), "must be a string"))
            }
            (Some(other), _) if passthrough.iter().any(|p| p == other) => {
                upstream_param.get_or_insert_with(|| other.to_string());
                text.push_str(&format!("[{other}]"));
            }
            (Some(other), _) => {
                return Err(ParseError::UnsupportedParameter {
                    param: format!("messages[{i}].content[{j}].type"),
                    message: format!("content parts of type `{other}` are not supported; use `text`"),
                })
            }
            (None, _) => return Err(field(format!("messages[{i}].content[{j}].type"), "is required")),
        }
    }
    Ok(text)
}

fn prompt_text(prompt: Value) -> Result<String, ParseError> {
    match prompt {
        Value::String(s) => Ok(s),
        Value::Array(mut items) if items.len() == 1 && items[0].is_string() => {
            Ok(items.pop().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default())
        }
        Value::Array(items) if items.iter().all(Value::is_string) => Err(ParseError::UnsupportedParameter {
            param: "prompt".into(),
            message: "batched prompts are not supported; send one prompt per request".into(),
        }),
        _ => Err(field("prompt", "must be a string (token-id prompts are not supported)")),
    }
}

fn stop_list(stop: Option<Value>) -> Result<Vec<String>, ParseError> {
    let list = match stop {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s),
                _ => Err(field(format!("stop[{i}]"), "must be a string")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(field("stop", "must be a string or an array of strings")),
    };
    let bounds = engine_api::bounds::MAX_STOPS;
    if list.len() > bounds {
        return Err(field("stop", format!("at most {bounds} stop sequences are allowed")));
    }
    let most = engine_api::bounds::MAX_STOP_BYTES;
    if let Some(i) = list.iter().position(|s| s.len() > most) {
        return Err(field(format!("stop[{i}]"), format!("a stop sequence is at most {most} bytes")));
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Result<CompletionRequest, ParseError> {
        parse(Kind::Chat, body.to_string().as_bytes())
    }

    #[test]
    fn renders_chat_messages_and_reads_options() {
        let r = chat(json!({
            "model": "m", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_tokens": 7, "temperature": 0.5, "stop": "END", "top_p": 0.9, "n": 1,
        }))
        .unwrap();
        assert_eq!(r.prompt, "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n");
        assert_eq!((r.max_tokens, r.stream, r.include_usage), (Some(7), true, true));
        assert_eq!(r.stop, vec!["END".to_string()]);
    }

    #[test]
    fn every_string_and_array_is_bounded() {
        let user = json!({"role": "user", "content": "x"});
        let long_stop = "s".repeat(engine_api::bounds::MAX_STOP_BYTES + 1);
        let cases = [
            (json!({"model": "m", "messages": [user], "stop": [long_stop]}), "stop[0]"),
            (json!({"model": "m", "messages": [user], "stop": ["a", "b", "c", "d", "e"]}), "stop"),
            (json!({"model": "m".repeat(300), "messages": [user]}), "model"),
            (json!({"model": "m", "messages": vec![user.clone(); MAX_MESSAGES + 1]}), "messages"),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": vec![json!({"type": "text", "text": "x"}); MAX_PARTS + 1]}]}),
                "messages[0].content",
            ),
        ];
        for (body, param) in cases {
            let e = chat(body).unwrap_err();
            assert_eq!((e.param(), e.status()), (Some(param), 400), "{e}");
        }
    }

    #[test]
    fn max_completion_tokens_wins_and_completions_default_to_16() {
        let r = chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
                            "max_tokens": 5, "max_completion_tokens": 9}))
        .unwrap();
        assert_eq!(r.max_tokens, Some(9));
        let c = parse(Kind::Completion, br#"{"model":"m","prompt":"x"}"#).unwrap();
        assert_eq!(c.max_tokens, Some(16));
    }

    #[test]
    fn wrong_types_name_the_field() {
        let e =
            chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}))
                .unwrap_err();
        assert_eq!(e.param(), Some("max_tokens"), "{e}");
        let e = chat(json!({"model": "m", "messages": [{"role": "wizard", "content": "x"}]})).unwrap_err();
        assert_eq!(e.param(), Some("messages[0].role"), "{e}");
        let e = chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3}))
            .unwrap_err();
        assert_eq!(e.param(), Some("temperature"));
        let e = chat(json!({"messages": [{"role": "user", "content": "x"}]})).unwrap_err();
        assert_eq!(e.param(), Some("model"));
    }

    #[test]
    fn unknown_and_unsupported_parameters_are_named() {
        let e = chat(json!({"model": "m", "messages": [], "zeta": 1, "alpha": 2})).unwrap_err();
        assert_eq!(e, ParseError::UnknownParameters(vec!["alpha".into(), "zeta".into()]));
        let e =
            chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2})).unwrap_err();
        assert_eq!(e.param(), Some("n"));
        assert_eq!(e.code(), "unsupported_parameter");
        let e = chat(json!({"model": "m", "messages": [{"role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}))
        .unwrap_err();
        assert_eq!(e.param(), Some("messages[0].content[0].type"));
    }

    #[test]
    fn a_models_passthrough_parameters_are_accepted_for_it_alone() {
        let model = |id: &str, list: &[&str]| policies::config::Model {
            id: id.into(),
            owned_by: "t".into(),
            passthrough: list.iter().map(|p| p.to_string()).collect(),
        };
        let models = [model("json-capable", &["response_format", "top_k"]), model("plain", &[])];
        let body = |m: &str| {
            json!({"model": m, "messages": [{"role": "user", "content": "x"}],
                   "response_format": {"type": "json_object"}, "top_k": 40})
            .to_string()
        };
        let r = parse_for(Kind::Chat, body("json-capable").as_bytes(), &models).unwrap();
        assert_eq!(r.upstream_param.as_deref(), Some("response_format"), "the first one, by name");
        let e = parse_for(Kind::Chat, body("plain").as_bytes(), &models).unwrap_err();
        assert_eq!(e.param(), Some("response_format"), "refused as before for another model: {e}");
        let plain =
            json!({"model": "json-capable", "messages": [{"role": "user", "content": "x"}]}).to_string();
        assert_eq!(parse_for(Kind::Chat, plain.as_bytes(), &models).unwrap().upstream_param, None);
    }

    #[test]
    fn the_engine_takes_the_router_extensions_at_neutral_values_and_the_gateway_does_not() {
        // What SGLang's model gateway adds to a forwarded chat request.
        let forwarded = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "logprobs": false, "max_completion_tokens": 5, "stream": false, "no_stop_trim": false,
            "ignore_eos": false, "continue_final_message": false, "skip_special_tokens": true,
            "separate_reasoning": true, "stream_reasoning": true, "return_hidden_states": false,
            "include_reasoning": true})
        .to_string();
        let r = parse_engine(Kind::Chat, forwarded.as_bytes()).unwrap();
        assert_eq!(r.max_tokens, Some(5));
        let e = parse(Kind::Chat, forwarded.as_bytes()).unwrap_err();
        assert_eq!(e.code(), "unknown_parameter", "the public API stays OpenAI's: {e}");
        let changed = forwarded.replace("\"ignore_eos\":false", "\"ignore_eos\":true");
        let e = parse_engine(Kind::Chat, changed.as_bytes()).unwrap_err();
        assert_eq!((e.code(), e.param()), ("unsupported_parameter", Some("ignore_eos")));
    }

    #[test]
    fn malformed_json_and_non_objects_are_invalid_json() {
        assert_eq!(parse(Kind::Chat, b"{\"model\":").unwrap_err().code(), "invalid_json");
        assert_eq!(parse(Kind::Chat, b"[1]").unwrap_err().code(), "invalid_json");
    }
}
