//! docs/openapi.yaml against what the gateway really answers: one real
//! `gateway up` (emulated text, image, video and streaming-video engines)
//! is called on every public operation, successes and typed errors alike;
//! each exchange (status, headers, JSON body or every SSE event, and the
//! request when it was accepted) is written down and handed to
//! scripts/check-openapi, which validates the document with an OpenAPI
//! validator and every exchange against its schemas, and fails when an
//! operation was never answered successfully.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http_body_util::Full;
use loadtest::client::{body_bytes, Conn, Proto};
use loadtest::sse::SseParser;
use serde_json::{json, Value};

/// What the exchanges' requests send.
enum Body {
    None,
    Json(Value),
    /// `multipart/form-data` of these fields (recorded as a JSON object).
    Form(Vec<(&'static str, &'static str)>),
}

/// Calls the gateway and writes each exchange down.
struct Recorder {
    conn: Conn,
    exchanges: Vec<Value>,
}

const BOUNDARY: &str = "openapi-test-boundary";

impl Recorder {
    async fn call(
        &mut self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Body,
        headers: &[(&str, &str)],
    ) -> Value {
        let mut req = http::Request::builder().method(method).uri(path);
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let (ctype, bytes, recorded) = match body {
            Body::None => (None, Bytes::new(), Value::Null),
            Body::Json(v) => (Some("application/json".to_string()), Bytes::from(v.to_string()), v),
            Body::Form(fields) => {
                let mut text = String::new();
                for (name, value) in &fields {
                    text += &format!(
                        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
                    );
                }
                text += &format!("--{BOUNDARY}--\r\n");
                let as_json: serde_json::Map<_, _> =
                    fields.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
                (
                    Some(format!("multipart/form-data; boundary={BOUNDARY}")),
                    Bytes::from(text),
                    Value::Object(as_json),
                )
            }
        };
        if let Some(c) = &ctype {
            req = req.header("content-type", c);
        }
        let resp = self.conn.send(req.body(Full::new(bytes)).unwrap()).await.unwrap();
        let status = resp.status().as_u16();
        let headers: serde_json::Map<_, _> = resp
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), json!(v.to_str().unwrap_or(""))))
            .collect();
        let content_type = header(&resp, "content-type").to_string();
        let raw = tokio::time::timeout(Duration::from_secs(30), body_bytes(resp)).await.unwrap().unwrap();
        let (body, events) = if content_type.starts_with("text/event-stream") {
            let events: Vec<Value> = SseParser::new()
                .push(&raw)
                .into_iter()
                .map(|e| json!({"event": e.event, "data": e.data}))
                .collect();
            (Value::Null, events)
        } else if content_type.starts_with("application/json") {
            (json(&raw), Vec::new())
        } else {
            (json!({"bytes": raw.len()}), Vec::new())
        };
        let exchange = json!({
            "method": method, "path": path.split('?').next().unwrap(),
            "request_content_type": ctype, "request": recorded,
            "status": status, "content_type": content_type, "headers": headers,
            "body": body, "events": events,
        });
        self.exchanges.push(exchange.clone());
        exchange
    }

    async fn get(&mut self, path: &str, key: Option<&str>) -> Value {
        self.call("GET", path, key, Body::None, &[]).await
    }

    async fn post(&mut self, path: &str, key: Option<&str>, body: Value) -> Value {
        self.call("POST", path, key, Body::Json(body), &[]).await
    }
}

fn status(x: &Value) -> u64 {
    x["status"].as_u64().unwrap()
}

