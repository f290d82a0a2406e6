//! Failure behaviour against a real `gateway up` with real engine processes:
//! client cancellation, engines killed before and after the first byte,
//! shutdown without orphans.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use http::StatusCode;
use http_body_util::BodyExt;
use loadtest::client::{body_bytes, Proto};
use loadtest::sse::SseParser;

/// Polls until `cond` holds on engine `id`'s load report, or `limit` passes.
async fn wait_engine(
    sys: &System,
    id: &str,
    limit: Duration,
    cond: impl Fn(&engine::api::LoadReport) -> bool,
) -> Duration {
    let t = Instant::now();
    loop {
        if cond(&sys.engine_load(id).await) {
            return t.elapsed();
        }
        assert!(t.elapsed() < limit, "engine {id} did not reach the condition within {limit:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Engine id and the first SSE bytes of a started stream.
async fn start_stream(
    conn: &loadtest::client::Conn,
    max_tokens: u32,
) -> (String, http::Response<hyper::body::Incoming>) {
    let mut resp = conn
        .post_json("/v1/chat/completions", Some(GOLD), chat_body("cancel me", max_tokens, true))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let engine = resp.headers()["x-engine"].to_str().unwrap().to_string();
    let first = resp.body_mut().frame().await.unwrap().unwrap();
    assert!(first.into_data().unwrap().starts_with(b"data: "));
    (engine, resp)
}

#[tokio::test]
async fn client_disconnect_frees_the_engine_work_within_100ms() {
    let sys = System::start(&paced(0, 40), 1).await;
    for proto in [Proto::H2, Proto::Http1] {
        let conn = sys.conn(proto).await;
        let (engine, resp) = start_stream(&conn, 500).await;
        let load = sys.engine_load(&engine).await;
        assert_eq!(load.inflight_sequences, 1, "{proto:?}: the stream runs on {engine}");
        assert!(load.kv_pages_free < load.kv_pages_total);
        // Walk away: HTTP/2 resets the stream; HTTP/1.1 closes the connection.
        drop(resp);
        drop(conn);
        let took = wait_engine(&sys, &engine, Duration::from_secs(2), |l| l.inflight_sequences == 0).await;
        assert!(took < Duration::from_millis(100), "{proto:?}: engine work freed after {took:?}");
        let load = sys.engine_load(&engine).await;
        assert_eq!(load.kv_pages_free, load.kv_pages_total, "{proto:?}: KV pages returned");
    }
}

/// Sends `body` to `path`, kills whichever engine picked it up while it is
/// still in prefill (nothing sent to the client yet), and returns the
/// response with the victim's id.
async fn kill_during_prefill(
    sys: &System,
    proto: Proto,
    path: &'static str,
    body: String,
) -> (String, http::Response<hyper::body::Incoming>) {
    let conn = sys.conn(proto).await;
    let c = conn.clone();
    // Bronze: its 3 s TTFT budget admits a 600 ms prefill (gold's 500 ms
    // budget would have admission refuse it up front).
    let req = tokio::spawn(async move { c.post_json(path, Some(BRONZE), body).await });
    let t = Instant::now();
    let victim = 'found: loop {
        for e in &sys.engines {
            if sys.engine_load(&e.id).await.inflight_sequences > 0 {
                break 'found e.id.clone();
            }
        }
        assert!(t.elapsed() < Duration::from_millis(500), "no engine picked the request up");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    sys.kill_engine(&victim);
    let resp = tokio::time::timeout(Duration::from_secs(10), req).await.unwrap().unwrap().unwrap();
    (victim, resp)
}

#[tokio::test]
async fn engine_killed_before_the_first_byte_is_retried_on_another() {
    // Prefill takes 600 ms: time to find and kill the engine holding the request.
    let sys = System::start(&paced(600, 1), 2).await;
    let (victim, resp) =
        kill_during_prefill(&sys, Proto::H2, "/v1/chat/completions", chat_body("retry me", 4, true)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-engine"], sys.other_engine(&victim).as_str());
    let body = body_bytes(resp).await.unwrap();
    assert!(body.ends_with(b"data: [DONE]\n\n"), "{}", String::from_utf8_lossy(&body));
    assert!(sys.metrics().await.contains("gateway_engine_retries_total 1"));

    // Non-streaming over HTTP/1.1, on a fresh pair of engines.
    let sys = System::start(&paced(600, 1), 2).await;
    let body = r#"{"model":"synthetic-small","prompt":"x","max_tokens":3}"#.to_string();
    let (victim, resp) = kill_during_prefill(&sys, Proto::Http1, "/v1/completions", body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-engine"], sys.other_engine(&victim).as_str());
    assert_eq!(json(&body_bytes(resp).await.unwrap())["usage"]["completion_tokens"], 3);
}

/// Reads `resp`'s body until it ends (or `limit` passes: a hang fails).
async fn read_rest(resp: &mut http::Response<hyper::body::Incoming>, limit: Duration) -> Vec<u8> {
    tokio::time::timeout(limit, async {
        let mut bytes = Vec::new();
        while let Some(frame) = resp.body_mut().frame().await {
            bytes.extend_from_slice(&frame.expect("the stream closes cleanly").into_data().unwrap());
        }
        bytes
    })
    .await
    .expect("no hang: the stream ends after the engine dies")
}

/// The text of a chat stream's content deltas, one string each.
fn deltas(events: &[loadtest::sse::SseEvent]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .filter_map(|e| {
            json(e.data.as_bytes())["choices"][0]["delta"]["content"].as_str().map(str::to_string)
        })
        .filter(|c| !c.is_empty())
        .collect()
}

#[tokio::test]
async fn engine_killed_mid_stream_is_resumed_on_another_engine() {
    let body = |stream: bool| {
        let mut b = serde_json::json!({
            "model": MODEL, "max_tokens": 40, "stream": stream,
            "messages": [{"role": "user", "content": long_prompt(60)}],
        });
        if stream {
            b["stream_options"] = serde_json::json!({"include_usage": true});
        }
        b.to_string()
    };
    for proto in [Proto::H2, Proto::Http1] {
        // A fresh pair each time: the victim stays dead for the test.
        let sys = System::start(&paced(0, 30), 2).await;
        let conn = sys.conn(proto).await;
        let whole = conn.post_json("/v1/chat/completions", Some(GOLD), body(false)).await.unwrap();
        let whole = json(&body_bytes(whole).await.unwrap());
        let mut resp = conn.post_json("/v1/chat/completions", Some(GOLD), body(true)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let engine = resp.headers()["x-engine"].to_str().unwrap().to_string();
        let request_id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
        // A few tokens in, its engine dies.
        let mut bytes = Vec::new();
        while bytes.windows(10).filter(|w| w == b"\"content\":").count() < 4 {
            let frame = resp.body_mut().frame().await.expect("more of the stream").unwrap();
            bytes.extend_from_slice(&frame.into_data().unwrap());
        }
        sys.kill_engine(&engine);
        bytes.extend(read_rest(&mut resp, Duration::from_secs(10)).await);
        let events = SseParser::new().push(&bytes);
        let text = String::from_utf8_lossy(&bytes);
        // The client sees one stream to its end: no error, [DONE].
        assert!(!text.contains("\"error\""), "{proto:?}: {text}");
        assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"), "{proto:?}: {text}");
        // Its usage counts the whole answer as output and the client's
        // prompt as prompt (the continuation's prompt held the text
        // relayed before it), as the same request run whole does.
        let usage = events
            .iter()
            .rev()
            .find_map(|e| {
                serde_json::from_str::<serde_json::Value>(&e.data).ok().filter(|j| j["usage"].is_object())
            })
            .expect("a usage chunk")["usage"]
            .clone();
        let delivered = deltas(&events);
        assert!(delivered.len() > 4, "{proto:?}: the rest came: {delivered:?}");
        assert_eq!(usage["completion_tokens"], delivered.len(), "{proto:?}: {usage}");
        assert!(delivered.len() <= 40, "{proto:?}: within max_tokens");
        assert_eq!(usage["prompt_tokens"], whole["usage"]["prompt_tokens"], "{proto:?}: {usage}");
        let m = sys.metrics().await;
        assert_eq!(metric(&m, "gateway_stream_resumes_total{outcome=\"resumed\"}"), Some(1.0), "{m}");
        // Logged under the request's span, from the victim to the other.
        let log = sys.log();
        let span = format!("request{{id={request_id}}}");
        let other = sys.other_engine(&engine);
        assert!(
            log.lines().any(|l| l.contains("stream_resumed")
                && l.contains(&format!("from={engine}"))
                && l.contains(&format!("engine={other}"))
                && l.contains(&span)),
            "{proto:?}: no stream_resumed line under {span} in\n{log}"
        );
    }
}

#[tokio::test]
async fn engine_killed_mid_stream_with_no_other_engine_ends_the_stream_with_an_error_event() {
    for proto in [Proto::H2, Proto::Http1] {
        let sys = System::start(&paced(0, 30), 1).await;
        let conn = sys.conn(proto).await;
        let (engine, mut resp) = start_stream(&conn, 500).await;
        let request_id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
        sys.kill_engine(&engine);
        let rest = read_rest(&mut resp, Duration::from_secs(5)).await;
        let events = SseParser::new().push(&rest);
        let last = json(events.last().expect("an error event").data.as_bytes());
        assert_eq!(last["error"]["code"], "engine_failed", "{last}");
        assert_eq!(last["error"]["type"], "server_error");
        assert!(last["error"]["message"].as_str().unwrap().contains(&engine));
        assert!(events.iter().all(|e| e.data != "[DONE]"), "an error is not a [DONE]");
        // The failure is logged with the request's id (the relay task runs
        // in the request's span).
        let log = sys.log();
        let span = format!("request{{id={request_id}}}");
        assert!(
            log.lines().any(|l| l.contains("stream_failed") && l.contains(&engine) && l.contains(&span)),
            "no stream_failed line under {span} in\n{log}"
        );
    }
}

#[tokio::test]
async fn a_dead_engine_leaves_routing_and_requests_keep_succeeding() {
    // The supervisor restarts dead engines after its backoff: 10 s here, so
    // the outage is observed (tests/autoscale.rs covers the restart).
    let policy = default_policy().replace("restart_backoff_s = 1.0", "restart_backoff_s = 10.0");
    assert!(policy.contains("restart_backoff_s = 10.0"));
    let sys = System::start_with_policy(&paced(0, 0), 2, &[], Some(&policy)).await;
    let conn = sys.conn(Proto::H2).await;
    sys.kill_engine("e0");
    for _ in 0..10 {
        let resp = conn
            .post_json("/v1/chat/completions", Some(GOLD), chat_body("still up", 2, false))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["x-engine"], "e1");
    }
    let v = json(&body_bytes(conn.get("/readyz", None).await.unwrap()).await.unwrap());
    assert_eq!(v["detail"]["ready_engines"], 1, "{v}");
    sys.kill_engine("e1");
    let resp =
        conn.post_json("/v1/chat/completions", Some(GOLD), chat_body("anyone?", 2, false)).await.unwrap();
    assert!(resp.status() == StatusCode::SERVICE_UNAVAILABLE || resp.status() == StatusCode::BAD_GATEWAY);
    assert_eq!(resp.headers()["retry-after"], "1");
    let v = json(&body_bytes(resp).await.unwrap());
    assert_eq!(v["error"]["type"], "server_error");
    tokio::time::sleep(Duration::from_millis(600)).await; // a poll notices
    let resp = conn.get("/readyz", None).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn engines_at_capacity_give_a_retryable_503_naming_the_reason() {
    // 8 pages of 16 tokens per engine, 2 kept free (25%): 96 tokens of
    // headroom. A 60-token prompt with 20 output tokens needs 80: one
    // running sequence per engine leaves too little for another, and the
    // gateway refuses it itself rather than push an engine below its low
    // watermark.
    let args = [
        "--engine-arg=--kv-pages=8",
        "--engine-arg=--page-tokens=16",
        "--engine-arg=--kv-low-watermark=0.25",
        "--engine-arg=--kv-output-reserve=16",
    ];
    let sys = System::start_with(&paced(0, 200), 2, &args).await;
    let conn = sys.conn(Proto::H2).await;
    let body = |stream: bool| {
        serde_json::json!({"model": MODEL, "prompt": "word ".repeat(60), "max_tokens": 20, "stream": stream})
            .to_string()
    };
    // Two streams (60 + 20 tokens fit one engine's headroom each) hold both engines.
    let mut held = Vec::new();
    for _ in 0..2 {
        let resp = conn.post_json("/v1/completions", Some(GOLD), body(true)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        held.push(resp);
    }
    let resp = conn.post_json("/v1/completions", Some(GOLD), body(false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()["retry-after"], "1");
    assert_eq!(resp.headers()["x-admission"], "rejected");
    assert_eq!(resp.headers()["x-admission-reason"], "kv_headroom");
    let v = json(&body_bytes(resp).await.unwrap());
    assert_eq!(v["error"]["code"], "kv_headroom", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("low watermark"), "{v}");
    drop(held);
}

/// SIGTERM (an orchestrator's stop): first out of rotation (`/readyz` 503
/// `draining`) while connections are still accepted and served, for
/// `limits.shutdown_grace_ms` (2 s), then the drain and the exit, engines
/// included.
#[tokio::test]
async fn sigterm_stops_the_gateway_and_its_engines() {
    let mut sys = System::start(&paced(0, 0), 2).await;
    let pids: Vec<u32> = sys.engines.iter().map(|e| e.pid).collect();
    assert!(pids.iter().all(|p| alive(*p)));
    assert_eq!(sys.readyz().await["ready"], true);
    let termed = Instant::now();
    signal(sys.child.id().unwrap(), "TERM");
    // Within the grace: a new connection is accepted, answered, and told
    // the gateway is draining; requests are still served.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = sys.readyz().await;
    assert_eq!((&r["ready"], &r["draining"]), (&serde_json::json!(false), &serde_json::json!(true)), "{r}");
    let conn = sys.conn(Proto::H2).await;
    let resp = conn.post_json("/v1/completions", Some(GOLD), completion("draining", 2, false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "served while draining");
    assert!(termed.elapsed() < Duration::from_secs(2), "checked within the grace");
    let status = tokio::time::timeout(Duration::from_secs(15), sys.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(
        termed.elapsed() >= Duration::from_secs(2),
        "stopped only after the grace: {:?}",
        termed.elapsed()
    );
    let t = Instant::now();
    while pids.iter().any(|p| alive(*p)) {
        assert!(t.elapsed() < Duration::from_secs(6), "engine children outlived the gateway");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn sigkill_of_the_gateway_leaves_no_orphans() {
    let mut sys = System::start(&paced(0, 0), 2).await;
    let pids: Vec<u32> = sys.engines.iter().map(|e| e.pid).collect();
    signal(sys.child.id().unwrap(), "KILL");
    let _ = sys.child.wait().await;
    let t = Instant::now();
    while pids.iter().any(|p| alive(*p)) {
        assert!(t.elapsed() < Duration::from_secs(6), "engines outlived a SIGKILLed gateway");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
