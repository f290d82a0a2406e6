//! `loadtest`: measure the gateway. See `loadtest --help`.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use loadtest::results::Results;

#[derive(Parser)]
#[command(name = "loadtest", version, about = "Load and latency measurements for the SLO-aware gateway")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Open-loop load: send a workload at a schedule (Poisson, bursts or a
    /// replayed trace), record every request, and write results.json and
    /// report.html to --out.
    Run(loadtest::run::RunArgs),
    /// Print the key figures of two results files side by side with ratios.
    Compare {
        /// Baseline results.json (A).
        a: PathBuf,
        /// Results to compare with it (B); ratios are B/A.
        b: PathBuf,
    },
    /// Per-tier figures of several runs in one Markdown table (TTFT, TLET,
    /// deadline misses, goodput, rejections, degradations, met-SLO share).
    Table {
        /// results.json files, one row per run within each tier.
        #[arg(required = true)]
        results: Vec<PathBuf>,
        /// Also TTFT p99 of requests scheduled in this window, seconds from
        /// the start: `FROM,TO` (e.g. the burst).
        #[arg(long, value_parser = loadtest::run::parse_window)]
        window: Option<(f64, f64)>,
    },
    /// The simulator against live runs of the same scenario: TTFT p50 and
    /// p95, goodput and deadline-miss rate per tier, with the simulator's
    /// error (Markdown; medians over runs when several are given). Exits 1
    /// if any figure is off by more than --tolerance.
    Calibrate {
        /// results.json of the live runs.
        #[arg(long, num_args = 1.., required = true)]
        live: Vec<PathBuf>,
        /// results.json of `loadtest sim` with the same flags and seeds.
        #[arg(long, num_args = 1.., required = true)]
        sim: Vec<PathBuf>,
        #[arg(long, default_value_t = 0.10)]
        tolerance: f64,
    },
    /// The fleet experiment table of several runs (Markdown): throughput,
    /// goodput, TTFT p95/p99, deadline misses, per-tier SLO satisfaction and
    /// its fairness index, GPU-hours, cost per 1M tokens, cold starts.
    FleetTable {
        #[arg(required = true)]
        results: Vec<PathBuf>,
    },
    /// The admission benchmark's regime sweep (loads x burst factors, arms,
    /// seeds) as one Markdown table, medians over seeds, with ours checked
    /// against B1 (goodput, met-SLO share per tier, misses, refusals and
    /// degradations where B1 does well). DIR/<cell>/seed-<n>/<arm>/results.json,
    /// as scripts/sim-regimes writes. Also writes DIR/regimes.json.
    Regimes { dir: PathBuf },
    /// Re-render report.html from a results.json.
    Report {
        results: PathBuf,
        /// Where to write the HTML (default: beside the results file).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// The same workload against several targets at stepped rates,
    /// interleaved: added latency over the first target and the highest
    /// sustainable rate of each (the proxy-overhead benchmark).
    Sweep(loadtest::sweep::SweepArgs),
    /// Many concurrent streamed chat completions held open against one
    /// target, and the resident memory of the target's process tree: idle,
    /// held, per stream (one JSON line on stdout)
    Streams(loadtest::streams::StreamsArgs),
    /// Video streams: a workload (steady, burst, prompt-switch, pause) of
    /// streams created, played out in real time and measured (CPR, TTFC,
    /// stalls, quality); writes results.json to --out.
    Video(loadtest::video::run::VideoArgs),
    /// Video results of several runs as one Markdown table.
    VideoTable {
        /// results.json files of `loadtest video`, one row each.
        files: Vec<std::path::PathBuf>,
    },
    /// A trivial streaming endpoint that answers at once, for measuring the
    /// harness itself.
    Sink(loadtest::sink::SinkArgs),
    /// Gateway overhead: the same requests through the gateway and straight
    /// to the engine, interleaved; prints added latency and TBT difference.
    Overhead(loadtest::overhead::OverheadArgs),
    /// The reliability suite: stalled readers, engine SIGSTOP/SIGKILL, Redis
    /// faults, a cancellation storm, 10,000 concurrent streams, policy
    /// reloads and slow connections against a real `gateway up` on
    /// loopback; writes results.json and table.md (docs/reliability.md).
    Chaos(loadtest::chaos::ChaosArgs),
    /// The fleet simulator: the same workload and schedule flags as `run`,
    /// sent in virtual time to simulated engines (timed by a latency
    /// profile) behind the production admission, routing, batching and
    /// autoscaling code; 16-256 engines, hours of traffic in seconds.
    /// Writes results.json (with engines over time, GPU-seconds and cost)
    /// and report.html to --out.
    Sim(loadtest::sim::SimArgs),
    /// TurboServe's video fleet experiments in virtual time: session traces
    /// with arrivals, departures and active/idle transitions placed,
    /// rebalanced and autoscaled by the production policy against the
    /// paper's baselines (`compare`), the volatility table's offline
    /// profiling (`levels`), placement time and its gap to an exhaustive
    /// oracle (`placement`). Prints Markdown; writes results.json to --out.
    SimVideo(loadtest::sim::video::bench::SimVideoArgs),
    /// GenServe's image + video co-serving experiments in virtual time over
    /// the production diffusion scheduler: the ablation (FCFS, +preemption,
    /// +DP, +SP switching), SLO scale, mix and arrival-rate sweeps, and the
    /// DP's decision time. Prints Markdown; writes results.json and SVG
    /// charts to --out.
    SimDiffusion(loadtest::diffusion::bench::SimDiffusionArgs),
    /// OServe's deployment planning (issue 25) against static deployments
    /// on traces of shifting workload-type mixes, at the capacity level
    /// (requests per second each sustains per segment), swept over spatial
    /// skew; planner time. Prints Markdown.
    SimOserve(loadtest::oserve::SimOserveArgs),
    /// OServe vs static deployments at the request level in virtual time:
    /// P99 latency and throughput per trace segment (issue 25).
    SimOserveLatency(loadtest::oserve::latency::LatencyArgs),
    /// Writes `sim-oserve-latency`'s trace for a seed as a CSV for
    /// `loadtest run --trace` (the live OServe benchmark).
    OserveTrace(loadtest::oserve::live::TraceArgs),
    /// Per trace segment of runs that replayed an `oserve-trace` CSV: P99
    /// E2E and TTFT, completed requests per second.
    OserveSegments(loadtest::oserve::live::SegmentsArgs),
    /// Trains the live planner's per-type LSTM forecasters (`[oserve]
    /// forecast = "lstm"`) on recorded runs or the generated trace; writes
    /// the model file.
    OserveTrain(loadtest::oserve::live::TrainArgs),
    /// Workload types (k-means over prompt and output tokens) refit from
    /// the completed requests of recorded runs; prints the policy file's
    /// `[oserve]` section.
    OserveFit(loadtest::oserve::OserveFitArgs),
    /// A latency profile per TP x PP configuration of the OServe cost model
    /// (70B on H200-class GPUs), for emulated engines of each configuration.
    OserveProfiles(loadtest::oserve::OserveProfilesArgs),
    /// A GenServe image + video trace (the `sim-diffusion` workloads) sent
    /// on time to a live gateway, each request with its deadline; SLO
    /// attainment per kind. Writes results.json to --out.
    Diffusion(loadtest::diffusion::live::DiffusionArgs),
    /// How long the control plane's decisions take on this machine: an
    /// admission decision and an autoscaler tick over --engines engines, a
    /// placement event over --placement-engines (medians, microseconds).
    DecisionCost {
        #[arg(long, default_value_t = 256)]
        engines: usize,
        #[arg(long, default_value_t = 64)]
        placement_engines: usize,
        #[arg(long, default_value = "policies/default.toml")]
        policies: PathBuf,
        #[arg(long, default_value = "policies/profiles/emulated-a100-8b.toml")]
        profile: PathBuf,
    },
}

