//! The engine's OpenAI-compatible surface, beside its native API, so that
//! any router or gateway (LiteLLM, SGLang's model gateway, the vLLM router,
//! Envoy, nginx, or our own gateway with `kind = "openai"`) can front it
//! as it fronts vLLM:
//!
//! - `POST /v1/chat/completions`, `POST /v1/completions`: parsed by
//!   `openai-wire` (the gateway's parser: the same bounds, the same typed
//!   400s), run on the same scheduler as `/engine/v1/generate`, answered
//!   with the gateway's encoder (SSE chunks, `[DONE]`, `usage` when asked;
//!   or one JSON body). A client that goes away cancels the sequence: its
//!   event channel closes and the scheduler frees its pages.
//! - `GET /v1/models`: the one model served (`--served-model-name`).
//! - `GET /health`: 200 with an empty body while the engine takes work
//!   (vLLM's probe), 503 otherwise.
//! - vLLM's metric names on `GET /metrics` ([`vllm_metrics`]).
//!
//! Errors are OpenAI-style bodies (`{"error": {...}}`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use openai_wire::encode::Encoder;
use openai_wire::error::error_body;
use openai_wire::{CompletionRequest, Kind};
use tokio::sync::mpsc;

use crate::api::{Event, GenerateRequest};
use crate::body::ChannelBody;
use crate::http::{EngineBody, MAX_REQUEST_BYTES};
use crate::Engine;

/// Answers a chat or text completion request.
pub(crate) async fn completions(
    engine: Arc<Engine>,
    req: Request<Incoming>,
    kind: Kind,
) -> Response<EngineBody> {
    if !engine.accepting() {
        let code = if engine.is_draining() { "engine_draining" } else { "engine_not_ready" };
        ::metrics::counter!(crate::metrics::REFUSALS, "reason" => code).increment(1);
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            None,
            code,
            "engine is not taking new work",
        );
    }
    let body = match Limited::new(req.into_body(), MAX_REQUEST_BYTES).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            let too_large = e.downcast_ref::<http_body_util::LengthLimitError>().is_some();
            let (status, code) = if too_large {
                (StatusCode::PAYLOAD_TOO_LARGE, "request_too_large")
            } else {
                (StatusCode::BAD_REQUEST, "body_read_failed")
            };
            return error(status, "invalid_request_error", None, code, &e.to_string());
        }
    };
    let parsed = match openai_wire::parse_engine(kind, &body) {
        Ok(p) => p,
        Err(e) => return with_body(StatusCode::BAD_REQUEST, e.body()),
    };
    if parsed.model != engine.served_model {
        let message = format!("the model `{}` does not exist", parsed.model);
        return error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("model"),
            "model_not_found",
            &message,
        );
    }
    let n = engine.openai_ids.fetch_add(1, Ordering::Relaxed);
    let id = match kind {
        Kind::Chat => format!("chatcmpl-{}-{n}", engine.id),
        Kind::Completion => format!("cmpl-{}-{n}", engine.id),
    };
    let encoder = Encoder {
        kind,
        id: id.clone(),
        created: crate::clock::unix_s() as u64,
        model: parsed.model.clone(),
        stream: parsed.stream,
        include_usage: parsed.include_usage,
        verbatim: false,
        tail: Default::default(),
    };
    let gen = generate_request(id, parsed, engine.default_max_tokens);
    if let Err(message) = gen.validate() {
        return error(StatusCode::BAD_REQUEST, "invalid_request_error", None, "invalid_value", &message);
    }
    let prompt_tokens = policies::tokens::count(&gen.prompt);
    let (tx, rx) = mpsc::unbounded_channel();
    if let Err(e) = engine.scheduler.enqueue_traced(gen, prompt_tokens, tx, None).await {
        ::metrics::counter!(crate::metrics::REFUSALS, "reason" => e.code()).increment(1);
        let mut resp = error(StatusCode::SERVICE_UNAVAILABLE, "server_error", None, e.code(), &e.to_string());
        resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return resp;
    }
    if encoder.stream {
        stream(encoder, rx)
    } else {
        whole(encoder, rx).await
    }
}

/// What the scheduler runs for `parsed`: the chat default cap where the
/// request sets none.
fn generate_request(id: String, parsed: CompletionRequest, default_max_tokens: u32) -> GenerateRequest {
    let max_tokens = parsed.max_tokens.unwrap_or(default_max_tokens);
    parsed.into_generate(id, max_tokens)
}

