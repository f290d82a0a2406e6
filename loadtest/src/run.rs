//! `loadtest run`: plan, execute, summarise, write `results.json` and
//! `report.html`, print the summary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::arrival::{parse_trace, plan, Burst, Process, RateSpec, Schedule};
use crate::client::{ClientError, Proto};
use crate::results::{Results, RunInfo, SCHEMA};
use crate::runner::{execute, Api, Live, Target};
use crate::summary::{summarise, time_series, Slo};
use crate::workload::{Workload, WorkloadError};

/// Options of `loadtest run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Base URL of the target: the gateway (`https://...`), or an engine or
    /// proxy with `--api engine` (`http://` is HTTP/2 cleartext).
    #[arg(long, default_value = "https://localhost:8443")]
    pub target: String,
    /// CA certificate to trust for `https` targets.
    #[arg(long, default_value = "certs/ca.pem")]
    pub ca: PathBuf,
    /// Send every request with this API key instead of the workload's mix
    /// (tiers for reporting still come from the mix).
    #[arg(long)]
    pub key: Option<String>,
    /// The workload and its arrival schedule.
    #[command(flatten)]
    pub load: ScheduleArgs,
    /// Directory for results.json and report.html.
    #[arg(long, default_value = "loadtest-out")]
    pub out: PathBuf,
    /// Name for this run in reports and comparisons.
    #[arg(long)]
    pub label: Option<String>,
    /// HTTP version.
    #[arg(long, value_enum, default_value_t = Proto::H2)]
    pub proto: Proto,
    /// Wire API of the target.
    #[arg(long, value_enum, default_value_t = Api::Openai)]
    pub api: Api,
    /// HTTP/2 connections to spread requests over (HTTP/1.1: opened up
    /// front; more are opened while all are busy).
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Give up on a request this long after its scheduled send time.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Do not print the summary table.
    #[arg(long)]
    pub quiet: bool,
    /// Also summarise the requests scheduled in this window, seconds from
    /// the start: `FROM,TO` (a burst, or a steady run after its warm-up);
    /// written as `window` in results.json.
    #[arg(long, value_parser = parse_window)]
    pub window: Option<(f64, f64)>,
    #[command(flatten)]
    pub watch: crate::watch::WatchArgs,
}

/// What is sent and when: shared by `loadtest run` and `loadtest sim`, so
/// the same flags give the same requests at the same times.
#[derive(Debug, Clone, clap::Args)]
pub struct ScheduleArgs {
    /// Workload: a shipped name (chat, rag, tiny) or a TOML file.
    #[arg(long, default_value = "chat")]
    pub workload: String,
    /// Policy document whose tiers give the SLOs goodput is judged against.
    #[arg(long, default_value = "policies/default.toml")]
    pub policies: PathBuf,
    /// Mean arrival rate, requests per second (ignored with --trace).
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Length of the arrival schedule: seconds, or with a unit (500ms, 30s, 2m).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Spacing of arrivals.
    #[arg(long, value_enum, default_value_t = Process::Poisson)]
    pub process: Process,
    /// Burst: multiply the rate by this factor (1 = no burst).
    #[arg(long, default_value_t = 1.0)]
    pub burst_factor: f64,
    /// Burst: when the ramp up starts.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub burst_at: Duration,
    /// Burst: length of the ramp up (and of the ramp down).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub burst_ramp: Duration,
    /// Burst: how long the peak holds.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub burst_hold: Duration,
    /// Replay this CSV trace (timestamp, input tokens, output tokens; the
    /// Azure LLM inference trace layout) instead of generating arrivals.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Replay the trace this many times faster.
    #[arg(long, default_value_t = 1.0)]
    pub trace_speed: f64,
    /// Seed for arrivals, tenants, sizes and prompts.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// `500ms`, `30s`, `2m`, `1h` or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("not a duration: {s:?} (try 30s, 500ms, 2m)"))?;
    Duration::try_from_secs_f64(v * mult).map_err(|e| format!("{s:?}: {e}"))
}

/// `FROM,TO` in seconds from the start (a window such as a burst).
pub fn parse_window(s: &str) -> Result<(f64, f64), String> {
    let (a, b) = s.split_once(',').ok_or("expected FROM,TO in seconds")?;
    let p = |x: &str| x.trim().parse::<f64>().map_err(|e| format!("{x:?}: {e}"));
    let (a, b) = (p(a)?, p(b)?);
    if a < b {
        Ok((a, b))
    } else {
        Err("FROM must be before TO".into())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error("policies: {0}")]
    Policies(String),
    #[error("trace {0}: {1}")]
    Trace(String, String),
    #[error("{0}")]
    Args(String),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("writing {0}: {1}")]
    Write(String, std::io::Error),
}

