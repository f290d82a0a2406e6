//! `loadtest chaos`: the reliability suite. Each scenario starts a real
//! `gateway up` (and `redis-server` where it needs one) on loopback, runs
//! protected traffic while it injects a fault or hostile load, and reports
//! requests lost, errors by kind, recovery time and the gateway's RSS,
//! against the target docs/reliability.md sets. Every loop is bounded in
//! count and time; nothing leaves loopback.

pub mod fleet;
pub mod fleet_run;
pub mod hosts;
pub mod load;
pub mod scenarios;
pub mod system;

use std::path::PathBuf;

use scenarios::Outcome;

/// The scenarios, in the order `all` runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    All,
    /// 256 never-reading streams of one tenant; another is served.
    Stalled,
    /// An engine SIGSTOPped mid-stream under load, then SIGCONT.
    Sigstop,
    /// An engine SIGKILLed mid-stream under load.
    Sigkill,
    /// Redis killed, restarted, paused and resumed under load.
    Redis,
    /// 1,200 open streams, 1,000 of them reset at once.
    CancelStorm,
    /// 10,000 concurrent SSE streams held for a minute.
    Streams,
    /// 20 policy reloads under load.
    Reloads,
    /// Idle TCP, trickled HTTP/1.1 heads and idle HTTP/2 connections.
    Slowloris,
}

#[derive(Debug, clap::Args)]
pub struct ChaosArgs {
    /// Which scenario (`all`: every one, about 8 minutes).
    #[arg(long, value_enum, default_value_t = Scenario::All)]
    pub scenario: Scenario,
    /// The gateway binary (`cargo build --release -p gateway`).
    #[arg(long, default_value = "target/release/gateway")]
    pub gateway: PathBuf,
    /// Concurrent streams of the `streams` scenario.
    #[arg(long, default_value_t = 10_000)]
    pub streams: usize,
    /// How long the `streams` scenario holds them, seconds.
    #[arg(long, default_value_t = 60)]
    pub hold_s: u32,
    /// Where results.json and table.md (fleet.json and fleet.md) go.
    #[arg(long, default_value = "out/chaos")]
    pub out: PathBuf,
    /// Run the multi-host fleet scenarios instead (issue 52): Redis with a
    /// replica and 3 sentinels, 3 gateways and 4 engines on hosts of their
    /// own (network namespaces: root and iproute2), faults under load.
    #[arg(long)]
    pub fleet: bool,
    /// Which fleet scenario (`all`: every one, `--runs` times each).
    #[arg(long, value_enum, default_value_t = fleet_run::FleetScenario::All)]
    pub fleet_scenario: fleet_run::FleetScenario,
    /// Fleet: streamed chats a second (three tenants in turn).
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// Fleet: output tokens per chat.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: u32,
    /// Fleet: live video streams, each with a client that resumes its feed.
    #[arg(long, default_value_t = 4)]
    pub video: u32,
    /// Fleet: how long a cut lasts, seconds.
    #[arg(long, default_value_t = 60)]
    pub cut_s: u64,
    /// Fleet: load before each fault and after it ends, seconds.
    #[arg(long, default_value_t = 10)]
    pub settle_s: u64,
    /// Fleet: runs of each scenario, each on a fresh fleet.
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Fleet: the gateways' policy document.
    #[arg(long, default_value = "policies/default.toml")]
    pub policy: PathBuf,
}

impl ChaosArgs {
    pub fn fleet_options(&self) -> fleet_run::FleetOptions {
        fleet_run::FleetOptions {
            rate: self.rate,
            max_tokens: self.max_tokens,
            video: self.video,
            cut_s: self.cut_s,
            settle_s: self.settle_s,
            runs: self.runs,
        }
    }
}

/// Runs the chosen scenarios one after another; writes results.json and a
/// Markdown table; fails if a scenario could not run.
pub async fn run(args: &ChaosArgs) -> Result<Vec<Outcome>, String> {
    use Scenario::*;
    let chosen: Vec<Scenario> = match args.scenario {
        All => vec![Stalled, Sigstop, Sigkill, Redis, CancelStorm, Streams, Reloads, Slowloris],
        one => vec![one],
    };
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let scratch = std::env::temp_dir().join(format!("loadtest-chaos-{}", std::process::id()));
    let bin = &args.gateway;
    let mut outcomes = Vec::new();
    for (i, s) in chosen.iter().enumerate() {
        eprintln!("chaos: [{}/{}] {s:?} ...", i + 1, chosen.len());
        let started = crate::clock::now();
        let o = match s {
            Stalled => scenarios::stalled_readers(bin, &scratch).await,
            Sigstop => scenarios::engine_fault(bin, &scratch, "STOP").await,
            Sigkill => scenarios::engine_fault(bin, &scratch, "KILL").await,
            Redis => scenarios::redis_faults(bin, &scratch).await,
            CancelStorm => scenarios::cancellation_storm(bin, &scratch, 1200, 1000).await,
            Streams => scenarios::many_streams(bin, &scratch, args.streams, args.hold_s).await,
            Reloads => scenarios::reloads(bin, &scratch).await,
            Slowloris => scenarios::slow_connections(bin, &scratch).await,
            All => unreachable!("expanded above"),
        }?;
        eprintln!(
            "chaos: [{}/{}] {} in {:.0} s: {} of {} protected requests ok, {} lost, target {}",
            i + 1,
            chosen.len(),
            o.name,
            crate::clock::since(started).as_secs_f64(),
            o.protected.ok,
            o.protected.requests,
            o.lost,
            if o.met { "met" } else { "NOT met" }
        );
        outcomes.push(o);
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let json = serde_json::to_string_pretty(&outcomes).expect("outcomes serialise");
    std::fs::write(args.out.join("results.json"), json).map_err(|e| e.to_string())?;
    std::fs::write(args.out.join("table.md"), table(&outcomes)).map_err(|e| e.to_string())?;
    Ok(outcomes)
}

/// One row per scenario.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut s = String::from(
        "| scenario | protected requests ok | lost | errors by kind | TTFT p50 / p99 ms | recovery s | gateway RSS idle → peak MiB | target met |\n\
         |---|---:|---:|---|---:|---:|---:|---|\n",
    );
    for o in outcomes {
        let kinds: Vec<String> = o.protected.by_kind.iter().map(|(k, n)| format!("{k}: {n}")).collect();
        let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
        s.push_str(&format!(
            "| {} | {} / {} | {} | {} | {} / {} | {} | {:.1} → {:.1} | {} |\n",
            o.name,
            o.protected.ok,
            o.protected.requests,
            o.lost,
            if kinds.is_empty() { "none".into() } else { kinds.join(", ") },
            ms(o.protected.ttft_p50_ms),
            ms(o.protected.ttft_p99_ms),
            o.recovery_s.map_or("-".into(), |r| format!("{r:.1}")),
            o.rss_idle_kib as f64 / 1024.0,
            o.rss_peak_kib as f64 / 1024.0,
            if o.met { "yes" } else { "**no**" },
        ));
    }
    s
}
