//! `loadtest video`: runs a video workload against the gateway. Each
//! planned stream is created at its time, its SSE feed read as it comes,
//! played out in real time by a [`Player`], and paused / switched on its
//! schedule. Writes `results.json` (schema `slo-gateway.loadtest.video/v1`)
//! and prints a summary: CPR, TTFC, stalls, chunk lateness, quality.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::time::Instant;

use super::plan::{plan, PlannedStream, VideoWorkload};
use super::player::Player;
use crate::client::{body_bytes, Conn, Proto};
use crate::sse::SseParser;
use crate::stats::Summary;

/// Options of `loadtest video`.
#[derive(Debug, Clone, clap::Args)]
pub struct VideoArgs {
    /// Gateway base URL.
    #[arg(long, default_value = "https://localhost:8443")]
    pub target: String,
    /// CA certificate to trust (the development CA by default).
    #[arg(long, default_value = "certs/ca.pem")]
    pub ca: PathBuf,
    /// API key the streams are created with.
    #[arg(long, default_value = "sk-demo-gold")]
    pub key: String,
    #[arg(long, value_enum, default_value_t = VideoWorkload::Steady)]
    pub workload: VideoWorkload,
    /// Streams per second (on average).
    #[arg(long, default_value_t = 0.5)]
    pub rate: f64,
    /// Seconds over which streams arrive (they then play to their end).
    #[arg(long, default_value_t = 30.0)]
    pub duration: f64,
    #[arg(long, default_value_t = 16)]
    pub fps: u32,
    #[arg(long, default_value_t = 12)]
    pub frames_per_chunk: u32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Directory for results.json.
    #[arg(long)]
    pub out: PathBuf,
    /// --watch-fleet: also the cost per video minute delivered.
    #[command(flatten)]
    pub watch: crate::watch::WatchArgs,
}

/// What one stream saw.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StreamRecord {
    pub at: f64,
    pub length_frames: u32,
    /// `created`, `rejected` (with `code`) or `failed`.
    pub outcome: String,
    pub code: Option<String>,
    pub ttfc_ms: Option<f64>,
    pub chunks: u64,
    pub on_time: u64,
    pub stalls: u64,
    pub stall_ms: f64,
    pub lateness_ms: Vec<f64>,
    pub quality: Vec<f64>,
    pub modes: BTreeMap<String, u64>,
    pub rehomes: u64,
    /// Time its chunks waited on moves of its state, ms (the gateway's).
    #[serde(default)]
    pub migration_stall_ms: f64,
    /// Each chunk's generation latency: from the gateway asking the engine
    /// to the chunk's delivery, ms.
    #[serde(default)]
    pub chunk_ms: Vec<f64>,
    pub end_reason: Option<String>,
    /// `recovered` events: its engine was lost and it went on (from a
    /// staged copy or from its prompt).
    #[serde(default)]
    pub recoveries: u64,
}

/// The whole run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VideoResults {
    pub schema: String,
    pub workload: VideoWorkload,
    pub rate: f64,
    pub duration_s: f64,
    pub seed: u64,
    pub fps: u32,
    pub frames_per_chunk: u32,
    pub summary: VideoSummary,
    pub streams: Vec<StreamRecord>,
    /// The fleet over the run (with --watch-fleet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<crate::results::Fleet>,
    /// Minutes of video delivered (chunks × frames per chunk / fps).
    #[serde(default)]
    pub video_minutes: f64,
    /// The fleet's cost over the run per minute of video delivered.
    #[serde(default)]
    pub cost_per_video_minute: Option<f64>,
}

