//! Prefix caching end to end (issue 23) against a real `gateway up` and
//! real engine processes: prompts behind one long system prompt land on
//! the engine that holds it, that engine computes only the rest (the
//! client sees it as `usage.prompt_tokens_details.cached_tokens` and in a
//! far shorter time to the answer), and the engine's own load report counts
//! the hits.
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
