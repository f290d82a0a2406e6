//! The experiments of `loadtest sim-video` (docs/benchmarks/video.md, "Video
//! fleet control"):
//!
//! - `compare` (TurboServe §7.2-7.3): every arm on the same trace. Matched
//!   cost: the fixed-engine arms get ours' mean engine count, and their
//!   worst-case per-chunk latency is set beside ours'. Matched latency:
//!   each other arm's cheapest configuration (fixed arms: the fewest
//!   engines; `no-migration`: the best ρ̂ scaling of the level table) whose
//!   worst case is within ours', and its cost beside ours'.
//! - `levels` (Appendix A): segments of increasing burstiness; for each, a
//!   grid search over ρ̂ for the cheapest run within L_SLO; prints the
//!   `[[video.fleet.levels]]` rows.
//! - `oracles` (§7.4): ours' cost against the per-window ρ* oracle and
//!   the budget oracle (a lower bound) on the `levels` windows.
//! - `placement` (§7.4): placement time per event at 4-256 engines, and the
//!   gap to the exhaustive oracle on small mixed clusters.

use policies::video::fleet::{ChunkLatency, FleetConfig};
use serde::Serialize;
use std::path::PathBuf;

use super::trace::{self, Trace, TraceSpec};
use super::{run, Arm, Outcome, Setup, Transfer};
use crate::progress::Progress;
use crate::stats::median;

mod levels;
mod oracles;
mod placement;

use levels::levels;
use oracles::oracles;
use placement::placement;

/// Which experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Experiment {
    Compare,
    Levels,
    Oracles,
    Placement,
}

/// Options of `loadtest sim-video`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimVideoArgs {
    #[arg(long, value_enum, default_value = "compare")]
    pub experiment: Experiment,
    /// Session trace: table11 or t1-t6 (TurboServe Tables 11 and 12).
    #[arg(long, default_value = "t1")]
    pub trace: String,
    /// Cluster sizes (the most engines an arm may use); the trace is scaled
    /// so its busiest span's mean active sessions fill `--fill` of them.
    #[arg(long, value_delimiter = ',', default_value = "8,64,256")]
    pub engines: Vec<u32>,
    #[arg(long, default_value_t = 0.6)]
    pub fill: f64,
    /// Seeds 1..=N (trace generation); medians are reported.
    #[arg(long, default_value_t = 3)]
    pub seeds: u64,
    /// Mean arrivals per burst in the generated trace.
    #[arg(long, default_value_t = 3.0)]
    pub burst: f64,
    /// ℓ̂(1): one session's chunk alone, ms (LongLive-like: with the
    /// default coalescing cost and L_SLO, K = 5 as in TurboServe App. A).
    #[arg(long, default_value_t = 300.0)]
    pub chunk_ms: f64,
    #[arg(long, default_value_t = 0.3)]
    pub batch_cost: f64,
    /// L_SLO, ms.
    #[arg(long, default_value_t = 670.0)]
    pub slo_ms: f64,
    /// A chunk's playout duration, s.
    #[arg(long, default_value_t = 0.75)]
    pub chunk_s: f64,
    /// Seconds from asking for an engine to its serving (billed
    /// throughout): a worker with its checkpoint staged (TurboServe §6.2).
    #[arg(long, default_value_t = 5.0)]
    pub cold_start_s: f64,
    #[arg(long, default_value_t = 3.0)]
    pub gpu_hour: f64,
    /// Session state, MiB, growing by --growth-mib per chunk to twice this.
    #[arg(long, default_value_t = 64.0)]
    pub state_mib: f64,
    #[arg(long, default_value_t = 0.5)]
    pub growth_mib: f64,
    #[arg(long, value_enum, default_value = "async")]
    pub transfer: Transfer,
    /// Engine-to-engine throughput, MiB/s (default: RDMA class, as
    /// TurboServe's GPU-GPU path; the policy's own value is the live
    /// HTTP path's).
    #[arg(long, default_value_t = 10_000.0)]
    pub transfer_mib_per_s: f64,
    /// `--experiment levels`: how many volatility levels (TurboServe's
    /// Table 6 has 10).
    #[arg(long, default_value_t = 10)]
    pub levels: usize,
    /// `--experiment levels`: the volatility measure profiled (default:
    /// the policy's `volatility_measure`); `std` is TurboServe's plain
    /// standard deviation, `dispersion` std / √mean.
    #[arg(long, value_enum)]
    pub volatility: Option<Volatility>,
    /// The policy document whose `[video.fleet]` the arms run.
    #[arg(long, default_value = "policies/default.toml")]
    pub policies: PathBuf,
    /// Where results.json goes.
    #[arg(long, default_value = "bench-out/sim-video")]
    pub out: PathBuf,
}