/// The figures a viewer notices, over the whole run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct VideoSummary {
    pub planned: usize,
    pub created: usize,
    pub rejected: usize,
    pub failed: usize,
    pub chunks: u64,
    /// Share of all chunks ready by their playout deadline (chunk-weighted).
    pub cpr: f64,
    /// The mean over streams of each stream's on-time share (SlackServe's
    /// QoE); streams that delivered no chunk count 0.
    #[serde(default)]
    pub cpr_stream_mean: f64,
    /// The slowest chunk's generation latency, ms.
    #[serde(default)]
    pub worst_chunk_ms: f64,
    #[serde(default)]
    pub migration_stall_ms: f64,
    pub ttfc_ms: Option<Summary>,
    pub stalls_per_stream: f64,
    pub stall_s_per_stream: f64,
    pub lateness_ms: Option<Summary>,
    pub mean_quality: f64,
    pub modes: BTreeMap<String, u64>,
    pub rehomes: u64,
}

impl VideoSummary {
    pub fn of(streams: &[StreamRecord]) -> Self {
        let created: Vec<&StreamRecord> = streams.iter().filter(|s| s.outcome == "created").collect();
        let chunks: u64 = created.iter().map(|s| s.chunks).sum();
        let on_time: u64 = created.iter().map(|s| s.on_time).sum();
        let ttfc: Vec<f64> = created.iter().filter_map(|s| s.ttfc_ms).collect();
        let lateness: Vec<f64> = created.iter().flat_map(|s| s.lateness_ms.iter().copied()).collect();
        let quality: Vec<f64> = created.iter().flat_map(|s| s.quality.iter().copied()).collect();
        let mut modes = BTreeMap::new();
        for s in &created {
            for (k, v) in &s.modes {
                *modes.entry(k.clone()).or_default() += v;
            }
        }
        let n = created.len().max(1) as f64;
        Self {
            planned: streams.len(),
            created: created.len(),
            rejected: streams.iter().filter(|s| s.outcome == "rejected").count(),
            failed: streams.iter().filter(|s| s.outcome == "failed").count(),
            chunks,
            cpr: if chunks == 0 { 0.0 } else { on_time as f64 / chunks as f64 },
            cpr_stream_mean: created
                .iter()
                .map(|s| if s.chunks == 0 { 0.0 } else { s.on_time as f64 / s.chunks as f64 })
                .sum::<f64>()
                / n,
            worst_chunk_ms: created.iter().flat_map(|s| s.chunk_ms.iter().copied()).fold(0.0, f64::max),
            migration_stall_ms: created.iter().map(|s| s.migration_stall_ms).sum(),
            ttfc_ms: Summary::of(&ttfc),
            stalls_per_stream: created.iter().map(|s| s.stalls as f64).sum::<f64>() / n,
            stall_s_per_stream: created.iter().map(|s| s.stall_ms / 1e3).sum::<f64>() / n,
            lateness_ms: Summary::of(&lateness),
            mean_quality: if quality.is_empty() {
                0.0
            } else {
                quality.iter().sum::<f64>() / quality.len() as f64
            },
            modes,
            rehomes: created.iter().map(|s| s.rehomes).sum(),
        }
    }
}

/// Shared between a stream's reader and its scheduled actions.
struct Live {
    player: Player,
    epoch: u64,
}

async fn post(
    conn: &Conn,
    path: &str,
    key: &str,
    body: serde_json::Value,
) -> Result<(u16, serde_json::Value), String> {
    let resp = conn.post_json(path, Some(key), body.to_string()).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let bytes = body_bytes(resp).await.map_err(|e| e.to_string())?;
    Ok((status, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null)))
}

