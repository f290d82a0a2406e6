//! The request path's timeouts in tokio's paused time, against scripted
//! engines in-process: each test asserts what a client sees (status,
//! headers, SSE bytes) and exactly when, in virtual time.

use std::time::Duration;

use engine_api::Event;
use http::StatusCode;
use serde_json::json;
use tokio::time::Instant;

use super::*;

const POLICY: &str = include_str!("../../../policies/default.toml");

fn chat(max_tokens: u32) -> serde_json::Value {
    json!({
        "model": "synthetic-small",
        "stream": true,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hello"}],
    })
}

fn header<'a>(resp: &'a Response<Incoming>, name: &str) -> &'a str {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// Reads SSE bytes until `needle` has arrived; the text read.
async fn read_until(body: &mut Incoming, needle: &str) -> String {
    let mut text = String::new();
    while !text.contains(needle) {
        match next_chunk(body).await {
            Some(Ok(b)) => text.push_str(&String::from_utf8_lossy(&b)),
            other => panic!("the stream ended before {needle:?} ({other:?}); read: {text}"),
        }
    }
    text
}

/// The rest of the body; `Err` if it ended with a reset.
async fn read_rest(body: &mut Incoming) -> Result<String, String> {
    let mut text = String::new();
    while let Some(chunk) = next_chunk(body).await {
        match chunk {
            Ok(b) => text.push_str(&String::from_utf8_lossy(&b)),
            Err(e) => return Err(format!("{e} after {text:?}")),
        }
    }
    Ok(text)
}

#[tokio::test(start_paused = true)]
async fn a_streamed_answer_arrives_on_the_engines_schedule() {
    let h = Harness::start(
        POLICY,
        vec![("e0", vec![Script::tokens(Duration::from_millis(40), 3, Duration::from_millis(10))])],
        |_| {},
    )
    .await;
    let t0 = Instant::now();
    let resp = h.post("/v1/chat/completions", "sk-demo-gold", &chat(3)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(&resp, "x-admission"), "admitted");
    assert_eq!(header(&resp, "x-engine"), "e0");
    let mut body = resp.into_body();
    read_until(&mut body, "\"t0\"").await;
    assert_eq!(t0.elapsed(), Duration::from_millis(40), "the first token as the engine sent it");
    let rest = read_rest(&mut body).await.unwrap();
    assert!(rest.contains("\"t2\"") && rest.ends_with("data: [DONE]\n\n"), "{rest}");
    assert_eq!(t0.elapsed(), Duration::from_millis(60));
    assert_eq!(h.engines[0].cancelled(), 0);
    assert_eq!(h.engine_sequences(0), 0, "the lease ends with the stream");
}

/// Engine e0 plays `failing`; e1 answers two tokens, the first after
/// `e1_ttft`. The request must end on e1, complete; returns the harness
/// and how long the answer's headers (sent with the first token) took.
async fn moved_to_e1(failing: Script, e1_ttft: Duration) -> (Harness, Duration) {
    let e1 = Script::tokens(e1_ttft, 2, Duration::ZERO);
    let h = Harness::start(POLICY, vec![("e0", vec![failing]), ("e1", vec![e1])], |_| {}).await;
    let t0 = Instant::now();
    let resp = h.post("/v1/chat/completions", "sk-demo-gold", &chat(2)).await;
    let took = t0.elapsed();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(&resp, "x-engine"), "e1");
    let rest = read_rest(&mut resp.into_body()).await.unwrap();
    assert!(rest.contains("\"t1\"") && rest.ends_with("data: [DONE]\n\n"), "{rest}");
    assert_eq!((h.engines[0].requests(), h.engines[1].requests()), (1, 1));
    assert_eq!(h.engine_sequences(0), 0, "e0's lease is back");
    (h, took)
}

#[tokio::test(start_paused = true)]
async fn an_engine_that_refuses_costs_no_time_the_next_one_serves() {
    let refuses = Script::Refuse(StatusCode::SERVICE_UNAVAILABLE, "kv_low_watermark");
    let (_, took) = moved_to_e1(refuses, Duration::from_millis(25)).await;
    assert_eq!(took, Duration::from_millis(25), "the refusal cost no virtual time");
}

