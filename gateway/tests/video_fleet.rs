//! Live video streams that outlive their gateway (issue 52): three
//! gateways on one real `redis-server`, an emulated engine; the gateway
//! driving a stream is SIGKILLed; another takes the stream over within 5 s
//! and its client resumes the feed through a third from the last chunk it
//! received, losing none the engine made. Records Redis holds cannot make
//! a gateway serve a forged stream, nor another tenant's.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use http::StatusCode;
use http_body_util::BodyExt;
use loadtest::client::{body_bytes, Conn, Proto};
use loadtest::sse::{SseEvent, SseParser};
use serde_json::{json, Value};

/// A stream's SSE feed, event by event, with the SSE ids.
struct Feed {
    body: hyper::body::Incoming,
    parser: SseParser,
    ready: std::collections::VecDeque<SseEvent>,
}

impl Feed {
    async fn open(
        conn: &Conn,
        id: &str,
        key: &str,
        last_event_id: Option<u64>,
    ) -> Result<Self, (StatusCode, Value)> {
        let mut req = http::Request::get(format!("/v1/video/streams/{id}/events"))
            .header("authorization", format!("Bearer {key}"));
        if let Some(last) = last_event_id {
            req = req.header("last-event-id", last.to_string());
        }
        let resp =
            conn.send(req.body(http_body_util::Full::new(bytes::Bytes::new())).unwrap()).await.unwrap();
        if resp.status() != StatusCode::OK {
            let status = resp.status();
            return Err((status, json(&body_bytes(resp).await.unwrap())));
        }
        Ok(Self { body: resp.into_body(), parser: SseParser::new(), ready: Default::default() })
    }

    /// The next event (kind, id, data), or `None` when the feed ended.
    async fn next(&mut self) -> Option<(String, Option<String>, Value)> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Some((e.event.unwrap_or_default(), e.id, json(e.data.as_bytes())));
            }
            let frame = tokio::time::timeout(Duration::from_secs(20), self.body.frame())
                .await
                .expect("an event within 20 s")?;
            if let Ok(data) = frame.ok()?.into_data() {
                self.ready.extend(self.parser.push(&data));
            }
        }
    }
}

fn counter(m: &str, labels: &str) -> f64 {
    metric(m, &format!("gateway_video_adoptions_total{{{labels}}}")).unwrap_or(0.0)
}

