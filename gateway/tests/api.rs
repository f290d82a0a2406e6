//! The public API against a real `gateway up` (TLS, HTTP/2 and HTTP/1.1,
//! engine child processes): OpenAI response shapes, SSE framing, usage,
//! errors, health, metrics.

mod common;

use common::*;
use http::StatusCode;
use loadtest::client::{body_bytes, Proto};
use serde_json::{json, Value};
use std::time::Duration;

fn data(events: &[loadtest::sse::SseEvent]) -> Vec<String> {
    events.iter().map(|e| e.data.clone()).collect()
}

#[tokio::test]
async fn streaming_chat_over_h2_and_http1_has_openai_framing_and_usage() {
    let sys = System::start(INSTANT, 2).await;
    let mut texts = Vec::new();
    for proto in [Proto::H2, Proto::Http1] {
        let conn = sys.conn(proto).await;
        let body = json!({
            "model": MODEL, "stream": true, "max_tokens": 5, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "Tell me a story"}],
        });
        let resp = conn.post_json("/v1/chat/completions", Some(GOLD), body.to_string()).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        assert!(resp.headers().contains_key("x-request-id"));
        assert!(resp.headers()["x-engine"].to_str().unwrap().starts_with('e'));
        let events = data(&sse_events(resp).await);
        assert_eq!(events.last().unwrap(), "[DONE]", "{proto:?}: stream ends with [DONE]");
        let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|d| json(d.as_bytes())).collect();
        let id = chunks[0]["id"].clone();
        for c in &chunks {
            assert_eq!(c["object"], "chat.completion.chunk");
            assert_eq!(c["id"], id, "one id per stream");
            assert_eq!(c["model"], MODEL);
        }
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant", "role delta first");
        let n = chunks.len();
        let finish = &chunks[n - 2]["choices"][0];
        assert_eq!(finish["finish_reason"], "length");
        assert!(chunks[..n - 2].iter().all(|c| c["choices"][0]["finish_reason"].is_null()));
        assert!(chunks[..n - 1].iter().all(|c| c["usage"].is_null()), "usage: null until the last chunk");
        let usage = &chunks[n - 1];
        assert_eq!(usage["choices"], json!([]));
        let prompt = "<|user|>\nTell me a story\n<|assistant|>\n";
        assert_eq!(usage["usage"]["prompt_tokens"], policies::tokens::count(prompt));
        assert_eq!(usage["usage"]["completion_tokens"], 5);
        assert_eq!(usage["usage"]["total_tokens"], policies::tokens::count(prompt) + 5);
        let text: String =
            chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(chunks.iter().filter(|c| c["choices"][0]["delta"]["content"].is_string()).count(), 6);
        texts.push(text);
    }
    assert_eq!(texts[0], texts[1], "same prompt, same text over both protocols");
}

#[tokio::test]
async fn non_streaming_chat_and_completions_return_one_body_with_usage() {
    let sys = System::start(INSTANT, 2).await;
    let conn = sys.conn(Proto::H2).await;
    let resp =
        conn.post_json("/v1/chat/completions", Some(GOLD), chat_body("Hello", 7, false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/json");
    assert!(resp.headers().contains_key("x-engine"));
    let v = json(&body_bytes(resp).await.unwrap());
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 7);
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(text.split_whitespace().count(), 7, "{text:?}");

    // The streamed text for the same request is the same text.
    let resp = conn.post_json("/v1/chat/completions", Some(GOLD), chat_body("Hello", 7, true)).await.unwrap();
    let streamed: String = data(&sse_events(resp).await)
        .iter()
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| json(d.as_bytes())["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(streamed, text);

    let body = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3});
    let resp = conn.post_json("/v1/completions", Some(BRONZE), body.to_string()).await.unwrap();
    let v = json(&body_bytes(resp).await.unwrap());
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"]["prompt_tokens"], policies::tokens::count("Once upon a time"));
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert!(v["choices"][0]["text"].as_str().unwrap().len() > 3);
}