fn regimes(dir: &std::path::Path) -> Result<(), String> {
    let cells = loadtest::regimes::load(dir)?;
    if cells.is_empty() {
        return Err(format!("{}: no DIR/<cell>/seed-<n>/<arm>/results.json found", dir.display()));
    }
    let json = serde_json::to_string_pretty(&cells).map_err(|e| e.to_string())?;
    let path = dir.join("regimes.json");
    std::fs::write(&path, json).map_err(|e| format!("{}: {e}", path.display()))?;
    print!("{}", loadtest::regimes::markdown(&cells));
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Run(args) => run(&args).await,
        Command::Compare { a, b } => compare(&a, &b),
        Command::Calibrate { live, sim, tolerance } => calibrate(&live, &sim, tolerance),
        Command::Table { results, window } => table(&results, window),
        Command::FleetTable { results } => {
            let runs = results
                .iter()
                .map(|p| Results::load(p).map_err(|e| e.to_string()))
                .collect::<Result<Vec<_>, _>>();
            runs.map(|r| print!("{}", loadtest::text::fleet_table(&r)))
        }
        Command::Report { results, out } => report(&results, out),
        Command::Regimes { dir } => regimes(&dir),
        Command::Sweep(args) => sweep(&args).await,
        Command::Streams(args) => match loadtest::streams::run(&args).await {
            Ok(r) => {
                println!("{}", serde_json::to_string(&r).unwrap_or_default());
                Ok(())
            }
            Err(e) => Err(e),
        },
        Command::Video(args) => video(args).await,
        Command::VideoTable { files } => video_table(&files),
        Command::Sink(args) => loadtest::sink::serve(args).await,
        Command::Overhead(args) => overhead(&args).await,
        Command::Chaos(args) => chaos(&args).await,
        Command::Sim(args) => sim(&args),
        Command::SimVideo(args) => loadtest::sim::video::bench::main(&args).map(|md| print!("{md}")),
        Command::SimDiffusion(args) => loadtest::diffusion::bench::main(&args).map(|md| print!("{md}")),
        Command::SimOserve(args) => loadtest::oserve::main(&args).map(|md| print!("{md}")),
        Command::SimOserveLatency(args) => loadtest::oserve::latency::main(&args).map(|md| print!("{md}")),
        Command::OserveTrace(args) => loadtest::oserve::live::write_trace(&args).map(|s| print!("{s}")),
        Command::OserveSegments(args) => loadtest::oserve::live::segments(&args).map(|md| print!("{md}")),
        Command::OserveTrain(args) => loadtest::oserve::live::train(&args).map(|s| print!("{s}")),
        Command::OserveFit(args) => loadtest::oserve::fit(&args).map(|toml| print!("{toml}")),
        Command::OserveProfiles(args) => {
            loadtest::oserve::write_profiles(&args).map(|paths| print!("{paths}"))
        }
        Command::Diffusion(args) => loadtest::diffusion::live::main(&args).await.map(|line| print!("{line}")),
        Command::DecisionCost { engines, placement_engines, policies, profile } => {
            decision_cost(engines, placement_engines, &policies, &profile)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadtest: {e}");
            ExitCode::FAILURE
        }
    }
}

