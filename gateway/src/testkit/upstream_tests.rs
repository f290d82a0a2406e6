//! `openai` engines (third-party OpenAI-compatible servers) behind the
//! gateway, in paused time: the scripted upstream speaks HTTP/1.1 and SSE
//! and serves a llama.cpp-server `/metrics` page.

use std::time::Duration;

use engine_api::Event;
use http::StatusCode;
use serde_json::json;
use tokio::time::Instant;

use super::*;
use crate::engines::telemetry::Flavour;
use crate::engines::Upstream;

const POLICY: &str = include_str!("../../../policies/default.toml");

fn llamacpp_metrics(processing: u32, deferred: u32) -> String {
    format!(
        "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.1\n\
         # TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing {processing}\n\
         # TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred {deferred}\n"
    )
}

fn llama(max_batch: u32, metrics: &str, scripts: Vec<Script>) -> TestEngine {
    let up = Upstream {
        flavour: Flavour::Llamacpp,
        served_model: Some("tiny-llama".into()),
        max_batch: Some(max_batch),
        ..Default::default()
    };
    TestEngine::openai("llama", up, metrics, scripts)
}

fn chat(stream: bool, max_tokens: u32) -> serde_json::Value {
    let mut body = json!({
        "model": "synthetic-small",
        "stream": stream,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hello"}],
    });
    if stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

async fn body_text(resp: Response<Incoming>) -> String {
    let bytes = resp.into_body().collect().await.expect("a complete body").to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[tokio::test(start_paused = true)]
async fn an_upstreams_stream_reaches_the_client_under_the_gateways_ids() {
    let script = Script::tokens(Duration::from_millis(30), 3, Duration::from_millis(10));
    let h = Harness::start_with(POLICY, vec![llama(4, &llamacpp_metrics(0, 0), vec![script])], |_| {}).await;
    let t0 = Instant::now();
    let resp = h.post("/v1/chat/completions", "sk-demo-gold", &chat(true, 3)).await;
    assert_eq!(t0.elapsed(), Duration::from_millis(30), "headers with the first token");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-engine"], "llama");
    let rid = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    let text = body_text(resp).await;
    assert_eq!(t0.elapsed(), Duration::from_millis(50));
    assert!(text.contains(&format!("\"id\":\"chatcmpl-{rid}\"")), "the gateway's id: {text}");
    for t in ["t0", "t1", "t2"] {
        assert!(text.contains(&format!("\"content\":\"{t}\"")), "{t} in {text}");
    }
    assert!(text.contains("\"completion_tokens\":3"), "the upstream's usage: {text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    // What went up: the client's body with the gateway's decisions.
    let up = h.engines[0].last_body.lock().unwrap().clone().unwrap();
    assert_eq!(up["model"], "tiny-llama");
    assert_eq!(up["messages"][0]["content"], "hello");
    assert_eq!(
        (up["stream"].as_bool(), up["stream_options"]["include_usage"].as_bool()),
        (Some(true), Some(true))
    );
    assert_eq!(up["max_tokens"], 3);
}

#[tokio::test(start_paused = true)]
async fn a_non_streaming_request_is_collected_from_the_upstreams_stream() {
    let script = Script::tokens(Duration::from_millis(20), 2, Duration::from_millis(5));
    let h = Harness::start_with(POLICY, vec![llama(4, &llamacpp_metrics(0, 0), vec![script])], |_| {}).await;
    let resp = h.post("/v1/chat/completions", "sk-demo-gold", &chat(false, 2)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let doc: serde_json::Value = serde_json::from_str(&body_text(resp).await).unwrap();
    assert_eq!(doc["choices"][0]["message"]["content"], "t0t1");
    assert_eq!(doc["choices"][0]["finish_reason"], "length");
    assert_eq!(doc["usage"]["completion_tokens"], 2);
    assert_eq!(doc["object"], "chat.completion");
}

#[tokio::test(start_paused = true)]
async fn the_upstreams_own_queue_takes_its_slots_and_admission_refuses_with_a_reason() {
    // llama.cpp says 4 requests run and 2 wait that are not the gateway's:
    // of its 4 slots none is free, so the gateway's gate holds requests, and
    // one that cannot start within gold's 500 ms TTFT budget is refused.
    let slow = Script::tokens(Duration::from_secs(5), 1, Duration::ZERO);
    let h = Harness::start_with(POLICY, vec![llama(4, &llamacpp_metrics(4, 2), vec![slow])], |_| {}).await;
    let slot = h.app.engines.slot(0);
    let report = slot.report().expect("the metrics were read");
    assert_eq!((report.inflight_sequences, report.queued_sequences, report.batch_target), (4, 2, 1));
    let ask = chat(true, 8);
    let first = h.post("/v1/chat/completions", "sk-demo-gold", &ask);
    let second = h.post("/v1/chat/completions", "sk-demo-gold", &ask);
    let (first, second) = tokio::join!(first, second);
    let refused = if first.status() == StatusCode::OK { second } else { first };
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!refused.headers()["x-admission-reason"].is_empty());
    assert!(refused.headers().contains_key("retry-after"));
}

#[tokio::test(start_paused = true)]
async fn an_upstream_silent_mid_stream_is_cut_at_the_event_timeout_and_its_request_cancelled() {
    let steps = vec![
        Step::Wait(Duration::from_millis(10)),
        Step::Event(Event::Token { text: "t0".into() }),
        Step::Hang,
    ];
    let h = Harness::start_with(
        POLICY,
        vec![llama(4, &llamacpp_metrics(0, 0), vec![Script::Stream(steps)])],
        |c| {
            c.limits.engine_event_timeout_ms = 5_000;
        },
    )
    .await;
    let t0 = Instant::now();
    let resp = h.post("/v1/chat/completions", "sk-demo-gold", &chat(true, 8)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let text = body_text(resp).await;
    assert_eq!(t0.elapsed(), Duration::from_millis(5_010));
    assert!(
        text.contains("\"content\":\"t0\"") && text.contains("no event from the engine for 5s"),
        "{text}"
    );
    assert!(!text.contains("[DONE]"));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(h.engines[0].cancelled(), 1, "the upstream request is cancelled (its connection closed)");
    assert_eq!(h.engine_sequences(0), 0);
}

#[tokio::test(start_paused = true)]
async fn an_upstream_that_refuses_is_left_for_a_native_engine_before_the_first_byte() {
    let refuses = Script::Refuse(StatusCode::SERVICE_UNAVAILABLE, "server_busy");
    let native = TestEngine::native("e0", vec![Script::tokens(Duration::from_millis(15), 1, Duration::ZERO)]);
    let h =
        Harness::start_with(POLICY, vec![llama(4, &llamacpp_metrics(0, 0), vec![refuses]), native], |_| {})
            .await;
    let mut served = vec![];
    for _ in 0..2 {
        let resp = h.post("/v1/chat/completions", "sk-demo-gold", &chat(true, 1)).await;
        assert_eq!(resp.status(), StatusCode::OK);
        served.push(resp.headers()["x-engine"].to_str().unwrap().to_string());
        body_text(resp).await;
    }
    assert_eq!(served, ["e0", "e0"], "every request ends on the native engine");
    assert!(h.engines[0].requests() >= 1, "the upstream was tried");
}

#[tokio::test(start_paused = true)]
async fn an_upstream_with_a_model_list_gets_only_its_models() {
    let policy = format!("{POLICY}\n[[models]]\nid = \"tiny-llama\"\nowned_by = \"test\"\n");
    // The same profile as the native engine: without its model list the
    // idle upstream would be admission's choice.
    let profile = concat!(env!("CARGO_MANIFEST_DIR"), "/../policies/profiles/emulated-a100-8b.toml");
    let up = Upstream {
        flavour: Flavour::Llamacpp,
        models: vec!["tiny-llama".into()],
        profile: Some(profile.into()),
        ..Default::default()
    };
    let fast = Script::tokens(Duration::from_millis(5), 1, Duration::ZERO);
    let llama = TestEngine::openai("llama", up, &llamacpp_metrics(0, 0), vec![fast.clone()]);
    let native =
        TestEngine::native("e0", vec![Script::tokens(Duration::from_millis(100), 1, Duration::ZERO)]);
    let h = Harness::start_with(&policy, vec![llama, native], |_| {}).await;
    // The idle upstream is never offered synthetic-small, however busy e0 is.
    let ask = chat(true, 1);
    let answers = tokio::join!(
        h.post("/v1/chat/completions", "sk-demo-gold", &ask),
        h.post("/v1/chat/completions", "sk-demo-gold", &ask),
        h.post("/v1/chat/completions", "sk-demo-gold", &ask),
    );
    for resp in [answers.0, answers.1, answers.2] {
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["x-engine"], "e0");
        body_text(resp).await;
    }
    assert_eq!(h.engines[0].requests(), 0);
    // Its own model it serves.
    let mut tiny = chat(true, 1);
    tiny["model"] = json!("tiny-llama");
    let mut served = std::collections::BTreeSet::new();
    for _ in 0..3 {
        let resp = h.post("/v1/chat/completions", "sk-demo-gold", &tiny).await;
        assert_eq!(resp.status(), StatusCode::OK);
        served.insert(resp.headers()["x-engine"].to_str().unwrap().to_string());
        body_text(resp).await;
    }
    assert!(served.contains("llama"), "{served:?}");
}

/// Each flavour's `/metrics` page with `running` and `waiting` requests, in
/// the shape its server writes (names, labels and types from vLLM's,
/// SGLang's and TGI's documentation and source; values ours). A fake of the
/// server's metrics, since those servers need GPUs.
fn metrics_page(flavour: Flavour, running: u32, waiting: u32) -> String {
    match flavour {
        Flavour::Vllm => format!(
            "# TYPE vllm:num_requests_running gauge\n\
             vllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} {running}.0\n\
             # TYPE vllm:num_requests_waiting gauge\n\
             vllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} {waiting}.0\n\
             # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} 0.5\n"
        ),
        Flavour::Sglang => format!(
            "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{{model_name=\"m\"}} {running}.0\n\
             # TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{{model_name=\"m\"}} {waiting}.0\n\
             # TYPE sglang:token_usage gauge\nsglang:token_usage{{model_name=\"m\"}} 0.5\n"
        ),
        Flavour::Tgi => format!(
            "# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size {running}\n\
             # TYPE tgi_queue_size gauge\ntgi_queue_size {waiting}\n"
        ),
        Flavour::Llamacpp => llamacpp_metrics(running, waiting),
        Flavour::Generic => String::new(),
    }
}

#[tokio::test(start_paused = true)]
async fn every_flavours_metrics_feed_the_load_report() {
    for flavour in [Flavour::Vllm, Flavour::Sglang, Flavour::Tgi, Flavour::Llamacpp, Flavour::Generic] {
        let up = Upstream { flavour, max_batch: Some(8), kv_tokens: Some(64_000), ..Default::default() };
        let page = metrics_page(flavour, 5, 2);
        let h = Harness::start_with(POLICY, vec![TestEngine::openai("up", up, &page, vec![])], |_| {}).await;
        let r = h.app.engines.slot(0).report().expect("a report");
        assert!(r.ready, "{flavour:?}");
        if flavour == Flavour::Generic {
            // Nothing to read: the gateway's own counts stand alone.
            assert_eq!((r.inflight_sequences, r.queued_sequences, r.batch_target), (0, 0, 8), "{flavour:?}");
            continue;
        }
        assert_eq!((r.inflight_sequences, r.queued_sequences), (5, 2), "{flavour:?}");
        assert_eq!(r.batch_target, 1, "{flavour:?}: 7 foreign requests leave 1 of 8 slots");
        // KV in use as the server says (half; llama.cpp's page: a tenth) of
        // 4,000 pages; TGI says nothing.
        let kv = match flavour {
            Flavour::Tgi => 0,
            Flavour::Llamacpp => 3_600,
            _ => 2_000,
        };
        assert_eq!(r.kv_pages_free, kv, "{flavour:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_passthrough_parameter_goes_only_to_an_upstream_and_up_in_its_body() {
    let policy = POLICY.replace(
        "id = \"synthetic-small\"",
        "id = \"synthetic-small\"\npassthrough = [\"response_format\", \"top_k\"]",
    );
    let profile = concat!(env!("CARGO_MANIFEST_DIR"), "/../policies/profiles/emulated-a100-8b.toml");
    let up = Upstream { flavour: Flavour::Llamacpp, profile: Some(profile.into()), ..Default::default() };
    let fast = Script::tokens(Duration::from_millis(5), 1, Duration::ZERO);
    let llama = TestEngine::openai("llama", up, &llamacpp_metrics(0, 0), vec![fast.clone()]);
    let h =
        Harness::start_with(&policy, vec![TestEngine::native("e0", vec![fast.clone()]), llama], |_| {}).await;
    let mut ask = chat(true, 1);
    ask["response_format"] = json!({"type": "json_object"});
    ask["top_k"] = json!(40);
    for _ in 0..3 {
        let resp = h.post("/v1/chat/completions", "sk-demo-gold", &ask).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["x-engine"], "llama", "the native engine cannot honour it");
        body_text(resp).await;
    }
    let up = h.engines[1].last_body.lock().unwrap().clone().unwrap();
    assert_eq!(
        (up["response_format"]["type"].as_str(), up["top_k"].as_u64()),
        (Some("json_object"), Some(40))
    );
    // Without a third-party engine for the model: the 400 it always was,
    // saying why.
    let alone = Harness::start_with(&policy, vec![TestEngine::native("e0", vec![fast])], |_| {}).await;
    let resp = alone.post("/v1/chat/completions", "sk-demo-gold", &ask).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let err: serde_json::Value = serde_json::from_str(&body_text(resp).await).unwrap();
    assert_eq!(err["error"]["param"], "response_format", "{err}");
    assert_eq!(err["error"]["code"], "unsupported_parameter", "{err}");
}

/// A tool call streamed as OpenAI servers stream one: the role, the call's
/// name and arguments in pieces, `finish_reason: tool_calls`, the usage
/// chunk, `[DONE]`.
const TOOL_CALL_SSE: &[u8] = b"data: {\"id\":\"up-1\",\"object\":\"chat.completion.chunk\",\"model\":\"tiny-llama\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"up-1\",\"object\":\"chat.completion.chunk\",\"model\":\"tiny-llama\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"city\\\": \\\"Oslo\\\"}\"}}]},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"up-1\",\"object\":\"chat.completion.chunk\",\"model\":\"tiny-llama\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n\
data: {\"id\":\"up-1\",\"object\":\"chat.completion.chunk\",\"model\":\"tiny-llama\",\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":12,\"total_tokens\":42}}\n\n\
data: [DONE]\n\n";

/// The same call as one answer.
const TOOL_CALL_JSON: &[u8] = b"{\"id\":\"up-2\",\"object\":\"chat.completion\",\"model\":\"tiny-llama\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Oslo\\\"}\"}}]},\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":12,\"total_tokens\":42}}";

/// The shipped policy with `tools` and `tool_choice` passed through for the
/// model.
fn tools_policy() -> String {
    POLICY.replace(
        "id = \"synthetic-small\"",
        "id = \"synthetic-small\"\npassthrough = [\"tools\", \"tool_choice\"]",
    )
}

fn tool_request(stream: bool) -> serde_json::Value {
    let mut ask = chat(stream, 64);
    if stream {
        ask.as_object_mut().unwrap().remove("stream_options"); // no usage asked for
    }
    ask["tools"] = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    ask["tool_choice"] = json!("auto");
    ask
}

#[tokio::test(start_paused = true)]
async fn tool_calls_are_relayed_as_the_upstream_wrote_them_under_the_gateways_id() {
    let policy = tools_policy();
    let scripts = vec![
        Script::Stream(vec![Step::Wait(Duration::from_millis(20)), Step::Raw(TOOL_CALL_SSE)]),
        Script::Stream(vec![Step::Wait(Duration::from_millis(20)), Step::Raw(TOOL_CALL_JSON)]),
    ];
    let h = Harness::start_with(&policy, vec![llama(4, &llamacpp_metrics(0, 0), scripts)], |_| {}).await;
    // Streamed: every chunk as the upstream wrote it, re-stamped; the usage
    // chunk the gateway asked for is not the client's.
    let resp = h.post("/v1/chat/completions", "sk-demo-gold", &tool_request(true)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let rid = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    let text = body_text(resp).await;
    let chunks: Vec<serde_json::Value> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks.len(), 3, "{text}");
    for c in &chunks {
        assert_eq!(
            (c["id"].as_str(), c["model"].as_str()),
            (Some(format!("chatcmpl-{rid}").as_str()), Some("synthetic-small"))
        );
        assert!(c.get("usage").is_none());
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(
        chunks[1]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"],
        "{\"city\": \"Oslo\"}"
    );
    assert_eq!(chunks[2]["choices"][0]["finish_reason"], "tool_calls");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let up = h.engines[0].last_body.lock().unwrap().clone().unwrap();
    assert_eq!(
        (up["tools"][0]["function"]["name"].as_str(), up["tool_choice"].as_str()),
        (Some("get_weather"), Some("auto"))
    );
    // Not streamed: the upstream is asked for one answer, relayed re-stamped.
    let resp = h.post("/v1/chat/completions", "sk-demo-gold", &tool_request(false)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let doc: serde_json::Value = serde_json::from_str(&body_text(resp).await).unwrap();
    assert!(doc["id"].as_str().unwrap().starts_with("chatcmpl-req_"), "{doc}");
    assert_eq!(doc["model"], "synthetic-small");
    assert_eq!(
        doc["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
        "{\"city\": \"Oslo\"}"
    );
    assert_eq!(doc["usage"]["total_tokens"], 42);
    let up = h.engines[0].last_body.lock().unwrap().clone().unwrap();
    assert_eq!(up["stream"], false);
    assert!(up.get("stream_options").is_none());
}

#[tokio::test(start_paused = true)]
async fn a_whole_answer_past_the_bound_is_a_typed_error_not_a_buffer_without_end() {
    let policy = tools_policy();
    // A syntactically fine answer one byte over the bound.
    let head = br#"{"object":"chat.completion","choices":[],"pad":""#;
    let mut answer = head.to_vec();
    answer.resize(crate::upstream::MAX_ANSWER_BYTES + 1 - 2, b'x');
    answer.extend_from_slice(b"\"}");
    assert_eq!(answer.len(), crate::upstream::MAX_ANSWER_BYTES + 1);
    let answer: &'static [u8] = Box::leak(answer.into_boxed_slice());
    let scripts = vec![Script::Stream(vec![Step::Raw(answer)])];
    let h = Harness::start_with(&policy, vec![llama(4, &llamacpp_metrics(0, 0), scripts)], |_| {}).await;
    let resp = h.post("/v1/chat/completions", "sk-demo-gold", &tool_request(false)).await;
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    let text = body_text(resp).await;
    assert!(text.contains("\"engine_failed\"") && text.len() < 4096, "{}", &text[..text.len().min(400)]);
}

const EMBEDDING_JSON: &[u8] = b"{\"object\":\"list\",\"data\":[{\"object\":\"embedding\",\"index\":0,\"embedding\":[0.25,-0.5,0.125]}],\"model\":\"bge-small\",\"usage\":{\"prompt_tokens\":3,\"total_tokens\":3}}";

#[tokio::test(start_paused = true)]
async fn embeddings_go_to_an_upstream_serving_the_model_and_come_back_under_its_public_name() {
    let policy = format!("{POLICY}\n[[models]]\nid = \"text-embed\"\nowned_by = \"test\"\n");
    let up = Upstream {
        flavour: Flavour::Vllm,
        models: vec!["text-embed".into()],
        served_model: Some("bge-small".into()),
        ..Default::default()
    };
    let script = Script::Stream(vec![Step::Wait(Duration::from_millis(7)), Step::Raw(EMBEDDING_JSON)]);
    let emb = TestEngine::openai("emb", up, &metrics_page(Flavour::Vllm, 0, 0), vec![script]);
    let native = TestEngine::native("e0", vec![Script::tokens(Duration::from_millis(5), 1, Duration::ZERO)]);
    let h = Harness::start_with(&policy, vec![native, emb], |_| {}).await;
    let t0 = Instant::now();
    let resp = h
        .post("/v1/embeddings", "sk-demo-gold", &json!({"model": "text-embed", "input": "hello there"}))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(t0.elapsed(), Duration::from_millis(7));
    assert_eq!(resp.headers()["x-engine"], "emb");
    assert_eq!(resp.headers()["x-admission"], "admitted");
    let doc: serde_json::Value = serde_json::from_str(&body_text(resp).await).unwrap();
    assert_eq!(doc["model"], "text-embed", "the public name");
    assert_eq!(doc["data"][0]["embedding"], json!([0.25, -0.5, 0.125]));
    assert!(doc.get("id").is_none(), "nothing added");
    let up = h.engines[1].last_body.lock().unwrap().clone().unwrap();
    assert_eq!((up["model"].as_str(), up["input"].as_str()), (Some("bge-small"), Some("hello there")));
    assert!(up.get("max_tokens").is_none() && up.get("stream").is_none(), "the body as sent: {up}");
    // No engine computes embeddings for the text model.
    let resp =
        h.post("/v1/embeddings", "sk-demo-gold", &json!({"model": "synthetic-small", "input": "x"})).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let err: serde_json::Value = serde_json::from_str(&body_text(resp).await).unwrap();
    assert_eq!(
        (err["error"]["param"].as_str(), err["error"]["code"].as_str()),
        (Some("model"), Some("unsupported_parameter"))
    );
    assert_eq!(h.engines[0].requests(), 0, "the native engine was never asked");
}

#[tokio::test(start_paused = true)]
async fn discovered_models_are_the_ones_an_upstream_gets() {
    let policy = format!("{POLICY}\n[[models]]\nid = \"tiny-llama\"\nowned_by = \"test\"\n");
    let profile = concat!(env!("CARGO_MANIFEST_DIR"), "/../policies/profiles/emulated-a100-8b.toml");
    let up = Upstream {
        flavour: Flavour::Llamacpp,
        discover_models: true,
        profile: Some(profile.into()),
        ..Default::default()
    };
    let fast = Script::tokens(Duration::from_millis(5), 1, Duration::ZERO);
    let llama =
        TestEngine::openai("llama", up, &llamacpp_metrics(0, 0), vec![fast.clone()]).listing(&["tiny-llama"]);
    let native =
        TestEngine::native("e0", vec![Script::tokens(Duration::from_millis(100), 1, Duration::ZERO)]);
    let h = Harness::start_with(&policy, vec![llama, native], |_| {}).await;
    let slot = h.app.engines.slot(0);
    assert!(slot.serves("tiny-llama", false) && !slot.serves("synthetic-small", false), "as it lists");
    let ask = chat(true, 1);
    let answers = tokio::join!(
        h.post("/v1/chat/completions", "sk-demo-gold", &ask),
        h.post("/v1/chat/completions", "sk-demo-gold", &ask),
    );
    for resp in [answers.0, answers.1] {
        assert_eq!(resp.headers()["x-engine"], "e0");
        body_text(resp).await;
    }
    assert_eq!(h.engines[0].requests(), 0);
}

/// Anthropic's tool use through an OpenAI-speaking upstream: the request's
/// tools, choice and `tool_use` / `tool_result` history go up as OpenAI's;
/// the upstream's tool call comes back as a `tool_use` block (streamed:
/// `input_json_delta`s; whole: the parsed input), `stop_reason: tool_use`.
#[tokio::test(start_paused = true)]
async fn anthropic_tool_use_is_translated_both_ways_through_an_openai_upstream() {
    let policy = tools_policy();
    let scripts = vec![
        Script::Stream(vec![Step::Wait(Duration::from_millis(20)), Step::Raw(TOOL_CALL_SSE)]),
        Script::Stream(vec![Step::Wait(Duration::from_millis(20)), Step::Raw(TOOL_CALL_JSON)]),
    ];
    let h = Harness::start_with(&policy, vec![llama(4, &llamacpp_metrics(0, 0), scripts)], |_| {}).await;
    let ask = |stream: bool| {
        json!({"model": "synthetic-small", "max_tokens": 64, "stream": stream,
               "tools": [{"name": "get_weather", "description": "the weather",
                          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
               "tool_choice": {"type": "any"},
               "messages": [
                   {"role": "user", "content": "weather in Paris, then Oslo?"},
                   {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_0", "name": "get_weather", "input": {"city": "Paris"}}]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_0", "content": "sunny"}, {"type": "text", "text": "and Oslo?"}]}]})
    };
    let version = [("anthropic-version", "2023-06-01")];
    let resp = h.post_with("/v1/messages", "sk-demo-gold", &ask(true), &version).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let text = body_text(resp).await;
    let events: Vec<(String, serde_json::Value)> = text
        .split("\n\n")
        .filter(|b| !b.is_empty())
        .map(|b| {
            let (name, data) = b.split_once("\ndata: ").unwrap();
            (name.trim_start_matches("event: ").to_string(), serde_json::from_str(data).unwrap())
        })
        .collect();
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ],
        "{text}"
    );
    assert_eq!(
        events[2].1["content_block"],
        json!({"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}})
    );
    assert_eq!(
        events[3].1["delta"],
        json!({"type": "input_json_delta", "partial_json": "{\"city\": \"Oslo\"}"})
    );
    assert_eq!(events[5].1["delta"]["stop_reason"], "tool_use");
    assert_eq!(events[5].1["usage"]["output_tokens"], 12, "the upstream's usage");
    let up = h.engines[0].last_body.lock().unwrap().clone().unwrap();
    assert_eq!(up["tools"][0]["function"]["name"], "get_weather");
    assert_eq!(up["tools"][0]["function"]["parameters"]["properties"]["city"]["type"], "string");
    assert_eq!(up["tool_choice"], "required");
    let msgs = up["messages"].as_array().unwrap();
    assert_eq!(msgs[1]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}");
    assert_eq!((msgs[2]["role"].as_str(), msgs[2]["tool_call_id"].as_str()), (Some("tool"), Some("toolu_0")));
    assert_eq!((msgs[3]["role"].as_str(), msgs[3]["content"].as_str()), (Some("user"), Some("and Oslo?")));
    // Not streamed: one message with the parsed input.
    let resp = h.post_with("/v1/messages", "sk-demo-gold", &ask(false), &version).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let doc: serde_json::Value = serde_json::from_str(&body_text(resp).await).unwrap();
    assert_eq!(doc["type"], "message");
    assert_eq!(
        doc["content"],
        json!([{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Oslo"}}])
    );
    assert_eq!(
        (doc["stop_reason"].as_str(), doc["usage"]["input_tokens"].as_u64()),
        (Some("tool_use"), Some(30))
    );
    // A model without tools passed through: a typed 400 in Anthropic's shape.
    let alone = Harness::start_with(POLICY, vec![TestEngine::native("e0", vec![])], |_| {}).await;
    let resp = alone.post_with("/v1/messages", "sk-demo-gold", &ask(false), &version).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let err: serde_json::Value = serde_json::from_str(&body_text(resp).await).unwrap();
    assert_eq!(err["type"], "error");
    assert_eq!(err["error"]["type"], "invalid_request_error");
    assert!(err["error"]["message"].as_str().unwrap().contains("tool"), "{err}");
}
