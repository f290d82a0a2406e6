//! `loadtest diffusion`: a trace of image and video requests sent on time
//! to a live gateway (open loop, one HTTP/2 connection), each with its
//! deadline in `x-slo-e2e-ms` (σ × solo latency from the same profile the
//! engines replay, so gateway and harness agree on it). An image meets its
//! SLO if its 200 arrives in time; a video if the job completes in time
//! (its `completed_at_ms` against the create request's send time; polled
//! every `--poll-ms`).
//!
//! The solo latency σ scales is measured first, as GenServe's profiler
//! does: each (kind, size) of the trace alone on the idle system,
//! `--solo-runs` times, the median, so the deadlines include what serving
//! costs beyond the model's steps (HTTP, PNG encoding, the video's rounds).
//! The median, not the best run: at σ = 1 a deadline is the solo latency
//! itself, and a request served exactly as if alone meets the best of `n`
//! idle runs with probability 1/(n + 1) by symmetry, whatever the
//! scheduler (docs/benchmarks/diffusion.md, "Live, 8 emulated engines"). Measure it
//! once on the reference configuration (`[diffusion] mode = "fcfs"`:
//! videos at the default SP) with `--solo-out FILE --calibrate-only`, and
//! give every arm `--solo FILE`: an elastic-SP gateway would widen a lone
//! video and tighten its own deadlines. `--no-calibrate` takes the
//! profile's numbers instead.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::Full;
use policies::diffusion::{DiffusionProfile, SchedConfig};
use serde::Serialize;

use super::workload::{self, Mix, Request as Planned, Resolutions, Spec};
use crate::client::{body_bytes, Conn, Proto};
use crate::progress::Progress;

/// Options of `loadtest diffusion`.
#[derive(Debug, Clone, clap::Args)]
pub struct DiffusionArgs {
    /// Gateway base URL.
    #[arg(long, default_value = "https://localhost:8443")]
    pub target: String,
    /// CA certificate for the gateway's TLS.
    #[arg(long)]
    pub ca: Option<PathBuf>,
    #[arg(long, default_value = "sk-demo-gold")]
    pub key: String,
    #[arg(long, value_enum, default_value = "balanced")]
    pub mix: Mix,
    #[arg(long, value_enum, default_value = "skewed")]
    pub resolutions: Resolutions,
    /// Requests per minute on the profile's own clock (divided by
    /// `--time-scale` on the wall clock).
    #[arg(long, default_value_t = 24.0)]
    pub rate: f64,
    #[arg(long, default_value_t = 1.0)]
    pub sigma: f64,
    #[arg(long, default_value_t = 100)]
    pub requests: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, default_value_t = 5)]
    pub video_seconds: u32,
    /// SP degree the solo latency is taken at (the policy's `default_sp`).
    #[arg(long, default_value_t = 2)]
    pub default_sp: u32,
    /// The engines' profile (the shipped one unless they were given another).
    #[arg(long, default_value = "policies/profiles/genserve-emulated.toml")]
    pub profile: PathBuf,
    /// The engines' clock compression (their profile's `time_scale`).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    #[arg(long, default_value_t = 100)]
    pub poll_ms: u64,
    /// Use the profile's solo latencies, not measured ones.
    #[arg(long)]
    pub no_calibrate: bool,
    /// Read the measured solo latencies from this file (written by
    /// `--solo-out`) instead of measuring.
    #[arg(long)]
    pub solo: Option<PathBuf>,
    /// Write the measured solo latencies here.
    #[arg(long)]
    pub solo_out: Option<PathBuf>,
    /// Idle runs of each (kind, size) when measuring solo latencies; the
    /// median is taken.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub solo_runs: u32,
    /// Measure the solo latencies and stop.
    #[arg(long)]
    pub calibrate_only: bool,
    /// Timing tolerance of the testbed, ms: `sar_within_tolerance` also
    /// counts requests that missed their deadline by at most this much (a
    /// request served as if alone lands within the machine's timing noise
    /// of its solo latency, on either side; the strict `sar` is the result).
    #[arg(long, default_value_t = 2.0)]
    pub tolerance_ms: f64,
    #[arg(long, default_value = "run")]
    pub label: String,
    #[arg(long, default_value = "bench-out/diffusion")]
    pub out: PathBuf,
}