/// Runs one planned stream from its arrival to its end.
async fn one_stream(conn: Conn, args: Arc<VideoArgs>, p: PlannedStream, origin: Instant) -> StreamRecord {
    tokio::time::sleep_until(origin + Duration::from_secs_f64(p.at)).await;
    let mut rec = StreamRecord { at: p.at, length_frames: p.length_frames, ..Default::default() };
    let created_at = Instant::now();
    let body = json!({
        "prompt": format!("stream at {:.2}", p.at), "fps": args.fps,
        "frames_per_chunk": args.frames_per_chunk, "length_frames": p.length_frames,
    });
    let id = match post(&conn, "/v1/video/streams", &args.key, body).await {
        Ok((201, v)) => v["id"].as_str().unwrap_or_default().to_string(),
        Ok((status, v)) => {
            rec.outcome = if status == 503 || status == 429 { "rejected" } else { "failed" }.into();
            rec.code = v["error"]["code"].as_str().map(str::to_string);
            return rec;
        }
        Err(e) => {
            rec.outcome = "failed".into();
            rec.code = Some(e);
            return rec;
        }
    };
    rec.outcome = "created".into();
    let chunk_s = f64::from(args.frames_per_chunk) / f64::from(args.fps);
    let live = Arc::new(Mutex::new(Live { player: Player::new(chunk_s), epoch: 0 }));
    let t = move |at: Instant| at.duration_since(created_at).as_secs_f64();
    // Scheduled actions: prompt switches and pauses, from the stream's creation.
    let mut actions = Vec::new();
    for (i, at) in p.switches.iter().enumerate() {
        let (conn, args, id, live, at) =
            (conn.clone(), Arc::clone(&args), id.clone(), Arc::clone(&live), *at);
        actions.push(tokio::spawn(async move {
            tokio::time::sleep_until(created_at + Duration::from_secs_f64(at)).await;
            let path = format!("/v1/video/streams/{id}/prompt");
            if let Ok((200, _)) =
                post(&conn, &path, &args.key, json!({"prompt": format!("switch {i}")})).await
            {
                let mut l = live.lock().expect("live lock");
                l.epoch += 1;
                l.player.switch(t(Instant::now()));
            }
        }));
    }
    for &(at, dur) in &p.pauses {
        let (conn, args, id, live) = (conn.clone(), Arc::clone(&args), id.clone(), Arc::clone(&live));
        actions.push(tokio::spawn(async move {
            tokio::time::sleep_until(created_at + Duration::from_secs_f64(at)).await;
            let base = format!("/v1/video/streams/{id}");
            if post(&conn, &format!("{base}/pause"), &args.key, json!({})).await.is_ok() {
                live.lock().expect("live lock").player.pause(t(Instant::now()));
            }
            tokio::time::sleep(Duration::from_secs_f64(dur)).await;
            if post(&conn, &format!("{base}/resume"), &args.key, json!({})).await.is_ok() {
                live.lock().expect("live lock").player.resume(t(Instant::now()));
            }
        }));
    }
    let limit = Duration::from_secs_f64(f64::from(p.length_frames) / f64::from(args.fps) * 4.0 + 30.0);
    let read = read_feed(&conn, &args, &id, &live, &mut rec, created_at);
    if tokio::time::timeout(limit, read).await.is_err() {
        rec.end_reason = Some("client_timeout".into());
    }
    for a in actions {
        a.abort();
    }
    let l = live.lock().expect("live lock");
    rec.chunks = l.player.chunks;
    rec.on_time = l.player.on_time;
    rec.stalls = l.player.stalls;
    rec.stall_ms = l.player.stall_s * 1e3;
    rec.lateness_ms = l.player.lateness.iter().map(|x| x * 1e3).collect();
    rec
}

