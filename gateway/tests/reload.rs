//! Live policy reload end to end against a real `gateway up`: reloads by
//! the admin API, SIGHUP and the file watcher while load runs fail no
//! request; an invalid document keeps the old version and names line and
//! key; dry runs apply nothing; the admin API wants its token and lives
//! only on its own listener; a changed cap holds from the very next
//! request while admitted requests finish under their version.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::StatusCode;
use http_body_util::Full;
use loadtest::client::{body_bytes, Conn, Proto};
use policies::PolicyDocument;
use serde_json::Value;

fn version_of(text: &str) -> String {
    PolicyDocument::parse("t", text).unwrap().version
}

/// The shipped document with gold's output cap set to `cap` (a harmless
/// change that makes a new version).
fn variant(cap: u32) -> String {
    let text =
        default_policy().replacen("max_output_tokens = 1024", &format!("max_output_tokens = {cap}"), 1);
    assert_ne!(text, default_policy());
    text
}

async fn admin(
    conn: &Conn,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (StatusCode, Value) {
    let mut req =
        http::Request::builder().method(method).uri(path).header("content-type", "application/toml");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = conn.send(req.body(Full::new(Bytes::from(body.to_string()))).unwrap()).await.unwrap();
    let status = resp.status();
    (status, json(&body_bytes(resp).await.unwrap()))
}

async fn active_version(conn: &Conn, token: &str) -> String {
    let (status, body) = admin(conn, "GET", "/admin/policies", Some(token), "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["active"]["version"].as_str().unwrap().to_string()
}

/// Polls until `version` is active (file watch and SIGHUP apply
/// asynchronously).
async fn wait_active(conn: &Conn, token: &str, version: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while active_version(conn, token).await != version {
        assert!(Instant::now() < deadline, "version {version} never became active");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Sends streaming chat requests until `stop`, bounded in count; returns
/// the failures and the policy versions the responses carried.
async fn load_worker(conn: Conn, stop: Arc<AtomicBool>) -> (usize, Vec<String>, Vec<String>) {
    let (mut sent, mut failures, mut versions) = (0, Vec::new(), Vec::new());
    while !stop.load(Ordering::Relaxed) && sent < 600 {
        sent += 1;
        let req = request("/v1/chat/completions", GOLD, chat_body("hello there", 6, true), &[]);
        match conn.send(req).await {
            Ok(resp) if resp.status() == StatusCode::OK => {
                versions.push(header(&resp, "x-policy-version").to_string());
                let events = sse_events(resp).await;
                if events.last().map(|e| e.data.as_str()) != Some("[DONE]") {
                    failures.push(format!("stream did not finish: {events:?}"));
                }
            }
            Ok(resp) => {
                let status = resp.status();
                failures
                    .push(format!("{status}: {}", String::from_utf8_lossy(&body_bytes(resp).await.unwrap())));
            }
            Err(e) => failures.push(format!("transport: {e}")),
        }
    }
    (sent, failures, versions)
}

#[tokio::test]
async fn twenty_reloads_under_load_fail_no_request() {
    let sys = System::start_with_policy(&paced(2, 4), 2, &[], Some(&default_policy())).await;
    let token = sys.admin_token();
    let admin_conn = sys.admin_conn().await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..6 {
        workers.push(tokio::spawn(load_worker(sys.conn(Proto::H2).await, Arc::clone(&stop))));
    }
    let mut expected = Vec::new();
    for i in 0..20u32 {
        let text = variant(900 + i);
        let version = version_of(&text);
        match i % 3 {
            0 => {
                let (status, body) = admin(&admin_conn, "PUT", "/admin/policies", Some(&token), &text).await;
                assert_eq!(status, StatusCode::OK, "{body}");
                assert_eq!(body["applied"], true, "{body}");
                assert_eq!(body["active"], version.as_str());
            }
            1 => {
                std::fs::write(&sys.policies, &text).unwrap();
                signal(sys.child.id().unwrap(), "HUP");
            }
            _ => std::fs::write(&sys.policies, &text).unwrap(), // the watcher picks it up
        }
        wait_active(&admin_conn, &token, &version).await;
        expected.push(version);
    }
    stop.store(true, Ordering::Relaxed);
    let (mut sent, mut failures, mut seen) = (0, Vec::new(), std::collections::BTreeSet::new());
    for w in workers {
        let (n, f, v) = w.await.unwrap();
        sent += n;
        failures.extend(f);
        seen.extend(v);
    }
    assert!(
        failures.is_empty(),
        "{} of {sent} requests failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    eprintln!("{sent} requests during 20 reloads, responses under {} versions", seen.len());
    assert!(sent >= 100, "only {sent} requests ran during the reloads");
    assert!(seen.len() >= 10, "responses carried only {} versions: {seen:?}", seen.len());
    // Every change is in the audit trail with where it came from.
    let (_, audit) = admin(&admin_conn, "GET", "/admin/policies/audit", Some(&token), "").await;
    let applied: Vec<&Value> =
        audit["entries"].as_array().unwrap().iter().filter(|e| e["outcome"] == "applied").collect();
    assert_eq!(applied.len(), 20, "{audit}");
    let count = |s: &str| applied.iter().filter(|e| e["source"] == s).count();
    assert_eq!(count("api"), 7);
    assert!(count("signal") >= 1 && count("file") >= 1, "{audit}");
    assert_eq!(count("signal") + count("file"), 13);
    assert!(applied.iter().filter(|e| e["source"] == "api").all(|e| e["admin"] == "dev"));
    assert_eq!(applied[0]["version"], expected[19].as_str(), "newest first");
    assert_eq!(applied[0]["summary"], format!("tiers.gold.max_output_tokens: {} -> {}", 918, 919));
}

#[tokio::test]
async fn an_invalid_document_keeps_the_old_version_and_names_line_and_key() {
    let sys = System::start_with_policy(INSTANT, 1, &[], Some(&default_policy())).await;
    let token = sys.admin_token();
    let admin_conn = sys.admin_conn().await;
    let v0 = active_version(&admin_conn, &token).await;
    // An unknown key, on a known line, loaded by SIGHUP.
    let bad = default_policy().replacen("ttft_ms = 500", "ttft_ms = 500\nttft_budget = 7", 1);
    let line = bad.lines().position(|l| l == "ttft_budget = 7").unwrap() + 1;
    std::fs::write(&sys.policies, &bad).unwrap();
    signal(sys.child.id().unwrap(), "HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    let rejected = loop {
        let (_, audit) = admin(&admin_conn, "GET", "/admin/policies/audit", Some(&token), "").await;
        if let Some(e) = audit["entries"].as_array().unwrap().iter().find(|e| e["outcome"] == "rejected") {
            break e.clone();
        }
        assert!(Instant::now() < deadline, "no rejection recorded");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let summary = rejected["summary"].as_str().unwrap();
    assert!(
        summary.contains(&format!(":{line}:")) && summary.contains("`tiers.gold.ttft_budget`"),
        "{summary}"
    );
    assert_eq!(rejected["previous"], v0.as_str());
    assert_eq!(active_version(&admin_conn, &token).await, v0);
    // Still serving, under the old version.
    let conn = sys.conn(Proto::H2).await;
    let resp =
        conn.send(request("/v1/chat/completions", GOLD, chat_body("hi", 4, false), &[])).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(&resp, "x-policy-version"), v0);
    // Through the API: 422 with the key path and line; a cross-field error too.
    let (status, body) = admin(&admin_conn, "PUT", "/admin/policies", Some(&token), &bad).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "invalid_policy");
    assert_eq!(body["error"]["param"], "tiers.gold.ttft_budget");
    assert_eq!(body["error"]["line"], line);
    let inverted = default_policy().replacen("e2e_ms = 20000", "e2e_ms = 100", 1);
    let line = inverted.lines().position(|l| l == "e2e_ms = 100").unwrap() + 1;
    let (status, body) = admin(&admin_conn, "PUT", "/admin/policies", Some(&token), &inverted).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["param"], "tiers.gold.e2e_ms");
    assert_eq!(body["error"]["line"], line);
    assert!(body["error"]["message"].as_str().unwrap().contains("must be >= ttft_ms"), "{body}");
    assert_eq!(active_version(&admin_conn, &token).await, v0);
}

#[tokio::test]
async fn dry_run_reports_the_diff_and_applies_nothing() {
    let sys = System::start_with_policy(INSTANT, 1, &[], Some(&default_policy())).await;
    let token = sys.admin_token();
    let admin_conn = sys.admin_conn().await;
    let v0 = active_version(&admin_conn, &token).await;
    let text = default_policy().replacen("priority_weight = 1", "priority_weight = 3", 1);
    let (status, body) = admin(&admin_conn, "PUT", "/admin/policies?dry_run=true", Some(&token), &text).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["valid"], true);
    assert_eq!(body["dry_run"], true);
    assert_eq!(body["applied"], false);
    assert_eq!(body["version"], version_of(&text).as_str());
    assert_eq!(body["active"], v0.as_str());
    assert_eq!(
        body["changes"],
        serde_json::json!([{"key": "tiers.bronze.priority_weight", "old": "1", "new": "3"}])
    );
    assert_eq!(active_version(&admin_conn, &token).await, v0);
    assert_eq!(std::fs::read_to_string(&sys.policies).unwrap(), default_policy(), "the file is untouched");
    let (_, audit) = admin(&admin_conn, "GET", "/admin/policies/audit", Some(&token), "").await;
    assert_eq!(audit["entries"], serde_json::json!([]), "a dry run is not a change");
    let conn = sys.conn(Proto::H2).await;
    let resp =
        conn.send(request("/v1/chat/completions", BRONZE, chat_body("hi", 4, false), &[])).await.unwrap();
    assert_eq!(header(&resp, "x-policy-version"), v0);
    // An invalid dry run is reported the same way as a real one.
    let (status, _) =
        admin(&admin_conn, "PUT", "/admin/policies?dry_run=true", Some(&token), "models = 1").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn admin_api_wants_its_token_and_is_not_on_the_public_listener() {
    let sys = System::start_with_policy(INSTANT, 1, &[], Some(&default_policy())).await;
    let token = sys.admin_token();
    let admin_conn = sys.admin_conn().await;
    let v0 = active_version(&admin_conn, &token).await;
    let text = variant(1000);
    for (given, code) in [
        (None, "missing_admin_token"),
        (Some("wrong-token-0123456789"), "invalid_admin_token"),
        (Some(GOLD), "invalid_admin_token"),
    ] {
        for (method, path, body) in [
            ("GET", "/admin/policies", ""),
            ("GET", "/admin/policies/history", ""),
            ("PUT", "/admin/policies", &text),
        ] {
            let (status, resp) = admin(&admin_conn, method, path, given, body).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}: {resp}");
            assert_eq!(resp["error"]["code"], code);
        }
    }
    assert_eq!(active_version(&admin_conn, &token).await, v0, "refused changes applied nothing");
    // The public listener does not serve the admin API, token or not.
    let public = sys.conn(Proto::H2).await;
    for (method, path) in
        [("GET", "/admin/policies"), ("PUT", "/admin/policies"), ("GET", "/admin/policies/history")]
    {
        let (status, resp) = admin(&public, method, path, Some(&token), &text).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {resp}");
        assert_eq!(resp["error"]["code"], "unknown_url");
    }
    assert_eq!(active_version(&admin_conn, &token).await, v0);
    // Metrics need no token, on the admin listener only.
    assert!(sys.metrics().await.contains("gateway_policy_version_info"));
}

#[tokio::test]
async fn a_cap_change_holds_from_the_next_request_and_admitted_streams_keep_their_version() {
    let sys = System::start_with_policy(&paced(0, 20), 1, &[], Some(&default_policy())).await;
    let token = sys.admin_token();
    let admin_conn = sys.admin_conn().await;
    let conn = sys.conn(Proto::H2).await;
    let v0 = active_version(&admin_conn, &token).await;
    let prompt = long_prompt(60);
    // A bronze stream of 40 tokens (~0.8 s) admitted under v0.
    let held = conn.post_json("/v1/completions", Some(BRONZE), completion(&prompt, 40, true)).await.unwrap();
    assert_eq!(header(&held, "x-policy-version"), v0);
    // Bronze's output cap 256 -> 16 and context ceiling 2048 -> 64.
    let text = default_policy()
        .replacen("max_output_tokens = 256", "max_output_tokens = 16", 1)
        .replacen("max_context_tokens = 2048", "max_context_tokens = 64", 1)
        .replacen("output_floor_tokens = 32", "output_floor_tokens = 16", 1);
    let (status, body) = admin(&admin_conn, "PUT", "/admin/policies", Some(&token), &text).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v1 = version_of(&text);
    assert_eq!(body["active"], v1.as_str());
    // The very next request: capped, under v1.
    let resp = conn.post_json("/v1/completions", Some(BRONZE), completion(&prompt, 40, false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(&resp, "x-policy-version"), v1);
    let out = json(&body_bytes(resp).await.unwrap());
    assert_eq!(out["usage"]["completion_tokens"], 16, "{out}");
    let long = "word ".repeat(200);
    let resp = conn.post_json("/v1/completions", Some(BRONZE), completion(&long, 4, false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json(&body_bytes(resp).await.unwrap())["error"]["code"], "context_length_exceeded");
    // The stream admitted under v0 finishes under v0: all 40 tokens.
    let events = sse_events(held).await;
    assert_eq!(events.last().unwrap().data, "[DONE]");
    let tokens = events.iter().filter(|e| e.data.contains("\"text\"")).count();
    assert!(tokens >= 38, "the held stream was cut to the new cap: {tokens} events");
    // Metrics carry the active version.
    let metrics = sys.metrics().await;
    assert_eq!(metric(&metrics, &format!("gateway_policy_version_info{{version=\"{v1}\"}}")), Some(1.0));
    assert_eq!(metric(&metrics, &format!("gateway_policy_version_info{{version=\"{v0}\"}}")), Some(0.0));
    // History, newest first, and a rollback to v0.
    let (_, history) = admin(&admin_conn, "GET", "/admin/policies/history", Some(&token), "").await;
    assert_eq!(history["active"], v1.as_str());
    assert_eq!(history["versions"][0]["version"], v1.as_str());
    assert_eq!(history["versions"][1]["version"], v0.as_str());
    let path = format!("/admin/policies/rollback?version={v0}");
    let (status, body) = admin(&admin_conn, "POST", &path, Some(&token), "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let resp = conn.post_json("/v1/completions", Some(BRONZE), completion(&prompt, 40, false)).await.unwrap();
    assert_eq!(header(&resp, "x-policy-version"), v0);
    assert_eq!(json(&body_bytes(resp).await.unwrap())["usage"]["completion_tokens"], 40);
    let (status, body) =
        admin(&admin_conn, "POST", "/admin/policies/rollback?version=000000000000", Some(&token), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // Shown documents never carry tenant keys.
    let (_, active) = admin(&admin_conn, "GET", "/admin/policies", Some(&token), "").await;
    let doc = active["document"].as_str().unwrap();
    assert!(!doc.contains("sk-demo") && doc.contains("<redacted>"), "{doc}");
}

#[test]
fn policy_check_names_file_line_and_key_and_exits_nonzero() {
    let dir = std::env::temp_dir().join(format!("policy-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.toml");
    let bad = dir.join("bad.toml");
    std::fs::write(&good, default_policy()).unwrap();
    let text = default_policy().replacen("priority_weight = 2", "priority_weight = 0", 1);
    let line = text.lines().position(|l| l == "priority_weight = 0").unwrap() + 1;
    std::fs::write(&bad, &text).unwrap();
    let run = |files: &[&std::path::Path]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
            .args(["policy", "check"])
            .args(files)
            .output()
            .unwrap()
    };
    let ok = run(&[&good]);
    assert!(ok.status.success());
    assert!(String::from_utf8_lossy(&ok.stdout).contains(": ok (version "));
    let out = run(&[&good, &bad]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = format!("{}:{line}:", bad.display());
    assert!(stderr.contains(&expected) && stderr.contains("`tiers.silver.priority_weight`"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The limits engine `e` reports it forms batches with.
async fn engine_limits(sys: &System, e: &EngineInfo) -> Value {
    let conn = Conn::connect(&e.url, None, Proto::H2).await.unwrap();
    json(
        &body_bytes(conn.get("/engine/v1/batching", Some(&sys.engine_token())).await.unwrap()).await.unwrap(),
    )
}

/// Polls engine `e` until `check` holds for its limits.
async fn wait_limits(sys: &System, e: &EngineInfo, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let limits = engine_limits(sys, e).await;
        if check(&limits) {
            return limits;
        }
        assert!(Instant::now() < deadline, "engine {} never took the hints: {limits}", e.id);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn batching_hints_reach_every_engine_on_reload() {
    let sys =
        System::start_with_policy(INSTANT, 2, &["--engine-arg=--split-ratio=6"], Some(&default_policy()))
            .await;
    let token = sys.admin_token();
    let admin_conn = sys.admin_conn().await;
    for e in &sys.engines {
        let limits = engine_limits(&sys, e).await;
        assert_eq!(limits["split_ratio"], 6.0, "unset hints keep the engine's flag: {limits}");
        assert_eq!(limits["long_prompt_tokens"], 1024);
        assert_eq!(limits["max_decode_stall_ms"], 500);
    }
    let text = default_policy()
        .replacen("# split_ratio = 8.0", "split_ratio = 3.0", 1)
        .replacen("# max_decode_stall_ms = 500", "max_decode_stall_ms = 120", 1)
        .replacen("# max_long_per_prefill = 1", "max_long_per_prefill = 2", 1)
        .replacen("long_prompt_tokens = 1024", "long_prompt_tokens = 700", 1);
    let (status, body) = admin(&admin_conn, "PUT", "/admin/policies", Some(&token), &text).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for e in &sys.engines {
        let limits = wait_limits(&sys, e, |l| l["split_ratio"] == 3.0).await;
        assert_eq!(limits["max_long_per_prefill"], 2);
        assert_eq!(limits["max_decode_stall_ms"], 120);
        assert_eq!(limits["long_prompt_tokens"], 700, "engines follow the routing lane");
        assert_eq!(limits["max_batch"], 64, "hardware limits stay engine flags");
    }
    // Unset again: back to the engine's own flag.
    let (status, _) = admin(&admin_conn, "PUT", "/admin/policies", Some(&token), &default_policy()).await;
    assert_eq!(status, StatusCode::OK);
    for e in &sys.engines {
        wait_limits(&sys, e, |l| {
            l["split_ratio"] == 6.0 && l["max_long_per_prefill"] == 1 && l["max_decode_stall_ms"] == 500
        })
        .await;
    }
    // A hint out of range is refused with its key, and nothing changes.
    let bad = default_policy().replacen("# ttft_fraction = 0.4", "ttft_fraction = 1.5", 1);
    let (status, body) = admin(&admin_conn, "PUT", "/admin/policies", Some(&token), &bad).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["param"], "batching.ttft_fraction");
    let bad = default_policy().replacen("# max_decode_stall_ms = 500", "max_decode_stall_ms = 0", 1);
    let (status, body) = admin(&admin_conn, "PUT", "/admin/policies", Some(&token), &bad).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["param"], "batching.max_decode_stall_ms");
}