/// One request's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub video: bool,
    pub size: String,
    pub deadline_ms: f64,
    pub status: u16,
    /// Send to answer (images) or to completion (videos), ms; none if it
    /// failed.
    pub latency_ms: Option<f64>,
    pub met: bool,
    pub error: Option<String>,
}

/// A run's outcome (`results.json`).
#[derive(Debug, Clone, Serialize)]
pub struct LiveOutcome {
    pub label: String,
    pub requests: usize,
    pub sar: f64,
    pub image_sar: f64,
    pub video_sar: f64,
    /// The tolerance `sar_within_tolerance` allows, ms.
    pub tolerance_ms: f64,
    /// Share done by their deadline plus `tolerance_ms`.
    pub sar_within_tolerance: f64,
    pub refused: usize,
    pub failed: usize,
    pub records: Vec<Record>,
}

fn unix_ms() -> f64 {
    crate::clock::wall().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

fn request(
    method: http::Method,
    path: &str,
    key: &str,
    body: Bytes,
    deadline_ms: Option<f64>,
) -> Request<Full<Bytes>> {
    let mut r = Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {key}"))
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(d) = deadline_ms {
        r = r.header("x-slo-e2e-ms", format!("{d:.1}"));
    }
    r.body(Full::new(body)).expect("valid request parts")
}

async fn one(conn: Arc<Conn>, key: String, r: Planned, poll: Duration, k: usize) -> Record {
    let deadline = r.deadline_ms - r.at_ms;
    let mut rec = Record {
        video: r.video,
        size: r.size.clone(),
        deadline_ms: deadline,
        status: 0,
        latency_ms: None,
        met: false,
        error: None,
    };
    let sent = unix_ms();
    let started = crate::clock::now();
    let prompt = format!("request {k}: a synthetic scene");
    let (path, body) = if r.video {
        ("/v1/videos", serde_json::json!({"prompt": prompt, "size": r.size, "seconds": r.seconds}))
    } else {
        ("/v1/images/generations", serde_json::json!({"prompt": prompt, "size": r.size, "n": 1}))
    };
    let req = request(http::Method::POST, path, &key, Bytes::from(body.to_string()), Some(deadline));
    let answer = match conn.send(req).await {
        Ok(resp) => {
            rec.status = resp.status().as_u16();
            body_bytes(resp).await.map_err(|e| e.to_string())
        }
        Err(e) => Err(e.to_string()),
    };
    let bytes = match answer {
        Ok(b) if rec.status == StatusCode::OK.as_u16() => b,
        Ok(b) => {
            rec.error = Some(String::from_utf8_lossy(&b[..b.len().min(300)]).into_owned());
            return rec;
        }
        Err(e) => {
            rec.error = Some(e);
            return rec;
        }
    };
    if !r.video {
        let ms = crate::clock::since(started).as_secs_f64() * 1000.0;
        rec.latency_ms = Some(ms);
        rec.met = ms <= deadline;
        return rec;
    }
    let id = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v["id"].as_str().map(String::from));
    match id {
        Some(id) => poll_video(&conn, &key, &id, poll, started, sent, rec).await,
        None => Record { error: Some("no video id".into()), ..rec },
    }
}

/// Polls video `id` until it ends, for at most ten deadlines and a minute.
async fn poll_video(
    conn: &Conn,
    key: &str,
    id: &str,
    poll: Duration,
    started: std::time::Instant,
    sent: f64,
    mut rec: Record,
) -> Record {
    let give_up =
        Duration::from_secs_f64((rec.deadline_ms * 10.0 / 1000.0).min(3600.0)) + Duration::from_secs(60);
    while crate::clock::since(started) < give_up {
        tokio::time::sleep(poll).await;
        let req = request(http::Method::GET, &format!("/v1/videos/{id}"), key, Bytes::new(), None);
        let Ok(resp) = conn.send(req).await else { continue };
        let Ok(b) = body_bytes(resp).await else { continue };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&b) else { continue };
        match v["status"].as_str() {
            Some("completed") => {
                let done = v["completed_at_ms"].as_f64().unwrap_or_else(unix_ms);
                rec.latency_ms = Some(done - sent);
                rec.met = done - sent <= rec.deadline_ms;
                return rec;
            }
            Some("failed") => {
                rec.error = Some(v["error"].to_string());
                return rec;
            }
            _ => {}
        }
    }
    rec.error = Some("gave up polling".into());
    rec
}

