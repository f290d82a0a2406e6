//! `loadtest run --watch-fleet`: samples a live gateway's `/admin/fleet`
//! every second while the run goes, so live autoscaling runs carry the same
//! `fleet` part (engines over time, decisions, GPU-seconds and cost) as
//! simulated ones.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::client::{body_bytes, Conn, Proto};
use crate::results::{Fleet, ScaleEvent};

/// The `--watch-fleet` flags, shared by `loadtest run` and `loadtest video`.
#[derive(Debug, Clone, clap::Args)]
pub struct WatchArgs {
    /// Sample this gateway admin listener's `/admin/fleet` every second
    /// (`https://localhost:9444`): engines over time, autoscaling decisions,
    /// GPU-seconds and cost go into results.json (and the report).
    #[arg(long)]
    pub watch_fleet: Option<String>,
    /// Admin token for --watch-fleet (a file holding it).
    #[arg(long, default_value = "certs/admin.token")]
    pub admin_token_file: PathBuf,
    /// Backend label of the watched fleet (emulated, cpu, cuda).
    #[arg(long, default_value = "emulated")]
    pub backend: String,
}

/// A running watch; [`Watcher::finish`] stops it and returns the fleet.
#[derive(Debug)]
pub struct Watcher {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Option<Fleet>>,
}

impl WatchArgs {
    /// Starts watching when --watch-fleet was given (`ca` trusts the admin
    /// listener), for at most `max_samples` seconds of samples.
    pub fn start(&self, ca: &Path, max_samples: usize) -> Result<Option<Watcher>, String> {
        let Some(admin) = &self.watch_fleet else { return Ok(None) };
        let token = std::fs::read_to_string(&self.admin_token_file)
            .map_err(|e| format!("{}: {e}", self.admin_token_file.display()))?;
        let t =
            WatchTarget { admin: admin.clone(), ca: Some(ca.to_path_buf()), token: token.trim().to_string() };
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(watch(t, self.backend.clone(), Arc::clone(&stop), max_samples.min(100_000)));
        Ok(Some(Watcher { stop, task }))
    }
}

impl Watcher {
    /// Stops sampling; the fleet over the run (None if the gateway never answered).
    pub async fn finish(w: Option<Self>) -> Option<Fleet> {
        let w = w?;
        w.stop.store(true, Ordering::Relaxed);
        w.task.await.ok().flatten()
    }
}

/// Where to watch.
#[derive(Debug, Clone)]
pub struct WatchTarget {
    /// The gateway's admin listener, `https://host:port`.
    pub admin: String,
    pub ca: Option<PathBuf>,
    pub token: String,
}

async fn sample(conn: &Conn, token: &str) -> Option<serde_json::Value> {
    let resp = tokio::time::timeout(Duration::from_secs(2), conn.get("/admin/fleet", Some(token)))
        .await
        .ok()?
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    serde_json::from_slice(&body_bytes(resp).await.ok()?).ok()
}

fn sum(v: &serde_json::Value) -> f64 {
    v.as_object().map_or(0.0, |m| m.values().filter_map(serde_json::Value::as_f64).sum())
}

/// Samples until `stop`, then returns the fleet over the run (backend
/// `backend`). Bounded: one sample a second, at most `max_samples`.
pub async fn watch(
    t: WatchTarget,
    backend: String,
    stop: Arc<AtomicBool>,
    max_samples: usize,
) -> Option<Fleet> {
    let conn = Conn::connect(&t.admin, t.ca.as_deref(), Proto::H2).await.ok()?;
    let first = sample(&conn, &t.token).await?;
    let t0 = first["now_s"].as_f64().unwrap_or(0.0);
    let (gpu0, cost0, tokens0) =
        (sum(&first["gpu_seconds"]), sum(&first["cost_usd"]), first["output_tokens"].as_u64().unwrap_or(0));
    let cold0 = first["supervisor"]["cold_starts"].as_u64().unwrap_or(0);
    let mut f = Fleet { backend, bin_s: 1.0, ..Fleet::default() };
    let mut last = first;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    while !stop.load(Ordering::Relaxed) && f.serving.len() < max_samples {
        tick.tick().await;
        let Some(v) = sample(&conn, &t.token).await else { continue };
        let e = &v["supervisor"]["engines"];
        let n = |k: &str| e[k].as_f64().unwrap_or(0.0);
        f.serving.push(n("serving"));
        f.warm.push(n("warm"));
        f.starting.push(n("starting") + n("restarting"));
        f.draining.push(n("draining"));
        let desired = v["classes"]
            .as_object()
            .and_then(|c| c.values().next())
            .and_then(|c| c["desired_serving"].as_f64());
        f.desired.push(desired.unwrap_or(n("serving")));
        last = v;
    }
    f.decisions = last["decisions"]
        .as_array()
        .map(|ds| {
            ds.iter()
                .filter_map(|d| {
                    let at = d["at_s"].as_f64()? - t0;
                    (at >= 0.0).then(|| ScaleEvent {
                        at_s: at,
                        serving: d["serving"].as_u64().unwrap_or(0) as u32,
                        warm: d["warm"].as_u64().unwrap_or(0) as u32,
                        why: d["why"].as_str().unwrap_or("").to_string(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    f.gpu_seconds = sum(&last["gpu_seconds"]) - gpu0;
    f.cost_usd = sum(&last["cost_usd"]) - cost0;
    f.output_tokens = last["output_tokens"].as_u64().unwrap_or(0).saturating_sub(tokens0);
    f.cost_per_1m_output_tokens = (f.output_tokens > 0).then(|| f.cost_usd / f.output_tokens as f64 * 1e6);
    f.cold_starts = last["supervisor"]["cold_starts"].as_u64().unwrap_or(0).saturating_sub(cold0);
    Some(f)
}
