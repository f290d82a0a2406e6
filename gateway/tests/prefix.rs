//! Prefix caching end to end (issue 23) against a real `gateway up` and
//! real engine processes: prompts behind one long system prompt land on
//! the engine that holds it, that engine computes only the rest (the
//! client sees it as `usage.prompt_tokens_details.cached_tokens` and in a
//! far shorter time to the answer), and the engine's own load report counts
//! the hits; a second gateway on the same engines (a real `redis-server`
//! for the registry) learns where prefixes live from the engines' KV events
//! alone.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use http::StatusCode;
use loadtest::client::{body_bytes, Proto};

/// Prefill 0.5 ms per prompt token (a long prompt's prefill is worth
/// skipping), decode 5 ms a token.
const PROFILE: &str = "model = \"synthetic-small\"\nengine_class = \"test-prefix\"\n\
    [prefill]\npoints = [[0, 0.0], [4096, 2048.0]]\n[decode]\nbatch_points = [[1, 5.0]]\n";

/// `n` one-token words tagged `tag` (four characters each).
fn words(tag: char, n: usize) -> String {
    (0..n).map(|i| format!("{tag}{i:03x}")).collect::<Vec<_>>().join(" ")
}

#[tokio::test]
async fn prompts_behind_one_system_prompt_follow_it_and_skip_its_prefill() {
    let sys = System::start(PROFILE, 3).await;
    let conn = sys.conn(Proto::H2).await;
    // Two system prompts of 800 tokens (50 blocks of 16).
    for tag in ['p', 'q'] {
        let system = words(tag, 800);
        let mut engines = Vec::new();
        for i in 0..5 {
            let prompt = format!("{system} question {i} {}", words('z', 7));
            let started = Instant::now();
            let resp =
                conn.post_json("/v1/completions", Some(SILVER), completion(&prompt, 1, false)).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            engines.push(header(&resp, "x-engine").to_string());
            let took = started.elapsed();
            let v = json(&body_bytes(resp).await.unwrap());
            let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
            if i == 0 {
                // ~400 ms of prefill for ~810 tokens, nothing cached.
                assert_eq!(cached, 0, "{v}");
                assert!(took >= Duration::from_millis(380), "{took:?}");
            } else {
                // The 800-token system prompt is found: 10-odd tokens computed.
                assert_eq!(cached, 800, "{v}");
                assert!(took < Duration::from_millis(250), "request {i} took {took:?}");
            }
        }
        assert!(engines.iter().all(|e| *e == engines[0]), "system prompt {tag}: {engines:?}");
        let load = sys.engine_load(&engines[0]).await;
        assert!(load.prefix_hit_tokens >= 4 * 800, "{load:?}");
        assert!(load.prefix_cached_pages >= 50, "{load:?}");
    }
    // The gateway reads every engine's KV events: the one that served reports
    // stored blocks (sequence numbers past 0) within a few probes.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ready = sys.readyz().await;
        let index = &ready["detail"]["prefix_index"];
        let read: Vec<u64> =
            index["events_read"].as_array().unwrap().iter().filter_map(|v| v.as_u64()).collect();
        if read.len() == 3 && read.iter().filter(|s| **s > 0).count() >= 1 {
            assert!(index["blocks"].as_u64().unwrap() >= 100, "{index}");
            break;
        }
        assert!(Instant::now() < deadline, "the KV events were not read: {index}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `sys`'s `/readyz` until `check` holds (10 s at most).
async fn wait_ready(sys: &System, what: &str, check: impl Fn(&serde_json::Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = sys.readyz().await;
        if check(&r) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_second_gateway_learns_where_a_prefix_lives_from_the_engines_events() {
    let redis = start_redis();
    let url = redis.url();
    let a = System::start_with_policy(PROFILE, 3, &["--redis", &url], None).await;
    let b = System::serve_beside(&a, &default_policy(), &["--redis", &url]).await;
    let ready = |r: &serde_json::Value| {
        r["detail"]["engines"].as_array().map_or(0, |e| e.iter().filter(|e| e["ready"] == true).count())
    };
    wait_ready(&b, "B discovers the three engines", |r| ready(r) == 3).await;
    // Through A only: the system prompt is prefilled on one engine.
    let system = words('r', 800);
    let ca = a.conn(Proto::H2).await;
    let first = format!("{system} question one {}", words('z', 7));
    let resp = ca.post_json("/v1/completions", Some(SILVER), completion(&first, 1, false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let holder = header(&resp, "x-engine").to_string();
    body_bytes(resp).await.unwrap();
    // B routed nothing, but reads the engines' KV events: it learns the 50 blocks.
    let blocks = |r: &serde_json::Value| r["detail"]["prefix_index"]["blocks"].as_u64().unwrap_or(0);
    wait_ready(&b, "B's index learns the blocks from the events", |r| blocks(r) >= 50).await;
    let cb = b.conn(Proto::H2).await;
    let second = format!("{system} question two {}", words('y', 7));
    let resp = cb.post_json("/v1/completions", Some(SILVER), completion(&second, 1, false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(&resp, "x-engine"), holder, "B sends the prefix where A's request left it");
    let v = json(&body_bytes(resp).await.unwrap());
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 800, "{v}");
}