/// Each (kind, size) of `trace` alone, `runs` times: the median of its
/// latencies (the measured solo latency).
async fn calibrate(
    conn: &Arc<Conn>,
    key: &str,
    trace: &[Planned],
    poll: Duration,
    runs: u32,
) -> Result<std::collections::HashMap<(bool, String), f64>, String> {
    let mut solo = std::collections::HashMap::new();
    for r in trace {
        let k = (r.video, r.size.clone());
        if solo.contains_key(&k) {
            continue;
        }
        let mut ms = Vec::with_capacity(runs as usize);
        for _ in 0..runs {
            let probe = Planned { at_ms: 0.0, deadline_ms: 3_600_000.0, ..r.clone() };
            let rec = one(Arc::clone(conn), key.to_string(), probe, poll, 0).await;
            ms.push(rec.latency_ms.ok_or_else(|| format!("calibrating {k:?}: {:?}", rec.error))?);
        }
        let median = crate::stats::median(ms.clone());
        eprintln!("solo {} {}: {median:.1} ms (median of {ms:.1?})", r.kind_name(), r.size);
        solo.insert(k, median);
    }
    Ok(solo)
}

/// The trace `args` asks for, each deadline σ × the profile's solo time
/// (on the engines' clock) until measured ones replace it.
pub fn plan(args: &DiffusionArgs) -> Result<Vec<Planned>, String> {
    if !(args.tolerance_ms.is_finite() && args.tolerance_ms >= 0.0) {
        return Err(format!("--tolerance-ms must be 0 or more, not {}", args.tolerance_ms));
    }
    let text =
        std::fs::read_to_string(&args.profile).map_err(|e| format!("{}: {e}", args.profile.display()))?;
    let profile = DiffusionProfile::parse(&args.profile.display().to_string(), &text)
        .map_err(|e| e.to_string())?
        .scaled(args.time_scale);
    let cfg = SchedConfig { default_sp: args.default_sp, ..SchedConfig::default() };
    let spec = Spec {
        mix: args.mix,
        resolutions: args.resolutions,
        rate_per_min: args.rate / args.time_scale,
        sigma: args.sigma,
        requests: args.requests,
        video_seconds: args.video_seconds,
    };
    Ok(workload::generate(&spec, &profile, &cfg, args.seed))
}

/// Runs the trace; returns a one-line summary (results.json under `--out`).
pub async fn main(args: &DiffusionArgs) -> Result<String, String> {
    let mut trace = plan(args)?;
    let conn = Arc::new(
        Conn::connect(&args.target, args.ca.as_deref(), Proto::H2).await.map_err(|e| e.to_string())?,
    );
    let poll = Duration::from_millis(args.poll_ms.max(5));
    if !args.no_calibrate {
        let solo: Vec<((bool, String), f64)> = match &args.solo {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
                serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?
            }
            None => calibrate(&conn, &args.key, &trace, poll, args.solo_runs).await?.into_iter().collect(),
        };
        if let Some(p) = &args.solo_out {
            std::fs::write(p, serde_json::to_vec_pretty(&solo).expect("serialises"))
                .map_err(|e| e.to_string())?;
        }
        if args.calibrate_only {
            return Ok(format!("solo latencies: {solo:?}\n"));
        }
        with_solo(&mut trace, &solo.into_iter().collect(), args.sigma)?;
    }
    let records = send(&conn, &args.key, trace, poll).await?;
    let out = summarize(&args.label, records, args.tolerance_ms);
    std::fs::create_dir_all(&args.out).map_err(|e| e.to_string())?;
    let path = args.out.join("results.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&out).expect("serialises")).map_err(|e| e.to_string())?;
    Ok(format!(
        "{}: SAR {:.0}% (images {:.0}%, videos {:.0}%; {:.0}% within {} ms), {} refused, {} failed of {}\n",
        out.label,
        out.sar,
        out.image_sar,
        out.video_sar,
        out.sar_within_tolerance,
        out.tolerance_ms,
        out.refused,
        out.failed,
        out.requests
    ))
}

