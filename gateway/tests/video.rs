//! Streaming video sessions end to end against a real `gateway up` with
//! emulated engines: chunk events in a gapless, strictly increasing
//! sequence with real PNG frames, across a re-home too; prompt switches
//! reset slack; pause holds slack; another tenant's key gets 404; bad
//! input is a typed 400; a fleet that cannot keep up refuses with 503 and
//! Retry-After.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use common::*;
use http::StatusCode;
use http_body_util::BodyExt;
use loadtest::client::{body_bytes, Conn, Proto};
use loadtest::sse::{SseEvent, SseParser};
use serde_json::{json, Value};

async fn create(conn: &Conn, key: &str, body: Value) -> (StatusCode, Value, Option<String>) {
    let resp = conn.post_json("/v1/video/streams", Some(key), body.to_string()).await.unwrap();
    let status = resp.status();
    let retry = resp.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
    (status, json(&body_bytes(resp).await.unwrap()), retry)
}

async fn call(conn: &Conn, method: &str, path: &str, key: &str, body: Value) -> (StatusCode, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body.to_string())))
        .unwrap();
    let resp = conn.send(req).await.unwrap();
    let status = resp.status();
    (status, json(&body_bytes(resp).await.unwrap()))
}

/// A frame of a chunk event (base64 PNG): its size and RGB pixels.
fn decode_frame(b64: &str) -> (u32, u32, Vec<u8>) {
    use base64::Engine as _;
    let file = base64::engine::general_purpose::STANDARD.decode(b64).expect("base64");
    let mut reader = png::Decoder::new(std::io::Cursor::new(file)).read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).expect("one frame");
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

/// Reads a stream's SSE feed event by event.
struct Feed {
    body: hyper::body::Incoming,
    parser: SseParser,
    ready: std::collections::VecDeque<SseEvent>,
}

impl Feed {
    async fn open(conn: &Conn, id: &str, key: &str) -> Self {
        let resp = conn.get(&format!("/v1/video/streams/{id}/events"), Some(key)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        Self { body: resp.into_body(), parser: SseParser::new(), ready: Default::default() }
    }

    /// Reads to the `end` event, calling `on_chunk` with each chunk event's
    /// data and how many chunks came so far; returns the end event's data.
    async fn until_end(&mut self, mut on_chunk: impl AsyncFnMut(&Value, usize)) -> Value {
        let mut n = 0;
        loop {
            let (kind, data) = self.next().await.expect("the feed ends with an end event");
            match kind.as_str() {
                "chunk" => {
                    n += 1;
                    on_chunk(&data, n).await;
                }
                "stall" | "recovered" => {}
                "end" => return data,
                other => panic!("unexpected event {other}"),
            }
        }
    }

    /// The next event (kind, data), or `None` when the feed ended.
    async fn next(&mut self) -> Option<(String, Value)> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Some((e.event.unwrap_or_default(), json(e.data.as_bytes())));
            }
            let frame = tokio::time::timeout(Duration::from_secs(20), self.body.frame())
                .await
                .expect("an event within 20 s")?;
            if let Ok(data) = frame.unwrap().into_data() {
                self.ready.extend(self.parser.push(&data));
            }
        }
    }
}

