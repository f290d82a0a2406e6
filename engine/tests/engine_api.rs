//! The engine binary's APIs, run as a real process: the internal API (KV
//! admission and its typed refusals, cancellation, drain) and the OpenAI
//! surface beside it (bytes on the wire, the official Python client).
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

use std::process::Stdio;
use std::time::Duration;

use loadtest::client::{body_bytes, Conn, Proto};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

mod common;
use common::process::{generate, rand_suffix, start_with, Engine, FAST, SLOW};

/// Starts `engine` with a slow decode (so sequences stay resident) and `args`.
async fn start(args: &[&str]) -> Engine {
    start_with(SLOW, args).await
}

async fn load(e: &Engine) -> serde_json::Value {
    serde_json::from_slice(&body_bytes(e.conn.get("/engine/v1/load", None).await.unwrap()).await.unwrap())
        .unwrap()
}

#[tokio::test]
async fn below_the_low_watermark_new_work_gets_a_typed_refusal() {
    // 16 pages of 16 tokens; keep 4 (25%) free; reopen at 50%.
    let e = start(&[
        "--kv-pages",
        "16",
        "--page-tokens",
        "16",
        "--kv-low-watermark",
        "0.25",
        "--kv-high-watermark",
        "0.5",
        "--kv-output-reserve",
        "16",
    ])
    .await;
    // 144 prompt tokens + 16 reserved = 10 pages: 6 left, above the low mark.
    let first = e.conn.post_json("/engine/v1/generate", None, generate(144, 50)).await.unwrap();
    assert_eq!(first.status(), 200);
    let l = load(&e).await;
    assert_eq!((l["kv_pages_free"].as_u64(), l["kv_admitting"].as_bool()), (Some(6), Some(true)));
    // 48 + 16 tokens = 4 pages would leave 2 < 4: refused, typed.
    let resp = e.conn.post_json("/engine/v1/generate", None, generate(48, 50)).await.unwrap();
    assert_eq!(resp.status(), 503);
    let body: serde_json::Value = serde_json::from_slice(&body_bytes(resp).await.unwrap()).unwrap();
    assert_eq!(body["code"], "kv_low_watermark", "{body}");
    assert_eq!(load(&e).await["kv_admitting"], false);
    // Cancelling the first sequence frees its pages and reopens admission.
    drop(first);
    let t = std::time::Instant::now();
    while load(&e).await["kv_pages_free"] != 16 {
        assert!(t.elapsed() < Duration::from_secs(1), "pages came back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let resp = e.conn.post_json("/engine/v1/generate", None, generate(48, 2)).await.unwrap();
    assert_eq!(resp.status(), 200);
    // A request larger than the whole cache is refused with its own code.
    let resp = e.conn.post_json("/engine/v1/generate", None, generate(300, 2)).await.unwrap();
    let body: serde_json::Value = serde_json::from_slice(&body_bytes(resp).await.unwrap()).unwrap();
    assert_eq!(body["code"], "kv_request_too_large");

    let metrics = body_bytes(e.conn.get("/metrics", None).await.unwrap()).await.unwrap();
    let text = String::from_utf8_lossy(&metrics);
    for needle in [
        "engine_refusals_total{reason=\"kv_low_watermark\"} 1",
        "engine_refusals_total{reason=\"kv_request_too_large\"} 1",
        "engine_kv_pages_capacity 16",
        "engine_batch_target 64",
        "engine_cold_start_seconds ",
        "engine_prefill_seconds_count ",
        "engine_decode_step_seconds_count ",
        "engine_batch_size_bucket{le=\"1\"}",
        "engine_batch_formation_seconds_count ",
    ] {
        assert!(text.contains(needle), "engine metrics lack {needle:?}:\n{text}");
    }
    // Every family served carries its # HELP text.
    let undescribed = loadtest::prom::undescribed(&text);
    assert!(undescribed.is_empty(), "families without # HELP: {undescribed:?}");
}

#[tokio::test]
async fn drain_refuses_new_work_and_finishes_what_runs() {
    let e = start(&[]).await;
    let running = e.conn.post_json("/engine/v1/generate", None, generate(4, 3)).await.unwrap();
    let resp = e.conn.post_json("/engine/v1/drain", None, "").await.unwrap();
    assert_eq!(resp.status(), 200);
    let resp = e.conn.post_json("/engine/v1/generate", None, generate(4, 3)).await.unwrap();
    assert_eq!(resp.status(), 503);
    let body: serde_json::Value = serde_json::from_slice(&body_bytes(resp).await.unwrap()).unwrap();
    assert_eq!(body["code"], "engine_draining");
    assert_eq!(e.conn.get("/readyz", None).await.unwrap().status(), 503);
    let out = tokio::time::timeout(Duration::from_secs(5), body_bytes(running)).await.unwrap().unwrap();
    let last = out.split(|b| *b == b'\n').rev().find(|l| !l.is_empty()).unwrap();
    let last: serde_json::Value = serde_json::from_slice(last).unwrap();
    assert_eq!(last["event"], "done", "in-flight work finished: {last}");
    assert_eq!(last["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn sigterm_drains_in_flight_work_then_exits() {
    let mut e = start(&[]).await; // 200 ms decode steps
    let running = e.conn.post_json("/engine/v1/generate", None, generate(4, 4)).await.unwrap();
    let pid = e.child.id().unwrap();
    let ok = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
    assert!(ok.success());
    // New work is refused while the admitted sequence finishes.
    let t = std::time::Instant::now();
    loop {
        let resp = e.conn.post_json("/engine/v1/generate", None, generate(4, 4)).await.unwrap();
        if resp.status() == 503 {
            let body: serde_json::Value = serde_json::from_slice(&body_bytes(resp).await.unwrap()).unwrap();
            assert_eq!(body["code"], "engine_draining");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(2), "SIGTERM starts a drain");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let out = tokio::time::timeout(Duration::from_secs(5), body_bytes(running)).await.unwrap().unwrap();
    let last = out.split(|b| *b == b'\n').rev().find(|l| !l.is_empty()).unwrap();
    let last: serde_json::Value = serde_json::from_slice(last).unwrap();
    assert_eq!(last["event"], "done", "{last}");
    assert_eq!(last["usage"]["completion_tokens"], 4);
    let status = tokio::time::timeout(Duration::from_secs(10), e.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "exits cleanly after the drain: {status:?}");
}

/// `--backend auto` on a machine without a usable GPU (or without the GPU
/// model backend) runs `cpu` and says why on its log; it never fails to
/// start for want of CUDA.
#[tokio::test]
async fn backend_auto_picks_a_backend_and_says_why() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(["--listen", "127.0.0.1:0", "--id", "auto0", "--exit-on-stdin-eof", "--backend", "auto"])
        .args(["--model-layers", "1", "--model-hidden", "32", "--model-heads", "2", "--model-ffn", "64"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let ready = tokio::time::timeout(
        Duration::from_secs(60),
        BufReader::new(child.stdout.take().unwrap()).lines().next_line(),
    )
    .await
    .expect("ready within 60 s")
    .unwrap()
    .unwrap();
    assert!(ready.contains("backend=cpu"), "{ready}");
    let _ = child.start_kill();
    let mut log = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut child.stderr.take().unwrap(), &mut log).await.unwrap();
    assert!(log.contains("backend_selected") && log.contains("using cpu"), "{log}");
    let why_present = log.contains("without the `cuda` feature")
        || log.contains("could not be loaded")
        || log.contains("no device")
        || log.contains("found, but");
    assert!(why_present, "{log}");
}

#[tokio::test]
async fn with_an_api_token_every_route_but_health_needs_it() {
    let dir = std::env::temp_dir().join(format!("engine-token-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("token");
    std::fs::write(&token_file, "s3cret-engine-token-0123\n").unwrap();
    let e = start(&["--api-token-file", token_file.to_str().unwrap()]).await;
    for path in
        ["/engine/v1/load", "/engine/v1/profile", "/engine/v1/batching", "/engine/v1/video/load", "/metrics"]
    {
        for key in [None, Some("wrong-token-wrong-token")] {
            let resp = e.conn.get(path, key).await.unwrap();
            assert_eq!(resp.status(), 401, "{path} with {key:?}");
        }
        assert_eq!(e.conn.get(path, Some("s3cret-engine-token-0123")).await.unwrap().status(), 200, "{path}");
    }
    for (path, body) in [("/engine/v1/generate", generate(2, 2)), ("/engine/v1/drain", String::new())] {
        let resp = e.conn.post_json(path, None, body).await.unwrap();
        assert_eq!(resp.status(), 401, "{path}");
    }
    let report =
        body_bytes(e.conn.get("/engine/v1/load", Some("s3cret-engine-token-0123")).await.unwrap()).await;
    let report: serde_json::Value = serde_json::from_slice(&report.unwrap()).unwrap();
    assert_eq!(report["draining"], false, "the unauthorised drain did nothing");
    for path in ["/healthz", "/readyz"] {
        assert_eq!(e.conn.get(path, None).await.unwrap().status(), 200, "{path} stays open to probes");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_non_loopback_listener_without_a_token_is_refused_at_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(["--listen", "0.0.0.0:0", "--id", "t0"])
        .env_remove(engine::api::TOKEN_ENV)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("without an API token"), "{stderr}");
}

async fn kv_events(e: &Engine, after: u64) -> engine::api::KvEvents {
    let path = format!("/engine/v1/kv-events?after={after}");
    serde_json::from_slice(&body_bytes(e.conn.get(&path, None).await.unwrap()).await.unwrap()).unwrap()
}

#[tokio::test]
async fn kv_events_name_each_prefilled_block_and_a_reader_out_of_step_gets_a_snapshot() {
    let e = start(&["--page-tokens", "16", "--kv-output-reserve", "0"]).await;
    // A new reader starts from a snapshot: nothing is cached yet.
    let first = kv_events(&e, 0).await;
    assert_eq!((first.snapshot.as_deref(), first.last_seq, first.page_tokens), (Some(&[][..]), 0, 16));
    // 40 one-token words: two full blocks are named once prefilled.
    let prompt = |tag: char| -> String { (0..40).map(|i| format!("{tag}{i:03} ")).collect() };
    let run = |p: String| {
        let body =
            serde_json::json!({"request_id": "r", "model": "m", "prompt": p, "max_tokens": 1}).to_string();
        let e = &e;
        async move {
            let resp = e.conn.post_json("/engine/v1/generate", None, body).await.unwrap();
            String::from_utf8(body_bytes(resp).await.unwrap().to_vec()).unwrap()
        }
    };
    let (a, b) =
        (policies::prefix::block_hashes(&prompt('a'), 16), policies::prefix::block_hashes(&prompt('b'), 16));
    run(prompt('a')).await;
    let snap = kv_events(&e, 0).await;
    assert_eq!(
        (snap.snapshot.as_deref(), snap.last_seq),
        (
            Some(
                &{
                    let mut s = a.clone();
                    s.sort();
                    s
                }[..]
            ),
            1
        )
    );
    run(prompt('b')).await;
    let next = kv_events(&e, snap.last_seq).await;
    assert_eq!(next.snapshot, None);
    assert_eq!(next.events.len(), 1, "{next:?}");
    assert_eq!(next.events[0].stored, b, "the engine and the gateway hash blocks alike");
    assert_eq!((next.events[0].seq, next.last_seq, next.more), (2, 2, false));
    // Up to date: an empty batch. Ahead of the engine (it restarted): a snapshot.
    assert!(kv_events(&e, 2).await.events.is_empty());
    let resync = kv_events(&e, 7).await;
    let mut all = [a, b].concat();
    all.sort();
    assert_eq!((resync.snapshot, resync.last_seq), (Some(all), 2));
    assert_eq!(resync.epoch, first.epoch);
    // The same prompt again finds both blocks, as the load report counts.
    let text = run(prompt('a')).await;
    assert!(text.contains("\"cached_tokens\":32"), "{text}");
    let l = load(&e).await;
    assert_eq!(
        (l["prefix_cached_pages"].as_u64(), l["prefix_hit_tokens"].as_u64()),
        (Some(4), Some(32)),
        "{l}"
    );
}

/// A diffusion state import is read up to its bound (16 MiB) and no
/// further: a larger body is refused with a typed error, and the engine
/// still imports a real state after it.
#[tokio::test]
async fn an_oversized_diffusion_state_is_refused_and_a_real_one_still_imports() {
    let e = start(&[]).await;
    let put = |body: Vec<u8>| {
        let mut req = http::Request::builder()
            .method("PUT")
            .uri("/engine/v1/diffusion/videos/v1/state")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap();
        req.headers_mut().insert("content-type", "application/octet-stream".parse().unwrap());
        e.conn.send(req)
    };
    let resp = put(vec![b'x'; (16 << 20) + 1]).await.unwrap();
    assert_eq!(resp.status(), 400);
    let v: serde_json::Value = serde_json::from_slice(&body_bytes(resp).await.unwrap()).unwrap();
    assert_eq!(
        (v["code"].as_str(), v["message"].as_str()),
        (Some("invalid_request"), Some("length limit exceeded"))
    );
    // A real state: 5 steps of a small video, exported, then imported here.
    let steps = serde_json::json!({"prompt": "waves", "size": "256x448", "frames": 81, "total_steps": 50, "steps": 5, "sp": 1});
    let resp =
        e.conn.post_json("/engine/v1/diffusion/videos/v0/steps", None, steps.to_string()).await.unwrap();
    assert_eq!(resp.status(), 200);
    let state =
        body_bytes(e.conn.get("/engine/v1/diffusion/videos/v0/state", None).await.unwrap()).await.unwrap();
    assert!(state.len() > 100 && state.len() < 16 << 20);
    assert_eq!(put(state.to_vec()).await.unwrap().status(), 200);
}

/// Whether a new connection to `e` is served (its health probe answered).
async fn served(e: &Engine) -> Option<Conn> {
    let conn = Conn::connect(&e.url, None, Proto::H2).await.ok()?;
    let probe = tokio::time::timeout(Duration::from_secs(5), conn.get("/healthz", None)).await;
    matches!(probe, Ok(Ok(r)) if r.status() == 200).then_some(conn)
}

#[tokio::test]
async fn connections_past_the_bound_are_closed_and_a_freed_slot_is_taken_again() {
    let e = start(&["--max-connections", "2"]).await; // `e.conn` holds one
    let second = served(&e).await.expect("the second connection is within the bound");
    for _ in 0..3 {
        assert!(served(&e).await.is_none(), "a third connection is closed at once");
    }
    assert_eq!(e.conn.get("/healthz", None).await.unwrap().status(), 200, "the held ones still serve");
    drop(second);
    // The engine frees the slot when it sees the connection close.
    let mut again = None;
    for _ in 0..50 {
        again = served(&e).await;
        if again.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(again.is_some(), "a closed connection's slot is taken by a new one");
    assert!(served(&e).await.is_none(), "and the bound holds again");
}

#[tokio::test]
async fn a_request_body_past_16_mib_is_a_typed_400_and_the_connection_serves_on() {
    let e = start(&[]).await;
    // Valid JSON (leading whitespace) up to the bound: only the size is wrong.
    let request = generate(4, 1);
    let at = format!("{}{request}", " ".repeat((16 << 20) - request.len()));
    let resp = e.conn.post_json("/engine/v1/generate", None, format!(" {at}")).await.unwrap();
    assert_eq!(resp.status(), 400);
    let body: serde_json::Value = serde_json::from_slice(&body_bytes(resp).await.unwrap()).unwrap();
    assert_eq!(body["code"], "invalid_request", "{body}");
    let resp = e.conn.post_json("/engine/v1/generate", None, at).await.unwrap();
    assert_eq!(resp.status(), 200, "exactly 16 MiB is accepted, on the same connection");
}

// The OpenAI surface.

fn chat(extra: serde_json::Value) -> String {
    let mut body =
        serde_json::json!({"model": "synthetic-small", "messages": [{"role": "user", "content": "hello"}]});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body.to_string()
}

async fn json_of(resp: http::Response<hyper::body::Incoming>) -> (u16, serde_json::Value) {
    let status = resp.status().as_u16();
    (status, serde_json::from_slice(&body_bytes(resp).await.unwrap()).unwrap())
}

#[tokio::test]
async fn the_openai_surface_answers_whole_and_streamed_with_usage() {
    let e = start_with(FAST, &[]).await;
    let resp =
        e.conn.post_json("/v1/chat/completions", None, chat(serde_json::json!({"max_tokens": 5}))).await;
    let (status, body) = json_of(resp.unwrap()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "synthetic-small");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["completion_tokens"], 5);
    assert_eq!(body["usage"]["prompt_tokens"], policies::tokens::count("<|user|>\nhello\n<|assistant|>\n"));
    let whole = body["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(!whole.is_empty());

    let streamed =
        chat(serde_json::json!({"max_tokens": 5, "stream": true, "stream_options": {"include_usage": true}}));
    let resp = e.conn.post_json("/v1/chat/completions", None, streamed).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = String::from_utf8(body_bytes(resp).await.unwrap().to_vec()).unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|s| !s.is_empty()).collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"), "{text}");
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant", "the opening chunk");
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect::<Vec<_>>()
        .concat();
    assert_eq!(content, whole, "the same greedy text, streamed");
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let last = chunks.last().unwrap();
    assert_eq!(
        (last["choices"].as_array().unwrap().len(), &last["usage"]["completion_tokens"]),
        (0, &serde_json::json!(5))
    );

    let resp = e
        .conn
        .post_json("/v1/completions", None, r#"{"model":"synthetic-small","prompt":"once"}"#.to_string())
        .await;
    let (status, body) = json_of(resp.unwrap()).await;
    assert_eq!((status, &body["object"]), (200, &serde_json::json!("text_completion")), "{body}");
    assert!(body["usage"]["completion_tokens"].as_u64().unwrap() <= 16, "OpenAI's default cap of 16");

    let (status, models) = json_of(e.conn.get("/v1/models", None).await.unwrap()).await;
    assert_eq!((status, &models["data"][0]["id"]), (200, &serde_json::json!("synthetic-small")));
    let health = e.conn.get("/health", None).await.unwrap();
    assert_eq!(health.status(), 200);
    assert!(body_bytes(health).await.unwrap().is_empty(), "vLLM's probe answers an empty 200");
}

#[tokio::test]
async fn the_openai_surface_refuses_bad_input_with_typed_openai_errors() {
    let e = start_with(FAST, &["--served-model-name", "served-one"]).await;
    let post = |path: &'static str, body: String| e.conn.post_json(path, None, body);
    let body = |model: &str, extra: serde_json::Value| {
        let mut b = serde_json::json!({"model": model, "messages": [{"role": "user", "content": "x"}]});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b.to_string()
    };
    let cases = [
        (body("served-one", serde_json::json!({"zeta": 1})), 400, "unknown_parameter", Some("zeta")),
        (body("served-one", serde_json::json!({"n": 3})), 400, "unsupported_parameter", Some("n")),
        (
            body("served-one", serde_json::json!({"temperature": 9})),
            400,
            "invalid_value",
            Some("temperature"),
        ),
        (
            body("served-one", serde_json::json!({"stop": ["a", "b", "c", "d", "e"]})),
            400,
            "invalid_value",
            Some("stop"),
        ),
        (body("served-one", serde_json::json!({"max_tokens": 200_000})), 400, "invalid_value", None),
        (body("synthetic-small", serde_json::json!({})), 404, "model_not_found", Some("model")),
        ("{\"model\":".to_string(), 400, "invalid_json", None),
    ];
    for (request, status, code, param) in cases {
        let (got, b) = json_of(post("/v1/chat/completions", request.clone()).await.unwrap()).await;
        assert_eq!(
            (got, b["error"]["code"].as_str(), b["error"]["param"].as_str()),
            (status, Some(code), param),
            "{request}: {b}"
        );
        assert!(
            b["error"]["message"].as_str().is_some_and(|m| !m.is_empty()) && b["error"]["type"].is_string(),
            "{b}"
        );
    }
    // The body bound: one byte past 16 MiB is refused, the connection serves on.
    let request = body("served-one", serde_json::json!({"max_tokens": 1}));
    let over = format!("{}{request}", " ".repeat((16 << 20) + 1 - request.len()));
    let (status, b) = json_of(post("/v1/chat/completions", over).await.unwrap()).await;
    assert_eq!((status, b["error"]["code"].as_str()), (413, Some("request_too_large")));
    let (status, _) = json_of(post("/v1/chat/completions", request).await.unwrap()).await;
    assert_eq!(status, 200, "served on the same connection");
}

#[tokio::test]
async fn a_client_gone_mid_stream_frees_its_sequence_and_the_metrics_say_so_in_vllms_names() {
    use http_body_util::BodyExt;
    let e = start(&[]).await; // 200 ms a token: the sequence is still running when the client goes
    let request = chat(serde_json::json!({"max_tokens": 500, "stream": true}));
    let mut resp = e.conn.post_json("/v1/chat/completions", None, request).await.unwrap();
    let first = resp.body_mut().frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(first.starts_with(b"data: {"), "{first:?}");
    let metrics =
        String::from_utf8(body_bytes(e.conn.get("/metrics", None).await.unwrap()).await.unwrap().to_vec())
            .unwrap();
    assert!(metrics.contains("vllm:num_requests_running{model_name=\"synthetic-small\"} 1\n"), "{metrics}");
    assert!(metrics.contains("# TYPE vllm:kv_cache_usage_perc gauge"), "{metrics}");
    drop(resp);
    let mut running = u64::MAX;
    for _ in 0..50 {
        running = load(&e).await["inflight_sequences"].as_u64().unwrap();
        if running == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(running, 0, "the reset stream cancelled its sequence");
    assert_eq!(load(&e).await["kv_pages_free"], load(&e).await["kv_pages_total"], "and its pages are back");
}

/// The official OpenAI Python client, unmodified, against the engine's own
/// OpenAI surface (scripts/test-all installs it and sets OPENAI_PYTHON).
#[tokio::test]
async fn the_official_openai_python_client_talks_to_the_engine() {
    let Some(python) = std::env::var_os("OPENAI_PYTHON") else {
        assert!(std::env::var_os("CI").is_none(), "CI must set OPENAI_PYTHON (see scripts/test-all)");
        eprintln!("SKIPPED: set OPENAI_PYTHON to a python with `openai` installed");
        return;
    };
    let e = start_with(FAST, &[]).await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_engine.py");
    let out = Command::new(python)
        .arg(script)
        .env("OPENAI_BASE_URL", format!("{}/v1", e.url))
        .env("OPENAI_API_KEY", "unused-by-an-engine-without-a-token")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("OK"), "{stdout}");
}
