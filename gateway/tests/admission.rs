//! SLO admission end to end against a real `gateway up`: overload is
//! refused within milliseconds with a reason and a Retry-After (never a
//! timeout), degradations are visible in headers and in what is served,
//! waiters at the gate are served when a slot frees, tenant limits give
//! 429, SLO hints are validated, and brownout engages and recovers.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use http::StatusCode;
use loadtest::client::{body_bytes, Proto};

#[tokio::test]
async fn overload_is_refused_in_milliseconds_with_retry_after_and_reason() {
    // One engine, two decode slots, 50 ms per token.
    let sys = System::start_with(&paced(0, 50), 1, &["--engine-arg=--max-batch=2"]).await;
    let conn = sys.conn(Proto::H2).await;
    let prompt = long_prompt(120);
    let mut held = Vec::new();
    for _ in 0..2 {
        let resp =
            conn.post_json("/v1/completions", Some(GOLD), completion(&prompt, 100, true)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(header(&resp, "x-admission"), "admitted");
        assert_eq!(header(&resp, "x-admission-reason"), "slo_feasible");
        let predicted: f64 = header(&resp, "x-predicted-ttft-ms").parse().unwrap();
        assert!(predicted > 0.0 && predicted < 500.0, "{predicted}");
        assert_eq!(header(&resp, "x-policy-version").len(), 12);
        held.push(resp);
    }
    // Both slots are busy for ~5 s: gold's 500 ms TTFT cannot be met. Twenty
    // such requests at once are all refused at once, none waits it out.
    let started = Instant::now();
    let tries =
        (0..20).map(|_| conn.post_json("/v1/completions", Some(GOLD), completion(&prompt, 100, false)));
    let answers = futures_join(tries).await;
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1000), "20 refusals took {took:?}");
    for resp in answers {
        let resp = resp.unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(header(&resp, "x-admission"), "rejected");
        assert_eq!(header(&resp, "x-admission-reason"), "ttft_infeasible");
        let retry: u32 = header(&resp, "retry-after").parse().unwrap();
        assert!((1..=30).contains(&retry), "{retry}");
        let predicted: f64 = header(&resp, "x-predicted-ttft-ms").parse().unwrap();
        assert!(predicted > 500.0, "{predicted}");
        let v = json(&body_bytes(resp).await.unwrap());
        assert_eq!(v["error"]["code"], "ttft_infeasible", "{v}");
        assert_eq!(v["error"]["type"], "server_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("500 ms budget"), "{v}");
    }
    let one = Instant::now();
    let resp = conn.post_json("/v1/completions", Some(GOLD), completion(&prompt, 100, false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(one.elapsed() < Duration::from_millis(250), "one refusal took {:?}", one.elapsed());
    let text = sys.metrics().await;
    let rejected = metric(
        &text,
        "gateway_admission_decisions_total{tier=\"gold\",decision=\"rejected\",reason=\"ttft_infeasible\"}",
    );
    assert!(rejected.is_some_and(|n| n >= 21.0), "{rejected:?}");
    // The shipped [oserve] types: the two admitted requests (~120 prompt
    // tokens, at most 100 out) are short-in-short-out; refusals count not.
    let typed = metric(&text, "gateway_workload_type_total{type=\"short-in-short-out\"}");
    assert_eq!(typed, Some(2.0), "{text}");
    // Every family served carries its # HELP text.
    let undescribed = loadtest::prom::undescribed(&text);
    assert!(undescribed.is_empty(), "families without # HELP: {undescribed:?}");
    let lint = promtool_lint(&text);
    assert!(lint.is_empty(), "promtool check metrics on the gateway:\n{lint}");
    // The two held answers' tokens are on the engine (the gauge is sampled
    // every second: wait for a sample).
    let started = Instant::now();
    let in_flight = loop {
        let v = metric(&sys.metrics().await, "gateway_tokens_in_flight").unwrap_or(0.0);
        if v > 0.0 || started.elapsed() > Duration::from_secs(3) {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        (200.0..=500.0).contains(&in_flight),
        "two answers of ~120 prompt + 100 output tokens: {in_flight}"
    );
    let engine = sys.engine_metrics(0).await;
    let lint = promtool_lint(&engine);
    assert!(lint.is_empty(), "promtool check metrics on the engine:\n{lint}");
    // The two held answers met their TTFT target; their clients leave
    // before the end, so the end-to-end target counts as missed.
    let slo = |slo: &str, result: &str| {
        format!("gateway_slo_requests_total{{tier=\"gold\",slo=\"{slo}\",result=\"{result}\"}}")
    };
    assert_eq!(metric(&sys.metrics().await, &slo("ttft", "met")), Some(2.0));
    drop(held);
    let started = Instant::now();
    let missed = loop {
        let v = metric(&sys.metrics().await, &slo("e2e", "missed"));
        if v == Some(2.0) || started.elapsed() > Duration::from_secs(5) {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(missed, Some(2.0), "two generations left by their clients");
    assert_eq!(metric(&sys.metrics().await, &slo("ttft", "missed")), None);
}

/// Awaits all futures concurrently (no extra dependency for join_all).
async fn futures_join<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let handles: Vec<_> = futs.map(|f| Box::pin(f)).collect();
    let mut out = Vec::new();
    let mut pending: Vec<_> = handles.into_iter().map(Some).collect();
    let mut results: Vec<Option<F::Output>> = (0..pending.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut left = false;
        for (i, slot) in pending.iter_mut().enumerate() {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        results[i] = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Pending => left = true,
                }
            }
        }
        if left {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.extend(results.into_iter().map(Option::unwrap));
    out
}

#[tokio::test]
async fn a_waiter_at_the_gate_gets_the_slot_that_frees() {
    // One slot, 50 ms per token; a 20-token answer holds it for ~1 s.
    let sys = System::start_with(&paced(0, 50), 1, &["--engine-arg=--max-batch=1"]).await;
    let conn = sys.conn(Proto::H2).await;
    let first = conn
        .post_json("/v1/completions", Some(BRONZE), completion(&long_prompt(40), 20, true))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let t0 = Instant::now();
    // Bronze's 3 s TTFT budget covers the wait: admitted to wait at the gate.
    let second = conn
        .post_json("/v1/completions", Some(BRONZE), completion(&long_prompt(40), 20, false))
        .await
        .unwrap();
    let waited = t0.elapsed();
    assert_eq!(second.status(), StatusCode::OK, "{:?}", second.headers());
    assert_eq!(header(&second, "x-admission"), "admitted");
    assert!(waited > Duration::from_millis(500), "served only after the first freed its slot: {waited:?}");
    let v = json(&body_bytes(second).await.unwrap());
    assert_eq!(v["usage"]["completion_tokens"], 20);
    let events = sse_events(first).await;
    assert_eq!(events.last().unwrap().data, "[DONE]");
    // Both requests' gate waits are in the histogram (one ~0, one > 0.5 s),
    // and the gaps between their 19 later tokens each (50 ms apart).
    let text = sys.metrics().await;
    let value = |name: &str| metric(&text, name).unwrap_or_else(|| panic!("{name} missing:\n{text}"));
    assert_eq!(value("gateway_queue_wait_seconds_count{tier=\"bronze\"}"), 2.0);
    assert!(value("gateway_queue_wait_seconds_sum{tier=\"bronze\"}") > 0.4);
    assert_eq!(value("gateway_tbt_seconds_count{tier=\"bronze\"}"), 38.0);
    let mean_tbt = value("gateway_tbt_seconds_sum{tier=\"bronze\"}") / 38.0;
    assert!((0.03..0.2).contains(&mean_tbt), "mean time between tokens {mean_tbt}");
}

#[tokio::test]
async fn degradation_lowers_max_tokens_to_fit_the_e2e_hint() {
    let sys = System::start(&paced(0, 20), 1).await;
    let conn = sys.conn(Proto::H2).await;
    // 200 tokens at 20 ms would take 4 s; the hint allows 3 s, so silver's
    // ladder lowers max_tokens to what fits (3,000 ms less a 20 ms first
    // token, at 20 ms a token: 149).
    let req = request(
        "/v1/completions",
        SILVER,
        completion(&long_prompt(250), 200, false),
        &[("x-slo-e2e-ms", "3000")],
    );
    let resp = conn.send(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(&resp, "x-admission"), "degraded");
    assert_eq!(header(&resp, "x-admission-reason"), "reduce_output");
    let v = json(&body_bytes(resp).await.unwrap());
    let served = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((140..=155).contains(&served), "served {served} tokens");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // A hint under the floor's cost (64 tokens x 20 ms) cannot be met even
    // by an idle engine: no overload, so no 503. Silver (`unattainable =
    // "best_effort"` in the shipped policy) is served, saying so; bronze
    // (`"refuse"`) gets a 422 naming the prediction, and no Retry-After.
    // (Bronze's floor is 32 tokens, 640 ms: its hints are 200 ms to the
    // first token and 500 ms in all; an end-to-end target is never below
    // the TTFT one, 3 s for bronze.)
    let unattainable = |key: &str, ttft: &str, e2e: &str| {
        let hints = [("x-slo-ttft-ms", ttft), ("x-slo-e2e-ms", e2e)];
        request("/v1/completions", key, completion(&long_prompt(250), 200, false), &hints)
    };
    let resp = conn.send(unattainable(SILVER, "1000", "1000")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(&resp, "x-admission"), "degraded");
    assert!(header(&resp, "x-admission-reason").ends_with("slo_unattainable"), "{:?}", resp.headers());
    let _ = body_bytes(resp).await;
    let resp = conn.send(unattainable(BRONZE, "200", "500")).await.unwrap();
    if resp.status() != StatusCode::UNPROCESSABLE_ENTITY {
        let (status, headers) = (resp.status(), format!("{:?}", resp.headers()));
        panic!("{status} {headers}: {}", String::from_utf8_lossy(&body_bytes(resp).await.unwrap()));
    }
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(resp.headers().get("retry-after").is_none(), "retrying never helps");
    assert_eq!(header(&resp, "x-admission-reason"), "slo_unattainable");
    let v = json(&body_bytes(resp).await.unwrap());
    assert_eq!(v["error"]["code"], "slo_unattainable");
    assert!(v["error"]["message"].as_str().unwrap().contains("idle engine"), "{v}");
    // Hints are validated.
    let req = request("/v1/completions", SILVER, completion("hi", 5, false), &[("x-slo-ttft-ms", "soon")]);
    let resp = conn.send(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let v = json(&body_bytes(resp).await.unwrap());
    assert_eq!(v["error"]["code"], "invalid_header");
    assert_eq!(v["error"]["param"], "x-slo-ttft-ms");
}

#[tokio::test]
async fn tenant_concurrency_limit_answers_429_and_frees_with_the_stream() {
    let policy = default_policy().replacen("max_concurrency = 256", "max_concurrency = 1", 3);
    let sys = System::start_with_policy(&paced(0, 20), 1, &[], Some(&policy)).await;
    let conn = sys.conn(Proto::H2).await;
    let held = conn
        .post_json("/v1/completions", Some(BRONZE), completion(&long_prompt(30), 30, true))
        .await
        .unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let resp = conn.post_json("/v1/completions", Some(BRONZE), completion("hi", 5, false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&resp, "retry-after"), "1");
    assert_eq!(header(&resp, "x-admission-reason"), "tenant_concurrency");
    let v = json(&body_bytes(resp).await.unwrap());
    assert_eq!(v["error"]["code"], "tenant_concurrency");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    // Another tenant is not limited by bronze's count.
    let resp = conn.post_json("/v1/completions", Some(GOLD), completion("hi", 5, false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    // The permit lives as long as the stream: once it ends, bronze may send.
    sse_events(held).await;
    let resp = conn.post_json("/v1/completions", Some(BRONZE), completion("hi", 5, false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn brownout_caps_bronze_under_overload_and_recovers() {
    // Fast brownout for the test: 5 samples, 0.25 s up, 1 s down.
    let policy = default_policy()
        .replace("min_samples = 20", "min_samples = 5")
        .replace("up_dwell_s = 1.0", "up_dwell_s = 0.25")
        .replace("down_dwell_s = 10.0", "down_dwell_s = 1.0")
        .replace("window_s = 10.0", "window_s = 2.0");
    let sys =
        System::start_with_policy(&paced(0, 50), 1, &["--engine-arg=--max-batch=1"], Some(&policy)).await;
    let conn = sys.conn(Proto::H2).await;
    let held = conn
        .post_json("/v1/completions", Some(GOLD), completion(&long_prompt(120), 100, true))
        .await
        .unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    // Refused gold requests report waits far over budget: the signal rises.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut level = 0;
    while level == 0 && Instant::now() < deadline {
        let resp = conn.post_json("/v1/completions", Some(GOLD), completion("hi", 50, false)).await.unwrap();
        level = header(&resp, "x-brownout-level").parse().unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(level >= 1, "brownout engaged");
    let text = sys.metrics().await;
    assert!(metric(&text, "gateway_brownout_level").is_some_and(|l| l >= 1.0), "{text}");
    // The slot frees (client gone: the engine cancels at the next token),
    // the level holds: bronze's output cap shrinks (256 -> 128 at level 1,
    // less above) and a bronze request is admitted degraded, visibly.
    drop(held);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let resp = conn
        .post_json("/v1/completions", Some(BRONZE), completion(&long_prompt(200), 256, false))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{:?}", resp.headers());
    assert_eq!(header(&resp, "x-admission"), "degraded");
    assert_eq!(header(&resp, "x-admission-reason").split('+').next(), Some("brownout_output_cap"));
    assert!(header(&resp, "x-brownout-level").parse::<u32>().unwrap() >= 1);
    let v = json(&body_bytes(resp).await.unwrap());
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 128, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // Load gone: one level down per quiet second, back to 0.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = sys.metrics().await;
        if metric(&text, "gateway_brownout_level") == Some(0.0) {
            break;
        }
        assert!(Instant::now() < deadline, "brownout did not recover");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let resp = conn
        .post_json("/v1/completions", Some(BRONZE), completion(&short_prompt(200), 256, false))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(&resp, "x-brownout-level"), "0");
}

#[tokio::test]
async fn faster_class_moves_gold_to_the_overflow_engines() {
    // The primary engine (one slot, 50 ms a token) is busy; a faster
    // overflow class exists for gold: gold is degraded to it, not refused.
    let fast = std::env::temp_dir().join(format!("overflow-profile-{}.toml", std::process::id()));
    std::fs::write(
        &fast,
        "model = \"synthetic-small\"\nengine_class = \"test-fast\"\n[prefill]\npoints = [[0, 0.0]]\n\
         [decode]\nbatch_points = [[1, 2.0]]\n",
    )
    .unwrap();
    let policy = default_policy().replacen(
        "degradations = [\"faster_class\", \"greedy\", \"reduce_output\"]",
        "degradations = [\"faster_class\", \"greedy\", \"reduce_output\"]\noverflow_class = \"test-fast\"",
        1,
    );
    assert!(policy.contains("overflow_class = \"test-fast\""));
    let overflow = format!("--overflow-profile={}", fast.display());
    let args = ["--engine-arg=--max-batch=1", "--overflow-engines=1", overflow.as_str()];
    let sys = System::start_with_policy(&paced(0, 50), 1, &args, Some(&policy)).await;
    let conn = sys.conn(Proto::H2).await;
    let held = conn
        .post_json("/v1/completions", Some(BRONZE), completion(&long_prompt(120), 100, true))
        .await
        .unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    assert_eq!(header(&held, "x-engine"), "e0", "bronze has no overflow class: the primary engine");
    let resp = conn.post_json("/v1/completions", Some(GOLD), completion("hi", 20, false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{:?}", resp.headers());
    assert_eq!(header(&resp, "x-admission"), "degraded");
    assert_eq!(header(&resp, "x-admission-reason"), "faster_class");
    assert_eq!(header(&resp, "x-engine"), "o0");
    // Bronze, without an overflow class, is refused (its wait is too long
    // for even its 3 s budget), never sent to gold's overflow engines.
    let resp = conn.post_json("/v1/completions", Some(BRONZE), completion("hi", 20, false)).await.unwrap();
    assert_ne!(header(&resp, "x-engine"), "o0");
    drop(held);
    let _ = std::fs::remove_file(fast);
}

#[tokio::test]
async fn gold_starts_by_pausing_bronze_when_no_slot_and_no_wait_meets_its_ttft() {
    // One engine, two decode slots, 50 ms per token; priority preemption on.
    let policy = default_policy().replace(
        "recheck_factor = 1.0 ",
        "recheck_factor = 1.0\npreempt_lower_tiers = true\nmax_pauses = 1\n",
    );
    assert!(policy.contains("preempt_lower_tiers = true"));
    let sys =
        System::start_with_policy(&paced(0, 50), 1, &["--engine-arg=--max-batch=2"], Some(&policy)).await;
    let conn = sys.conn(Proto::H2).await;
    let prompt = long_prompt(120);
    // Two bronze answers of 100 tokens hold both slots for ~5 s.
    let mut bronze = Vec::new();
    for _ in 0..2 {
        let resp =
            conn.post_json("/v1/completions", Some(BRONZE), completion(&prompt, 100, true)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        bronze.push(resp);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Gold's 500 ms TTFT: no slot frees in time, so it pauses a bronze.
    let t0 = Instant::now();
    let gold = conn.post_json("/v1/completions", Some(GOLD), completion(&prompt, 10, true)).await.unwrap();
    assert_eq!(gold.status(), StatusCode::OK, "{:?}", gold.headers());
    assert_eq!(header(&gold, "x-admission"), "admitted");
    assert_eq!(header(&gold, "x-admission-reason"), "preempts_lower_tier");
    let events = sse_events(gold).await;
    assert_eq!(events.last().unwrap().data, "[DONE]");
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "10 tokens at 50 ms, not behind bronze: {:?}",
        t0.elapsed()
    );
    // A second gold: one bronze is paused already, the other may be.
    let gold = conn.post_json("/v1/completions", Some(GOLD), completion(&prompt, 10, false)).await.unwrap();
    assert_eq!(header(&gold, "x-admission-reason"), "preempts_lower_tier");
    // Both bronze answers finish whole: paused, then resumed.
    for b in bronze {
        let events = sse_events(b).await;
        assert_eq!(events.last().unwrap().data, "[DONE]");
    }
    let engine = sys.engine_metrics(0).await;
    let pauses = metric(&engine, "engine_priority_pauses_total");
    assert!(pauses.is_some_and(|n| n >= 1.0), "{pauses:?}");
    let text = sys.metrics().await;
    let admitted = metric(
        &text,
        "gateway_admission_decisions_total{tier=\"gold\",decision=\"admitted\",reason=\"preempts_lower_tier\"}",
    );
    assert_eq!(admitted, Some(2.0), "{text}");
}