async fn text_routes(r: &mut Recorder) {
    let chat = |stream: bool| {
        json!({"model": MODEL, "max_tokens": 4, "stream": stream,
               "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
               "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    };
    assert_eq!(status(&r.post("/v1/chat/completions", Some(GOLD), chat(false)).await), 200);
    let streamed = r.post("/v1/chat/completions", Some(GOLD), chat(true)).await;
    assert_eq!(streamed["events"].as_array().unwrap().last().unwrap()["data"], "[DONE]");
    let hinted = r
        .call(
            "POST",
            "/v1/chat/completions",
            Some(SILVER),
            Body::Json(chat(false)),
            &[("x-slo-ttft-ms", "800")],
        )
        .await;
    assert_eq!(status(&hinted), 200);
    let completion = |stream: bool| json!({"model": MODEL, "prompt": "hello", "max_tokens": 3, "stream": stream, "stop": ["\n"]});
    assert_eq!(status(&r.post("/v1/completions", Some(BRONZE), completion(false)).await), 200);
    assert_eq!(status(&r.post("/v1/completions", Some(GOLD), completion(true)).await), 200);
    // Typed errors.
    assert_eq!(status(&r.post("/v1/chat/completions", None, chat(false)).await), 401);
    assert_eq!(status(&r.post("/v1/chat/completions", Some("sk-wrong"), chat(false)).await), 401);
    let mut unknown = chat(false);
    unknown["frobnicate"] = json!(1);
    assert_eq!(status(&r.post("/v1/chat/completions", Some(GOLD), unknown).await), 400);
    let mut missing = chat(false);
    missing["model"] = json!("no-such-model");
    assert_eq!(status(&r.post("/v1/chat/completions", Some(GOLD), missing).await), 404);
    let bad_hint = r
        .call(
            "POST",
            "/v1/completions",
            Some(GOLD),
            Body::Json(completion(false)),
            &[("x-slo-e2e-ms", "soon")],
        )
        .await;
    assert_eq!(status(&bad_hint), 400);
    // Anthropic's Messages API: its shapes, its errors.
    let v = [("anthropic-version", "2023-06-01")];
    let message = |stream: bool| {
        json!({"model": MODEL, "max_tokens": 3, "stream": stream, "system": "be brief",
               "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    };
    for stream in [false, true] {
        let m = r.call("POST", "/v1/messages", Some(GOLD), Body::Json(message(stream)), &v).await;
        assert_eq!(status(&m), 200, "{m}");
    }
    let count = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        status(&r.call("POST", "/v1/messages/count_tokens", Some(GOLD), Body::Json(count), &v).await),
        200
    );
    assert_eq!(status(&r.call("POST", "/v1/messages", None, Body::Json(message(false)), &v).await), 401);
    assert_eq!(
        status(&r.call("POST", "/v1/messages", Some(GOLD), Body::Json(message(false)), &[]).await),
        400
    );
    let mut nope = message(false);
    nope["model"] = json!("no-such-model");
    assert_eq!(status(&r.call("POST", "/v1/messages", Some(GOLD), Body::Json(nope), &v).await), 404);
    // OpenAI's Responses API: created (whole and streamed), read, chained,
    // deleted; another tenant's is not found.
    let created = r
        .post("/v1/responses", Some(GOLD), json!({"model": MODEL, "input": "hi", "instructions": "be brief"}))
        .await;
    assert_eq!(status(&created), 200, "{created}");
    let id = created["body"]["id"].as_str().unwrap().to_string();
    let streamed = r
        .post(
            "/v1/responses",
            Some(GOLD),
            json!({"model": MODEL, "input": "again?", "previous_response_id": id, "stream": true}),
        )
        .await;
    assert_eq!(status(&streamed), 200, "{streamed}");
    assert_eq!(status(&r.get(&format!("/v1/responses/{id}"), Some(GOLD)).await), 200);
    assert_eq!(status(&r.get(&format!("/v1/responses/{id}"), Some(SILVER)).await), 404);
    assert_eq!(
        status(&r.call("DELETE", &format!("/v1/responses/{id}"), Some(GOLD), Body::None, &[]).await),
        200
    );
    assert_eq!(status(&r.post("/v1/responses", Some(GOLD), json!({"model": MODEL})).await), 400);
    // Embeddings: no engine of this fleet computes them (the 200 is
    // exercised against llama.cpp in llamacpp.rs).
    let e = r.post("/v1/embeddings", Some(GOLD), json!({"model": MODEL, "input": "hi"})).await;
    assert_eq!(status(&e), 400);
    assert_eq!(status(&r.get("/v1/models", Some(GOLD)).await), 200);
    assert_eq!(status(&r.get(&format!("/v1/models/{MODEL}"), Some(GOLD)).await), 200);
    assert_eq!(status(&r.get("/v1/models/nope", Some(GOLD)).await), 404);
    assert_eq!(status(&r.get("/healthz", None).await), 200);
    assert_eq!(status(&r.get("/readyz", None).await), 200);
    for page in ["/player", "/player/player.js", "/player/player.css"] {
        assert_eq!(status(&r.get(page, None).await), 200);
    }
}

async fn image_and_video_routes(r: &mut Recorder) {
    let image = r
        .post("/v1/images/generations", Some(GOLD), json!({"prompt": "a lighthouse", "size": "512x512"}))
        .await;
    assert_eq!(status(&image), 200, "{image}");
    let bad =
        r.post("/v1/images/generations", Some(GOLD), json!({"prompt": "a lighthouse", "size": "3x3"})).await;
    assert_eq!(status(&bad), 400);
    let form = Body::Form(vec![("prompt", "waves"), ("seconds", "1"), ("size", "256x448")]);
    let created = r.call("POST", "/v1/videos", Some(GOLD), form, &[]).await;
    assert_eq!(status(&created), 200, "{created}");
    let id = created["body"]["id"].as_str().unwrap().to_string();
    // Behind the first on the pool: a generous deadline of its own.
    let rain = json!({"prompt": "rain", "seconds": 1, "size": "256x448"});
    let json_created =
        r.call("POST", "/v1/videos", Some(SILVER), Body::Json(rain), &[("x-slo-e2e-ms", "60000")]).await;
    assert_eq!(status(&json_created), 200, "{json_created}");
    let started = Instant::now();
    loop {
        let v = r.get(&format!("/v1/videos/{id}"), Some(GOLD)).await;
        if v["body"]["status"] == "completed" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status(&r.get("/v1/videos?limit=5", Some(GOLD)).await), 200);
    let content = r.get(&format!("/v1/videos/{id}/content"), Some(GOLD)).await;
    assert_eq!(status(&content), 200);
    assert_eq!(content["content_type"], "image/apng");
    assert_eq!(status(&r.get(&format!("/v1/videos/{id}"), Some(SILVER)).await), 404, "another tenant's");
    assert_eq!(
        status(&r.call("DELETE", &format!("/v1/videos/{id}"), Some(GOLD), Body::None, &[]).await),
        200
    );
    assert_eq!(status(&r.get(&format!("/v1/videos/{id}"), Some(GOLD)).await), 404);
}

async fn stream_routes(r: &mut Recorder) {
    let created = r
        .post("/v1/video/streams", Some(GOLD), json!({"prompt": "a fox in snow", "length_frames": 36}))
        .await;
    assert_eq!(status(&created), 201, "{created}");
    let id = created["body"]["id"].as_str().unwrap().to_string();
    let at = |tail: &str| format!("/v1/video/streams/{id}{tail}");
    assert_eq!(status(&r.get(&at(""), Some(GOLD)).await), 200);
    assert_eq!(status(&r.get(&at(""), Some(SILVER)).await), 404, "another tenant's");
    assert_eq!(status(&r.call("POST", &at("/pause"), Some(GOLD), Body::None, &[]).await), 200);
    assert_eq!(status(&r.call("POST", &at("/resume"), Some(GOLD), Body::None, &[]).await), 200);
    assert_eq!(
        status(&r.post(&at("/prompt"), Some(GOLD), json!({"prompt": "the fox reaches a lake"})).await),
        200
    );
    assert_eq!(status(&r.post(&at("/prompt"), Some(GOLD), json!({"prompt": ""})).await), 400);
    let feed = r.get(&at("/events"), Some(GOLD)).await;
    assert_eq!(status(&feed), 200);
    let kinds: Vec<&str> =
        feed["events"].as_array().unwrap().iter().filter_map(|e| e["event"].as_str()).collect();
    assert_eq!(kinds.last(), Some(&"end"), "{kinds:?}");
    assert!(kinds.contains(&"chunk"));
    let after = r.call("POST", &at("/pause"), Some(GOLD), Body::None, &[]).await;
    assert!([404, 409].contains(&status(&after)), "{after}");
    let other = r.post("/v1/video/streams", Some(GOLD), json!({"prompt": "clouds"})).await;
    assert_eq!(status(&other), 201);
    let path = format!("/v1/video/streams/{}", other["body"]["id"].as_str().unwrap());
    assert_eq!(status(&r.call("DELETE", &path, Some(GOLD), Body::None, &[]).await), 200);
    let bad = r.post("/v1/video/streams", Some(GOLD), json!({"prompt": "x", "resolution": "huge"})).await;
    assert_eq!(status(&bad), 400);
}

#[tokio::test]
async fn every_public_operation_answers_as_the_openapi_document_says() {
    let dir = std::env::temp_dir().join(format!("openapi-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = "model = \"synthetic-small\"\nengine_class = \"test-openapi\"\n\
        [prefill]\npoints = [[0, 1.0]]\n[decode]\nbatch_points = [[1, 2.0]]\n";
    let sys = System::start_with_policy(profile, 2, &[&diffusion_profile(&dir, 0.02)], None).await;
    let mut r = Recorder { conn: sys.conn(Proto::H2).await, exchanges: Vec::new() };
    text_routes(&mut r).await;
    image_and_video_routes(&mut r).await;
    stream_routes(&mut r).await;

    let file = dir.join("exchanges.jsonl");
    let lines: Vec<String> = r.exchanges.iter().map(Value::to_string).collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/check-openapi");
    let out = tokio::process::Command::new(script).arg(&file).arg("createEmbedding").output().await.unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    std::fs::remove_dir_all(&dir).ok();
    assert!(out.status.success(), "scripts/check-openapi:\n{said}");
    assert!(said.contains("operations answered successfully"), "{said}");
}

/// The engine's own OpenAI surface (what LiteLLM, smg or the vLLM router
/// front when they front our engines; issue 47) answers with the
/// document's schemas: a real engine process, called directly with its
/// token, chat and completions whole and streamed with usage, the model
/// list, and its typed errors (unknown parameter, bad JSON, unknown model);
/// every exchange validated by scripts/check-openapi like the gateway's.
/// The engine has only these operations: the rest are listed as not
/// exercised.
#[tokio::test]
async fn the_engines_openai_surface_answers_with_the_documents_schemas() {
    let dir = std::env::temp_dir().join(format!("openapi-engine-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sys = System::start(INSTANT, 1).await;
    let key = sys.engine_token();
    let conn =
        Conn::connect(&sys.engines[0].url, Some(&sys.ca), Proto::H2).await.expect("connects to the engine");
    let mut r = Recorder { conn, exchanges: Vec::new() };
    let chat = |stream: bool| {
        json!({"model": MODEL, "max_tokens": 4, "stream": stream,
               "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
               "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]})
    };
    let whole = r.post("/v1/chat/completions", Some(&key), chat(false)).await;
    assert_eq!(status(&whole), 200, "{whole}");
    assert!(whole["body"]["usage"]["completion_tokens"].as_u64().unwrap() >= 1, "{whole}");
    let streamed = r.post("/v1/chat/completions", Some(&key), chat(true)).await;
    assert_eq!(streamed["events"].as_array().unwrap().last().unwrap()["data"], "[DONE]", "{streamed}");
    let completion =
        |stream: bool| json!({"model": MODEL, "prompt": "hello", "max_tokens": 3, "stream": stream});
    assert_eq!(status(&r.post("/v1/completions", Some(&key), completion(false)).await), 200);
    assert_eq!(status(&r.post("/v1/completions", Some(&key), completion(true)).await), 200);
    assert_eq!(status(&r.get("/v1/models", Some(&key)).await), 200);
    let mut unknown = chat(false);
    unknown["frobnicate"] = json!(1);
    assert_eq!(status(&r.post("/v1/chat/completions", Some(&key), unknown).await), 400);
    let mut missing = chat(false);
    missing["model"] = json!("no-such-model");
    assert_eq!(status(&r.post("/v1/chat/completions", Some(&key), missing).await), 404);
    let mut bad = chat(false);
    bad["max_tokens"] = json!(-1);
    assert_eq!(status(&r.post("/v1/completions", Some(&key), bad).await), 400);

    let file = dir.join("exchanges.jsonl");
    let lines: Vec<String> = r.exchanges.iter().map(Value::to_string).collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/check-openapi");
    // The Messages and Responses APIs are the gateway's (translated to chat
    // before an engine sees them).
    let not_on_engines = [
        "createMessage",
        "countMessageTokens",
        "createResponse",
        "getResponse",
        "deleteResponse",
        "createEmbedding",
        "retrieveModel",
        "createImage",
        "createVideo",
        "listVideos",
        "retrieveVideo",
        "deleteVideo",
        "downloadVideoContent",
        "createVideoStream",
        "retrieveVideoStream",
        "deleteVideoStream",
        "watchVideoStream",
        "pauseVideoStream",
        "resumeVideoStream",
        "switchVideoStreamPrompt",
        "playerPage",
        "playerScript",
        "playerStyle",
        "healthz",
        "readyz",
    ];
    // The engine makes no admission decisions: the gateway's own `x-`
    // headers are not asked of it (everything else is).
    let out = tokio::process::Command::new(script)
        .arg(&file)
        .args(not_on_engines)
        .env("GATEWAY_HEADERS", "0")
        .output()
        .await
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    std::fs::remove_dir_all(&dir).ok();
    assert!(out.status.success(), "scripts/check-openapi:\n{said}");
    assert!(said.contains("operations answered successfully"), "{said}");
}
