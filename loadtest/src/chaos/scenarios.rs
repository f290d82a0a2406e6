//! The reliability scenarios (docs/reliability.md): each starts its own
//! system, injects one kind of fault or hostile load while protected
//! traffic runs, and measures what the protected traffic saw: requests
//! lost, errors by kind, recovery time, and the gateway's RSS.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;
use tokio::io::AsyncWriteExt;

use super::load::{self, chat, open_loop, Record, Tally};
use super::system::{rss_kib, signal, Gateway, Redis, Setup};
use crate::client::{Conn, Proto};

const MODEL: &str = "synthetic-small";
const GOLD: &str = "sk-demo-gold";
const BRONZE: &str = "sk-demo-bronze";
const DEFAULT_POLICY: &str = include_str!("../../../policies/default.toml");
const FCFS_POLICY: &str = include_str!("../../../policies/examples/fcfs-baseline.toml");
/// The bundled emulated engine profile (an 8B model on an A100).
const REAL_PROFILE: &str = include_str!("../../../policies/profiles/emulated-a100-8b.toml");

/// What one scenario measured.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub name: &'static str,
    /// What was done, with its numbers.
    pub what: String,
    /// The protected traffic.
    pub protected: Tally,
    /// Requests that ended without `[DONE]` and without a typed error
    /// (cut off, transport failure, timeout).
    pub lost: usize,
    pub recovery_s: Option<f64>,
    pub rss_idle_kib: u64,
    pub rss_peak_kib: u64,
    /// The scenario's own figures.
    pub extra: serde_json::Value,
    /// The target and whether it was met.
    pub target: String,
    pub met: bool,
}

fn lost(records: &[Record]) -> usize {
    records.iter().filter(|r| matches!(r.outcome.as_str(), "cut_off" | "transport" | "timeout")).count()
}

/// A profile with a fixed prefill and per-token decode time (ms), the same
/// at any batch size.
fn paced(prefill_ms: u32, decode_ms: u32) -> String {
    format!(
        "model = \"{MODEL}\"\nengine_class = \"chaos-paced\"\n[prefill]\npoints = [[0, {prefill_ms}.0]]\n\
         [decode]\nbatch_points = [[1, {decode_ms}.0]]\n"
    )
}

/// The FCFS baseline policy with every tenant limit lifted: scenarios that
/// measure the transport, not admission.
fn lifted_policy() -> String {
    FCFS_POLICY.replace("max_concurrency = 256\n", "")
}

/// Two engines with the bundled A100 8B profile and the shipped policy.
fn shipped(limits: &str, extra: Vec<String>) -> Setup<'_> {
    Setup { engines: 2, profile: REAL_PROFILE, policy: DEFAULT_POLICY, limits, extra }
}

/// Starts the system; returns it with its idle RSS and a peak watcher.
async fn up_measured(
    bin: &Path,
    scratch: &Path,
    setup: &Setup<'_>,
) -> Result<(Gateway, u64, RssPeak), String> {
    let gw = Gateway::up(bin, scratch, setup).await?;
    let (idle, rss) = (gw.rss_kib(), RssPeak::watch(gw.pid));
    Ok((gw, idle, rss))
}

/// Samples the gateway's RSS every 100 ms until dropped; `peak()` reads it.
struct RssPeak(Arc<std::sync::atomic::AtomicU64>, tokio::task::JoinHandle<()>);