#[tokio::test(start_paused = true)]
async fn a_request_tries_at_most_three_engines_and_answers_with_the_last_ones_reason() {
    let broken = || vec![Script::Refuse(StatusCode::INTERNAL_SERVER_ERROR, "internal")];
    let ids = ["e0", "e1", "e2", "e3", "e4"];
    let h = Harness::start(POLICY, ids.iter().map(|&id| (id, broken())).collect(), |_| {}).await;
    let resp = h.post("/v1/chat/completions", "sk-demo-gold", &chat(2)).await;
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    let body = String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(body.contains("\"engine_failed\"") && body.contains("internal"), "{body}");
    let tried: Vec<usize> = h.engines.iter().map(|e| e.requests()).collect();
    assert_eq!(tried.iter().sum::<usize>(), 3, "three engines of five, once each: {tried:?}");
    assert!(tried.iter().all(|&n| n <= 1), "{tried:?}");
    assert!((0..ids.len()).all(|i| h.engine_sequences(i) == 0), "every lease is back");
}

#[tokio::test(start_paused = true)]
async fn an_engine_silent_before_its_first_token_is_left_for_the_next_at_the_first_token_timeout() {
    let (h, took) = moved_to_e1(Script::Stream(vec![Step::Hang]), Duration::from_millis(5)).await;
    // Nothing reached the client while e0 was silent, so the request moved
    // to e1 once gold's first-event timeout (its 20 s end-to-end budget)
    // had passed, and e0's stream was cancelled.
    assert_eq!(took, Duration::from_millis(20_005));
    assert_eq!(h.engines[0].cancelled(), 1, "e0's silent stream is reset");
}

#[tokio::test(start_paused = true)]
async fn an_engine_that_answers_garbage_is_left_for_the_next_at_once() {
    let garbage = Script::Stream(vec![Step::Raw(b"<html>502 Bad Gateway</html>\n")]);
    let (_, took) = moved_to_e1(garbage, Duration::from_millis(15)).await;
    assert_eq!(took, Duration::from_millis(15));
}

