//! The gateway's connection to Redis itself: over TLS with a private CA
//! (and an untrusted certificate refused), a Redis that accepts and never
//! answers, and the stream sweep's bound on a large fleet. The fleet's
//! shared state across gateways: `cluster.rs`.
// Process-level code: it measures real time on purpose.
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use http::StatusCode;
use loadtest::client::Proto;

/// A Redis that speaks only TLS to its clients, its certificate from a
/// private CA (a managed Redis with in-transit encryption): a gateway given
/// `rediss://…?ca_file=` shares the fleet over TLS (its node mark, its
/// engine's registration and the tenant counters land in Redis); one given
/// the same URL without the CA refuses the certificate and serves on local
/// limits, Redis down, rather than trusting it, and logs why; one whose
/// system roots include the CA (`SSL_CERT_FILE`) needs no `ca_file`.
#[tokio::test]
async fn redis_over_tls_with_a_private_ca_is_shared_and_an_untrusted_certificate_is_refused() {
    let pki = gateway::certs::generate(&scratch_dir().join("redis-pki")).unwrap();
    let redis = Redis::start_tls(&scratch_dir(), &pki.server_cert, &pki.server_key).unwrap();
    let tls = redis.tls_url().unwrap();
    let trusted = format!("{tls}?ca_file={}", pki.ca_cert.display());
    let a = System::start_with_policy(&paced(0, 1), 1, &["--redis", &trusted], Some(&default_policy())).await;
    let r = wait_ready(&a, "A on Redis over TLS", |r| r["detail"]["cluster"]["redis_up"] == true).await;
    assert_eq!(r["detail"]["cluster"]["mode"], "redis");
    let conn = a.conn(Proto::H2).await;
    let resp =
        conn.send(request("/v1/chat/completions", GOLD, chat_body("hi", 2, false), &[])).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    within(Duration::from_secs(10), "A's engine registered over TLS", async || {
        redis.reply(&["SMEMBERS", "slo:engines"]).contains(a.engines[0].id.as_str())
    })
    .await;
    assert!(redis.reply(&["KEYS", "slo:gw:*"]).contains("slo:gw:"), "A's node mark is in Redis");
    // The same server, its CA not given: the system's roots do not know it.
    let b = System::start_with_policy(&paced(0, 1), 1, &["--redis", &tls], Some(&default_policy())).await;
    let conn = b.conn(Proto::H2).await;
    let resp =
        conn.send(request("/v1/chat/completions", GOLD, chat_body("hi", 2, false), &[])).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "served on local limits");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r = b.readyz().await;
    assert_eq!(r["detail"]["cluster"]["redis_up"], false, "an untrusted certificate is refused: {r}");
    assert!(b.metrics().await.contains("gateway_cluster_redis_up 0"));
    assert!(b.log().contains("redis_dial_failed"), "the cause is logged: {}", b.log());
    drop(b);
    // The system's roots are read from the usual places, SSL_CERT_FILE
    // included: a CA bundle installed there is trusted without ca_file.
    let ca = pki.ca_cert.display().to_string();
    let c = System::start_with_env(
        &paced(0, 1),
        1,
        &["--redis", &tls],
        Some(&default_policy()),
        &[("SSL_CERT_FILE", &ca)],
    )
    .await;
    wait_ready(&c, "C trusts the CA from SSL_CERT_FILE", |r| r["detail"]["cluster"]["redis_up"] == true)
        .await;
}

/// More stream records than one sweep may read (5,000 > `MAX_SWEEP`):
/// no sweep reads more than its bound and one SCAN batch, and every
/// stream is looked at within two sweeps (each goes on from where the
/// last stopped, so streams past the bound are not left unswept forever).
#[tokio::test]
async fn a_sweep_reads_a_bounded_number_of_stream_records_and_reaches_every_one_in_turn() {
    use gateway::cluster_testing::{ClusterConfig, RedisState, MAX_SWEEP, SWEEP_BATCH};
    const STREAMS: usize = 5000;
    let redis = start_redis();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut pipe = redis::pipe();
    for i in 0..STREAMS {
        pipe.hset(format!("slo:stream:s{i}"), "owner", "gw-dead").ignore();
    }
    pipe.query_async::<()>(&mut conn).await.unwrap();
    let target = fleet_redis::Target::parse(&redis.url()).unwrap();
    let state = RedisState::new(target, &ClusterConfig { timeout_ms: 500, ..ClusterConfig::default() });
    let mut seen = std::collections::HashSet::new();
    for pass in 0..2 {
        let owners = state.stream_owners().await.unwrap();
        assert!(
            !owners.is_empty() && owners.len() < MAX_SWEEP + 2 * SWEEP_BATCH,
            "pass {pass}: {}",
            owners.len()
        );
        assert!(owners.iter().all(|(_, o)| o == "gw-dead"));
        seen.extend(owners.into_iter().map(|(id, _)| id));
    }
    assert_eq!(seen.len(), STREAMS, "every stream swept within two passes");
}

/// A Redis that accepts connections and never answers (a hung server, or
/// a TLS port that never handshakes): requests are served on local limits
/// without waiting on it, and dials stay one at a time (a new connection
/// every redial at most, not one per request).
#[tokio::test]
async fn a_redis_that_never_answers_costs_requests_nothing_and_is_dialled_one_at_a_time() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    std::thread::spawn(move || {
        let mut held = Vec::new(); // open and silent until the test ends
        for s in listener.incoming().flatten() {
            counter.fetch_add(1, Ordering::Relaxed);
            held.push(s);
        }
    });
    let url = format!("redis://127.0.0.1:{port}");
    let sys = System::start_with_policy(INSTANT, 1, &["--redis", &url], Some(&default_policy())).await;
    let started = Instant::now();
    let mut load = Vec::new();
    for _ in 0..40 {
        let conn = sys.conn(Proto::H2).await;
        load.push(tokio::spawn(async move {
            let t = Instant::now();
            let r =
                conn.post_json("/v1/chat/completions", Some(GOLD), chat_body("hi", 2, false)).await.unwrap();
            (r.status(), t.elapsed())
        }));
    }
    for l in load {
        let (status, took) = l.await.unwrap();
        assert_eq!(status, StatusCode::OK, "served on local limits");
        assert!(took < Duration::from_secs(2), "a request waited {took:?} on a silent Redis");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let secs = started.elapsed().as_secs_f64();
    let dials = accepted.load(Ordering::Relaxed);
    // One dial in flight at a time, each bounded (0.5 s connect), at most
    // one a redial (0.5 s): some 2 a second, whatever the request rate.
    assert!(dials as f64 <= 4.0 + 3.0 * secs, "{dials} connections in {secs:.1} s");
    assert_eq!(sys.readyz().await["detail"]["cluster"]["redis_up"], false);
}
