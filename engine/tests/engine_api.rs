//! The engine binary's internal API, run as a real process: KV admission
//! and its typed refusals, cancellation, drain.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

use std::process::Stdio;
use std::time::Duration;

use loadtest::client::{body_bytes, Conn, Proto};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

struct Engine {
    child: Child,
    conn: Conn,
    /// `http://host:port`
    url: String,
    _dir: std::path::PathBuf,
}

/// Starts `engine` with a slow decode (so sequences stay resident) and `args`.
async fn start(args: &[&str]) -> Engine {
    let dir = std::env::temp_dir().join(format!("engine-test-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = dir.join("p.toml");
    std::fs::write(&profile, "model = \"m\"\nengine_class = \"t\"\n[prefill]\npoints = [[0, 0.0]]\n[decode]\nbatch_points = [[1, 200.0]]\n").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(["--listen", "127.0.0.1:0", "--id", "t0", "--exit-on-stdin-eof", "--profile"])
        .arg(&profile)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let line = BufReader::new(child.stdout.take().unwrap()).lines().next_line().await.unwrap().unwrap();
    let addr = line.split_whitespace().find_map(|w| w.strip_prefix("listen=")).unwrap().to_string();
    let url = format!("http://{addr}");
    let conn = Conn::connect(&url, None, Proto::H2).await.unwrap();
    Engine { child, conn, url, _dir: dir }
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

/// A request of `prompt_words` tokens whose prompt shares no prefix with
/// any other this process sends (the prefix cache stays out of the counts).
fn generate(prompt_words: usize, max_tokens: u32) -> String {
    static CALLS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    let tag = (b'a' + CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 26) as char;
    let prompt: String = (0..prompt_words).map(|i| format!("{tag}{i:03x} ")).collect();
    serde_json::json!({"request_id": "r", "model": "m", "prompt": prompt, "max_tokens": max_tokens})
        .to_string()
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