/// Streams the sequence as SSE: a task turns each event line into its
/// chunk as it arrives. Dropping the body (the client went away) ends the
/// task, which drops the scheduler's receiver: the sequence is cancelled.
/// The body's channel is unbounded like the scheduler's (the scheduler must
/// never wait on one slow client): it holds at most one frame per event,
/// and a sequence has at most `max_tokens` + 1 events.
fn stream(encoder: Encoder, mut events: mpsc::UnboundedReceiver<Bytes>) -> Response<EngineBody> {
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    tokio::spawn(async move {
        let mut out = BytesMut::new();
        encoder.opening(&mut out);
        while let Some(line) = events.recv().await {
            let last = match serde_json::from_slice::<Event>(&line) {
                Ok(Event::Token { text }) => {
                    encoder.token(&mut out, &text);
                    false
                }
                Ok(Event::Done { finish_reason, usage, .. }) => {
                    encoder.finish(&mut out, finish_reason, usage);
                    true
                }
                Ok(Event::Error { code, message }) => {
                    stream_error(&mut out, &code, &message);
                    true
                }
                Ok(Event::Upstream { .. }) => false,
                Err(e) => {
                    stream_error(&mut out, "engine_failed", &e.to_string());
                    true
                }
            };
            if tx.send(out.split().freeze()).is_err() || last {
                return;
            }
        }
        stream_error(&mut out, "engine_failed", "the sequence ended without finishing");
        let _ = tx.send(out.split().freeze());
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Either::Right(ChannelBody::new(rx, is_last_chunk)))
        .expect("static response parts are valid")
}

/// The last SSE frame of a stream: `[DONE]`, or an error event (no
/// `[DONE]` after it, as the gateway ends a failed stream), which may
/// follow the opening chunk in the same frame. Generated text is
/// JSON-escaped inside its chunk, so it cannot spell either marker.
fn is_last_chunk(frame: &[u8]) -> bool {
    const ERROR: &[u8] = b"data: {\"error\"";
    frame.ends_with(b"data: [DONE]\n\n") || frame.windows(ERROR.len()).any(|w| w == ERROR)
}

fn stream_error(out: &mut BytesMut, code: &str, message: &str) {
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(&error_body(message, "server_error", None, code));
    out.extend_from_slice(b"\n\n");
}

/// Collects the sequence into one JSON body.
async fn whole(encoder: Encoder, mut events: mpsc::UnboundedReceiver<Bytes>) -> Response<EngineBody> {
    let mut text = String::new();
    while let Some(line) = events.recv().await {
        match serde_json::from_slice::<Event>(&line) {
            Ok(Event::Token { text: t }) => text.push_str(&t),
            Ok(Event::Done { finish_reason, usage, .. }) => {
                return with_body(StatusCode::OK, encoder.complete(&text, finish_reason, usage));
            }
            Ok(Event::Error { code, message }) => {
                return error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", None, &code, &message)
            }
            Ok(Event::Upstream { .. }) => {}
            Err(e) => {
                let message = e.to_string();
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    None,
                    "engine_failed",
                    &message,
                );
            }
        }
    }
    let message = "the sequence ended without finishing";
    error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", None, "engine_failed", message)
}

/// `GET /v1/models`.
pub(crate) fn models(engine: &Engine) -> Response<EngineBody> {
    let body = serde_json::json!({"object": "list", "data": [{
        "id": engine.served_model, "object": "model",
        "created": crate::clock::unix_s() as u64, "owned_by": "slo-gateway",
    }]});
    with_body(StatusCode::OK, serde_json::to_vec(&body).expect("a model list always serialises"))
}

/// `GET /health`: vLLM's probe, an empty 200 while the engine takes work.
pub(crate) fn health(engine: &Engine) -> Response<EngineBody> {
    let status = if engine.accepting() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    Response::builder()
        .status(status)
        .body(Either::Left(Full::new(Bytes::new())))
        .expect("static response parts are valid")
}

/// What vLLM's metric families say of an engine.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct VllmLoad {
    pub running: u32,
    pub waiting: u32,
    pub kv_pages_free: u32,
    pub kv_pages_total: u32,
    pub prefix_lookup_tokens: u64,
    pub prefix_hit_tokens: u64,
}

/// vLLM's metric families (v1 names, and the v0 name of KV usage that
/// older routers read), labelled with the served model: requests running
/// and waiting, KV-cache usage (a fraction), and the prefix cache's queried
/// and hit prompt tokens.
pub(crate) fn vllm_metrics(report: &VllmLoad, model: &str) -> String {
    let usage = if report.kv_pages_total == 0 {
        0.0
    } else {
        1.0 - f64::from(report.kv_pages_free) / f64::from(report.kv_pages_total)
    };
    let label = serde_json::to_string(model).expect("a string always serialises");
    let families: [(&str, &str, &str, f64); 6] = [
        ("vllm:num_requests_running", "gauge", "Requests in model execution batches.", report.running.into()),
        ("vllm:num_requests_waiting", "gauge", "Requests waiting to be processed.", report.waiting.into()),
        ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage),
        (
            "vllm:gpu_cache_usage_perc",
            "gauge",
            "KV-cache usage (the v0 name). 1 means 100 percent usage.",
            usage,
        ),
        (
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            report.prefix_lookup_tokens as f64,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prompt tokens found in the prefix cache.",
            report.prefix_hit_tokens as f64,
        ),
    ];
    let mut out = String::new();
    for (name, kind, help, value) in families {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{model_name={label}}} {value}\n"
        ));
    }
    out
}