fn decision_cost(
    engines: usize,
    placement_engines: usize,
    policies: &std::path::Path,
    profile: &std::path::Path,
) -> Result<(), String> {
    let read = |p: &std::path::Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
    let policy = policies::PolicyDocument::parse(&policies.display().to_string(), &read(policies)?)
        .map_err(|e| e.to_string())?;
    let profile = policies::LatencyProfile::parse(&profile.display().to_string(), &read(profile)?)
        .map_err(|e| e.to_string())?;
    println!("| decision | engines | p50 µs | p99 µs | max µs |\n|---|---:|---:|---:|---:|");
    for c in loadtest::decision_cost::run(&policy, &profile, engines, placement_engines) {
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.1} |",
            c.what, c.engines, c.micros.p50, c.micros.p99, c.micros.max
        );
    }
    Ok(())
}

fn sim(args: &loadtest::sim::SimArgs) -> Result<(), String> {
    let r = loadtest::sim::run(args).map_err(|e| e.to_string())?;
    if !args.quiet {
        print!("{}", loadtest::text::summary(&r.results));
    }
    let virtual_s = args.load.duration.as_secs_f64();
    eprintln!(
        "simulated {virtual_s:.0} s in {:.2} s of wall time ({} events, {:.0}x real time); wrote {}",
        r.wall_s,
        r.events,
        virtual_s / r.wall_s.max(1e-9),
        args.out.join("results.json").display()
    );
    Ok(())
}

async fn run(args: &loadtest::run::RunArgs) -> Result<(), String> {
    let r = loadtest::run::run(args).await.map_err(|e| e.to_string())?;
    if !args.quiet {
        print!("{}", loadtest::text::summary(&r));
    }
    eprintln!(
        "wrote {} and {}",
        args.out.join("results.json").display(),
        args.out.join("report.html").display()
    );
    Ok(())
}

async fn video(args: loadtest::video::run::VideoArgs) -> Result<(), String> {
    let out = args.out.clone();
    let r = loadtest::video::run::run(args).await?;
    println!("{}", loadtest::video::run::render(&r));
    eprintln!("wrote {}", out.join("results.json").display());
    Ok(())
}

fn video_table(files: &[std::path::PathBuf]) -> Result<(), String> {
    let mut runs = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        let r: loadtest::video::run::VideoResults =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", f.display()))?;
        let name = f
            .parent()
            .and_then(|p| p.file_name())
            .map_or_else(|| f.display().to_string(), |n| n.to_string_lossy().into_owned());
        runs.push((name, r));
    }
    print!("{}", loadtest::video::run::table(&runs));
    Ok(())
}