#[tokio::test]
async fn a_killed_gateways_stream_is_taken_over_and_resumed_elsewhere_without_losing_a_chunk() {
    let redis = start_redis();
    let url = redis.url();
    // Chunks are instant; the driver keeps about a second buffered ahead
    // of playback (0.75 s chunks), so the engine makes chunks the client
    // has not read yet.
    let policy = default_policy().replace("max_buffer_s = 6.0", "max_buffer_s = 1.0");
    let a = System::start_with_policy(INSTANT, 1, &["--redis", &url], Some(&policy)).await;
    let mut b = System::serve_beside(&a, &policy, &["--redis", &url]).await;
    let c = System::serve_beside(&a, &policy, &["--redis", &url]).await;
    for g in [&b, &c] {
        let deadline = Instant::now() + Duration::from_secs(10);
        while g.readyz().await["detail"]["engines"]
            .as_array()
            .is_none_or(|e| e.iter().all(|e| e["ready"] != true))
        {
            assert!(Instant::now() < deadline, "a gateway never found the engine");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let (cb, cc) = (b.conn(Proto::H2).await, c.conn(Proto::H2).await);
    let resp = cb
        .post_json(
            "/v1/video/streams",
            Some(GOLD),
            json!({"prompt": "a fox in the snow", "length_frames": 144}).to_string(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let id = json(&body_bytes(resp).await.unwrap())["id"].as_str().unwrap().to_string();
    // The client reads three chunks from B, then stops reading while B
    // goes on making chunks into its feed.
    let mut feed = Feed::open(&cb, &id, GOLD, None).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let (kind, sse_id, data) = feed.next().await.expect("chunks from B");
        if kind == "chunk" {
            assert_eq!(
                sse_id.as_deref(),
                data["index"].as_u64().map(|i| i.to_string()).as_deref(),
                "the SSE id is the index"
            );
            seen.push(data["index"].as_u64().unwrap());
        }
    }
    assert_eq!(seen, [0, 1, 2]);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    b.child.start_kill().unwrap(); // SIGKILL
    let _ = b.child.wait().await;
    drop(feed);
    let killed = Instant::now();
    // Another gateway takes it over from the dead one within 5 s.
    let adopted = loop {
        let (ma, mc) = (a.metrics().await, c.metrics().await);
        let on = |m: &str| counter(m, "trigger=\"dead_owner\",result=\"adopted\"");
        if on(&ma) + on(&mc) >= 1.0 {
            break killed.elapsed();
        }
        assert!(killed.elapsed() < Duration::from_secs(8), "nobody took the stream over:\n{ma}\n{mc}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(adopted < Duration::from_secs(5), "taken over after {adopted:?}");
    // Another tenant cannot resume it; the owner can, through C (which
    // takes it from whichever gateway adopted it), from after chunk 2.
    let err = Feed::open(&cc, &id, BRONZE, Some(2)).await.err().expect("another tenant is refused");
    assert_eq!(err.0, StatusCode::NOT_FOUND, "{}", err.1);
    let mut feed = Feed::open(&cc, &id, GOLD, Some(2)).await.map_err(|e| e.1).unwrap();
    let mut resumed = Vec::new();
    let mut replayed = 0;
    let end = loop {
        let (kind, _, data) = feed.next().await.expect("the resumed feed ends with an end event");
        match kind.as_str() {
            "chunk" => {
                resumed.push(data["index"].as_u64().unwrap());
                replayed += usize::from(data["replayed"] == true);
                assert_eq!(data["frames"].as_array().map(Vec::len), Some(12), "{data}");
            }
            "stall" | "recovered" => {}
            "end" => break data,
            other => panic!("unexpected event {other}: {data}"),
        }
    };
    assert_eq!(end["reason"], "completed", "{end}");
    assert_eq!(
        resumed,
        (3..12).collect::<Vec<u64>>(),
        "every chunk after the last one received, once, in order"
    );
    // B had made chunks the client never read (about a second's worth):
    // those came from the engine's recent chunks, not made again.
    assert!(replayed >= 1, "replayed {replayed} of {resumed:?}");
    eprintln!("taken over {adopted:?} after the kill; {replayed} chunks replayed from the engine");
}

#[tokio::test]
async fn forged_and_mistyped_stream_records_are_refused_and_never_served() {
    let redis = start_redis();
    let url = redis.url();
    let a = System::start_with_policy(INSTANT, 1, &["--redis", &url], Some(&default_policy())).await;
    let cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &redis.port.to_string()])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success());
    };
    // A record naming the gold tenant and the fleet's engine, from a dead
    // "gateway", signed with the wrong key; and a key of the wrong type.
    let doc = json!({
        "id": "vs_forged", "tenant": "demo-gold", "tier": "gold", "owner": "gateway-dead", "engine": a.engines[0].id,
        "fps": 16, "frames_per_chunk": 12, "resolution": "tiny", "chunks_total": null,
        "prompt": "someone else's", "epoch": 0, "epoch_base": 0, "chunks": 0
    });
    cli(&[
        "HSET",
        "slo:stream:vs_forged",
        "owner",
        "gateway-dead",
        "doc",
        &doc.to_string(),
        "mac",
        &"ab".repeat(32),
    ]);
    cli(&["SET", "slo:stream:vs_wrong", "not a hash"]);
    let conn = a.conn(Proto::H2).await;
    for (id, why) in [("vs_forged", "forged"), ("vs_wrong", "malformed")] {
        let err = Feed::open(&conn, id, GOLD, None).await.err().expect("refused");
        assert_eq!(err.0, StatusCode::NOT_FOUND, "{id}: {}", err.1);
        assert_eq!(err.1["error"]["code"], "stream_not_found", "{}", err.1);
        let m = a.metrics().await;
        assert!(counter(&m, &format!("trigger=\"resume\",result=\"{why}\"")) >= 1.0, "{m}");
    }
    // The sweep refuses the forged record too (its owner is dead), and
    // adopts nothing.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = a.metrics().await;
        if counter(&m, "trigger=\"dead_owner\",result=\"forged\"") >= 1.0 {
            assert_eq!(counter(&m, "trigger=\"dead_owner\",result=\"adopted\""), 0.0, "{m}");
            break;
        }
        assert!(Instant::now() < deadline, "the sweep never looked at the forged record: {m}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(a.log().contains("video_record_refused"), "refusals are logged");
}
