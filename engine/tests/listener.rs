//! The engine's listener against abusive HTTP/2 peers holding the engine
//! token (`connguard`): a rapid-reset peer is closed, a gateway's own
//! cancel storm is not. The engine runs as a real process.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use loadtest::client::body_bytes;

mod common;
use common::process::{generate, rand_suffix, start_with, Engine, FAST, SLOW};

const TOKEN: &str = "engine-test-token";

/// An engine on `profile` requiring [`TOKEN`], and a raw HTTP/2
/// connection to it.
async fn start_with_token(profile: &str) -> (Engine, h2::client::SendRequest<bytes::Bytes>) {
    let token = std::env::temp_dir().join(format!("engine-token-{}-{}", std::process::id(), rand_suffix()));
    std::fs::write(&token, TOKEN).unwrap();
    let e = start_with(profile, &["--api-token-file", token.to_str().unwrap()]).await;
    let send = h2_conn(&e).await;
    (e, send)
}

async fn h2_conn(e: &Engine) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = tokio::net::TcpStream::connect(e.url.trim_start_matches("http://")).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    send
}

fn generate_request(e: &Engine) -> http::Request<()> {
    http::Request::post(format!("{}/engine/v1/generate", e.url))
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(())
        .unwrap()
}

/// The engine's `/metrics` text, with the token.
async fn engine_metrics(e: &Engine) -> String {
    let r = e.conn.get("/metrics", Some(TOKEN)).await.unwrap();
    String::from_utf8(body_bytes(r).await.unwrap().to_vec()).unwrap()
}

/// A peer holding the engine token that opens generate streams and resets
/// each right after its body, as fast as the connection takes them (the
/// rapid-reset shape of CVE-2023-44487), is closed, and only that
/// connection: a gateway's connection beside it keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rapid_reset_peer_with_the_token_is_closed_and_no_one_else() {
    let (e, mut send) = start_with_token(FAST).await;
    let honest = h2_conn(&e).await;
    let body = bytes::Bytes::from(generate(8, 4));
    let started = std::time::Instant::now();
    let (mut sent, mut closed) = (0u64, false);
    while started.elapsed() < Duration::from_secs(10) {
        let Ok(Ok(mut ready)) = tokio::time::timeout(Duration::from_secs(2), send.ready()).await else {
            closed = true;
            break;
        };
        let Ok((_resp, mut tx)) = ready.send_request(generate_request(&e), false) else {
            closed = true;
            break;
        };
        if tx.send_data(body.clone(), true).is_err() {
            closed = true;
            break;
        }
        tx.send_reset(h2::Reason::CANCEL);
        sent += 1;
        send = ready;
        if sent % 64 == 0 {
            tokio::task::yield_now().await;
        }
    }
    assert!(closed, "the attacking connection was closed ({sent} streams written in 10 s)");
    // Closed by the watch (rapid_reset, stream_rate) or by hyper's own
    // bound on streams reset before it accepted them (h2_calm), counted
    // once; the count lands just after the client sees the close.
    let closed_by = |m: &str| -> f64 {
        m.lines()
            .filter(|l| l.starts_with("engine_connections_closed_total{"))
            .filter(|l| {
                ["rapid_reset", "stream_rate", "h2_calm"].iter().any(|w| l.contains(&format!("why=\"{w}\"")))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let mut m = engine_metrics(&e).await;
    for _ in 0..40 {
        if closed_by(&m) > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        m = engine_metrics(&e).await;
    }
    assert_eq!(closed_by(&m), 1.0, "{m}");
    // What the attack got to the scheduler: streams reset in the same
    // write as their request are dropped before it; of the rest, those
    // that end fill the watch's window (100) and trip it, but streams
    // still running when it trips were scheduled too, more of them the
    // slower the machine (178 under CI's load, 0-2 on a quiet one).
    let scheduled = m
        .lines()
        .find(|l| l.starts_with("engine_generate_requests_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(scheduled <= 400.0, "{scheduled} attack streams reached the scheduler of {sent} written");
    // The honest connection still generates.
    let mut ready = honest.ready().await.unwrap();
    let (resp, mut tx) = ready.send_request(generate_request(&e), false).unwrap();
    tx.send_data(body, true).unwrap();
    assert_eq!(resp.await.unwrap().status(), 200);
    eprintln!(
        "rapid reset on the engine listener: closed after {sent} streams written, {scheduled} scheduled"
    );
}

/// A gateway relaying a cancel storm (every stream reset after its answer
/// began, hundreds at once) is not taken for an attacker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateways_cancel_storm_does_not_close_its_connection() {
    // A slow decode: the answers under way send few frames nobody reads.
    let (e, send) = start_with_token(SLOW).await;
    let body = bytes::Bytes::from(generate(8, 10_000));
    let mut streams = Vec::new();
    for _ in 0..300 {
        let mut ready = send.clone().ready().await.unwrap();
        let (resp, mut tx) = ready.send_request(generate_request(&e), false).unwrap();
        tx.send_data(body.clone(), true).unwrap();
        streams.push((resp, tx));
    }
    let mut answers = Vec::new();
    for (resp, tx) in streams {
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), 200);
        answers.push((resp, tx));
    }
    for (_, mut tx) in answers {
        tx.send_reset(h2::Reason::CANCEL);
    }
    // The same connection takes the next request.
    let mut ready = send.clone().ready().await.unwrap();
    let (resp, mut tx) = ready.send_request(generate_request(&e), false).unwrap();
    tx.send_data(bytes::Bytes::from(generate(8, 2)), true).unwrap();
    assert_eq!(resp.await.unwrap().status(), 200);
    let m = engine_metrics(&e).await;
    assert!(!m.contains("engine_connections_closed_total"), "{m}");
}