/// `--volatility`: policies' [`VolatilityMeasure`] on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Volatility {
    Dispersion,
    Std,
}

impl From<Volatility> for policies::autoscale::VolatilityMeasure {
    fn from(v: Volatility) -> Self {
        match v {
            Volatility::Dispersion => Self::Dispersion,
            Volatility::Std => Self::Std,
        }
    }
}

impl SimVideoArgs {
    fn setup(&self, fleet: FleetConfig) -> Setup {
        let mut fleet = fleet;
        fleet.transfer_mib_per_s = self.transfer_mib_per_s;
        Setup {
            latency: ChunkLatency { chunk_ms: self.chunk_ms, batch_cost: self.batch_cost },
            slo_ms: self.slo_ms,
            chunk_s: self.chunk_s,
            fleet,
            cold_start_s: self.cold_start_s,
            gpu_hour: self.gpu_hour,
            state_mib: self.state_mib,
            growth_mib: self.growth_mib,
            window_chunks: 8.0,
            transfer: self.transfer,
            warmup_s: 0.0,
        }
    }
}

/// Runs the experiment; returns the Markdown report (also written with
/// results.json under `--out`).
pub fn main(args: &SimVideoArgs) -> Result<String, String> {
    let text =
        std::fs::read_to_string(&args.policies).map_err(|e| format!("{}: {e}", args.policies.display()))?;
    let doc = policies::PolicyDocument::parse(&args.policies.display().to_string(), &text)
        .map_err(|e| e.to_string())?;
    let spec = trace::spec(&args.trace)
        .ok_or_else(|| format!("unknown trace {:?}: one of {}", args.trace, trace::names().join(", ")))?;
    std::fs::create_dir_all(&args.out).map_err(|e| e.to_string())?;
    let (report, json) = match args.experiment {
        Experiment::Compare => compare(args, &spec, &doc.video.fleet),
        Experiment::Levels => levels(args, &doc.video.fleet),
        Experiment::Oracles => oracles(args, &doc.video.fleet),
        Experiment::Placement => placement(args, &doc.video.fleet),
    };
    let path = args.out.join("results.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&json).expect("serialises"))
        .map_err(|e| e.to_string())?;
    Ok(report)
}

fn scaled(args: &SimVideoArgs, spec: &TraceSpec, engines: u32, k: u32, seed: u64) -> Trace {
    let scale = f64::from(engines) * f64::from(k) * args.fill / spec.peak_active();
    trace::generate(spec, scale, args.burst, seed)
}

/// Per cluster size and arm: the latency and cost reductions of ours.
type Headline = (u32, Arm, f64, f64);

/// One cell of the comparison.
#[derive(Debug, Clone, Serialize)]
struct Cell {
    engines: u32,
    seed: u64,
    arm: Arm,
    /// At ours' mean engine count.
    matched_cost: Outcome,
    /// The cheapest configuration within ours' worst case (None: none is).
    matched_latency: Option<Outcome>,
}

/// The engines an autoscaled arm starts with: the first span's need.
fn initial(spec: &TraceSpec, trace_scale: f64, k: u32, cfg: &FleetConfig, most: u32) -> u32 {
    let need = spec.avg_active[0] * trace_scale / (f64::from(k) * cfg.table(most)[0].target_utilization);
    (need.ceil() as u32).clamp(cfg.min_engines, most)
}

fn compare(args: &SimVideoArgs, spec: &TraceSpec, fleet_cfg: &FleetConfig) -> (String, serde_json::Value) {
    let mut cells = Vec::new();
    let mut ours_runs = Vec::new();
    let total = args.engines.len() * args.seeds as usize;
    let mut progress = Progress::new(total);
    for &engines in &args.engines {
        let mut cfg = fleet_cfg.clone();
        cfg.max_engines = engines;
        cfg.autoscale = true;
        let setup = args.setup(cfg.clone());
        let k = setup.capacity();
        for seed in 1..=args.seeds {
            let trace = scaled(args, spec, engines, k, seed);
            let scale = f64::from(engines) * f64::from(k) * args.fill / spec.peak_active();
            let m0 = initial(spec, scale, k, &cfg, engines);
            let ours = run(&setup, &trace, Arm::Ours, m0, false);
            let m_cost = (ours.mean_engines.round() as u32).max(1);
            let target = ours.worst_ms;
            for arm in Arm::ALL.into_iter().filter(|a| *a != Arm::Ours) {
                let matched_cost = if arm.autoscales() {
                    run(&setup, &trace, arm, m0, false)
                } else {
                    run(&setup, &trace, arm, m_cost, false)
                };
                let matched_latency = if arm.autoscales() {
                    // The cheapest ρ̂ (the table's scaled down) within target.
                    (1..=16)
                        .map(|i| 1.0 - 0.05 * f64::from(i - 1))
                        .filter_map(|f| {
                            let mut c = cfg.clone();
                            for l in &mut c.levels {
                                l.target_utilization = (l.target_utilization * f).max(0.05);
                            }
                            let o = run(&args.setup(c), &trace, arm, m0, false);
                            (o.worst_ms <= target + 1e-6).then_some(o)
                        })
                        .min_by(|a, b| a.cost.total_cmp(&b.cost))
                } else {
                    fewest_within(engines * 4, target, |m| run(&setup, &trace, arm, m, false))
                };
                cells.push(Cell { engines, seed, arm, matched_cost, matched_latency });
            }
            if seed == 1 {
                let lag = cells.iter().rev().find(|c| c.engines == engines && c.arm == Arm::Lag);
                if let Some(lag) = lag {
                    let svg = timeline_svg(engines, k, &ours, lag);
                    let _ = std::fs::write(args.out.join(format!("timeline-{engines}.svg")), svg);
                }
            }
            ours_runs.push((engines, seed, ours));
            progress.tick();
        }
    }
    progress.done();
    let md = render_compare(args, spec, fleet_cfg, &cells, &ours_runs);
    let json = serde_json::json!({
        "experiment": "compare",
        "trace": spec.name,
        "ours": ours_runs.iter().map(|(e, s, o)| serde_json::json!({"engines": e, "seed": s, "outcome": o})).collect::<Vec<_>>(),
        "cells": cells,
    });
    (md, json)
}

/// The comparison as Markdown: per cluster size, every arm at matched cost
/// and matched latency beside ours (medians over seeds), then the averages
/// against the baselines and the ablation.
fn render_compare(
    args: &SimVideoArgs,
    spec: &TraceSpec,
    fleet_cfg: &FleetConfig,
    cells: &[Cell],
    ours_runs: &[(u32, u64, Outcome)],
) -> String {
    let mut md = format!(
        "trace {} (scaled to fill {:.0}% of each cluster at K), ℓ̂(1) = {} ms, coalescing cost {}, L_SLO = {} ms (K = {}), cold start {} s, {} transfer at {} MiB/s, {} seeds (medians)\n\n",
        spec.name,
        args.fill * 100.0,
        args.chunk_ms,
        args.batch_cost,
        args.slo_ms,
        args.setup(fleet_cfg.clone()).capacity(),
        args.cold_start_s,
        match args.transfer {
            Transfer::Sync => "sync",
            Transfer::Async => "async",
        },
        args.transfer_mib_per_s,
        args.seeds
    );
    let mut headline: Vec<Headline> = Vec::new();
    for &engines in &args.engines {
        let ours: Vec<&Outcome> =
            ours_runs.iter().filter(|(e, _, _)| *e == engines).map(|(_, _, o)| o).collect();
        let ours_worst = median(ours.iter().map(|o| o.worst_ms).collect());
        let ours_cost = median(ours.iter().map(|o| o.cost).collect());
        md.push_str(&format!("**{engines} engines**\n\n"));
        md.push_str("| arm | engines (matched cost) | worst-case ms | p99 ms | within L_SLO | latency vs ours | engines (matched latency) | cost $ | cost vs ours | migrations |\n");
        md.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        md.push_str(&format!(
            "| ours | {:.1} (auto) | {:.0} | {:.0} | {:.2}% | — | {:.1} (auto) | {:.2} | — | {:.0} |\n",
            median(ours.iter().map(|o| o.mean_engines).collect()),
            ours_worst,
            median(ours.iter().map(|o| o.p99_ms).collect()),
            100.0 * median(ours.iter().map(|o| o.pass_rate).collect()),
            median(ours.iter().map(|o| o.mean_engines).collect()),
            ours_cost,
            median(ours.iter().map(|o| o.migrations as f64).collect()),
        ));
        for arm in Arm::ALL.into_iter().filter(|a| *a != Arm::Ours) {
            let mine: Vec<&Cell> = cells.iter().filter(|c| c.engines == engines && c.arm == arm).collect();
            let worst = median(mine.iter().map(|c| c.matched_cost.worst_ms).collect());
            let lat_ratio = median(
                mine.iter()
                    .zip(&ours)
                    .map(|(c, o)| 1.0 - o.worst_ms / c.matched_cost.worst_ms.max(1e-9))
                    .collect(),
            );
            let matched: Vec<&Outcome> = mine.iter().filter_map(|c| c.matched_latency.as_ref()).collect();
            let cost = median(matched.iter().map(|o| o.cost).collect());
            let cost_ratio = median(
                mine.iter()
                    .zip(&ours)
                    .filter_map(|(c, o)| c.matched_latency.as_ref().map(|m| 1.0 - o.cost / m.cost.max(1e-12)))
                    .collect(),
            );
            let m_engines = if arm.autoscales() {
                format!("{:.1} (auto)", median(matched.iter().map(|o| o.mean_engines).collect()))
            } else {
                format!("{:.0}", median(matched.iter().filter_map(|o| o.engines.map(f64::from)).collect()))
            };
            let c_engines = if arm.autoscales() {
                format!("{:.1} (auto)", median(mine.iter().map(|c| c.matched_cost.mean_engines).collect()))
            } else {
                format!(
                    "{:.0}",
                    median(mine.iter().filter_map(|c| c.matched_cost.engines.map(f64::from)).collect())
                )
            };
            md.push_str(&format!(
                "| {} | {} | {:.0} | {:.0} | {:.2}% | {} | {} | {} | {} | {:.0} |\n",
                arm.label(),
                c_engines,
                worst,
                median(mine.iter().map(|c| c.matched_cost.p99_ms).collect()),
                100.0 * median(mine.iter().map(|c| c.matched_cost.pass_rate).collect()),
                pct_lower(lat_ratio),
                if matched.len() == mine.len() {
                    m_engines
                } else {
                    format!("{} of {} seeds", matched.len(), mine.len())
                },
                if matched.is_empty() { "—".into() } else { format!("{cost:.2}") },
                if matched.is_empty() { "—".into() } else { pct_lower(cost_ratio) },
                median(mine.iter().map(|c| c.matched_cost.migrations as f64).collect()),
            ));
            headline.push((engines, arm, lat_ratio, cost_ratio));
        }
        md.push('\n');
    }
    let baselines = [Arm::Base, Arm::Lag, Arm::Mag];
    let mean = |f: &dyn Fn(&Headline) -> f64, arms: &[Arm]| {
        let v: Vec<f64> =
            headline.iter().filter(|h| arms.contains(&h.1)).map(f).filter(|x| x.is_finite()).collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    md.push_str(&format!(
        "Against the baselines (base, +LAG, +MAG; mean over cluster sizes): worst-case per-chunk latency at matched cost {}; GPU cost at matched worst-case latency {}.\n",
        pct_lower(mean(&|h| h.2, &baselines)),
        pct_lower(mean(&|h| h.3, &baselines)),
    ));
    md.push_str(&format!(
        "Ablation at matched latency: disabling autoscaling costs {} more than ours, disabling migration {} more.\n",
        pct_more(mean(&|h| h.3, &[Arm::NoAutoscale])),
        pct_more(mean(&|h| h.3, &[Arm::NoMigration])),
    ));
    md
}

/// The run with the fewest fixed engines (1..=most) whose worst case is
/// within `target`, by bisection (the worst case falls as engines are
/// added, up to placement noise: the bisection's answer is then re-checked
/// one below).
fn fewest_within(most: u32, target: f64, run: impl Fn(u32) -> Outcome) -> Option<Outcome> {
    let ok = |o: &Outcome| o.worst_ms <= target + 1e-6;
    let top = run(most);
    if !ok(&top) {
        return None;
    }
    let (mut lo, mut hi, mut best) = (0u32, most, top);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        let o = run(mid);
        if ok(&o) {
            hi = mid;
            best = o;
        } else {
            lo = mid;
        }
    }
    Some(best)
}

/// Seed 1's run at one size as two charts: engines over time (ours, and
/// the fixed count base+LAG needs at matched latency) and the busiest
/// engine's sessions (ours, and base+LAG at matched cost) against K.
fn timeline_svg(engines: u32, k: u32, ours: &Outcome, lag: &Cell) -> String {
    use crate::svg::{Chart, Reference, Series};
    let line = |name: &str, o: &Outcome, pick: fn(&(f64, u32, u32, u32, u32)) -> u32| Series {
        name: name.into(),
        points: o.timeline.iter().map(|t| (t.0, Some(f64::from(pick(t))))).collect(),
    };
    let mut cost = Chart {
        title: format!("{engines}-engine cluster: engines billed"),
        x_label: "seconds".into(),
        y_label: "engines".into(),
        ..Chart::default()
    };
    cost.series.push(line("ours", ours, |t| t.1));
    cost.series.push(line("ours: active sessions / K", ours, |t| t.3));
    if let Some(m) = lag.matched_latency.as_ref().and_then(|o| o.engines) {
        cost.references.push(Reference {
            name: "base+LAG at matched latency".into(),
            y: f64::from(m),
            like_series: None,
        });
    }
    // Sessions / K as engines: scale the second series.
    if let Some(s) = cost.series.get_mut(1) {
        s.points.iter_mut().for_each(|p| p.1 = p.1.map(|v| v / f64::from(k.max(1))));
    }
    let mut busy = Chart {
        title: format!("{engines}-engine cluster: the busiest engine's sessions"),
        x_label: "seconds".into(),
        y_label: "sessions".into(),
        ..Chart::default()
    };
    busy.series.push(line("ours", ours, |t| t.4));
    busy.series.push(line("base+LAG at matched cost", &lag.matched_cost, |t| t.4));
    busy.references.push(Reference { name: "K".into(), y: f64::from(k), like_series: None });
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"640\" height=\"600\">{}<g transform=\"translate(0,300)\">{}</g></svg>",
        cost.render(),
        busy.render()
    )
}

/// "x% lower" from a reduction ratio r (1 − ours/theirs).
fn pct_lower(r: f64) -> String {
    if !r.is_finite() {
        "—".into()
    } else if r >= 0.0 {
        format!("{:.1}% lower", r * 100.0)
    } else {
        format!("{:.1}% higher", -r * 100.0)
    }
}

/// A cost reduction r = 1 − ours/theirs as "theirs is x% more than ours".
fn pct_more(r: f64) -> String {
    if !r.is_finite() || r >= 1.0 {
        "—".into()
    } else {
        format!("{:.1}%", (1.0 / (1.0 - r) - 1.0) * 100.0)
    }
}