/// The cpu backend end to end: a real (small) transformer behind the
/// gateway, deterministic at temperature 0, different for other prompts.
#[tokio::test]
async fn cpu_backend_engines_serve_model_text_through_the_gateway() {
    let sys = System::start_with(INSTANT, 1, &TINY_CPU_MODEL).await;
    assert_eq!(sys.engine_load(&sys.engines[0].id).await.backend, "cpu");
    let conn = sys.conn(Proto::H2).await;
    let ask = |prompt: &str| {
        json!({"model": MODEL, "max_tokens": 12, "temperature": 0,
               "messages": [{"role": "user", "content": prompt}]})
        .to_string()
    };
    let mut texts = Vec::new();
    for prompt in ["What is paged attention?", "What is paged attention?", "Write a haiku"] {
        let resp = conn.post_json("/v1/chat/completions", Some(GOLD), ask(prompt)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let v = json(&body_bytes(resp).await.unwrap());
        let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        let n = v["usage"]["completion_tokens"].as_u64().unwrap();
        assert!((1..=12).contains(&n), "{v}");
        assert_eq!(text.split_whitespace().count() as u64, n, "one word per token: {text:?}");
        texts.push(text);
    }
    assert_eq!(texts[0], texts[1], "greedy decoding is deterministic");
    assert_ne!(texts[0], texts[2], "the prompt drives the model");
}

#[tokio::test]
async fn streaming_completions_end_with_done() {
    let sys = System::start(INSTANT, 1).await;
    let conn = sys.conn(Proto::Http1).await;
    let body = json!({"model": MODEL, "prompt": "abc", "max_tokens": 4, "stream": true});
    let resp = conn.post_json("/v1/completions", Some(GOLD), body.to_string()).await.unwrap();
    let events = data(&sse_events(resp).await);
    assert_eq!(events.len(), 4 + 1 + 1, "4 tokens, the finish chunk, [DONE]: {events:?}");
    assert_eq!(events[5], "[DONE]");
    let finish = json(events[4].as_bytes());
    assert_eq!(finish["object"], "text_completion");
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert!(finish.get("usage").is_none(), "no usage unless include_usage");
}

#[tokio::test]
async fn output_cap_clamps_and_context_ceiling_refuses() {
    let sys = System::start(INSTANT, 1).await;
    let conn = sys.conn(Proto::H2).await;
    // Find a prompt whose natural answer is longer than bronze's 256-token cap.
    let prompt = (0..)
        .map(|i| format!("long answer {i}"))
        .find(|p| {
            let mut src = engine::backend::emulated::TextSource::new(p, None);
            std::iter::from_fn(|| src.next_token()).count() > 256
        })
        .unwrap();
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 5000});
    let v = json(
        &body_bytes(conn.post_json("/v1/completions", Some(BRONZE), body.to_string()).await.unwrap())
            .await
            .unwrap(),
    );
    assert_eq!(v["usage"]["completion_tokens"], 256, "clamped to the bronze cap");
    assert_eq!(v["choices"][0]["finish_reason"], "length");

    let long = "word ".repeat(2100); // 2100 tokens > bronze's 2048 ceiling
    let body = json!({"model": MODEL, "prompt": long, "max_tokens": 5});
    let resp = conn.post_json("/v1/completions", Some(BRONZE), body.to_string()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let v = json(&body_bytes(resp).await.unwrap());
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    // Gold's ceiling is 8192: the same prompt is fine there.
    let resp = conn.post_json("/v1/completions", Some(GOLD), body.to_string()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn auth_errors_are_401_with_openai_bodies() {
    let sys = System::start(INSTANT, 1).await;
    for proto in [Proto::H2, Proto::Http1] {
        let conn = sys.conn(proto).await;
        for (key, code) in [(None, "missing_api_key"), (Some("sk-wrong"), "invalid_api_key")] {
            let resp = conn.post_json("/v1/chat/completions", key, chat_body("hi", 1, false)).await.unwrap();
            assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
            assert!(resp.headers().contains_key("x-request-id"));
            let v = json(&body_bytes(resp).await.unwrap());
            assert_eq!(v["error"]["code"], code);
            assert_eq!(v["error"]["type"], "authentication_error");
            assert!(v["error"]["message"].is_string() && v["error"].get("param").is_some());
        }
        let resp = conn.get("/v1/models", None).await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        let resp = conn.get("/v1/models", Some(GOLD)).await.unwrap();
        let v = json(&body_bytes(resp).await.unwrap());
        assert_eq!(v["object"], "list");
        assert_eq!(v["data"][0]["id"], MODEL);
        let resp = conn.get(&format!("/v1/models/{MODEL}"), Some(GOLD)).await.unwrap();
        assert_eq!(json(&body_bytes(resp).await.unwrap())["id"], MODEL);
    }
}

async fn expect_error(
    conn: &loadtest::client::Conn,
    path: &str,
    body: String,
    status: StatusCode,
    code: &str,
) -> Value {
    let resp = conn.post_json(path, Some(GOLD), body).await.unwrap_or_else(|e| panic!("{code}: {e}"));
    assert_eq!(resp.status(), status, "{code}");
    assert_eq!(resp.headers()["content-type"], "application/json");
    let v = json(&body_bytes(resp).await.unwrap());
    assert_eq!(v["error"]["code"], code, "{v}");
    v
}

#[tokio::test]
async fn bad_input_gets_typed_errors_and_the_connection_survives() {
    let sys = System::start(INSTANT, 1).await;
    for proto in [Proto::H2, Proto::Http1] {
        let conn = sys.conn(proto).await;
        let chat = "/v1/chat/completions";
        let v =
            expect_error(&conn, chat, "{\"model\": ".into(), StatusCode::BAD_REQUEST, "invalid_json").await;
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let body =
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"});
        let v = expect_error(&conn, chat, body.to_string(), StatusCode::BAD_REQUEST, "invalid_value").await;
        assert_eq!(v["error"]["param"], "max_tokens");
        let body =
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "frobnicate": true});
        let v =
            expect_error(&conn, chat, body.to_string(), StatusCode::BAD_REQUEST, "unknown_parameter").await;
        assert_eq!(v["error"]["param"], "frobnicate");
        let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 3});
        let v = expect_error(&conn, chat, body.to_string(), StatusCode::BAD_REQUEST, "unsupported_parameter")
            .await;
        assert_eq!(v["error"]["param"], "n");
        let body = json!({"model": "gpt-nope", "messages": [{"role": "user", "content": "x"}]});
        let v = expect_error(&conn, chat, body.to_string(), StatusCode::NOT_FOUND, "model_not_found").await;
        assert_eq!(v["error"]["param"], "model");
        let huge = format!("{{\"model\":\"{MODEL}\",\"prompt\":\"{}\"}}", "a".repeat(2 << 20));
        expect_error(&conn, "/v1/completions", huge, StatusCode::PAYLOAD_TOO_LARGE, "request_too_large")
            .await;
        expect_error(&conn, "/v1/nope", "{}".into(), StatusCode::NOT_FOUND, "unknown_url").await;
        let resp = conn.get(chat, Some(GOLD)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(header(&resp, "allow"), "POST", "a 405 names the methods allowed");
        let resp = conn.post_json("/v1/videos/v_1", Some(GOLD), "{}").await.unwrap();
        assert_eq!((resp.status(), header(&resp, "allow")), (StatusCode::METHOD_NOT_ALLOWED, "GET, DELETE"));
        let v = json(&body_bytes(resp).await.unwrap());
        assert_eq!(v["error"]["code"], "method_not_allowed");
        if proto == Proto::H2 {
            // A multiplexed connection keeps working after every error above.
            let resp = conn.post_json(chat, Some(GOLD), chat_body("still there?", 2, false)).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
        }
    }
}