impl RssPeak {
    fn watch(pid: u32) -> Self {
        let peak = Arc::new(std::sync::atomic::AtomicU64::new(rss_kib(pid)));
        let p = Arc::clone(&peak);
        let task = tokio::spawn(async move {
            loop {
                p.fetch_max(rss_kib(pid), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self(peak, task)
    }

    fn peak(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for RssPeak {
    fn drop(&mut self) {
        self.1.abort();
    }
}

async fn conns(gw: &Gateway, n: usize) -> Result<Vec<Conn>, String> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(gw.conn().await?);
    }
    Ok(v)
}

/// An HTTP/2 connection to the gateway whose stream windows are zero: a
/// client that never reads a byte of any response body.
async fn never_reading(gw: &Gateway) -> Result<h2::client::SendRequest<Bytes>, String> {
    let port = gw.base.rsplit(':').next().unwrap_or_default();
    let tcp = tokio::net::TcpStream::connect(format!("127.0.0.1:{port}")).await.map_err(|e| e.to_string())?;
    let tls = crate::client::tls_connector(Some(&gw.ca), Proto::H2).map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let io = tls.connect(name, tcp).await.map_err(|e| e.to_string())?;
    let (send, conn) =
        h2::client::Builder::new().initial_window_size(0).handshake(io).await.map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(send)
}

/// Whether `/readyz` shows engine `id` ready.
async fn engine_ready(gw: &Gateway, id: &str) -> bool {
    let Ok(c) = gw.conn().await else { return false };
    let Ok(r) = c.get("/readyz", None).await else { return false };
    let body = crate::client::body_bytes(r).await.unwrap_or_default();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    v["detail"]["engines"].as_array().is_some_and(|e| e.iter().any(|e| e["id"] == id && e["ready"] == true))
}

fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// 256 streams from one tenant (bronze) that never read a byte, while
/// another (gold) sends 10 req/s for 20 s.
pub async fn stalled_readers(bin: &Path, scratch: &Path) -> Result<Outcome, String> {
    let setup = shipped("", Vec::new());
    let (gw, idle, rss) = up_measured(bin, scratch, &setup).await?;
    // All 256 sent at once; each response head awaited for 10 s at most
    // (a gateway may hold it: such a stream counts as not opened).
    let mut waiting = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let send = never_reading(&gw).await?;
        for _ in 0..64 {
            let ready = tokio::time::timeout(Duration::from_secs(10), send.clone().ready()).await;
            let Ok(Ok(mut s)) = ready else { break };
            let req = http::Request::post(format!("{}/v1/chat/completions", gw.base))
                .header("authorization", format!("Bearer {BRONZE}"))
                .header("content-type", "application/json")
                .body(())
                .map_err(|e| e.to_string())?;
            let (resp, mut body) = s.send_request(req, false).map_err(|e| e.to_string())?;
            body.send_data(Bytes::from(chat(MODEL, 64)), true).map_err(|e| e.to_string())?;
            waiting.spawn(async move {
                let r = tokio::time::timeout(Duration::from_secs(10), resp).await.ok()?.ok()?;
                Some((r, body))
            });
        }
    }
    let mut stalled = Vec::new();
    while let Some(r) = waiting.join_next().await {
        if let Ok(Some((resp, body))) = r {
            stalled.push((resp.status() == 200, resp, body));
        }
    }
    let opened = stalled.iter().filter(|(ok, _, _)| *ok).count();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t0 = crate::clock::now();
    let gold = conns(&gw, 2).await?;
    let records =
        open_loop(&gold, GOLD, &chat(MODEL, 32), 10.0, Duration::from_secs(20), t0, Duration::from_secs(30))
            .await;
    let tally = Tally::of(&records);
    let within = records.iter().filter(|r| r.ok() && r.ttft_s.is_some_and(|t| t <= 0.5)).count();
    let resets = metric(&gw.metrics().await, "gateway_stream_resets_total{why=\"write_stall\"}");
    let met = tally.ok == tally.requests && within == tally.requests;
    Ok(Outcome {
        name: "stalled_readers",
        what: format!("{opened} bronze streams (64 tokens) over 4 HTTP/2 connections with zero windows, never read; gold 10 req/s x 20 s, 32-token streams; 2 emulated engines (A100 8B profile)"),
        lost: lost(&records),
        protected: tally,
        recovery_s: None,
        rss_idle_kib: idle,
        rss_peak_kib: rss.peak(),
        extra: serde_json::json!({"gold_within_ttft_budget": within, "stalled_streams_reset": resets}),
        target: "gold served 100% with TTFT within its 500 ms budget".into(),
        met,
    })
}

/// SIGSTOP (or SIGKILL) of one engine of two mid-stream under load.
pub async fn engine_fault(bin: &Path, scratch: &Path, sig: &'static str) -> Result<Outcome, String> {
    let profile = paced(5, 20);
    let policy = lifted_policy();
    let setup = Setup { engines: 2, profile: &profile, policy: &policy, limits: "", extra: Vec::new() };
    let (gw, idle, rss) = up_measured(bin, scratch, &setup).await?;
    let (victim, pid) = gw.engines[0].clone();
    let c = conns(&gw, 4).await?;
    let t0 = crate::clock::now();
    let stop_at = 10.0;
    let body = chat(MODEL, 100);
    let load = open_loop(&c, GOLD, &body, 8.0, Duration::from_secs(30), t0, Duration::from_secs(60));
    let fault = async {
        tokio::time::sleep(Duration::from_secs_f64(stop_at)).await;
        signal(pid, sig);
        if sig == "STOP" {
            tokio::time::sleep(Duration::from_secs(15)).await;
            signal(pid, "CONT");
            let back = crate::clock::now();
            while !engine_ready(&gw, &victim).await && crate::clock::since(back) < Duration::from_secs(20) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Some(crate::clock::since(back).as_secs_f64())
        } else {
            None
        }
    };
    let (records, recovery) = tokio::join!(load, fault);
    // Streams in flight on the engine when it stopped: the gateway moves
    // the rest of each to the other engine, so each must end whole, soon
    // (one that finishes after SIGCONT was silent all that time, which is
    // what a hung engine must not cost).
    let affected: Vec<&Record> =
        records.iter().filter(|r| r.engine == victim && r.sent_s < stop_at && r.ended_s > stop_at).collect();
    let worst_end = affected.iter().map(|r| r.ended_s - stop_at).fold(0.0, f64::max);
    let after: Vec<&Record> = records.iter().filter(|r| r.sent_s >= stop_at).collect();
    let after_tally = Tally::of(after.iter().copied());
    let resumed = affected.iter().filter(|r| r.ok()).count();
    let whole = !affected.is_empty() && resumed == affected.len();
    let met = whole && worst_end <= 10.0 && after_tally.failures == 0;
    Ok(Outcome {
        name: if sig == "STOP" { "engine_sigstop" } else { "engine_sigkill" },
        what: format!("SIG{sig} of engine {victim} (of 2) at t=10 s under 8 req/s of 100-token streams (20 ms/token) for 30 s{}", if sig == "STOP" { "; SIGCONT at t=25 s" } else { "" }),
        lost: lost(&records),
        protected: after_tally,
        recovery_s: recovery,
        rss_idle_kib: idle,
        rss_peak_kib: rss.peak(),
        extra: serde_json::json!({
            "streams_on_the_engine_when_it_stopped": affected.len(),
            "streams_continued_elsewhere_to_their_end": resumed,
            "slowest_end_after_the_fault_s": worst_end,
            "all_requests": Tally::of(&records),
        }),
        target: "every stream on the engine goes on on the other and ends whole within 10 s; no request sent after the fault fails".into(),
        met,
    })
}

/// Whether `/readyz` says Redis answers.
async fn redis_up(gw: &Gateway) -> bool {
    let Ok(c) = gw.conn().await else { return false };
    let Ok(r) = c.get("/readyz", None).await else { return false };
    let b = crate::client::body_bytes(r).await.unwrap_or_default();
    serde_json::from_slice::<serde_json::Value>(&b).unwrap_or_default()["detail"]["cluster"]["redis_up"]
        == true
}

/// Seconds from `since` until `/readyz` says Redis answers (20 s at most).
async fn wait_redis_up(gw: &Gateway, since: Instant) -> f64 {
    while !redis_up(gw).await && crate::clock::since(since) < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    crate::clock::since(since).as_secs_f64()
}

/// Redis killed and restarted, then paused and resumed, under load.
pub async fn redis_faults(bin: &Path, scratch: &Path) -> Result<Outcome, String> {
    let mut redis = Redis::start(scratch)?;
    let setup = shipped("", vec!["--redis".into(), redis.url()]);
    let (gw, idle, rss) = up_measured(bin, scratch, &setup).await?;
    let c = conns(&gw, 2).await?;
    let t0 = crate::clock::now();
    let body = chat(MODEL, 32);
    let load = open_loop(&c, GOLD, &body, 10.0, Duration::from_secs(40), t0, Duration::from_secs(30));
    let faults = async {
        tokio::time::sleep(Duration::from_secs(8)).await;
        redis.kill();
        tokio::time::sleep(Duration::from_secs(8)).await;
        let _ = redis.restart();
        let after_restart = wait_redis_up(&gw, crate::clock::now()).await;
        tokio::time::sleep_until((t0 + Duration::from_secs(24)).into()).await;
        let pid = redis.pid();
        signal(pid, "STOP");
        tokio::time::sleep(Duration::from_secs(6)).await;
        signal(pid, "CONT");
        let after_pause = wait_redis_up(&gw, crate::clock::now()).await;
        (after_restart, after_pause)
    };
    let (records, (after_restart, after_pause)) = tokio::join!(load, faults);
    let tally = Tally::of(&records);
    let met = tally.failures == 0;
    Ok(Outcome {
        name: "redis_faults",
        what: "gateway up --redis, 2 engines; gold 10 req/s x 40 s; redis-server SIGKILLed at t=8 s, restarted at t=16 s, SIGSTOPped at t=24 s for 6 s".into(),
        lost: lost(&records),
        protected: tally,
        recovery_s: Some(after_restart.max(after_pause)),
        rss_idle_kib: idle,
        rss_peak_kib: rss.peak(),
        extra: serde_json::json!({"redis_up_again_after_restart_s": after_restart, "redis_up_again_after_sigcont_s": after_pause}),
        target: "0 failed requests; Redis state back within seconds".into(),
        met,
    })
}

/// `n` streams held open, then `cancel` of them dropped at once.
pub async fn cancellation_storm(
    bin: &Path,
    scratch: &Path,
    n: usize,
    cancel: usize,
) -> Result<Outcome, String> {
    let profile = paced(0, 1000);
    let policy = lifted_policy();
    let extra = vec!["--engine-arg=--max-batch=16384".into(), "--engine-arg=--kv-pages=262144".into()];
    let setup = Setup { engines: 1, profile: &profile, policy: &policy, limits: "", extra };
    let (gw, idle, rss) = up_measured(bin, scratch, &setup).await?;
    let c = conns(&gw, 4).await?;
    let t0 = crate::clock::now();
    let body = chat(MODEL, 12);
    // Open all: the first `cancel` are held by tasks that drop them on
    // the signal; the rest are read to their end.
    let (go_tx, go_rx) = tokio::sync::watch::channel(false);
    let mut kept = tokio::task::JoinSet::new();
    let mut dropped = tokio::task::JoinSet::new();
    for i in 0..n {
        let conn = c[i % c.len()].clone();
        let body = body.clone();
        if i < cancel {
            let mut go = go_rx.clone();
            dropped.spawn(async move {
                let resp = conn.post_json("/v1/chat/completions", Some(GOLD), body).await;
                let opened = resp.as_ref().is_ok_and(|r| r.status() == 200);
                let _ = go.wait_for(|g| *g).await;
                drop(resp); // RST_STREAM
                opened
            });
        } else {
            kept.spawn(async move { load::one(&conn, GOLD, &body, t0, Duration::from_secs(60)).await });
        }
        if i % 200 == 199 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let storm_at = crate::clock::since(t0).as_secs_f64();
    let _ = go_tx.send(true);
    let mut cancelled_open = 0;
    while let Some(r) = dropped.join_next().await {
        cancelled_open += usize::from(r.unwrap_or(false));
    }
    let mut records = Vec::new();
    while let Some(r) = kept.join_next().await {
        if let Ok(r) = r {
            records.push(r);
        }
    }
    let after =
        open_loop(&c, GOLD, &chat(MODEL, 2), 20.0, Duration::from_secs(1), t0, Duration::from_secs(30)).await;
    let tally = Tally::of(&records);
    let met = tally.failures == 0 && Tally::of(&after).failures == 0;
    Ok(Outcome {
        name: "cancellation_storm",
        what: format!("{n} streams (12 tokens at 1 s/token) over 4 HTTP/2 connections, 1 engine; {cancel} reset at once at t={storm_at:.1} s; then 20 new requests"),
        lost: lost(&records) + lost(&after),
        protected: tally,
        recovery_s: None,
        rss_idle_kib: idle,
        rss_peak_kib: rss.peak(),
        extra: serde_json::json!({"cancelled_streams_open_at_the_storm": cancelled_open, "requests_after": Tally::of(&after)}),
        target: format!("0 failures among the other {} streams", n - cancel),
        met,
    })
}

/// `n` concurrent SSE streams held for about `hold_s` seconds.
pub async fn many_streams(bin: &Path, scratch: &Path, n: usize, hold_s: u32) -> Result<Outcome, String> {
    let tokens = 12;
    let profile = paced(0, hold_s * 1000 / tokens);
    let policy = lifted_policy();
    let extra = vec!["--engine-arg=--max-batch=16384".into(), "--engine-arg=--kv-pages=262144".into()];
    let setup = Setup { engines: 2, profile: &profile, policy: &policy, limits: "", extra };
    let gw = Gateway::up(bin, scratch, &setup).await?;
    let c = conns(&gw, n.div_ceil(500).max(1)).await?;
    // Idle size: after a few requests have warmed every path.
    let t0 = crate::clock::now();
    let _ =
        open_loop(&c, GOLD, &chat(MODEL, 1), 20.0, Duration::from_secs(1), t0, Duration::from_secs(30)).await;
    let idle = gw.rss_kib();
    let rss = RssPeak::watch(gw.pid);
    let body = chat(MODEL, tokens);
    let mut tasks = tokio::task::JoinSet::new();
    let ramp = crate::clock::now();
    for i in 0..n {
        let (conn, body) = (c[i % c.len()].clone(), body.clone());
        tasks.spawn(async move {
            load::one(&conn, GOLD, &body, t0, Duration::from_secs(u64::from(hold_s) * 3)).await
        });
        if i % 250 == 249 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let ramp_s = crate::clock::since(ramp).as_secs_f64();
    // Held: all open now, the last opened a moment ago.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let held = gw.rss_kib();
    let mut records = Vec::new();
    while let Some(r) = tasks.join_next().await {
        if let Ok(r) = r {
            records.push(r);
        }
    }
    let tally = Tally::of(&records);
    let per_stream = (held.saturating_sub(idle)) as f64 * 1024.0 / n as f64;
    let met = tally.failures == 0 && per_stream < 20.0 * 1024.0;
    Ok(Outcome {
        name: "concurrent_streams",
        what: format!("{n} concurrent SSE streams ({tokens} tokens over ~{hold_s} s each) over {} HTTP/2 connections, opened in {ramp_s:.1} s; 2 engines", c.len()),
        lost: lost(&records),
        protected: tally,
        recovery_s: None,
        rss_idle_kib: idle,
        rss_peak_kib: rss.peak(),
        extra: serde_json::json!({"rss_held_kib": held, "rss_bytes_per_stream": per_stream.round()}),
        target: "0 failures; gateway RSS below 20 KB per stream beyond its idle size".into(),
        met,
    })
}

/// 20 policy reloads through the admin API under load.
pub async fn reloads(bin: &Path, scratch: &Path) -> Result<Outcome, String> {
    let setup = shipped("", Vec::new());
    let (gw, idle, rss) = up_measured(bin, scratch, &setup).await?;
    let c = conns(&gw, 4).await?;
    let t0 = crate::clock::now();
    let body = chat(MODEL, 32);
    let load = open_loop(&c, GOLD, &body, 20.0, Duration::from_secs(32), t0, Duration::from_secs(30));
    let token = gw.admin_token();
    let apply = async {
        let admin = Conn::connect(&gw.admin, Some(&gw.ca), Proto::H2).await.map_err(|e| e.to_string())?;
        let mut applied = 0;
        for i in 0..20 {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let text = DEFAULT_POLICY.replace("ttft_ms = 500", &format!("ttft_ms = {}", 500 + (i % 2) * 100));
            let req = http::Request::put("/admin/policies")
                .header("authorization", format!("Bearer {token}"))
                .body(http_body_util::Full::new(Bytes::from(text)))
                .map_err(|e| e.to_string())?;
            if admin.send(req).await.is_ok_and(|r| r.status() == 200) {
                applied += 1;
            }
        }
        Ok::<_, String>(applied)
    };
    let (records, applied) = tokio::join!(load, apply);
    let applied = applied?;
    let tally = Tally::of(&records);
    let met = tally.failures == 0 && applied == 20;
    Ok(Outcome {
        name: "policy_reloads",
        what: "20 policy documents applied through the admin API, one every 1.5 s, under gold 20 req/s x 32 s; 2 engines".into(),
        lost: lost(&records),
        protected: tally,
        recovery_s: None,
        rss_idle_kib: idle,
        rss_peak_kib: rss.peak(),
        extra: serde_json::json!({"reloads_applied": applied}),
        target: "20 reloads applied, 0 failed requests".into(),
        met,
    })
}

/// Idle and slowloris connections while gold is served.
pub async fn slow_connections(bin: &Path, scratch: &Path) -> Result<Outcome, String> {
    let limits = "header_read_timeout_ms = 5000\nidle_timeout_ms = 10000";
    let setup = shipped(limits, Vec::new());
    let (gw, idle, rss) = up_measured(bin, scratch, &setup).await?;
    let port = gw.base.rsplit(':').next().unwrap_or_default().to_string();
    // 500 TCP connections that never start TLS, 200 HTTP/1.1 heads sent a
    // byte a second, 200 HTTP/2 connections that never send a request.
    let mut silent = Vec::new();
    for _ in 0..500 {
        silent.push(
            tokio::net::TcpStream::connect(format!("127.0.0.1:{port}")).await.map_err(|e| e.to_string())?,
        );
    }
    let started = crate::clock::now();
    let mut trickles = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let (port, ca) = (port.clone(), gw.ca.clone());
        trickles.spawn(async move {
            let tcp = tokio::net::TcpStream::connect(format!("127.0.0.1:{port}")).await.ok()?;
            let tls = crate::client::tls_connector(Some(&ca), Proto::Http1).ok()?;
            let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
            let mut io = tls.connect(name, tcp).await.ok()?;
            let t = crate::clock::now();
            for b in b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ".iter().cycle().take(120) {
                if io.write_all(&[*b]).await.is_err() || io.flush().await.is_err() {
                    return Some(crate::clock::since(t).as_secs_f64()); // cut off by the gateway
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            None
        });
    }
    let idle_h2 = conns(&gw, 200).await?;
    let c = conns(&gw, 2).await?;
    let t0 = crate::clock::now();
    let records =
        open_loop(&c, GOLD, &chat(MODEL, 32), 10.0, Duration::from_secs(20), t0, Duration::from_secs(30))
            .await;
    let mut cut = Vec::new();
    while let Some(r) = trickles.join_next().await {
        if let Ok(Some(s)) = r {
            cut.push(s);
        }
    }
    let silent_closed = {
        let mut n = 0;
        for s in &silent {
            let mut b = [0u8; 1];
            if matches!(tokio::time::timeout(Duration::from_millis(10), s.peek(&mut b)).await, Ok(Ok(0))) {
                n += 1;
            }
        }
        n
    };
    let idle_closed = idle_h2.iter().filter(|c| c.is_closed()).count();
    let tally = Tally::of(&records);
    let slowest_cut = cut.iter().copied().fold(0.0, f64::max);
    let met = tally.failures == 0 && silent_closed == 500 && cut.len() == 200 && idle_closed == 200;
    Ok(Outcome {
        name: "slow_connections",
        what: "500 TCP connections that never start TLS, 200 HTTP/1.1 request heads trickled at 1 byte/s, 200 idle HTTP/2 connections; header_read_timeout 5 s, idle_timeout 10 s; gold 10 req/s x 20 s".into(),
        lost: lost(&records),
        protected: tally,
        recovery_s: None,
        rss_idle_kib: idle,
        rss_peak_kib: rss.peak(),
        extra: serde_json::json!({
            "silent_tcp_closed": silent_closed,
            "trickled_heads_cut_off": cut.len(),
            "slowest_cut_off_s": slowest_cut,
            "idle_h2_closed": idle_closed,
            "elapsed_s": crate::clock::since(started).as_secs_f64(),
        }),
        target: "gold served 100%; every slow or idle connection closed by its timeout".into(),
        met,
    })
}
