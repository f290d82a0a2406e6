//! The embedded fleet's capacity, live: engines that die are restarted,
//! load starts engines, quiet drains them before they stop, and no request
//! fails on the way. Real `gateway up` with real engine processes; the
//! policy's `[autoscale]` knobs are shortened so the suite stays fast.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use http::StatusCode;
use loadtest::client::Proto;

/// The shipped policy with fast autoscaling knobs and `extra` lines added
/// to `[autoscale]`.
fn policy(extra: &str) -> String {
    let text = default_policy();
    let fast = format!(
        "[autoscale]\nenabled = false\nup_sustain_s = 0.5\nup_cooldown_s = 1.0\ndown_window_s = 1.0\n\
         down_windows = 2\ndown_cooldown_s = 1.0\nmax_step_in = 1.0\nrestart_backoff_s = 2.0\n{extra}\n"
    );
    let start = text.find("[autoscale]\n").expect("the shipped policy has [autoscale]");
    let end = start + text[start..].find("\n\n").unwrap();
    format!("{}{fast}{}", &text[..start], &text[end..])
}

#[tokio::test]
async fn an_engine_killed_is_restarted_after_its_backoff_and_serves_again() {
    let sys = System::start_with_policy(&paced(0, 1), 2, &[], Some(&policy(""))).await;
    let conn = sys.conn(Proto::H2).await;
    sys.kill_engine("e0");
    // While it is down the other engine serves everything.
    for _ in 0..5 {
        let resp = conn
            .post_json("/v1/chat/completions", Some(GOLD), chat_body("still up", 2, false))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["x-engine"], "e1");
    }
    // Both down: a typed, retryable refusal at once, not a hang.
    sys.kill_engine("e1");
    let resp =
        conn.post_json("/v1/chat/completions", Some(GOLD), chat_body("anyone?", 2, false)).await.unwrap();
    assert!(resp.status() == StatusCode::SERVICE_UNAVAILABLE || resp.status() == StatusCode::BAD_GATEWAY);
    assert!(resp.headers().contains_key("retry-after"));
    // After the 2 s backoff both come back (new processes, same ids).
    let v = fleet_until(&sys, Duration::from_secs(20), "both engines restarted", |v| {
        v["supervisor"]["restarts"] == 2 && v["supervisor"]["engines"]["serving"] == 2
    })
    .await;
    assert!(v["supervisor"]["cold_starts"].as_u64().unwrap() >= 4, "{v}");
    let t = Instant::now();
    loop {
        let r = sys.readyz().await;
        if r["detail"]["ready_engines"] == 2 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for old in &sys.engines {
        assert!(!alive(old.pid), "the killed process is gone");
    }
    for _ in 0..5 {
        let resp =
            conn.post_json("/v1/chat/completions", Some(GOLD), chat_body("back", 2, false)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
    let r = sys.readyz().await;
    let engines = r["detail"]["engines"].as_array().unwrap();
    assert_eq!(engines.len(), 2, "{r}");
    assert!(engines.iter().all(|e| e["ready"] == true && e["role"] == "serving"), "{r}");
    let urls: std::collections::BTreeSet<_> = engines.iter().map(|e| e["url"].as_str().unwrap()).collect();
    assert!(sys.engines.iter().all(|old| !urls.contains(old.url.as_str())), "new processes, new ports: {r}");
    assert!(sys.metrics().await.contains("gateway_engine_restarts_total 2"));
}

#[tokio::test]
async fn load_starts_engines_and_quiet_drains_them_without_failing_a_request() {
    // One engine with 2 decode slots; 40 ms per token alone, 60 ms with two
    // running (so routing spreads streams over idle engines rather than
    // filling one first); up to 3 engines.
    let profile = "model = \"synthetic-small\"\nengine_class = \"test-paced\"\n\
        [prefill]\npoints = [[0, 5.0]]\n[decode]\nbatch_points = [[1, 40.0], [2, 60.0]]\n";
    let sys = System::start_with_policy(
        profile,
        1,
        &["--min-engines", "1", "--max-engines", "3", "--engine-arg=--max-batch=2"],
        Some(&policy("warm_pool = false")),
    )
    .await;
    // 8 concurrent streams of 60 tokens, twice: demand 8 on 2 slots.
    let mut ok = 0;
    let mut engines = std::collections::BTreeSet::new();
    for _ in 0..2 {
        let mut tasks = Vec::new();
        for i in 0..8 {
            let conn = sys.conn(Proto::H2).await;
            tasks.push(tokio::spawn(async move {
                let resp = conn
                    .post_json(
                        "/v1/chat/completions",
                        Some(BRONZE),
                        chat_body(&format!("load {i}"), 60, true),
                    )
                    .await
                    .unwrap();
                let status = resp.status();
                let engine = resp.headers().get("x-engine").map(|v| v.to_str().unwrap().to_string());
                let events = sse_events(resp).await;
                (status, engine, events.last().map(|e| e.data.clone()))
            }));
        }
        for t in tasks {
            let (status, engine, last) = t.await.unwrap();
            // Refusals are allowed (typed, before any token); failures are not.
            if status == StatusCode::OK {
                assert_eq!(last.as_deref(), Some("[DONE]"), "an admitted stream finishes");
                ok += 1;
                engines.extend(engine);
            } else {
                assert!(status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS);
            }
        }
    }
    assert!(ok >= 8, "{ok} of 16 streams served");
    let v = fleet_until(&sys, Duration::from_secs(15), "scaled out", |v| {
        v["supervisor"]["cold_starts"].as_u64().unwrap_or(0) >= 2
    })
    .await;
    let decisions = v["decisions"].as_array().unwrap();
    assert!(decisions.iter().any(|d| d["why"] == "utilization" || d["why"] == "queue_latency"), "{v:#}");
    // Lighter load now: three streams at a time on 3 x 2 slots (rho 0.5 <
    // 0.8 - 0.1): quiet windows, then M_target = ceil(3 / (2 x 0.8)) = 2,
    // so one engine, running a stream as they all are, is drained. Every
    // stream must still end with [DONE].
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..3 {
        let conn = sys.conn(Proto::H2).await;
        let stop = std::sync::Arc::clone(&stop);
        workers.push(tokio::spawn(async move {
            let mut served = Vec::new();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 40 {
                n += 1;
                let body = chat_body(&format!("light {w} {n}"), 30, true);
                let resp = conn.post_json("/v1/chat/completions", Some(GOLD), body).await.unwrap();
                assert_eq!(resp.status(), StatusCode::OK, "light load is admitted");
                let engine = resp.headers()["x-engine"].to_str().unwrap().to_string();
                let last = sse_events(resp).await.last().map(|e| e.data.clone());
                assert_eq!(last.as_deref(), Some("[DONE]"), "a stream on {engine} was cut");
                served.push(engine);
            }
            served
        }));
    }
    let v = fleet_until(&sys, Duration::from_secs(40), "scaled back in", |v| {
        // On a loaded machine slower engines may scale it out again after;
        // what matters is that a drain completed and nothing failed.
        let quiet = v["decisions"].as_array().unwrap().iter().any(|d| d["why"] == "quiet");
        quiet && v["supervisor"]["engines"]["draining"] == 0
    })
    .await;
    // Let the light load run on the smaller fleet for a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut served = std::collections::BTreeSet::new();
    for w in workers {
        served.extend(w.await.expect("no stream failed"));
    }
    let left: Vec<String> = sys.readyz().await["detail"]["engines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert!(
        served.iter().any(|e| !left.contains(e)),
        "an engine that was drained away served streams: {served:?}"
    );
    assert!(v["decisions"].as_array().unwrap().iter().any(|d| d["why"] == "quiet"), "{v:#}");
    // Still serving after the scale-in.
    let conn = sys.conn(Proto::H2).await;
    let resp =
        conn.post_json("/v1/chat/completions", Some(GOLD), chat_body("after", 2, false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let m = sys.metrics().await;
    assert!(metric(&m, "gateway_autoscale_desired_engines{class=\"test-paced\"}").is_some(), "{m}");
}

#[tokio::test]
async fn a_warm_engine_is_ready_but_unrouted_until_load_promotes_it() {
    // A 1.5 s weight load per engine; one level expecting x3 bursts: the
    // pool is ceil(2 x 1 / 30 x ~1.6 x 1.25) = 1 warm engine beside 1 serving.
    let levels = "[[autoscale.levels]]\nabove = 0.0\ntarget_utilization = 0.8\nburst_factor = 3.0\n";
    let mut text = policy("warm_pool = true");
    let start = text.find("[[autoscale.levels]]").unwrap();
    let end = text.find("[cost]").unwrap();
    text.replace_range(start..end, &format!("{levels}\n"));
    let sys = System::start_with_policy(
        &paced(5, 40),
        1,
        &[
            "--min-engines",
            "1",
            "--max-engines",
            "3",
            "--engine-arg=--max-batch=2",
            "--engine-arg=--emulate-load-ms=1500",
        ],
        Some(&text),
    )
    .await;
    let v = fleet_until(&sys, Duration::from_secs(15), "a warm engine", |v| {
        v["supervisor"]["engines"]["warm"] == 1
    })
    .await;
    assert_eq!(v["supervisor"]["engines"]["serving"], 1, "{v:#}");
    // The new engine joins the pool at once; its first probe marks it ready.
    let t = Instant::now();
    let r = loop {
        let r = sys.readyz().await;
        if r["detail"]["engines"].as_array().unwrap().iter().all(|e| e["ready"] == true) {
            break r;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let warm: Vec<String> = r["detail"]["engines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["role"] == "warm")
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(warm.len(), 1, "{r}");
    assert!(r["detail"]["engines"].as_array().unwrap().iter().all(|e| e["ready"] == true), "{r}");
    let conn = sys.conn(Proto::H2).await;
    for _ in 0..5 {
        let resp =
            conn.post_json("/v1/chat/completions", Some(GOLD), chat_body("idle", 2, false)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_ne!(resp.headers()["x-engine"].to_str().unwrap(), warm[0], "a warm engine takes no work");
    }
    // Load: 6 streams on 2 slots; the warm engine is promoted (no cold
    // start) and serves.
    let mut tasks = Vec::new();
    for i in 0..6 {
        let conn = sys.conn(Proto::H2).await;
        tasks.push(tokio::spawn(async move {
            let mut engines = Vec::new();
            for j in 0..4 {
                let body = chat_body(&format!("busy {i} {j}"), 40, true);
                let resp = conn.post_json("/v1/chat/completions", Some(BRONZE), body).await.unwrap();
                if resp.status() == StatusCode::OK {
                    engines.push(resp.headers()["x-engine"].to_str().unwrap().to_string());
                    assert_eq!(
                        sse_events(resp).await.last().map(|e| e.data.clone()).as_deref(),
                        Some("[DONE]")
                    );
                }
            }
            engines
        }));
    }
    let mut served = std::collections::BTreeSet::new();
    for t in tasks {
        served.extend(t.await.unwrap());
    }
    assert!(served.contains(&warm[0]), "the warm engine was promoted and served: {served:?}");
}