#[tokio::test]
async fn chunks_arrive_gapless_with_frames_across_a_rehome() {
    // Instant chunks with the default 6 s buffer would all be made before
    // the move's pre-copy lands (then the stream rightly ends where it
    // is): with 1 s the driver waits for playback after the second chunk.
    let policy = default_policy().replace("max_buffer_s = 6.0", "max_buffer_s = 1.0");
    let sys = System::start_with_policy(INSTANT, 2, &[], Some(&policy)).await;
    let conn = sys.conn(Proto::H2).await;
    let (status, created, _) =
        create(&conn, GOLD, json!({"prompt": "a fox in the snow", "length_frames": 72})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["chunks"], 6);
    assert_eq!(created["fps"], 16);
    assert_eq!(created["frames_per_chunk"], 12);
    let id = created["id"].as_str().unwrap().to_string();
    let first_engine = created["home_engine"].as_str().unwrap().to_string();
    let mut feed = Feed::open(&conn, &id, GOLD).await;
    let mut indices = Vec::new();
    let mut engines = Vec::new();
    let end = loop {
        let (kind, data) = feed.next().await.expect("the feed ends with an end event");
        match kind.as_str() {
            "chunk" => {
                indices.push(data["index"].as_u64().unwrap());
                engines.push(data["engine"].as_str().unwrap().to_string());
                let frames = data["frames"].as_array().unwrap();
                assert_eq!(frames.len(), 12);
                let (w, h, pixels) = decode_frame(frames[0].as_str().unwrap());
                assert!(w > 0 && w == h && pixels.len() == (w * h * 3) as usize, "{w}x{h}");
                assert!(pixels.iter().any(|&p| p != pixels[0]), "a picture, not a flat fill");
                assert!(data["deadline_ms"].as_f64().is_some() && data["slack_ms"].as_f64().is_some());
                assert!(data["quality"].as_f64().unwrap() > 0.9);
                assert!(data["fidelity"]["label"].as_str().unwrap().starts_with('S'));
                if indices.len() == 2 {
                    // An operator moves the stream mid-flight.
                    let other = sys.other_engine(&first_engine);
                    let admin = sys.admin_conn().await;
                    let (s, body) = call(
                        &admin,
                        "POST",
                        &format!("/admin/video/streams/{id}/move?engine={other}"),
                        &sys.admin_token(),
                        json!({}),
                    )
                    .await;
                    assert_eq!(s, StatusCode::ACCEPTED, "{body}");
                }
            }
            "stall" => {}
            "end" => break data,
            other => panic!("unexpected event {other}"),
        }
    };
    assert_eq!(indices, (0..6).collect::<Vec<u64>>(), "gapless, strictly increasing, no duplicate");
    assert_eq!(engines[0], first_engine);
    assert_ne!(engines.last().unwrap(), &first_engine, "moved: {engines:?}");
    assert_eq!(end["reason"], "completed");
    assert_eq!(end["chunks"], 6);
    assert_eq!(end["rehomes"], 1);
    assert!(end["cpr"].as_f64().unwrap() >= 0.0 && end["ttfc_ms"].as_f64().unwrap() > 0.0);
    let (status, st) = call(&conn, "GET", &format!("/v1/video/streams/{id}"), GOLD, json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(st["status"], "ended");
}

#[tokio::test]
async fn another_tenant_gets_404_and_bad_input_is_a_typed_400() {
    let sys = System::start(INSTANT, 1).await;
    let conn = sys.conn(Proto::H2).await;
    let (_, created, _) = create(&conn, GOLD, json!({"prompt": "mine"})).await;
    let id = created["id"].as_str().unwrap();
    for (method, path) in [
        ("GET", format!("/v1/video/streams/{id}")),
        ("GET", format!("/v1/video/streams/{id}/events")),
        ("POST", format!("/v1/video/streams/{id}/pause")),
        ("POST", format!("/v1/video/streams/{id}/prompt")),
        ("DELETE", format!("/v1/video/streams/{id}")),
    ] {
        let (status, body) = call(&conn, method, &path, SILVER, json!({"prompt": "theirs"})).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {body}");
        assert_eq!(body["error"]["code"], "stream_not_found");
    }
    let (status, _) = call(&conn, "GET", "/v1/video/streams/vs_nope", GOLD, json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // The owner still has it, untouched.
    let (status, st) = call(&conn, "GET", &format!("/v1/video/streams/{id}"), GOLD, json!({})).await;
    assert_eq!((status, st["status"].as_str()), (StatusCode::OK, Some("active")));
    for (body, code, param) in [
        (json!({"fps": 16}), "invalid_value", "prompt"),
        (json!({"prompt": "x", "frames_per_chunk": 10}), "invalid_value", "frames_per_chunk"),
        (json!({"prompt": "x", "fps": 0}), "invalid_value", "fps"),
        (json!({"prompt": "x", "length_frames": 0}), "invalid_value", "length_frames"),
        (json!({"prompt": "x", "resolution": "8k"}), "invalid_value", "resolution"),
        (json!({"prompt": "x", "colour": "red"}), "unknown_parameter", "colour"),
        (json!({"prompt": "p".repeat(65 << 10)}), "invalid_value", "prompt"),
    ] {
        let (status, err, _) = create(&conn, GOLD, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {err}");
        assert_eq!(err["error"]["code"], code, "{body}: {err}");
        assert_eq!(err["error"]["param"], param, "{body}: {err}");
    }
    let resp = conn.post_json("/v1/video/streams", None, json!({"prompt": "x"}).to_string()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let (status, _) = call(&conn, "DELETE", &format!("/v1/video/streams/{id}"), GOLD, json!({})).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn prompt_switch_resets_slack_and_pause_holds_it() {
    let sys = System::start(INSTANT, 1).await;
    let conn = sys.conn(Proto::H2).await;
    let (_, created, _) = create(&conn, GOLD, json!({"prompt": "a quiet forest"})).await;
    let id = created["id"].as_str().unwrap().to_string();
    let initial = created["initial_slack_ms"].as_f64().unwrap();
    let mut feed = Feed::open(&conn, &id, GOLD).await;
    let mut indices = Vec::new();
    while indices.len() < 4 {
        let (kind, data) = feed.next().await.unwrap();
        if kind == "chunk" {
            assert_eq!(data["prompt_epoch"], 0);
            indices.push(data["index"].as_u64().unwrap());
        }
    }
    let path = format!("/v1/video/streams/{id}");
    let (status, st) =
        call(&conn, "POST", &format!("{path}/prompt"), GOLD, json!({"prompt": "a busy city"})).await;
    assert_eq!(status, StatusCode::OK, "{st}");
    assert_eq!(st["prompt_epoch"], 1);
    let slack = st["slack_ms"].as_f64().unwrap();
    assert!(
        (slack - initial).abs() < 250.0,
        "slack {slack} ms after the switch, initial budget {initial} ms"
    );
    // Later chunks are the new prompt's, and the sequence stays gapless.
    loop {
        let (kind, data) = feed.next().await.unwrap();
        if kind != "chunk" {
            continue;
        }
        let index = data["index"].as_u64().unwrap();
        assert_eq!(index, *indices.last().unwrap() + 1, "gapless: {indices:?} then {index}");
        indices.push(index);
        if data["prompt_epoch"] == 1 {
            break;
        }
    }
    // Paused: slack stands still.
    let (_, st) = call(&conn, "POST", &format!("{path}/pause"), GOLD, json!({})).await;
    assert_eq!(st["status"], "paused");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (_, later) = call(&conn, "GET", &path, GOLD, json!({})).await;
    let (a, b) = (st["slack_ms"].as_f64().unwrap(), later["slack_ms"].as_f64().unwrap());
    assert!(b >= a - 5.0, "slack fell while paused: {a} -> {b}");
    // Paused with a full buffer, the stream is idle: its state leaves the
    // engine's arena for host memory.
    let engine = Conn::connect(&sys.engines[0].url, None, Proto::H2).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let load = json(
            &body_bytes(engine.get("/engine/v1/video/load", Some(&sys.engine_token())).await.unwrap())
                .await
                .unwrap(),
        );
        if load["suspended"] == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never suspended: {load}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, st) = call(&conn, "POST", &format!("{path}/resume"), GOLD, json!({})).await;
    assert_eq!(st["status"], "active");
    // It plays on: a chunk made after the resume comes (the engine resumed
    // the state for it).
    let next = st["chunks"].as_u64().unwrap();
    loop {
        let (kind, data) = feed.next().await.unwrap();
        if kind == "chunk" && data["index"].as_u64().unwrap() >= next {
            break;
        }
    }
    let (status, _) = call(&conn, "DELETE", &path, GOLD, json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let end = loop {
        let (kind, data) = feed.next().await.unwrap();
        if kind == "end" {
            break data;
        }
    };
    assert_eq!(end["reason"], "deleted");
    let (status, _) = call(&conn, "POST", &format!("{path}/resume"), GOLD, json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "an ended stream cannot resume");
}

#[tokio::test]
async fn a_fleet_that_cannot_keep_up_refuses_new_streams_with_retry_after() {
    // One configuration, 2 s per chunk: never within a 0.75 s chunk.
    let slow = "model = \"synthetic-video\"\nengine_class = \"slow\"\nlatent_frames = 3\nbatch_cost = 0.3\n\
        [[configs]]\nsteps = 4\nsparsity = 0.0\nwindow = 7\nprecision = \"fp16\"\nchunk_ms = 2000.0\nquality = 1.0\n";
    let dir = std::env::temp_dir().join(format!("video-slow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("slow.toml");
    std::fs::write(&path, slow).unwrap();
    let arg = format!("--engine-arg=--video-profile={}", path.display());
    let sys = System::start_with(INSTANT, 1, &[&arg]).await;
    let conn = sys.conn(Proto::H2).await;
    let (status, err, retry) = create(&conn, GOLD, json!({"prompt": "too much"})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{err}");
    assert_eq!(err["error"]["code"], "video_capacity");
    assert!(retry.is_some_and(|r| r.parse::<u32>().unwrap() >= 1));
    // At a slower frame rate a chunk plays for 3 s: it fits.
    let (status, _, _) = create(&conn, GOLD, json!({"prompt": "slow motion", "fps": 4})).await;
    assert_eq!(status, StatusCode::CREATED);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn tenant_stream_limits_creation_rate_and_pause_time_are_bounded() {
    let at = |p: &str, tier: &str, extra: &str| {
        let i = p.find(&format!("[tiers.{tier}]")).unwrap();
        let j = i + p[i..].find("degradations").unwrap();
        format!("{}{extra}\n{}", &p[..j], &p[j..])
    };
    let policy = at(&default_policy(), "bronze", "max_video_streams = 2");
    let policy = at(&policy, "silver", "video_streams_per_minute = 3");
    let policy = policy.replacen("[video]\n", "[video]\nmax_pause_s = 1.0\n", 1);
    let sys = System::start_with_policy(INSTANT, 1, &[], Some(&policy)).await;
    let conn = sys.conn(Proto::H2).await;
    let body = json!({"prompt": "a fox in the snow"});
    // Bronze: two live streams at most.
    let (s1, a, _) = create(&conn, BRONZE, body.clone()).await;
    let (s2, _, _) = create(&conn, BRONZE, body.clone()).await;
    assert_eq!((s1, s2), (StatusCode::CREATED, StatusCode::CREATED));
    let (s3, refused, _) = create(&conn, BRONZE, body.clone()).await;
    assert_eq!(s3, StatusCode::TOO_MANY_REQUESTS, "{refused}");
    assert_eq!(refused["error"]["code"], "video_stream_limit");
    let id = a["id"].as_str().unwrap();
    assert_eq!(
        call(&conn, "DELETE", &format!("/v1/video/streams/{id}"), BRONZE, json!({})).await.0,
        StatusCode::OK
    );
    let mut freed = false;
    for _ in 0..50 {
        if create(&conn, BRONZE, body.clone()).await.0 == StatusCode::CREATED {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(freed, "an ended stream frees its place");
    // Silver: three creations a minute, then 429 with Retry-After.
    for _ in 0..3 {
        assert_eq!(create(&conn, SILVER, body.clone()).await.0, StatusCode::CREATED);
    }
    let (s, refused, retry) = create(&conn, SILVER, body.clone()).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{refused}");
    assert_eq!(refused["error"]["code"], "rate_limit_video_streams");
    assert!(retry.unwrap().parse::<u32>().unwrap() >= 1);
    // Gold: a stream paused past max_pause_s ends.
    let (_, g, _) = create(&conn, GOLD, body.clone()).await;
    let id = g["id"].as_str().unwrap().to_string();
    let mut feed = Feed::open(&conn, &id, GOLD).await;
    let (status, _) = call(&conn, "POST", &format!("/v1/video/streams/{id}/pause"), GOLD, json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let end = loop {
        match feed.next().await {
            Some((kind, data)) if kind == "end" => break data,
            Some(_) => {}
            None => panic!("the feed ended without an end event"),
        }
    };
    assert_eq!(end["reason"], "paused_too_long", "{end}");
}

#[tokio::test]
async fn a_create_cut_short_by_the_client_still_leaves_a_driven_stream() {
    // Engine calls take 30 ms, so the clients below go away mid-create. A
    // new stream's first chunk may wait out its initial slack budget (by
    // default 4 coalesced chunk times, seconds with 12 streams on one
    // engine) behind streams with less: a budget of one chunk time makes
    // "no first chunk" mean "no driver" within seconds.
    let policy = default_policy().replace("initial_slack_factor = 4.0", "initial_slack_factor = 1.0");
    let sys = System::start_with_policy(&paced(30, 0), 1, &[], Some(&policy)).await;
    let conn = sys.conn(Proto::H2).await;
    for i in 0..12 {
        let c = conn.clone();
        let req = tokio::spawn(async move {
            c.post_json("/v1/video/streams", Some(GOLD), json!({"prompt": format!("cut {i}")}).to_string())
                .await
        });
        tokio::time::sleep(Duration::from_millis(5 + i * 3)).await;
        req.abort(); // RST_STREAM: the gateway's handler is dropped wherever it is
    }
    // Every stream the gateway registered has a driver: it makes chunks
    // (nobody reads them) and is never stuck at zero.
    let admin = sys.admin_conn().await;
    let token = sys.admin_token();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let body = body_bytes(admin.get("/admin/video/streams", Some(&token)).await.unwrap()).await.unwrap();
        let streams = json(&body)["streams"].as_array().unwrap().clone();
        let stuck: Vec<_> = streams.iter().filter(|s| s["status"] != "ended" && s["chunks"] == 0).collect();
        if stuck.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "streams with no driver: {stuck:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Starts a stream of `chunks` chunks on a 2-engine fleet whose sessions
/// carry `state_mib` of KV, moves it after its second chunk, and SIGKILLs
/// the `victim` ("target" or "source") as the move begins. Returns the
/// chunk indices delivered, the engines they came from, the first engine
/// and the end event.
async fn move_and_kill(victim: &str, chunks: u64) -> (Vec<u64>, Vec<String>, String, Value) {
    let sys = System::start_with(INSTANT, 2, &["--engine-arg=--video-state-mib=256"]).await;
    let conn = sys.conn(Proto::H2).await;
    let frames = chunks * 12;
    let (status, created, _) =
        create(&conn, GOLD, json!({"prompt": "gulls over a pier", "length_frames": frames})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let first = created["home_engine"].as_str().unwrap().to_string();
    let other = sys.other_engine(&first);
    let mut feed = Feed::open(&conn, &id, GOLD).await;
    let (mut indices, mut engines) = (Vec::new(), Vec::new());
    let end = feed
        .until_end(async |data, n| {
            indices.push(data["index"].as_u64().unwrap());
            engines.push(data["engine"].as_str().unwrap().to_string());
            if n == 2 {
                let admin = sys.admin_conn().await;
                let path = format!("/admin/video/streams/{id}/move?engine={other}");
                let (s, body) = call(&admin, "POST", &path, &sys.admin_token(), json!({})).await;
                assert_eq!(s, StatusCode::ACCEPTED, "{body}");
                tokio::time::sleep(Duration::from_millis(20)).await;
                sys.kill_engine(if victim == "target" { &other } else { &first });
            }
        })
        .await;
    (indices, engines, first, end)
}

#[tokio::test]
async fn a_move_whose_target_dies_mid_transfer_loses_and_repeats_no_chunk_and_never_bounces() {
    let (indices, engines, first, end) = move_and_kill("target", 8).await;
    assert_eq!(indices, (0..8).collect::<Vec<u64>>(), "gapless, no duplicate: {end}");
    assert_eq!(end["reason"], "completed", "{end}");
    // The move failed and the stream stayed on its source, or (when the
    // supervisor had already restarted the target before the move began)
    // it went through once: never back and forth, never a lost chunk.
    let moved = engines.iter().position(|e| *e != first).unwrap_or(engines.len());
    assert!(engines[moved..].iter().all(|e| *e != first), "one switch at most: {engines:?}");
    assert_eq!(end["rehomes"].as_u64().unwrap(), u64::from(moved < engines.len()), "{end}");
}

#[tokio::test]
async fn a_move_whose_source_dies_mid_transfer_loses_and_repeats_no_chunk() {
    let (indices, _engines, _first, end) = move_and_kill("source", 8).await;
    assert_eq!(indices, (0..8).collect::<Vec<u64>>(), "gapless, no duplicate: {end}");
    assert_eq!(end["reason"], "completed", "{end}");
    // It continued on the other engine or on the restarted source; either
    // way every chunk came once.
}

#[tokio::test]
async fn a_stalled_stream_borrows_a_donor_for_sp2_and_gives_it_back_once_recovered() {
    let sys = System::start(INSTANT, 2).await;
    let conn = sys.conn(Proto::H2).await;
    let (status, created, _) =
        create(&conn, GOLD, json!({"prompt": "rain on a tin roof", "length_frames": 12 * 24})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let home = created["home_engine"].as_str().unwrap().to_string();
    let pid = sys.engines.iter().find(|e| e.id == home).unwrap().pid;
    let mut feed = Feed::open(&conn, &id, GOLD).await;
    let mut sp = Vec::new();
    let end = feed
        .until_end(async |data, n| {
            sp.push(data["sp"].as_u64().unwrap());
            if n == 2 {
                // The home engine freezes for 4 s: the stream's slack runs
                // out and its credit goes negative.
                signal(pid, "STOP");
                tokio::time::sleep(Duration::from_secs(4)).await;
                signal(pid, "CONT");
            }
        })
        .await;
    assert_eq!(end["reason"], "completed", "{end}");
    assert!(end["sp_borrows"].as_u64().unwrap() >= 1, "{end}");
    let first = sp.iter().position(|&d| d == 2).expect("some chunks ran at SP2");
    let released = sp[first..].iter().position(|&d| d == 1).expect("the donor was given back");
    assert!(sp[first + released..].iter().filter(|&&d| d == 1).count() >= 3, "{sp:?}");
}

/// Creating a stream goes through the tenant's limits like a completion:
/// a live stream holds one of the tenant's `max_concurrency` until it ends,
/// and a create past the limit is the same 429 with admission headers.
#[tokio::test]
async fn a_live_stream_holds_one_of_its_tenants_concurrency() {
    let p = default_policy();
    let i = p.find("[tiers.gold]").unwrap();
    let j = i + p[i..].find("max_concurrency = 256").unwrap();
    let policy = format!("{}max_concurrency = 1{}", &p[..j], &p[j + "max_concurrency = 256".len()..]);
    let sys = System::start_with_policy(INSTANT, 1, &[], Some(&policy)).await;
    let conn = sys.conn(Proto::H2).await;
    let body = json!({"prompt": "a fox in the snow"});
    let (status, first, _) = create(&conn, GOLD, body.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    // The tenant's one place is the live stream: another stream and a
    // completion are both refused, typed, with the admission headers.
    let resp = conn.post_json("/v1/video/streams", Some(GOLD), body.to_string()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&resp, "x-admission"), "rejected");
    assert_eq!(header(&resp, "x-admission-reason"), "tenant_concurrency");
    assert_eq!(json(&body_bytes(resp).await.unwrap())["error"]["code"], "tenant_concurrency");
    let resp = conn.post_json("/v1/completions", Some(GOLD), completion("hi", 5, false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    // Ending the stream gives the place back.
    let id = first["id"].as_str().unwrap();
    let (status, _) = call(&conn, "DELETE", &format!("/v1/video/streams/{id}"), GOLD, json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let mut freed = false;
    for _ in 0..50 {
        let resp = conn.post_json("/v1/completions", Some(GOLD), completion("hi", 5, false)).await.unwrap();
        if resp.status() == StatusCode::OK {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(freed, "an ended stream releases its tenant's hold");
}

/// The shipped policy with TurboServe's video autoscaling on: 1 to 3
/// engines, one volatility level at ρ̂ = 1, 1-s scale-in dwell and sustain, a
/// half-second control tick (a shortened clock for the suite).
fn video_autoscale_policy() -> String {
    let p = default_policy();
    let levels = p.find("[[video.fleet.levels]]").unwrap();
    let after = levels + p[levels..].find("\n# Brownout").unwrap();
    let head = p[..levels]
        .replace("\nautoscale = false ", "\nmin_engines = 1\nmax_engines = 3\nautoscale = true ")
        .replace("down_cooldown_s = 30.0\n", "down_cooldown_s = 1.0\n")
        .replace("down_sustain_s = 10.0 ", "down_sustain_s = 1.0 ")
        .replace("control_tick_s = 3.0 ", "control_tick_s = 0.5 ")
        .replace("elastic_sp = true ", "elastic_sp = false ");
    assert!(head.contains("max_engines = 3") && head.contains("control_tick_s = 0.5"));
    assert!(head.contains("down_sustain_s = 1.0 "));
    let row = "[[video.fleet.levels]]\nabove = 0\ntarget_utilization = 1.0\nlambda = 0.2\n";
    format!("{head}{row}{}", &p[after..])
}

async fn admin_get(sys: &System, path: &str) -> Value {
    let (status, v) = admin_json(sys, "GET", path, None).await;
    assert_eq!(status, StatusCode::OK);
    v
}

#[tokio::test]
async fn the_video_autoscaler_starts_engines_for_streams_and_drains_one_by_moving_its_stream_off() {
    // K = 2 streams per engine at the best fidelity (300 ms alone, 600 ms
    // for two, within the 750-ms chunk); a 100-ms fast point keeps four
    // streams admissible on one engine.
    let profile = "model = \"synthetic-video\"\nengine_class = \"test-video\"\nlatent_frames = 3\nbatch_cost = 1.0\n\
        [[configs]]\nsteps = 1\nsparsity = 0.0\nwindow = 1\nprecision = \"fp16\"\nchunk_ms = 100.0\nquality = 0.9\n\
        [[configs]]\nsteps = 4\nsparsity = 0.0\nwindow = 7\nprecision = \"fp16\"\nchunk_ms = 300.0\nquality = 1.0\n";
    let dir = std::env::temp_dir().join(format!("video-autoscale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("video.toml");
    std::fs::write(&path, profile).unwrap();
    let arg = format!("--engine-arg=--video-profile={}", path.display());
    let sys = System::start_with_policy(INSTANT, 1, &[&arg], Some(&video_autoscale_policy())).await;
    let conn = sys.conn(Proto::H2).await;
    // Four streams on one engine: ρ_max = 4 / 2, over ρ̂ + δ.
    let mut ids = Vec::new();
    let mut feeds = Vec::new();
    for i in 0..4 {
        let body = json!({"prompt": format!("a kite over dunes {i}"), "length_frames": 12 * 24});
        let (status, created, _) = create(&conn, GOLD, body).await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        let id = created["id"].as_str().unwrap().to_string();
        feeds.push(tokio::spawn({
            let conn = sys.conn(Proto::H2).await;
            let id = id.clone();
            async move {
                let mut feed = Feed::open(&conn, &id, GOLD).await;
                let mut indices = Vec::new();
                loop {
                    match feed.next().await.expect("the feed ends with an end event") {
                        (kind, data) if kind == "chunk" => indices.push(data["index"].as_u64().unwrap()),
                        (kind, data) if kind == "end" => break (indices, data),
                        _ => {}
                    }
                }
            }
        }));
        ids.push(id);
    }
    let v = fleet_until(&sys, Duration::from_secs(20), "scale-out to two serving engines", |v| {
        v["supervisor"]["engines"]["serving"] == 2
    })
    .await;
    let whys: Vec<&str> =
        v["decisions"].as_array().unwrap().iter().filter_map(|d| d["why"].as_str()).collect();
    assert!(whys.contains(&"video_utilization"), "{v:#}");
    // The placement spreads the streams over both engines (min-max).
    let homes = async || {
        let s = admin_get(&sys, "/admin/video/streams").await;
        let mut by_engine: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for st in s["streams"].as_array().unwrap() {
            if st["status"] != "ended" {
                by_engine
                    .entry(st["home_engine"].to_string())
                    .or_default()
                    .push(st["id"].as_str().unwrap().into());
            }
        }
        by_engine
    };
    let t = std::time::Instant::now();
    let spread = loop {
        let h = homes().await;
        if h.len() == 2 && h.values().all(|v| v.len() == 2) {
            break h;
        }
        assert!(t.elapsed() < Duration::from_secs(15), "streams not spread: {h:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // One stream ends on each engine: ρ_max = 1/2 and one engine can hold
    // both (Equation 5 prefers one): scale-in drains an engine that still
    // holds a live stream, which moves before the engine stops.
    let mut kept = Vec::new();
    for on in spread.values() {
        let (status, _) =
            call(&conn, "DELETE", &format!("/v1/video/streams/{}", on[0]), GOLD, json!({})).await;
        assert_eq!(status, StatusCode::OK);
        kept.push(on[1].clone());
    }
    let v = fleet_until(&sys, Duration::from_secs(30), "scale-in to one serving engine", |v| {
        v["supervisor"]["engines"]["serving"] == 1 && v["supervisor"]["engines"]["draining"] == 0
    })
    .await;
    let whys: Vec<&str> =
        v["decisions"].as_array().unwrap().iter().filter_map(|d| d["why"].as_str()).collect();
    assert!(whys.contains(&"video_quiet"), "{v:#}");
    // Both kept streams play to their end, gapless, one of them moved.
    let mut moved = 0;
    for (id, feed) in ids.iter().zip(feeds) {
        let (indices, end) = feed.await.unwrap();
        if kept.contains(id) {
            assert_eq!(end["reason"], "completed", "{id}: {end}");
            assert_eq!(indices, (0..24).collect::<Vec<u64>>(), "{id}: gapless, no duplicate");
            moved += end["rehomes"].as_u64().unwrap();
        } else {
            assert_eq!(end["reason"], "deleted", "{id}: {end}");
        }
    }
    assert!(moved >= 1, "the drained engine's stream moved off it");
    let v = admin_get(&sys, "/admin/fleet").await;
    assert_eq!(v["supervisor"]["engines"]["serving"], 1, "{v:#}");
    let _ = std::fs::remove_dir_all(dir);
}