/// Every request's deadline σ × its measured solo latency.
fn with_solo(
    trace: &mut [Planned],
    solo: &std::collections::HashMap<(bool, String), f64>,
    sigma: f64,
) -> Result<(), String> {
    for r in trace {
        let Some(&s) = solo.get(&(r.video, r.size.clone())) else {
            return Err(format!("no solo latency for {} {}", r.kind_name(), r.size));
        };
        r.solo_ms = s;
        r.deadline_ms = r.at_ms + sigma * r.solo_ms;
    }
    Ok(())
}

/// Sends each request of `trace` at its time; their records, in order.
async fn send(
    conn: &Arc<Conn>,
    key: &str,
    trace: Vec<Planned>,
    poll: Duration,
) -> Result<Vec<Record>, String> {
    let t0 = crate::clock::now();
    let mut tasks = Vec::with_capacity(trace.len());
    for (k, r) in trace.into_iter().enumerate() {
        let at = Duration::from_secs_f64(r.at_ms / 1000.0);
        tokio::time::sleep(at.saturating_sub(crate::clock::since(t0))).await;
        tasks.push(tokio::spawn(one(Arc::clone(conn), key.to_string(), r, poll, k)));
    }
    let mut progress = Progress::new(tasks.len());
    let mut records = Vec::with_capacity(tasks.len());
    for t in tasks {
        records.push(t.await.map_err(|e| e.to_string())?);
        progress.tick();
    }
    progress.done();
    Ok(records)
}

fn summarize(label: &str, records: Vec<Record>, tolerance_ms: f64) -> LiveOutcome {
    // The share of the records `of` selects that `met` counts as done in time.
    let share = |of: &dyn Fn(&Record) -> bool, met: &dyn Fn(&Record) -> bool| {
        let all: Vec<&Record> = records.iter().filter(|r| of(r)).collect();
        if all.is_empty() {
            0.0
        } else {
            100.0 * all.iter().filter(|r| met(r)).count() as f64 / all.len() as f64
        }
    };
    let strict = |r: &Record| r.met;
    let tolerant = |r: &Record| r.latency_ms.is_some_and(|l| l <= r.deadline_ms + tolerance_ms);
    LiveOutcome {
        label: label.to_string(),
        requests: records.len(),
        sar: share(&|_| true, &strict),
        image_sar: share(&|r| !r.video, &strict),
        video_sar: share(&|r| r.video, &strict),
        tolerance_ms,
        sar_within_tolerance: share(&|_| true, &tolerant),
        refused: records.iter().filter(|r| r.status == 503 || r.status == 429).count(),
        failed: records.iter().filter(|r| r.error.is_some() && r.status != 503 && r.status != 429).count(),
        records,
    }
}

#[cfg(test)]
mod tests {
    use super::{summarize, Record};

    #[test]
    fn the_tolerance_counts_near_misses_and_nothing_else() {
        let rec = |video, latency_ms: Option<f64>| Record {
            video,
            size: "512x512".into(),
            deadline_ms: 100.0,
            status: if latency_ms.is_some() { 200 } else { 502 },
            latency_ms,
            met: latency_ms.is_some_and(|l| l <= 100.0),
            error: latency_ms.is_none().then(|| "engine_failed".into()),
        };
        let records =
            vec![rec(false, Some(99.0)), rec(false, Some(101.5)), rec(true, Some(102.5)), rec(true, None)];
        let out = summarize("t", records, 2.0);
        assert_eq!((out.sar, out.image_sar, out.video_sar), (25.0, 50.0, 0.0));
        assert_eq!(out.sar_within_tolerance, 50.0, "101.5 is within 2 ms, 102.5 and a failure are not");
        assert_eq!(out.failed, 1);
    }
}