#[tokio::test(start_paused = true)]
async fn an_engine_silent_mid_stream_ends_the_stream_with_an_error_event_at_the_event_timeout() {
    let steps = vec![
        Step::Wait(Duration::from_millis(10)),
        Step::Event(Event::Token { text: "t0".into() }),
        Step::Hang,
    ];
    let h = Harness::start(POLICY, vec![("e0", vec![Script::Stream(steps)])], |c| {
        c.limits.engine_event_timeout_ms = 7_000;
    })
    .await;
    let t0 = Instant::now();
    let resp = h.post("/v1/chat/completions", "sk-demo-gold", &chat(8)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    read_until(&mut body, "\"t0\"").await;
    assert_eq!(t0.elapsed(), Duration::from_millis(10));
    let rest = read_rest(&mut body).await.expect("the stream ends cleanly, with an error event");
    assert_eq!(t0.elapsed(), Duration::from_millis(7_010), "exactly the event timeout after the last event");
    assert!(rest.contains("\"type\":\"engine_error\"") || rest.contains("engine_failed"), "{rest}");
    assert!(rest.contains("no event from the engine for 7s"), "{rest}");
    assert!(!rest.contains("[DONE]"), "a failed stream does not claim success: {rest}");
    assert_eq!(h.engines[0].cancelled(), 1, "the engine's stream is reset");
    assert_eq!(h.engine_sequences(0), 0);
}

#[tokio::test(start_paused = true)]
async fn an_engine_silent_mid_stream_has_the_rest_continued_on_another_at_the_event_timeout() {
    let steps = vec![
        Step::Wait(Duration::from_millis(10)),
        Step::Event(Event::Token { text: "t0".into() }),
        Step::Event(Event::Token { text: " t1".into() }),
        Step::Hang,
    ];
    let rest = vec![
        Step::Wait(Duration::from_millis(20)),
        Step::Event(Event::Token { text: " u0".into() }),
        Step::Event(Event::Done {
            finish_reason: engine_api::FinishReason::Stop,
            // The continuation's prompt held "t0 t1": 8 + 2 tokens.
            usage: engine_api::Usage { prompt_tokens: 10, completion_tokens: 1, cached_tokens: 9 },
            queue_ms: 0.0,
            prefill_ms: 1.0,
        }),
    ];
    let engines = vec![("e0", vec![Script::Stream(steps)]), ("e1", vec![Script::Stream(rest)])];
    let h = Harness::start(POLICY, engines, |c| c.limits.engine_event_timeout_ms = 7_000).await;
    let t0 = Instant::now();
    let mut body = chat(8);
    body["stream_options"] = json!({"include_usage": true});
    let resp = h.post("/v1/chat/completions", "sk-demo-gold", &body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(&resp, "x-engine"), "e0");
    let mut body = resp.into_body();
    read_until(&mut body, "\" t1\"").await;
    let rest = read_rest(&mut body).await.expect("the stream ends cleanly");
    // e0 was left at the event timeout; e1's first token came 20 ms later.
    assert_eq!(t0.elapsed(), Duration::from_millis(7_030));
    assert!(rest.contains("\" u0\"") && rest.ends_with("data: [DONE]\n\n"), "{rest}");
    assert!(!rest.contains("error"), "{rest}");
    // The client's usage: its own prompt (the gateway's count of "hello"
    // rendered) and every token it was sent.
    assert!(rest.contains("\"completion_tokens\":3"), "{rest}");
    // e1 was asked for the rest: the prompt followed by what was relayed,
    // the cap less the two tokens spent.
    let sent = h.engines[1].last_body.lock().unwrap().clone().expect("e1 got a request");
    let client_prompt =
        sent["prompt"].as_str().unwrap().strip_suffix("t0 t1").expect("the relayed text last");
    assert_eq!(sent["max_tokens"], 6);
    let prompt_tokens = policies::tokens::count(client_prompt);
    assert!(rest.contains(&format!("\"prompt_tokens\":{prompt_tokens},")), "{rest}");
    assert_eq!(h.engines[0].cancelled(), 1, "e0's silent stream is reset");
    assert_eq!((h.engine_sequences(0), h.engine_sequences(1)), (0, 0), "every lease is back");
}

#[tokio::test(start_paused = true)]
async fn a_stream_whose_engines_keep_failing_is_resumed_on_at_most_three_in_all() {
    // Every engine sends a token and then ends its stream unfinished.
    let cut = || {
        vec![Script::Stream(vec![
            Step::Wait(Duration::from_millis(10)),
            Step::Event(Event::Token { text: "t".into() }),
        ])]
    };
    let ids = ["e0", "e1", "e2", "e3", "e4"];
    let h = Harness::start(POLICY, ids.iter().map(|&id| (id, cut())).collect(), |_| {}).await;
    let resp = h.post("/v1/chat/completions", "sk-demo-gold", &chat(8)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let rest = read_rest(&mut resp.into_body()).await.expect("the stream ends cleanly");
    assert!(rest.contains("engine_failed") && !rest.contains("[DONE]"), "{rest}");
    let tried: Vec<usize> = h.engines.iter().map(|e| e.requests()).collect();
    assert_eq!(tried.iter().sum::<usize>(), 3, "the first engine and two continuations: {tried:?}");
    assert!(tried.iter().all(|&n| n <= 1), "{tried:?}");
    assert!((0..ids.len()).all(|i| h.engine_sequences(i) == 0), "every lease is back");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_stops_reading_is_reset_at_the_stall_timeout_and_the_engine_released() {
    // 8 MB at once: far more than every buffer on the way (the client's
    // 64 KiB window, the 64 KiB outbox, HTTP/2 send buffers and the engine
    // connection's window), so the engine is still sending when the
    // gateway gives up on the client.
    let big = "x".repeat(1000);
    let mut steps = vec![Step::Wait(Duration::from_millis(10))];
    steps.extend((0..8_000).map(|_| Step::Event(Event::Token { text: big.clone() })));
    steps.push(Step::Event(done(8_000)));
    let h = Harness::start(POLICY, vec![("e0", vec![Script::Stream(steps)])], |c| {
        c.limits.write_stall_timeout_ms = 4_000;
    })
    .await;
    let t0 = Instant::now();
    let resp = h.post("/v1/chat/completions", "sk-demo-gold", &chat(1024)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    // The client holds the response and reads nothing.
    tokio::time::sleep_until(t0 + Duration::from_millis(3_900)).await;
    assert_eq!(h.engines[0].cancelled(), 0, "within the stall timeout the stream lives");
    assert_eq!(h.engine_sequences(0), 1);
    tokio::time::sleep_until(t0 + Duration::from_millis(4_100)).await;
    assert_eq!(h.engines[0].cancelled(), 1, "past it the engine's stream is cancelled");
    assert_eq!(h.engine_sequences(0), 0, "and the engine's slot freed, before the client reads");
    let end = read_rest(&mut resp.into_body()).await;
    assert!(end.is_err(), "the client's stream is reset, not ended as if complete");
}

#[tokio::test(start_paused = true)]
async fn late_first_tokens_raise_brownout_which_caps_bronze_then_recedes() {
    // Every bronze request's first token comes at 2.9 s, past 0.9 of its
    // 3 s TTFT budget: trouble, though every one is served.
    let late = Script::tokens(Duration::from_millis(2_900), 1, Duration::ZERO);
    let h = Harness::start(POLICY, vec![("e0", vec![late])], |_| {}).await;
    let t0 = Instant::now();
    let burst: Vec<_> = (0..24)
        .map(|_| {
            let h = &h;
            async move {
                let resp = h.post("/v1/chat/completions", "sk-demo-bronze", &chat(256)).await;
                assert_eq!(resp.status(), StatusCode::OK);
                read_rest(&mut resp.into_body()).await.unwrap();
            }
        })
        .collect();
    futures_join_all(burst).await;
    assert_eq!(t0.elapsed(), Duration::from_millis(2_900));
    // The signal (share in trouble over the window: 24 of 24) is above
    // every level's threshold. The gate ticks every 250 ms; a level is
    // entered once the signal has been above it for up_dwell_s (1 s), and
    // the dwell for the next one starts at the tick after: levels at 4.0,
    // 5.25 and 6.5 s.
    let app = &h.app;
    let level_at = |ms| async move {
        tokio::time::sleep_until(t0 + Duration::from_millis(ms)).await;
        app.admission.brownout_level()
    };
    assert_eq!(level_at(3_900).await, 0);
    assert_eq!(level_at(4_100).await, 1);
    assert_eq!(level_at(5_200).await, 1);
    assert_eq!(level_at(5_300).await, 2);
    assert_eq!(level_at(6_600).await, 3);
    // At level 3 a bronze request is served with an eighth of its output
    // (down to bronze's floor of 32 tokens), and says so.
    let resp = h.post("/v1/chat/completions", "sk-demo-bronze", &chat(256)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(&resp, "x-brownout-level"), "3");
    assert_eq!(h.engines[0].last_max_tokens(), 32);
    read_rest(&mut resp.into_body()).await.unwrap();
    // Once the troubled requests have left the 10 s window the signal is
    // gone; each level lasts down_dwell_s (10 s) below its exit threshold.
    tokio::time::sleep(Duration::from_secs(45)).await;
    assert_eq!(h.app.admission.brownout_level(), 0, "brownout recedes without trouble");
    let resp = h.post("/v1/chat/completions", "sk-demo-bronze", &chat(256)).await;
    assert_eq!(header(&resp, "x-brownout-level"), "0");
    assert_eq!(h.engines[0].last_max_tokens(), 256);
    read_rest(&mut resp.into_body()).await.unwrap();
}

/// Runs the futures concurrently on this task (no extra crate for it).
async fn futures_join_all<F: std::future::Future<Output = ()>>(futures: Vec<F>) {
    let mut set: Vec<_> = futures.into_iter().map(Box::pin).collect();
    std::future::poll_fn(|cx| {
        set.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if set.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

/// Response heads keep their size on a long connection: the values unique
/// to a request (`x-request-id`, the predictions) are never put in the
/// connection's HPACK table, so they do not push out the headers that
/// repeat (policy version, decision, engine), which stay one byte each
/// (80 bytes a head here). Indexed, 60 answers' unique values filled the
/// 4 KiB table and every eviction sent the repeating headers as literals
/// again (heads of 33-48 bytes, then 82-188 at each eviction; and the
/// table's upkeep was the costliest part of encoding a head).
#[tokio::test(start_paused = true)]
async fn response_heads_stay_small_on_a_long_connection() {
    let script = Script::tokens(Duration::from_millis(1), 1, Duration::from_millis(1));
    let h = Harness::start(POLICY, vec![("e0", vec![script; 60])], |_| {}).await;
    let mut body = chat(1);
    body["stream"] = json!(false);
    for _ in 0..60 {
        let resp = h.post("/v1/chat/completions", "sk-demo-gold", &body).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(header(&resp, "x-request-id").starts_with("req_"));
        assert!(!header(&resp, "x-predicted-ttft-ms").is_empty());
        resp.into_body().collect().await.expect("the answer");
    }
    let heads: Vec<usize> =
        h.frames().iter().filter(|f| f.kind == tap::HEADERS && f.stream % 2 == 1).map(|f| f.len).collect();
    assert_eq!(heads.len(), 60, "one head per answer");
    // From the second answer on, the repeating headers are indexed. A
    // `date` that moves to the next second is a new literal (~25 bytes):
    // at most a few of those in a run.
    let base = heads[1];
    let larger = heads[1..].iter().filter(|&&n| n > base + 8).count();
    assert!(larger <= 2, "heads grew on a long connection: {heads:?}");
}

/// Usage counts what the client saw, once: a request retried on another
/// engine before its first byte is one request with the serving engine's
/// usage; a stream that fails after its first token counts that token
/// (and its prompt); a non-streamed request whose every engine failed
/// counts nothing.
#[tokio::test(start_paused = true)]
async fn usage_counts_a_retried_request_once_and_a_failed_stream_as_far_as_it_went() {
    let usage_of = |h: &Harness| {
        h.app
            .usage
            .report(0, u32::MAX, &[crate::usage::Dimension::Tenant])
            .first()
            .map(|(_, c)| *c)
            .unwrap_or_default()
    };
    let refuses = Script::Refuse(StatusCode::SERVICE_UNAVAILABLE, "kv_low_watermark");
    let (h, _) = moved_to_e1(refuses, Duration::from_millis(25)).await;
    let u = usage_of(&h);
    assert_eq!((u.requests, u.prompt_tokens, u.completion_tokens), (1, 8, 2), "once, e1's usage: {u:?}");

    let steps = vec![Step::Event(Event::Token { text: "t0".into() }), Step::Raw(b"garbage\n")];
    let h = Harness::start(POLICY, vec![("e0", vec![Script::Stream(steps)])], |_| {}).await;
    let resp = h.post("/v1/chat/completions", "sk-demo-gold", &chat(8)).await;
    let rest = read_rest(&mut resp.into_body()).await.unwrap();
    assert!(!rest.contains("[DONE]"), "{rest}");
    let u = usage_of(&h);
    assert_eq!((u.requests, u.completion_tokens), (1, 1), "the one token the client got: {u:?}");
    assert!(u.prompt_tokens > 0, "{u:?}");

    let broken = || vec![Script::Refuse(StatusCode::INTERNAL_SERVER_ERROR, "internal")];
    let h = Harness::start(POLICY, vec![("e0", broken()), ("e1", broken()), ("e2", broken())], |_| {}).await;
    let mut whole = chat(2);
    whole["stream"] = json!(false);
    let resp = h.post("/v1/chat/completions", "sk-demo-gold", &whole).await;
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(usage_of(&h).requests, 0, "nothing reached the client");
}
