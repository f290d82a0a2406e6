//! Bounds under hostile or broken peers, against a real `gateway up` with
//! real engine processes: clients that never read, engines that hang,
//! cancellation storms, connection caps, idle and slow (slowloris)
//! connections, bodies that never finish. Small numbers and short
//! timeouts here; the big figures are in the reliability suite
//! (docs/reliability.md).
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::StatusCode;
use http_body_util::BodyExt;
use loadtest::client::{body_bytes, Proto};
use loadtest::sse::SseParser;
use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A gateway config file with these `[limits]` lines, in the system's dir.
fn limits_config(dir: &Path, lines: &str) -> String {
    let path = dir.join(format!("limits-{}.toml", std::process::id()));
    std::fs::write(&path, format!("[limits]\n{lines}\n")).unwrap();
    path.display().to_string()
}

async fn start(profile: &str, engines: usize, limits: &str, policy: Option<&str>) -> System {
    let dir = std::env::temp_dir().join(format!("limits-cfg-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = limits_config(&dir, limits);
    System::start_with_policy(profile, engines, &["--config", &config], policy).await
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

/// A TLS connection to the gateway that offers ALPN `alpn`.
async fn tls(sys: &System, alpn: &[u8]) -> TlsStream<TcpStream> {
    tls_at(&sys.ca, &sys.base, alpn).await
}

/// [`tls`] to the gateway at `base` whose CA is `ca`.
async fn tls_at(ca: &std::path::Path, base: &str, alpn: &[u8]) -> TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    let port = base.rsplit(':').next().unwrap();
    let tcp = TcpStream::connect(format!("127.0.0.1:{port}")).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(cfg)).connect(name, tcp).await.unwrap()
}

/// An HTTP/2 connection whose stream windows are zero: the gateway may send
/// headers but not one byte of any body, as a client that never reads.
async fn never_reading_h2(sys: &System) -> h2::client::SendRequest<Bytes> {
    let io = tls(sys, b"h2").await;
    let (send, conn) = h2::client::Builder::new().initial_window_size(0).handshake(io).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send
}

fn h2_request(sys: &System, path: &str, key: &str) -> http::Request<()> {
    http::Request::post(format!("{}{path}", sys.base))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(())
        .unwrap()
}

/// Sends a streaming chat completion on a raw h2 connection; returns the
/// response head (its body is never read).
async fn open_unread_stream(
    send: &mut h2::client::SendRequest<Bytes>,
    sys: &System,
    key: &str,
    body: &str,
) -> (http::Response<h2::RecvStream>, h2::SendStream<Bytes>) {
    let mut send = send.clone().ready().await.unwrap();
    let (resp, mut tx) = send.send_request(h2_request(sys, "/v1/chat/completions", key), false).unwrap();
    tx.send_data(Bytes::from(body.to_string()), true).unwrap();
    (resp.await.unwrap(), tx)
}

async fn gateway_active(sys: &System) -> u64 {
    let r = sys.readyz().await;
    r["detail"]["engines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["gateway_active_sequences"].as_u64().unwrap())
        .sum()
}

#[tokio::test]
async fn streams_nobody_reads_release_their_holds_when_the_engine_finishes_and_are_reset_after_the_stall() {
    let bronze_at = |p: String| {
        let at = p.find("[tiers.bronze]").unwrap();
        let (head, tail) = p.split_at(at);
        format!("{head}{}", tail.replacen("max_concurrency = 256", "max_concurrency = 8", 1))
    };
    let policy = bronze_at(default_policy());
    let sys = start(&paced(0, 5), 2, "write_stall_timeout_ms = 1500", Some(&policy)).await;
    // Bronze fills its whole concurrency with streams it never reads, over
    // two connections.
    let mut conns = [never_reading_h2(&sys).await, never_reading_h2(&sys).await];
    let mut held = Vec::new();
    for i in 0..8 {
        let (resp, tx) =
            open_unread_stream(&mut conns[i % 2], &sys, BRONZE, &chat_body("stall", 40, true)).await;
        assert_eq!(resp.status(), StatusCode::OK);
        held.push((resp, tx));
    }
    // The engines finish (40 tokens at 5 ms): the gateway lets go of every
    // engine slot, ticket and tenant lease, though no byte was read.
    let t = Instant::now();
    while gateway_active(&sys).await > 0 {
        assert!(t.elapsed() < Duration::from_secs(3), "engine slots still held after the engines finished");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // So bronze itself may start another request, and gold is served.
    let conn = sys.conn(Proto::H2).await;
    let resp =
        conn.post_json("/v1/chat/completions", Some(BRONZE), chat_body("again", 4, false)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "bronze's lease was released with the engine");
    for _ in 0..10 {
        let t = Instant::now();
        let resp =
            conn.post_json("/v1/chat/completions", Some(GOLD), chat_body("hi", 8, true)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let events = sse_events(resp).await;
        assert_eq!(events.last().unwrap().data, "[DONE]");
        assert!(t.elapsed() < Duration::from_millis(500), "gold served in {:?}", t.elapsed());
    }
    // Past the stall timeout the unread streams are reset.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let metrics = sys.metrics().await;
    let resets = metric(&metrics, "gateway_stream_resets_total{why=\"write_stall\"}").unwrap_or(0.0);
    assert_eq!(resets, 8.0, "every unread stream reset after the stall");
}

#[tokio::test]
async fn a_stalled_reader_of_a_long_stream_is_reset_and_the_engine_work_cancelled() {
    // 250 tokens at 20 ms (~35 KB of SSE): far more than the 4 KiB buffer.
    let sys =
        start(&paced(0, 20), 1, "write_stall_timeout_ms = 1000\nstream_buffer_bytes = 4096", None).await;
    let mut send = never_reading_h2(&sys).await;
    let (resp, _tx) =
        open_unread_stream(&mut send, &sys, GOLD, &chat_body(&long_prompt(250), 250, true)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let engine = resp.headers()["x-engine"].to_str().unwrap().to_string();
    let t = Instant::now();
    loop {
        let load = sys.engine_load(&engine).await;
        if load.inflight_sequences == 0 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(3), "the engine still runs the stalled stream");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Cancelled, not finished: 250 tokens take 5 s.
    assert!(t.elapsed() < Duration::from_millis(3000));
    assert_eq!(gateway_active(&sys).await, 0);
}

#[tokio::test]
async fn a_hung_engine_has_its_streams_continued_elsewhere_and_new_requests_go_elsewhere() {
    let sys = start(
        &paced(0, 20),
        2,
        "engine_keepalive_interval_ms = 300\nengine_keepalive_timeout_ms = 700\nengine_event_timeout_ms = 2000",
        None,
    )
    .await;
    let conn = sys.conn(Proto::H2).await;
    let mut resp = conn
        .post_json("/v1/chat/completions", Some(GOLD), chat_body(&long_prompt(250), 100, true))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let victim = header(&resp, "x-engine").to_string();
    let pid = sys.engines.iter().find(|e| e.id == victim).unwrap().pid;
    let _ = resp.body_mut().frame().await.unwrap().unwrap();
    signal(pid, "STOP");
    let stopped = Instant::now();
    let rest = tokio::time::timeout(Duration::from_secs(10), async {
        let mut body = Vec::new();
        while let Some(Ok(f)) = resp.body_mut().frame().await {
            body.extend_from_slice(&f.into_data().unwrap_or_default());
        }
        body
    })
    .await
    .expect("the stream ends within 10 s");
    let took = stopped.elapsed();
    // The keepalive found the engine hung (within ~1 s) and the rest of the
    // 100 tokens (20 ms each) came from the other engine: one stream, no
    // error, [DONE].
    let events = SseParser::new().push(&rest);
    let text = String::from_utf8_lossy(&rest);
    assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"), "{text}");
    assert!(!text.contains("\"error\""), "{text}");
    assert!(took < Duration::from_secs(5), "the stream ended {took:?} after the engine hung");
    let m = sys.metrics().await;
    assert_eq!(metric(&m, "gateway_stream_resumes_total{outcome=\"resumed\"}"), Some(1.0), "{m}");
    // Requests sent after the engine stopped are all served, by the other.
    for _ in 0..6 {
        let r =
            conn.post_json("/v1/chat/completions", Some(GOLD), chat_body("hello", 4, false)).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_ne!(header(&r, "x-engine"), victim);
    }
    signal(pid, "CONT");
}

#[tokio::test]
async fn a_cancellation_storm_fails_no_other_stream() {
    // Admission off: this is about the transport, not about who is admitted.
    let policy = default_policy().replace("mode = \"slo\"", "mode = \"off\"");
    let sys = start(&paced(0, 10), 1, "", Some(&policy)).await;
    let conn = sys.conn(Proto::H2).await;
    let mut streams = Vec::new();
    for i in 0..150 {
        let c = conn.clone();
        let n = if i % 3 == 0 { 40 } else { 250 };
        streams.push(tokio::spawn(async move {
            let body = chat_body(&long_prompt(n), n, true);
            (i % 3 == 0, c.post_json("/v1/chat/completions", Some(GOLD), body).await.unwrap())
        }));
    }
    let mut keep = Vec::new();
    let mut cancel = Vec::new();
    for s in streams {
        let (kept, mut resp) = s.await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let _ = resp.body_mut().frame().await.unwrap().unwrap();
        if kept {
            keep.push(resp);
        } else {
            cancel.push(resp);
        }
    }
    drop(cancel); // 100 RST_STREAMs at once, all forwarded to the engine
    for resp in keep {
        let body = tokio::time::timeout(Duration::from_secs(20), body_bytes(resp)).await.unwrap().unwrap();
        let events = SseParser::new().push(&body);
        assert_eq!(events.last().unwrap().data, "[DONE]", "a kept stream finished");
    }
    // The engine connection survived: new requests are served.
    let r = conn.post_json("/v1/chat/completions", Some(GOLD), chat_body("after", 4, false)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let t = Instant::now();
    while gateway_active(&sys).await > 0 {
        assert!(t.elapsed() < Duration::from_secs(2), "cancelled streams still counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn connections_past_the_cap_are_closed_and_idle_ones_time_out() {
    let sys = start(INSTANT, 1, "max_connections = 3\nidle_timeout_ms = 800", None).await;
    let a = sys.conn(Proto::H2).await;
    let b = sys.conn(Proto::H2).await;
    let c = sys.conn(Proto::H2).await;
    // The fourth is closed before its handshake completes.
    let refused = loadtest::client::Conn::connect(&sys.base, Some(&sys.ca), Proto::H2).await;
    assert!(refused.is_err(), "a fourth connection past max_connections = 3");
    assert_eq!(a.get("/healthz", None).await.unwrap().status(), StatusCode::OK, "the first three are served");
    // Idle connections are shut down; then there is room again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(a.is_closed() && b.is_closed() && c.is_closed(), "idle connections closed");
    let d = sys.conn(Proto::H2).await;
    assert_eq!(d.get("/healthz", None).await.unwrap().status(), StatusCode::OK);
    let metrics = sys.metrics().await;
    assert!(metric(&metrics, "gateway_connections_refused_total{listener=\"public\"}").unwrap() >= 1.0);
}

#[tokio::test]
async fn slowloris_connections_and_bodies_are_bounded_in_time() {
    let sys = start(INSTANT, 1, "header_read_timeout_ms = 500\nbody_read_timeout_ms = 700", None).await;
    // A TCP connection that never starts TLS is closed.
    let port = sys.base.rsplit(':').next().unwrap();
    let mut tcp = TcpStream::connect(format!("127.0.0.1:{port}")).await.unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(3), tcp.read(&mut buf)).await.unwrap().unwrap_or(0);
    assert_eq!(n, 0, "closed");
    assert!(t.elapsed() >= Duration::from_millis(400) && t.elapsed() < Duration::from_secs(2));
    // An HTTP/1.1 request head sent a byte at a time never completes.
    let mut io = tls(&sys, b"http/1.1").await;
    io.write_all(b"POST /v1/chat/completions HTTP/1.1\r\n").await.unwrap();
    let t = Instant::now();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            if io.write_all(b"x").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut b = [0u8; 256];
            match tokio::time::timeout(Duration::from_millis(1), io.read(&mut b)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => out.extend_from_slice(&b[..n]),
                Err(_) => {}
            }
        }
    })
    .await;
    assert!(read.is_ok(), "a trickled request head is cut off");
    assert!(t.elapsed() < Duration::from_secs(2));
    // A body that never finishes gets a typed 408.
    let mut send = never_reading_h2(&sys).await.ready().await.unwrap();
    let (resp, mut tx) = send.send_request(h2_request(&sys, "/v1/chat/completions", GOLD), false).unwrap();
    tx.send_data(Bytes::from_static(b"{\"model\":"), false).unwrap();
    let t = Instant::now();
    let resp = tokio::time::timeout(Duration::from_secs(3), resp).await.unwrap().unwrap();
    assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
    assert!(t.elapsed() >= Duration::from_millis(600));
    drop(tx);
}

#[tokio::test]
async fn a_standalone_gateway_without_its_policy_file_does_not_fall_back_to_the_demo_keys() {
    let dir = std::env::temp_dir().join(format!("no-policy-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("gateway.toml"),
        "listen = \"127.0.0.1:0\"\n[[engines]]\nid = \"e0\"\nurl = \"http://127.0.0.1:9\"\n",
    )
    .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["serve", "--config", "gateway.toml"])
        .current_dir(&dir) // no policies/default.toml here
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("reading policies policies/default.toml"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_video_feed_nobody_reads_stops_generating_and_ends() {
    let sys = start(INSTANT, 1, "video_feed_buffer_bytes = 4096\nwrite_stall_timeout_ms = 1500", None).await;
    let conn = sys.conn(Proto::H2).await;
    let resp =
        conn.post_json("/v1/video/streams", Some(GOLD), r#"{"prompt":"a fox in the snow"}"#).await.unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let id = json(&body_bytes(resp).await.unwrap())["id"].as_str().unwrap().to_string();
    // The feed is opened on a connection that never reads.
    let mut send = never_reading_h2(&sys).await.ready().await.unwrap();
    let req = http::Request::get(format!("{}/v1/video/streams/{id}/events", sys.base))
        .header("authorization", format!("Bearer {GOLD}"))
        .body(())
        .unwrap();
    let (resp, _) = send.send_request(req, true).unwrap();
    let held = resp.await.unwrap(); // kept open, never read
    assert_eq!(held.status(), StatusCode::OK);
    let status = |conn: loadtest::client::Conn, id: String| async move {
        json(
            &body_bytes(conn.get(&format!("/v1/video/streams/{id}"), Some(GOLD)).await.unwrap())
                .await
                .unwrap(),
        )
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    let s = status(conn.clone(), id.clone()).await;
    // One chunk fills the 4 KiB feed; with an unread feed the driver asks
    // for nothing more (max_buffer_s alone would allow 8 chunks).
    assert!(s["chunks"].as_u64().unwrap() <= 2, "{s}");
    let t = Instant::now();
    loop {
        let s = status(conn.clone(), id.clone()).await;
        if s["status"] == "ended" {
            assert_eq!(s["end_reason"], "reader_stalled", "{s}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "the stream never ended: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Opens streams on a raw HTTP/2 connection with a bronze key and resets
/// each one (CANCEL) right after its body, as fast as the connection takes
/// them (the rapid-reset shape of CVE-2023-44487), for at most `within`.
/// Returns how many it sent and whether the gateway closed the connection.
async fn rapid_reset(
    mut send: h2::client::SendRequest<Bytes>,
    base: String,
    within: Duration,
) -> (u64, bool) {
    let body = Bytes::from(chat_body("reset me", 16, true));
    let started = Instant::now();
    let mut sent = 0u64;
    loop {
        if started.elapsed() > within {
            return (sent, false);
        }
        let Ok(ready) = tokio::time::timeout(Duration::from_secs(2), send.ready()).await else {
            return (sent, false);
        };
        let Ok(mut ready) = ready else { return (sent, true) };
        let req = http::Request::post(format!("{base}/v1/chat/completions"))
            .header("authorization", format!("Bearer {BRONZE}"))
            .header("content-type", "application/json")
            .body(())
            .unwrap();
        let Ok((_resp, mut tx)) = ready.send_request(req, false) else { return (sent, true) };
        if tx.send_data(body.clone(), true).is_err() {
            return (sent, true);
        }
        tx.send_reset(h2::Reason::CANCEL);
        sent += 1;
        send = ready;
        if sent % 64 == 0 {
            tokio::task::yield_now().await;
        }
    }
}

/// Puts the calling thread at nice 19 (Linux's nice is per thread):
/// the attacking client stands in for another machine, whose CPU is not
/// the gateway's. What the gateway spends on the attack (every frame it
/// reads, every handshake) is still on the gateway's cores.
fn lowest_cpu_priority() {
    let Ok(me) = std::fs::read_link("/proc/thread-self") else { return };
    let Some(tid) = me.file_name().and_then(|t| t.to_str()).map(str::to_string) else { return };
    let niced = std::process::Command::new("renice")
        .args(["-n", "19", "-p", &tid])
        .stdout(std::process::Stdio::null())
        .status();
    if !niced.is_ok_and(|s| s.success()) {
        eprintln!("renice failed: the attacking client runs at the gateway's priority");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_connections_are_closed_within_a_bounded_number_of_streams() {
    let sys = System::start(&paced(5, 2), 2).await;
    let honest = sys.conn(Proto::H2).await;
    let p99 = async |n: usize| {
        let mut ms = Vec::new();
        for _ in 0..n {
            let t = Instant::now();
            let r = honest
                .post_json("/v1/chat/completions", Some(GOLD), chat_body("hi", 16, false))
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            body_bytes(r).await.unwrap();
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        ms.sort_by(f64::total_cmp);
        ms[(ms.len() * 99 / 100).min(ms.len() - 1)]
    };
    let unloaded = p99(30).await;
    // Four attacking connections beside the honest tenant, from a thread
    // and runtime of their own (an attacker is another machine: its write
    // loops must not queue behind the honest client's tasks, nor these
    // behind them).
    let (ca, base) = (sys.ca.clone(), sys.base.clone());
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let attack = std::thread::spawn(move || {
        lowest_cpu_priority();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let mut attackers = Vec::new();
            for _ in 0..4 {
                let (send, conn) = h2::client::handshake(tls_at(&ca, &base, b"h2").await).await.unwrap();
                tokio::spawn(conn);
                attackers.push(tokio::spawn(rapid_reset(send, base.clone(), Duration::from_secs(10))));
            }
            let _ = started_tx.send(());
            let mut results = Vec::new();
            for a in attackers {
                results.push(a.await.unwrap());
            }
            results
        })
    });
    started.await.unwrap();
    let under = p99(30).await;
    let results = tokio::task::spawn_blocking(move || attack.join().unwrap()).await.unwrap();
    for (_, closed) in &results {
        assert!(*closed, "the attacking connection was closed: {results:?}");
    }
    let m = sys.metrics().await;
    // What the gateway spent on them: admission decisions, all tenants (the
    // attackers' streams the client wrote after the close never arrive).
    let decisions: f64 = m
        .lines()
        .filter(|l| l.starts_with("gateway_admission_decisions_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    // The honest client's 60, and of the attackers' streams only those
    // whose reset came in a later read than their request (the handler
    // yields once before any work, and hyper drops a stream reset by
    // then): at most a window of 100 per connection, against the ~40,000
    // such a connection pushed through admission in 10 s before.
    assert!(decisions <= 60.0 + 4.0 * 100.0, "{decisions} admission decisions: {results:?}");
    // Ours closes those whose streams are reset after hyper accepted them
    // (rapid_reset, stream_rate); hyper's own bound on streams reset before
    // it accepted them (max_pending_accept_reset_streams) may close some or
    // all first (h2_calm). Each attacking connection counted once.
    let closed: f64 = ["rapid_reset", "stream_rate", "h2_calm"]
        .iter()
        .filter_map(|why| {
            metric(&m, &format!("gateway_connections_closed_total{{listener=\"public\",why=\"{why}\"}}"))
        })
        .sum();
    assert_eq!(closed, 4.0, "{m}");
    // Every honest request was answered (p99 asserts each came back 200),
    // and the attack costs the honest tenant little: its p99 (the slowest
    // of 30) beside the attack was 0.81-1.24x of unloaded in 20 quiet runs
    // (the target is 1.5x, docs/reliability.md), up to 4.5x before the
    // gateway read connections a slice a turn. Bounded at 2x here: the
    // slowest of 30 on two shared cores, other tests running beside it.
    assert!(
        under <= 2.0 * unloaded,
        "honest p99 {unloaded:.1} ms unloaded, {under:.1} ms beside the attack: {results:?}"
    );
    eprintln!(
        "rapid reset: streams written per attacking connection {results:?}, {decisions} admission decisions; \
         honest p99 {unloaded:.1} ms -> {under:.1} ms"
    );
}