async fn sweep(args: &loadtest::sweep::SweepArgs) -> Result<(), String> {
    let r = loadtest::sweep::sweep(args).await.map_err(|e| e.to_string())?;
    print!("{}", loadtest::sweep::text(&r));
    eprintln!("wrote {}", args.run.out.join("sweep.json").display());
    Ok(())
}

fn table(paths: &[PathBuf], window: Option<(f64, f64)>) -> Result<(), String> {
    let runs =
        paths.iter().map(|p| Results::load(p).map_err(|e| e.to_string())).collect::<Result<Vec<_>, _>>()?;
    print!("{}", loadtest::text::tiers_table(&runs, window));
    Ok(())
}

fn compare(a: &std::path::Path, b: &std::path::Path) -> Result<(), String> {
    let (a, b) = (Results::load(a).map_err(|e| e.to_string())?, Results::load(b).map_err(|e| e.to_string())?);
    print!("{}", loadtest::text::compare(&a, &b));
    Ok(())
}

fn calibrate(live: &[PathBuf], sim: &[PathBuf], tolerance: f64) -> Result<(), String> {
    let load = |ps: &[PathBuf]| -> Result<Vec<Results>, String> {
        ps.iter().map(|p| Results::load(p).map_err(|e| e.to_string())).collect()
    };
    let (live, sim) = (load(live)?, load(sim)?);
    let (table, ok) = loadtest::text::calibration(&live, &sim, tolerance);
    print!("{table}");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the simulation is off by more than {:.0}% somewhere (rows marked no)",
            tolerance * 100.0
        ))
    }
}

fn report(path: &std::path::Path, out: Option<PathBuf>) -> Result<(), String> {
    let r = Results::load(path).map_err(|e| e.to_string())?;
    let out = out.unwrap_or_else(|| path.with_file_name("report.html"));
    std::fs::write(&out, loadtest::report::html(&r))
        .map_err(|e| format!("writing {}: {e}", out.display()))?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

async fn overhead(args: &loadtest::overhead::OverheadArgs) -> Result<(), String> {
    let r = loadtest::overhead::run(args).await.map_err(|e| e.to_string())?;
    let row = |name: &str, s: &loadtest::stats::Summary| {
        println!("{name:<28} {:>5} {:>9.3} {:>9.3} {:>9.3} {:>9.3}", s.count, s.p50, s.p90, s.p99, s.max)
    };
    println!("{:<28} {:>5} {:>9} {:>9} {:>9} {:>9}", "milliseconds", "n", "p50", "p90", "p99", "max");
    row("non-streaming via gateway", &r.nonstream_gateway_ms);
    row("non-streaming direct", &r.nonstream_direct_ms);
    row("TBT via gateway", &r.tbt_gateway_ms);
    row("TBT direct", &r.tbt_direct_ms);
    println!("added latency: p50 {:+.3} ms, p99 {:+.3} ms", r.added_p50_ms, r.added_p99_ms);
    println!("TBT difference: p50 {:+.3} ms, p99 {:+.3} ms", r.tbt_diff_p50_ms, r.tbt_diff_p99_ms);
    if let Some(p) = &r.proxy {
        row("non-streaming via proxy", &p.nonstream_ms);
        println!("proxy added latency: p50 {:+.3} ms, p99 {:+.3} ms", p.added_p50_ms, p.added_p99_ms);
        println!(
            "gateway/proxy added latency: p50 {:.2}, p99 {:.2}",
            r.added_p50_ms / p.added_p50_ms,
            r.added_p99_ms / p.added_p99_ms
        );
    }
    if let Some(path) = &args.out {
        let json = serde_json::to_string_pretty(&r).expect("reports serialise");
        std::fs::write(path, json).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

async fn chaos(args: &loadtest::chaos::ChaosArgs) -> Result<(), String> {
    if args.fleet {
        use loadtest::chaos::{fleet, fleet_run};
        let policy =
            std::fs::read_to_string(&args.policy).map_err(|e| format!("{}: {e}", args.policy.display()))?;
        let bins = fleet::Bins::beside(&args.gateway);
        let outcomes =
            fleet_run::run(&bins, &policy, args.fleet_scenario, &args.fleet_options(), &args.out).await?;
        println!("{}", fleet_run::table(&outcomes));
        println!("wrote {}/fleet.json and fleet.md", args.out.display());
        return Ok(());
    }
    let outcomes = loadtest::chaos::run(args).await?;
    println!("{}", loadtest::chaos::table(&outcomes));
    println!("wrote {}/results.json and table.md", args.out.display());
    Ok(())
}