#[tokio::test]
async fn health_readiness_metrics_and_request_ids() {
    let sys = System::start(INSTANT, 2).await;
    let conn = sys.conn(Proto::H2).await;
    let resp = conn.get("/healthz", None).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = conn.get("/readyz", None).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let v = json(&body_bytes(resp).await.unwrap());
    assert_eq!(v["detail"]["ready_engines"], 2);
    assert_eq!(v["detail"]["engines"][1]["load"]["backend"], "emulated");
    assert_eq!(v["detail"]["engines"][1]["engine_class"], "test-instant", "the profile was fetched");
    assert_eq!(v["detail"]["admission"]["mode"], "slo");
    assert_eq!(v["detail"]["admission"]["brownout_level"], 0);
    assert_eq!(v["detail"]["admission"]["waiting_at_gate"], 0);

    let req = http::Request::post("/v1/chat/completions")
        .header("authorization", format!("Bearer {GOLD}"))
        .header("x-request-id", "client-chosen-42")
        .body(http_body_util::Full::new(bytes::Bytes::from(chat_body("hi", 2, true))))
        .unwrap();
    let resp = conn.send(req).await.unwrap();
    assert_eq!(resp.headers()["x-request-id"], "client-chosen-42");
    let events = sse_events(resp).await;
    assert_eq!(json(events[0].data.as_bytes())["id"], "chatcmpl-client-chosen-42");

    let text = sys.metrics().await;
    for needle in [
        "gateway_requests_total{route=\"chat_completions\",status=\"200\"} 1",
        "gateway_requests_total{route=\"readyz\",status=\"200\"} 1",
        "gateway_ttft_seconds_bucket{tier=\"gold\"",
        "gateway_tlet_seconds_count{tier=\"gold\"} 1",
        "gateway_slo_requests_total{tier=\"gold\",slo=\"ttft\",result=\"met\"} 1",
        "gateway_slo_requests_total{tier=\"gold\",slo=\"e2e\",result=\"met\"} 1",
        "gateway_inflight_requests 0",
        "gateway_ready_engines 2",
    ] {
        assert!(text.contains(needle), "metrics lack {needle:?}:\n{text}");
    }
}