fn with_body(status: StatusCode, body: Vec<u8>) -> Response<EngineBody> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Either::Left(Full::new(Bytes::from(body))))
        .expect("static response parts are valid")
}

fn error(
    status: StatusCode,
    kind: &str,
    param: Option<&str>,
    code: &str,
    message: &str,
) -> Response<EngineBody> {
    with_body(status, error_body(message, kind, param, code))
}

/// The engine's OpenAI request path for the fuzzer (`fuzz/fuzz_targets/
/// engine_openai.rs`): every body parsed as chat and as a completion with
/// the engine's parser, turned into what the scheduler runs and validated,
/// as `completions` does; a request that passes holds the bounds the
/// scheduler relies on.
pub fn fuzz_request(data: &[u8]) {
    for kind in [Kind::Chat, Kind::Completion] {
        let Ok(parsed) = openai_wire::parse_engine(kind, data) else { continue };
        let gen = generate_request("fuzz".into(), parsed, 256);
        if gen.validate().is_ok() {
            use engine_api::bounds::{MAX_STOPS, MAX_STOP_BYTES, MAX_TOKENS};
            assert!(gen.max_tokens >= 1 && gen.max_tokens <= MAX_TOKENS, "max_tokens {}", gen.max_tokens);
            assert!(gen.stop.len() <= MAX_STOPS && gen.stop.iter().all(|s| s.len() <= MAX_STOP_BYTES));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fuzz target's seeds (and an over-bound request) run through
    /// its entry point without tripping an invariant.
    #[test]
    fn the_fuzz_entry_point_takes_its_seeds() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/engine_openai");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            fuzz_request(&std::fs::read(entry.unwrap().path()).unwrap());
            seen += 1;
        }
        assert!(seen >= 4, "{seen} seeds in {}", dir.display());
        fuzz_request(br#"{"model":"m","prompt":"x","max_tokens":4294967295}"#);
        fuzz_request(b"\xff\x00{");
    }

    #[test]
    fn the_metrics_carry_vllms_names_and_values() {
        let report = VllmLoad {
            running: 7,
            waiting: 3,
            kv_pages_free: 58,
            kv_pages_total: 100,
            prefix_lookup_tokens: 1000,
            prefix_hit_tokens: 250,
        };
        let text = vllm_metrics(&report, "m\"1");
        for want in [
            "vllm:num_requests_running{model_name=\"m\\\"1\"} 7\n",
            "vllm:num_requests_waiting{model_name=\"m\\\"1\"} 3\n",
            "vllm:kv_cache_usage_perc{model_name=\"m\\\"1\"} 0.42",
            "vllm:gpu_cache_usage_perc{model_name=\"m\\\"1\"} 0.42",
            "# TYPE vllm:prefix_cache_queries_total counter\n",
            "vllm:prefix_cache_hits_total{model_name=\"m\\\"1\"} 250\n",
        ] {
            assert!(text.contains(want), "{want:?} in\n{text}");
        }
        assert!(vllm_metrics(&VllmLoad::default(), "m").contains("kv_cache_usage_perc{model_name=\"m\"} 0\n"));
    }

    #[test]
    fn a_chat_request_without_max_tokens_gets_the_default_cap() {
        let parsed = openai_wire::parse(
            Kind::Chat,
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stop":"x"}"#,
        )
        .unwrap();
        let gen = generate_request("id".into(), parsed, 99);
        assert_eq!((gen.max_tokens, gen.stop.as_slice()), (99, &["x".to_string()][..]));
        assert_eq!(gen.prompt, "<|user|>\nhi\n<|assistant|>\n");
        let parsed = openai_wire::parse(Kind::Completion, br#"{"model":"m","prompt":"p"}"#).unwrap();
        assert_eq!(generate_request("id".into(), parsed, 99).max_tokens, 16, "OpenAI's completions default");
    }

    #[test]
    fn a_stream_ends_on_done_or_on_an_error_event() {
        assert!(is_last_chunk(b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n"));
        let mut out = BytesMut::new();
        stream_error(&mut out, "engine_failed", "x");
        assert!(is_last_chunk(&out));
        let mut opened = BytesMut::from(&b"data: {\"choices\":[]}\n\n"[..]);
        stream_error(&mut opened, "engine_failed", "x");
        assert!(is_last_chunk(&opened), "an error right after the opening chunk");
        assert!(!is_last_chunk(b"data: {\"choices\":[{\"delta\":{\"content\":\"[DONE]\"}}]}\n\n"));
    }
}
