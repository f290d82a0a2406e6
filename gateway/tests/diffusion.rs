//! Images and whole videos through a real `gateway up` and real engine
//! processes (issue 24): the official OpenAI Python client's images and
//! videos calls, bad input as typed 400s, tenant isolation, admission with
//! a reason and Retry-After, and a video that keeps its deadline while
//! images preempt it. Engines are emulated, replaying GenServe's published
//! tables on a clock compressed 50× (`time_scale`).
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use http::StatusCode;
use loadtest::client::{body_bytes, Conn, Proto};

const TEXT_PROFILE: &str = "model = \"synthetic-small\"\nengine_class = \"test-diffusion\"\n\
    [prefill]\npoints = [[0, 1.0]]\n[decode]\nbatch_points = [[1, 2.0]]\n";

async fn start(engines: usize, policy: Option<&str>) -> System {
    start_scaled(engines, policy, 0.02).await
}

async fn start_scaled(engines: usize, policy: Option<&str>, scale: f64) -> System {
    let dir = std::env::temp_dir().join(format!("diffusion-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let arg = diffusion_profile(&dir, scale);
    System::start_with_policy(TEXT_PROFILE, engines, &[&arg], policy).await
}

async fn post(
    conn: &Conn,
    path: &str,
    key: &str,
    body: serde_json::Value,
    headers: &[(&str, &str)],
) -> (StatusCode, http::HeaderMap, serde_json::Value) {
    let resp = conn.send(request(path, key, body.to_string(), headers)).await.unwrap();
    let (status, h) = (resp.status(), resp.headers().clone());
    let bytes = body_bytes(resp).await.unwrap();
    (status, h, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
}

async fn get(conn: &Conn, path: &str, key: &str) -> (StatusCode, bytes::Bytes) {
    let req = http::Request::get(path)
        .header("authorization", format!("Bearer {key}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = conn.send(req).await.unwrap();
    let status = resp.status();
    (status, body_bytes(resp).await.unwrap())
}

/// Polls video `id` until it completes (20 s at most); its object.
async fn completed(conn: &Conn, id: &str) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let (status, bytes) = get(conn, &format!("/v1/videos/{id}"), GOLD).await;
        assert_eq!(status, StatusCode::OK);
        let v = json(&bytes);
        if v["status"] == "completed" {
            return v;
        }
        assert_ne!(v["status"], "failed", "{v}");
        assert!(started.elapsed() < Duration::from_secs(20), "{v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_official_client_generates_images_and_videos() {
    let sys = start(4, None).await;
    run_openai_script(&sys, "openai_diffusion.py").await;
}

#[tokio::test]
async fn bad_input_isolation_and_admission_answer_with_typed_errors() {
    let sys = start(2, None).await;
    let conn = sys.conn(Proto::H2).await;
    let img = |extra: serde_json::Value| {
        let mut b = serde_json::json!({"prompt": "a fox", "size": "512x512"});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    for (extra, param, code) in [
        (serde_json::json!({"size": "333x333"}), "size", "invalid_value"),
        (serde_json::json!({"n": 11}), "n", "invalid_value"),
        (serde_json::json!({"n": 0}), "n", "invalid_value"),
        (serde_json::json!({"prompt": ""}), "prompt", "invalid_value"),
        (serde_json::json!({"bogus": 1}), "bogus", "unknown_parameter"),
    ] {
        let (status, _, body) = post(&conn, "/v1/images/generations", GOLD, img(extra.clone()), &[]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra}: {body}");
        assert_eq!(body["error"]["param"], param, "{body}");
        assert_eq!(body["error"]["code"], code, "{body}");
    }
    for (body, param) in [
        (serde_json::json!({"prompt": "x", "seconds": -2}), "seconds"),
        (serde_json::json!({"prompt": "x", "seconds": "zero"}), "seconds"),
        (serde_json::json!({"prompt": "x", "size": "1x1"}), "size"),
        (serde_json::json!({"prompt": "x", "seconds": 60}), "seconds"),
        (serde_json::json!({"seconds": 4}), "prompt"),
    ] {
        let (status, _, answer) = post(&conn, "/v1/videos", GOLD, body.clone(), &[]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{answer}");
    }
    // A deadline shorter than the job alone: refused at once, with a reason.
    let (status, h, body) =
        post(&conn, "/v1/images/generations", GOLD, img(serde_json::json!({})), &[("x-slo-e2e-ms", "5")])
            .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "deadline_infeasible", "{body}");
    assert!(h.contains_key("retry-after"), "{h:?}");
    // A video job belongs to its tenant.
    let (status, _, v) = post(
        &conn,
        "/v1/videos",
        GOLD,
        serde_json::json!({"prompt": "rain", "size": "256x448", "seconds": 2}),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    assert_eq!(get(&conn, &format!("/v1/videos/{id}"), SILVER).await.0, StatusCode::NOT_FOUND);
    assert_eq!(get(&conn, &format!("/v1/videos/{id}/content"), SILVER).await.0, StatusCode::NOT_FOUND);
    completed(&conn, &id).await;
    let (status, bytes) = get(&conn, &format!("/v1/videos/{id}/content"), GOLD).await;
    assert_eq!(status, StatusCode::OK);
    assert!(bytes.windows(4).any(|w| w == b"fdAT"), "frames after the first");
    // The operator sees the job in /readyz and both in /metrics.
    assert_eq!(sys.readyz().await["detail"]["diffusion"]["video_records"], 1);
    let text = sys.metrics().await;
    let has = |name: &str, label: &str| text.lines().any(|l| l.starts_with(name) && l.contains(label));
    assert!(has("gateway_diffusion_refused_total", "reason=\"deadline_infeasible\""), "{text}");
    assert!(has("gateway_diffusion_jobs_total", "kind=\"video\""), "{text}");
}

#[tokio::test]
async fn images_preempt_a_long_video_and_both_keep_their_deadlines() {
    // 2 GPUs on a 10× clock: a 720p video on both (rounds of 5 steps,
    // 205 ms; 2.5 s in all; σ = 1.5 leaves it room for pauses), then
    // images due within 1 s. Without preemption they would wait for the
    // whole video (2 s and more).
    let policy = default_policy().replace("slo_scale = 1.0", "slo_scale = 1.5");
    let sys = start_scaled(2, Some(&policy), 0.1).await;
    let conn = sys.conn(Proto::H2).await;
    let created = std::time::SystemTime::now();
    let body = serde_json::json!({"prompt": "a city", "size": "720x1280", "seconds": 5});
    let (status, _, v) = post(&conn, "/v1/videos", GOLD, body, &[]).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut tasks = Vec::new();
    for i in 0..3 {
        let conn = sys.conn(Proto::H2).await;
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let body = serde_json::json!({"prompt": format!("image {i}"), "size": "512x512"});
            let (status, h, b) =
                post(&conn, "/v1/images/generations", GOLD, body, &[("x-slo-e2e-ms", "1000")]).await;
            (status, h, b, started.elapsed())
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for t in tasks {
        let (status, h, body, took) = t.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(h["x-admission"], "admitted");
        // A round's wait at most, then 115 ms of steps: not the video's seconds.
        assert!(took < Duration::from_millis(1000), "an image waited {took:?} behind the video");
    }
    let v = completed(&conn, &id).await;
    assert_eq!(v["progress"], 100);
    // Its deadline: 1.5 × (50 steps of 409 ms at SP 2 + 5 s decode) / 10.
    let created_ms = created.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64() * 1000.0;
    let took = v["completed_at_ms"].as_f64().unwrap() - created_ms;
    assert!(took <= 1.5 * (50.0 * 409.4 + 5000.0) / 10.0, "the video took {took} ms");
}

#[tokio::test]
async fn the_harness_measures_solo_latencies_and_scores_a_trace_against_them() {
    // `loadtest diffusion` as the benchmark runs it, small: solo latencies
    // measured on the live system (the median of three idle runs), then a
    // 12-request trace whose deadlines are σ × those, scored strictly and
    // within the timing tolerance.
    let scale = 0.02;
    let sys = start_scaled(4, None, scale).await;
    let out = sys.dir.join("harness");
    let args = loadtest::diffusion::live::DiffusionArgs {
        target: sys.base.clone(),
        ca: Some(sys.ca.clone()),
        key: GOLD.to_string(),
        mix: loadtest::diffusion::workload::Mix::Balanced,
        resolutions: loadtest::diffusion::workload::Resolutions::Uniform,
        rate: 2.0,
        sigma: 3.0,
        requests: 12,
        seed: 7,
        video_seconds: 5,
        default_sp: 2,
        profile: std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../policies/profiles/genserve-emulated.toml"),
        time_scale: scale,
        poll_ms: 20,
        no_calibrate: false,
        solo: None,
        solo_out: Some(out.join("solo.json")),
        solo_runs: 3,
        calibrate_only: false,
        tolerance_ms: 2.0,
        label: "t".into(),
        out: out.clone(),
    };
    std::fs::create_dir_all(&out).unwrap();
    let line = loadtest::diffusion::live::main(&args).await.unwrap();
    assert!(line.contains("0 failed of 12"), "{line}");

    // The profile's solo time of each size, on the engines' clock: a
    // measured solo latency is that plus what serving costs, never less.
    let trace = loadtest::diffusion::live::plan(&args).unwrap();
    let solo: Vec<((bool, String), f64)> =
        serde_json::from_slice(&std::fs::read(out.join("solo.json")).unwrap()).unwrap();
    let solo: std::collections::HashMap<_, _> = solo.into_iter().collect();
    for r in &trace {
        let measured = solo[&(r.video, r.size.clone())];
        assert!(measured >= r.solo_ms, "{} {}: measured {measured} < profile {}", r.video, r.size, r.solo_ms);
        assert!(measured < r.solo_ms + 1000.0, "{} {}: measured {measured} ms", r.video, r.size);
    }

    let results = json(&std::fs::read(out.join("results.json")).unwrap());
    let records = results["records"].as_array().unwrap();
    assert_eq!(records.len(), 12);
    let mut met = 0;
    for (rec, planned) in records.iter().zip(&trace) {
        assert_eq!(rec["status"], 200, "{rec}");
        let deadline = rec["deadline_ms"].as_f64().unwrap();
        let measured = solo[&(planned.video, planned.size.clone())];
        assert!(
            (deadline - 3.0 * measured).abs() < 1e-6 * deadline,
            "{rec}: deadline is σ × the measured solo"
        );
        let latency = rec["latency_ms"].as_f64().unwrap();
        assert_eq!(rec["met"], latency <= deadline, "{rec}");
        met += usize::from(latency <= deadline);
    }
    assert_eq!(results["sar"].as_f64().unwrap(), 100.0 * met as f64 / 12.0);
    assert!(results["sar_within_tolerance"].as_f64().unwrap() >= results["sar"].as_f64().unwrap());
    assert_eq!(results["tolerance_ms"], 2.0);
}