/// The official OpenAI Python client, unmodified, given only a base URL and
/// a key (plus the dev CA through SSL_CERT_FILE). The test command installs
/// it into a virtualenv and sets OPENAI_PYTHON; CI fails if it is missing.
#[tokio::test]
async fn official_openai_python_client_works_streaming_and_not() {
    let sys = System::start(INSTANT, 2).await;
    run_openai_script(&sys, "openai_client.py").await;
}

/// The gateway in front of this project's engine through the engine's
/// OpenAI surface (`kind = "openai"`, vLLM flavour): a second gateway over
/// the first one's engine, reaching it as it would reach vLLM, with the
/// engine's API token as the upstream's key. The official OpenAI Python
/// client runs through it unmodified, and the gateway reads the engine's
/// vLLM-named metrics into its load report.
#[tokio::test]
async fn the_gateway_fronts_its_own_engines_openai_surface_as_an_openai_upstream() {
    let native = System::start(INSTANT, 1).await;
    let engine_url = &native.engines[0].url;
    // A name of this test's own: the variable is read by the gateway child.
    std::env::set_var("OWN_ENGINE_TOKEN_FOR_OPENAI_TEST", native.engine_token());
    let engines = format!(
        "[[engines]]\nid = \"own-openai\"\nurl = \"{engine_url}\"\nkind = \"openai\"\n\
         upstream = {{ flavour = \"vllm\", max_batch = 16, api_key_env = \"OWN_ENGINE_TOKEN_FOR_OPENAI_TEST\" }}\n"
    );
    let sys = System::serve(&engines, &default_policy()).await;
    run_openai_script(&sys, "openai_client.py").await;
    let conn = sys.conn(Proto::H2).await;
    let resp = conn.post_json("/v1/chat/completions", Some(GOLD), chat_body("hi", 3, true)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{}", sys.log());
    assert_eq!(header(&resp, "x-engine"), "own-openai");
    let text = String::from_utf8(body_bytes(resp).await.unwrap().to_vec()).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let ready = sys.readyz().await;
    let engine = &ready["detail"]["engines"][0];
    assert_eq!((&engine["id"], &engine["ready"]), (&json!("own-openai"), &json!(true)), "{ready}");
    assert_eq!(engine["load"]["backend"], "external", "{ready}");
    assert!(engine["load"]["kv_pages_total"].as_u64().is_some(), "{ready}");
}

/// The official Anthropic Python SDK, unmodified, on the Messages API:
/// `messages.create`, `messages.stream` (text deltas, the final message),
/// `count_tokens`, and its typed exceptions, the 429 among them with the
/// gateway's Retry-After honoured by the SDK's own retry (bronze here
/// allows one request at a time; the script holds it with a paced stream).
#[tokio::test]
async fn official_anthropic_sdk_speaks_the_messages_api() {
    let policy = default_policy();
    let bronze = policy.find("[tiers.bronze]").unwrap();
    let policy = format!(
        "{}{}",
        &policy[..bronze],
        policy[bronze..].replacen("max_concurrency = 256", "max_concurrency = 1", 1)
    );
    let sys = System::start_with_policy(&paced(1, 20), 1, &[], Some(&policy)).await;
    run_sdk_script(&sys, "anthropic_client.py", &[("HELD_KEY", BRONZE)]).await;
}

/// The official OpenAI Python client, unmodified, on the Responses API:
/// `responses.create` (cut at `max_output_tokens` and whole), `retrieve`,
/// chaining with `previous_response_id`, `responses.stream`, `delete`, and
/// another tenant's 404.
#[tokio::test]
async fn official_openai_client_speaks_the_responses_api() {
    let sys = System::start(INSTANT, 1).await;
    run_sdk_script(&sys, "openai_responses.py", &[("OTHER_KEY", SILVER)]).await;
}

/// The Messages API on the wire: `x-api-key` authenticates, a stream is
/// Anthropic's named events, and every error (auth, version, schema,
/// method) is Anthropic's shape, on both HTTP versions.
#[tokio::test]
async fn the_messages_api_on_the_wire_has_anthropics_events_and_errors() {
    let sys = System::start(INSTANT, 1).await;
    let body = |stream: bool| {
        json!({"model": MODEL, "max_tokens": 3, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
            .to_string()
    };
    let post = |key: Option<&str>, version: Option<&str>, body: String| {
        let mut req = http::Request::post("/v1/messages").header("content-type", "application/json");
        if let Some(k) = key {
            req = req.header("x-api-key", k);
        }
        if let Some(v) = version {
            req = req.header("anthropic-version", v);
        }
        req.body(http_body_util::Full::new(bytes::Bytes::from(body))).unwrap()
    };
    for proto in [Proto::H2, Proto::Http1] {
        let conn = sys.conn(proto).await;
        let resp = conn.send(post(Some(GOLD), Some("2023-06-01"), body(true))).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(header(&resp, "content-type"), "text/event-stream");
        let text = String::from_utf8(body_bytes(resp).await.unwrap().to_vec()).unwrap();
        let names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "ping",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ],
            "{text}"
        );
        assert!(!text.contains("[DONE]"), "no OpenAI terminator: {text}");
        let cases = [
            (post(None, Some("2023-06-01"), body(false)), 401, "authentication_error"),
            (post(Some("sk-wrong"), Some("2023-06-01"), body(false)), 401, "authentication_error"),
            (post(Some(GOLD), None, body(false)), 400, "invalid_request_error"),
            (post(Some(GOLD), Some("1999-01-01"), body(false)), 400, "invalid_request_error"),
            (post(Some(GOLD), Some("2023-06-01"), "{\"model\":".into()), 400, "invalid_request_error"),
            (
                post(
                    Some(GOLD),
                    Some("2023-06-01"),
                    json!({"model": "nope", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]})
                        .to_string(),
                ),
                404,
                "not_found_error",
            ),
        ];
        for (req, status, kind) in cases {
            let resp = conn.send(req).await.unwrap();
            assert_eq!(resp.status().as_u16(), status, "{kind}");
            let v = json(&body_bytes(resp).await.unwrap());
            assert_eq!((&v["type"], &v["error"]["type"]), (&json!("error"), &json!(kind)), "{v}");
            assert!(v["error"]["message"].is_string(), "{v}");
        }
        let get = http::Request::get("/v1/messages")
            .header("x-api-key", GOLD)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let resp = conn.send(get).await.unwrap();
        assert_eq!((resp.status(), header(&resp, "allow")), (StatusCode::METHOD_NOT_ALLOWED, "POST"));
        assert_eq!(json(&body_bytes(resp).await.unwrap())["type"], "error");
    }
}