async fn read_feed(
    conn: &Conn,
    args: &VideoArgs,
    id: &str,
    live: &Mutex<Live>,
    rec: &mut StreamRecord,
    created_at: Instant,
) {
    let Ok(resp) = conn.get(&format!("/v1/video/streams/{id}/events"), Some(&args.key)).await else {
        rec.end_reason = Some("events_failed".into());
        return;
    };
    let mut body = resp.into_body();
    let mut parser = SseParser::new();
    while let Some(Ok(frame)) = body.frame().await {
        let Ok(data) = frame.into_data() else { continue };
        for e in parser.push(&data) {
            let now = created_at.elapsed().as_secs_f64();
            let v: serde_json::Value = serde_json::from_str(&e.data).unwrap_or_default();
            match e.event.as_deref() {
                Some("chunk") => {
                    let mut l = live.lock().expect("live lock");
                    if v["prompt_epoch"].as_u64().unwrap_or(0) < l.epoch {
                        continue; // made for a prompt the viewer left
                    }
                    l.player.arrive(now);
                    rec.ttfc_ms.get_or_insert(now * 1e3);
                    rec.quality.push(v["quality"].as_f64().unwrap_or(0.0));
                    if let Some(ms) = v["latency_ms"].as_f64() {
                        rec.chunk_ms.push(ms);
                    }
                    *rec.modes.entry(v["mode"].as_str().unwrap_or("?").to_string()).or_default() += 1;
                }
                Some("recovered") => rec.recoveries += 1,
                Some("end") => {
                    rec.rehomes = v["rehomes"].as_u64().unwrap_or(0);
                    rec.migration_stall_ms = v["migration_stall_ms"].as_f64().unwrap_or(0.0);
                    rec.end_reason = v["reason"].as_str().map(str::to_string);
                    return;
                }
                _ => {}
            }
        }
    }
}

/// Runs the workload and writes `results.json`; returns the results.
pub async fn run(args: VideoArgs) -> Result<VideoResults, String> {
    let planned = plan(args.workload, args.rate, args.duration, args.fps, args.seed);
    let conn = Conn::connect(&args.target, Some(&args.ca), Proto::H2).await.map_err(|e| e.to_string())?;
    let args = Arc::new(args);
    let origin = Instant::now() + Duration::from_millis(100);
    let total = planned.len();
    eprintln!(
        "video {}: {total} streams over {:.0} s at {} fps, {} frames per chunk",
        args.workload.label(),
        args.duration,
        args.fps,
        args.frames_per_chunk
    );
    let watcher = args.watch.start(&args.ca, args.duration as usize + 3600)?;
    let mut tasks = tokio::task::JoinSet::new();
    for (i, p) in planned.into_iter().enumerate() {
        let (conn, args) = (conn.clone(), Arc::clone(&args));
        tasks.spawn(async move { (i, one_stream(conn, args, p, origin).await) });
    }
    let mut records = vec![StreamRecord::default(); total];
    let mut progress = crate::progress::Progress::new(total);
    while let Some(done) = tasks.join_next().await {
        let (i, rec) = done.map_err(|e| e.to_string())?;
        records[i] = rec;
        progress.tick();
    }
    progress.done();
    let fleet = crate::watch::Watcher::finish(watcher).await;
    let summary = VideoSummary::of(&records);
    let video_minutes =
        summary.chunks as f64 * f64::from(args.frames_per_chunk) / f64::from(args.fps.max(1)) / 60.0;
    let cost_per_video_minute =
        fleet.as_ref().filter(|_| video_minutes > 0.0).map(|f| f.cost_usd / video_minutes);
    let results = VideoResults {
        schema: "slo-gateway.loadtest.video/v1".into(),
        workload: args.workload,
        rate: args.rate,
        duration_s: args.duration,
        seed: args.seed,
        fps: args.fps,
        frames_per_chunk: args.frames_per_chunk,
        summary,
        streams: records,
        fleet,
        video_minutes,
        cost_per_video_minute,
    };
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let path = args.out.join("results.json");
    let text = serde_json::to_string_pretty(&results).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(results)
}

fn ms(x: &Option<Summary>, pick: fn(&Summary) -> f64) -> String {
    x.as_ref().map_or("-".to_string(), |v| format!("{:.0}", pick(v)))
}