/// The SLOs of every tier in the policy document at `path`.
pub fn tier_slos(path: &Path) -> Result<BTreeMap<String, Slo>, RunError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| RunError::Policies(format!("{}: {e}", path.display())))?;
    let doc = policies::PolicyDocument::parse(&path.display().to_string(), &text)
        .map_err(|e| RunError::Policies(e.to_string()))?;
    Ok(doc
        .tiers
        .iter()
        .map(|t| {
            let slo = Slo { ttft_ms: t.ttft.as_secs_f64() * 1e3, e2e_ms: t.e2e.as_secs_f64() * 1e3 };
            (t.name.clone(), slo)
        })
        .collect())
}

pub fn schedule(a: &ScheduleArgs) -> Result<(Schedule, String), RunError> {
    let duration_s = a.duration.as_secs_f64();
    if let Some(path) = &a.trace {
        let shown = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| RunError::Trace(shown.clone(), e.to_string()))?;
        let rows = parse_trace(&text).map_err(|e| RunError::Trace(shown.clone(), e))?;
        if a.trace_speed.is_nan() || a.trace_speed <= 0.0 {
            return Err(RunError::Args("--trace-speed must be > 0".into()));
        }
        let words = format!("trace {shown} at {}x", a.trace_speed);
        return Ok((Schedule::Trace { rows, speed: a.trace_speed, duration_s }, words));
    }
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(a.rate) || !positive(a.burst_factor) {
        return Err(RunError::Args("--rate and --burst-factor must be positive".into()));
    }
    let burst = (a.burst_factor != 1.0).then_some(Burst {
        factor: a.burst_factor,
        at_s: a.burst_at.as_secs_f64(),
        ramp_s: a.burst_ramp.as_secs_f64(),
        hold_s: a.burst_hold.as_secs_f64(),
    });
    let mut words = format!("{:?} {} req/s for {duration_s} s", a.process, a.rate).to_lowercase();
    if let Some(b) = burst {
        words += &format!(", burst x{} at {} s (ramp {} s, hold {} s)", b.factor, b.at_s, b.ramp_s, b.hold_s);
    }
    Ok((Schedule::Rate(RateSpec { rate: a.rate, duration_s, process: a.process, burst }), words))
}

/// Runs the load test and writes its outputs; returns the results.
pub async fn run(a: &RunArgs) -> Result<Results, RunError> {
    let workload = Workload::load(&a.load.workload)?;
    let slos = tier_slos(&a.load.policies)?;
    let (sched, words) = schedule(&a.load)?;
    let planned = plan(&workload, &sched, a.load.seed);
    std::fs::create_dir_all(&a.out).map_err(|e| RunError::Write(a.out.display().to_string(), e))?;
    let target = Target {
        url: a.target.trim_end_matches('/').to_string(),
        ca: a.target.starts_with("https").then(|| a.ca.clone()),
        proto: a.proto,
        api: a.api,
        connections: a.connections.max(1),
        timeout: a.timeout,
        key: a.key.clone(),
    };
    let live = Arc::new(Live::default());
    let duration_s = a.load.duration.as_secs_f64();
    let progress = tokio::spawn(crate::progress::watch_run(live.clone(), planned.len(), duration_s));
    let started_unix_s =
        crate::clock::wall().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let watcher = a.watch.start(&a.ca, duration_s as usize + 600).map_err(RunError::Args)?;
    let records = execute(&target, &workload, &planned, a.load.seed, live).await;
    let fleet = crate::watch::Watcher::finish(watcher).await;
    let records = match records {
        Ok(r) => {
            let _ = progress.await;
            r
        }
        Err(e) => {
            progress.abort();
            return Err(e.into());
        }
    };
    let results = Results {
        schema: SCHEMA.into(),
        run: RunInfo {
            label: a.label.clone().unwrap_or_else(|| workload.name.clone()),
            target: target.url.clone(),
            api: format!("{:?}", a.api).to_lowercase(),
            proto: format!("{:?}", a.proto).to_lowercase(),
            connections: target.connections,
            workload: workload.name.clone(),
            schedule: words,
            duration_s,
            seed: a.load.seed,
            planned: planned.len(),
            started_unix_s,
            harness_version: env!("CARGO_PKG_VERSION").into(),
        },
        summary: summarise(&records, planned.len(), duration_s, &slos),
        timeseries: time_series(&records, duration_s),
        window: a.window.map(|w| crate::summary::window(&records, w, &slos)),
        slos,
        records,
        fleet,
    };
    write(&a.out.join("results.json"), &results.to_json())?;
    write(&a.out.join("report.html"), &crate::report::html(&results))?;
    Ok(results)
}

fn write(path: &Path, text: &str) -> Result<(), RunError> {
    std::fs::write(path, text).map_err(|e| RunError::Write(path.display().to_string(), e))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("soon").unwrap_err().contains("not a duration"));
        assert!(parse_duration("-1s").is_err());
    }
}