/// OpenAI's `x-ratelimit-*` headers on every answer of a tier with
/// per-minute limits (the refusal too), and Anthropic's
/// `anthropic-ratelimit-*` on the Messages API's.
#[tokio::test]
async fn answers_carry_the_callers_rate_limit_headers() {
    let policy = default_policy().replacen(
        "priority_weight = 2\n",
        "priority_weight = 2\nrequests_per_minute = 4\ntokens_per_minute = 100000\n",
        1,
    );
    let sys = System::start_with_policy(INSTANT, 1, &[], Some(&policy)).await;
    let conn = sys.conn(Proto::H2).await;
    for _attempt in 0..2 {
        let minute = wall_minute();
        let mut seen = Vec::new();
        for i in 0..5 {
            let req = if i == 2 {
                let body =
                    json!({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
                request("/v1/messages", SILVER, body.to_string(), &[("anthropic-version", "2023-06-01")])
            } else {
                request("/v1/chat/completions", SILVER, chat_body("hi", 2, false), &[])
            };
            let resp = conn.send(req).await.unwrap();
            let h = |name: &str| resp.headers().get(name).map(|v| v.to_str().unwrap().to_string());
            seen.push((
                resp.status().as_u16(),
                h("x-ratelimit-remaining-requests").or(h("anthropic-ratelimit-requests-remaining")),
                h("x-ratelimit-limit-tokens").or(h("anthropic-ratelimit-tokens-limit")),
                h("x-ratelimit-reset-requests").or(h("anthropic-ratelimit-requests-reset")),
            ));
            let _ = body_bytes(resp).await;
        }
        if wall_minute() != minute {
            continue; // the window turned over mid-run
        }
        let statuses: Vec<_> = seen.iter().map(|s| s.0).collect();
        assert_eq!(statuses, [200, 200, 200, 200, 429], "{seen:?}");
        let remaining: Vec<_> = seen.iter().map(|s| s.1.as_deref().unwrap_or("-")).collect();
        assert_eq!(remaining, ["3", "2", "1", "0", "0"], "{seen:?}");
        assert!(seen[..4].iter().all(|s| s.2.as_deref() == Some("100000")), "{seen:?}");
        assert!(seen[0].3.as_deref().is_some_and(|r| r.ends_with('s')), "OpenAI: a duration: {seen:?}");
        assert!(seen[2].3.as_deref().is_some_and(|r| r.ends_with('Z')), "Anthropic: RFC 3339: {seen:?}");
        let gold =
            conn.send(request("/v1/chat/completions", GOLD, chat_body("hi", 2, false), &[])).await.unwrap();
        assert!(gold.headers().get("x-ratelimit-limit-requests").is_none(), "gold has no per-minute limit");
        return;
    }
    panic!("two attempts straddled minute boundaries");
}

/// The wall-clock minute: the tenant windows' boundaries.
#[allow(clippy::disallowed_methods)] // the gateway's windows are wall-clock minutes
fn wall_minute() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 60
}

/// The usage export's rows for one key, grouped by key.
async fn key_usage(sys: &System, id: &str) -> Value {
    let (status, v) = admin_json(sys, "GET", "/admin/usage?group_by=key", None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v["data"].as_array().unwrap().iter().find(|r| r["key"] == id).cloned().unwrap_or(Value::Null)
}

/// Keys made at run time: shown once, kept as hashes, used through both
/// headers, limited to their models, counted (finished and cancelled
/// streams as the client saw them) and priced, refused once their budget is
/// spent, rotated and revoked with an audit entry each, and still there
/// with their usage after a restart (the state directory).
#[tokio::test]
async fn keys_made_at_run_time_are_counted_budgeted_revoked_and_survive_a_restart() {
    let state = std::env::temp_dir().join(format!("gateway-state-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let policy = default_policy()
        .replacen(
            "[cost]\n",
            "[cost]\ntokens = { synthetic-small = { input_per_mtok = 1000.0, output_per_mtok = 2000.0 } }\n",
            1,
        )
        .replacen("[[models]]\n", "[[models]]\nid = \"other-model\"\n\n[[models]]\n", 1);
    let state_arg = state.display().to_string();
    let mut sys =
        System::start_with_policy(&paced(0, 10), 1, &["--state-dir", &state_arg], Some(&policy)).await;
    let (status, made) = admin_json(
        &sys,
        "POST",
        "/admin/keys",
        Some(json!({"tenant": "demo-silver", "name": "ci", "models": [MODEL], "budget": {"tokens_per_day": 120}})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let (id, secret) = (made["id"].as_str().unwrap().to_string(), made["key"].as_str().unwrap().to_string());
    assert!(made.get("hash").is_none(), "{made}");
    let (_, text) = admin_text(&sys, "GET", "/admin/keys", None).await;
    let listed = json(text.as_bytes());
    assert_eq!(listed["data"][0]["id"], id.as_str());
    assert!(!text.contains(&secret), "the secret is shown once: {text}");
    let saved = std::fs::read_to_string(state.join("keys.json")).unwrap();
    assert!(!saved.contains(&secret), "only its hash is kept");

    let conn = sys.conn(Proto::H2).await;
    let chat =
        |key: &str, stream: bool| request("/v1/chat/completions", key, chat_body("hi", 5, stream), &[]);
    for stream in [false, true] {
        let resp = conn.send(chat(&secret, stream)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        // No per-minute token limit on silver: the key's day budget is the
        // tokens trio, resetting at midnight UTC.
        assert_eq!(header(&resp, "x-ratelimit-limit-tokens"), "120");
        assert!(header(&resp, "x-ratelimit-reset-tokens").ends_with('s'), "{:?}", resp.headers());
        let _ = body_bytes(resp).await.unwrap();
    }
    // Anthropic's header works for the same key; another model does not.
    let body = json!({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    let req = http::Request::post("/v1/messages")
        .header("x-api-key", &secret)
        .header("anthropic-version", "2023-06-01")
        .body(http_body_util::Full::new(bytes::Bytes::from(body.to_string())))
        .unwrap();
    assert_eq!(conn.send(req).await.unwrap().status(), StatusCode::OK);
    let other =
        json!({"model": "other-model", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    let resp = conn.send(request("/v1/chat/completions", &secret, other.to_string(), &[])).await.unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert_eq!(json(&body_bytes(resp).await.unwrap())["error"]["code"], "model_not_allowed");

    // A stream the client leaves after its first tokens counts what it saw.
    let long = request("/v1/chat/completions", &secret, chat_body(&long_prompt(200), 200, true), &[]);
    let resp = conn.send(long).await.unwrap();
    let mut body = resp.into_body();
    let mut seen = 0;
    while seen < 3 {
        let frame = http_body_util::BodyExt::frame(&mut body).await.unwrap().unwrap();
        if let Ok(data) = frame.into_data() {
            seen += String::from_utf8_lossy(&data).matches("\"content\":\"").count();
        }
    }
    drop(body);
    let mut usage = Value::Null;
    for _ in 0..50 {
        usage = key_usage(&sys, &id).await;
        if usage["requests"] == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(usage["requests"], 4, "{usage}");
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!((15 + 2..15 + 100).contains(&completion), "3 x 5 finished + the cancelled stream's few: {usage}");
    let (p, c) = (usage["prompt_tokens"].as_f64().unwrap(), completion as f64);
    let cost = usage["cost_usd"].as_f64().unwrap();
    assert!((cost - (p * 1000.0 + c * 2000.0) / 1e6).abs() < 1e-6, "priced at [cost.tokens]: {usage}");
    let (_, csv) = admin_text(&sys, "GET", "/admin/usage?group_by=key,model&format=csv", None).await;
    assert!(
        csv.starts_with("key,model,requests,prompt_tokens,completion_tokens,cached_tokens,cost_usd\n"),
        "{csv}"
    );
    assert!(csv.contains(&format!("{id},{MODEL},4,")), "{csv}");

    // The budget (120 tokens a day) is spent within a few more requests.
    let mut refused = None;
    for _ in 0..20 {
        let resp = conn.send(chat(&secret, false)).await.unwrap();
        if resp.status() == StatusCode::TOO_MANY_REQUESTS {
            let retry = header(&resp, "retry-after").parse::<u64>().unwrap();
            refused = Some((json(&body_bytes(resp).await.unwrap()), retry));
            break;
        }
        let _ = body_bytes(resp).await;
    }
    let (err, retry) = refused.expect("the day's budget runs out");
    assert_eq!(err["error"]["code"], "budget_exceeded", "{err}");
    assert!(err["error"]["message"].as_str().unwrap().contains("key tokens_per_day"), "{err}");
    assert!(retry > 0 && retry <= 86_400, "until midnight UTC: {retry}");

    // Rotation retires the old secret; revocation the key.
    let (status, rotated) = admin_json(&sys, "POST", &format!("/admin/keys/{id}/rotate"), None).await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    let fresh = rotated["key"].as_str().unwrap().to_string();
    assert_eq!(conn.send(chat(&secret, false)).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let (status, second) =
        admin_json(&sys, "POST", "/admin/keys", Some(json!({"tenant": "demo-bronze", "expires_in_s": 3600})))
            .await;
    assert_eq!(status, StatusCode::CREATED);
    let (id2, secret2) =
        (second["id"].as_str().unwrap().to_string(), second["key"].as_str().unwrap().to_string());
    assert_eq!(conn.send(chat(&secret2, false)).await.unwrap().status(), StatusCode::OK);
    let (status, _) = admin_json(&sys, "DELETE", &format!("/admin/keys/{id2}"), None).await;
    assert_eq!(status, StatusCode::OK);
    let resp = conn.send(chat(&secret2, false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let (_, audit) = admin_json(&sys, "GET", "/admin/policies/audit", None).await;
    let summaries: Vec<&str> =
        audit["entries"].as_array().unwrap().iter().filter_map(|e| e["summary"].as_str()).collect();
    for what in ["made", "rotated", "revoked"] {
        assert!(
            summaries.iter().any(|s| s.starts_with("API key") && s.contains(what)),
            "{what}: {summaries:?}"
        );
    }
    let (status, bad) = admin_json(&sys, "POST", "/admin/keys", Some(json!({"tenant": "nobody"}))).await;
    assert_eq!((status, &bad["error"]["param"]), (StatusCode::BAD_REQUEST, &json!("tenant")));
    let before = key_usage(&sys, &id).await;

    // A restart (SIGTERM) keeps keys and usage.
    signal(sys.child.id().unwrap(), "TERM");
    tokio::time::timeout(Duration::from_secs(30), sys.child.wait()).await.expect("stops").unwrap();
    drop(sys);
    let sys = System::start_with_policy(INSTANT, 1, &["--state-dir", &state_arg], Some(&policy)).await;
    assert_eq!(key_usage(&sys, &id).await, before, "usage survives the restart");
    let conn = sys.conn(Proto::H2).await;
    assert_eq!(conn.send(chat(&secret2, false)).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let resp = conn.send(chat(&fresh, false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS, "the rotated key, its budget still spent today");
    drop(sys);
    std::fs::remove_dir_all(&state).ok();
}