/// The summary as text.
pub fn render(r: &VideoResults) -> String {
    let s = &r.summary;
    format!(
        "workload {}: {} streams planned, {} created, {} rejected, {} failed\n\
         CPR {:.3} per-stream mean, {:.3} chunk-weighted over {} chunks | worst chunk {:.0} ms | TTFC p50 {} ms p95 {} ms | stalls {:.2} per stream ({:.2} s)\n\
         chunk lateness p50 {} ms p99 {} ms | mean quality {:.4} | modes {:?} | re-homes {} (stall {:.0} ms)",
        r.workload.label(),
        s.planned,
        s.created,
        s.rejected,
        s.failed,
        s.cpr_stream_mean,
        s.cpr,
        s.chunks,
        s.worst_chunk_ms,
        ms(&s.ttfc_ms, |v| v.p50),
        ms(&s.ttfc_ms, |v| v.p95),
        s.stalls_per_stream,
        s.stall_s_per_stream,
        ms(&s.lateness_ms, |v| v.p50),
        ms(&s.lateness_ms, |v| v.p99),
        s.mean_quality,
        s.modes,
        s.rehomes,
        s.migration_stall_ms
    ) + &r.fleet.as_ref().map_or(String::new(), |f| {
        format!(
            "\nfleet: {:.0} GPU-seconds, ${:.3}; {:.2} video minutes delivered: {}",
            f.gpu_seconds,
            f.cost_usd,
            r.video_minutes,
            r.cost_per_video_minute.map_or("-".into(), |c| format!("${c:.3} per video minute"))
        )
    })
}

/// Several runs as one Markdown table, one row per `(name, results)`.
pub fn table(runs: &[(String, VideoResults)]) -> String {
    let mut out = String::from(
        "| run | workload | streams | rejected | CPR (stream mean) | CPR (chunk-weighted) | TTFC p50 ms | TTFC p95 ms | stalls/stream | stall s/stream | lateness p99 ms | worst chunk ms | mean quality | re-homes | move stall ms |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for (name, r) in runs {
        let s = &r.summary;
        out.push_str(&format!(
            "| {name} | {} | {} | {} | {:.3} | {:.3} | {} | {} | {:.2} | {:.2} | {} | {:.0} | {:.4} | {} | {:.0} |\n",
            r.workload.label(),
            s.created,
            s.rejected,
            s.cpr_stream_mean,
            s.cpr,
            ms(&s.ttfc_ms, |v| v.p50),
            ms(&s.ttfc_ms, |v| v.p95),
            s.stalls_per_stream,
            s.stall_s_per_stream,
            ms(&s.lateness_ms, |v| v.p99),
            s.worst_chunk_ms,
            s.mean_quality,
            s.rehomes,
            s.migration_stall_ms
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_weights_cpr_by_chunk_and_counts_outcomes() {
        let stream = |chunks, on_time, stalls| StreamRecord {
            outcome: "created".into(),
            chunks,
            on_time,
            stalls,
            ttfc_ms: Some(500.0),
            quality: vec![1.0, 0.98],
            ..Default::default()
        };
        let rejected = StreamRecord {
            outcome: "rejected".into(),
            code: Some("video_capacity".into()),
            ..Default::default()
        };
        let s = VideoSummary::of(&[stream(10, 10, 0), stream(30, 15, 4), rejected]);
        assert_eq!((s.planned, s.created, s.rejected, s.failed), (3, 2, 1, 0));
        assert!((s.cpr - 25.0 / 40.0).abs() < 1e-9, "chunk-weighted: {}", s.cpr);
        assert!((s.cpr_stream_mean - 0.75).abs() < 1e-9, "stream mean: (1 + 0.5) / 2, {}", s.cpr_stream_mean);
        assert_eq!(s.stalls_per_stream, 2.0);
        assert!((s.mean_quality - 0.99).abs() < 1e-9);
        let results = VideoResults {
            schema: "x".into(),
            workload: VideoWorkload::Steady,
            rate: 1.0,
            duration_s: 1.0,
            seed: 1,
            fps: 16,
            frames_per_chunk: 12,
            summary: s,
            streams: vec![],
            fleet: None,
            video_minutes: 0.0,
            cost_per_video_minute: None,
        };
        let t = table(&[("arm".into(), results)]);
        assert!(t.lines().nth(2).unwrap().starts_with("| arm | steady | 2 | 1 | 0.750 | 0.625 |"), "{t}");
    }
}
