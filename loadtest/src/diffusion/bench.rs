//! `loadtest sim-diffusion`: GenServe's experiments in virtual time over
//! the production scheduler (docs/benchmarks/diffusion.md, "Image and video
//! co-serving"):
//! - `ablation`: SAR of FCFS, + preemption, + DP, + SP switching (§6 Fig. 14);
//! - `sigma`: requests meeting their SLO vs σ ∈ [0.8, 1.5] (Fig. 10);
//! - `mix`: SAR per workload mix (Fig. 11); `rate`: SAR vs 12-36 req/min (Fig. 12);
//! - `solver`: the DP's decision time vs concurrent video groups (Table 6).

use std::path::PathBuf;

use policies::diffusion::{DiffusionProfile, Mode, SchedConfig};
use serde::Serialize;

use super::sim::{self, Outcome};
use super::workload::{self, Mix, Resolutions, Spec};
use crate::progress::Progress;
use crate::stats::median;
use crate::svg::{Chart, Series};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Experiment {
    Ablation,
    Sigma,
    Mix,
    Rate,
    Solver,
    All,
}

/// Options of `loadtest sim-diffusion`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimDiffusionArgs {
    #[arg(long, value_enum, default_value = "all")]
    pub experiment: Experiment,
    /// GPUs (engines) in the pool.
    #[arg(long, default_value_t = 8)]
    pub gpus: usize,
    /// Requests per minute (the anchor; `rate` sweeps 12-36).
    #[arg(long, default_value_t = 24.0)]
    pub rate: f64,
    /// SLO scale σ (the anchor; `sigma` sweeps 0.8-1.5).
    #[arg(long, default_value_t = 1.0)]
    pub sigma: f64,
    #[arg(long, value_enum, default_value = "balanced")]
    pub mix: Mix,
    #[arg(long, value_enum, default_value = "skewed")]
    pub resolutions: Resolutions,
    /// Requests per run (the paper counts 100).
    #[arg(long, default_value_t = 100)]
    pub requests: usize,
    /// Seeds 1..=N; medians are reported.
    #[arg(long, default_value_t = 5)]
    pub seeds: u64,
    #[arg(long, default_value_t = 5)]
    pub video_seconds: u32,
    /// Denoising steps per video round (Δ_round).
    #[arg(long, default_value_t = 5)]
    pub round_steps: u32,
    /// SP degree without elastic SP (and of the solo latency σ scales).
    #[arg(long, default_value_t = 2)]
    pub default_sp: u32,
    #[arg(long, default_value = "policies/profiles/genserve-emulated.toml")]
    pub profile: PathBuf,
    #[arg(long, default_value = "bench-out/sim-diffusion")]
    pub out: PathBuf,
}

const MODES: [Mode; 4] = [Mode::Fcfs, Mode::Preempt, Mode::Dp, Mode::GenServe];

/// Median outcome of one cell over seeds.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub mode: &'static str,
    pub label: String,
    pub x: f64,
    pub sar: f64,
    pub image_sar: f64,
    pub video_sar: f64,
    pub met: f64,
    pub mean_image_wait_s: f64,
    pub pauses: f64,
    pub sp_changes: f64,
}

impl SimDiffusionArgs {
    fn spec(&self) -> Spec {
        Spec {
            mix: self.mix,
            resolutions: self.resolutions,
            rate_per_min: self.rate,
            sigma: self.sigma,
            requests: self.requests,
            video_seconds: self.video_seconds,
        }
    }

    fn cfg(&self, mode: Mode) -> SchedConfig {
        SchedConfig {
            mode,
            round_steps: self.round_steps,
            default_sp: self.default_sp,
            ..SchedConfig::default()
        }
    }

    fn cell(&self, profile: &DiffusionProfile, spec: &Spec, mode: Mode, label: String, x: f64) -> Cell {
        let cfg = self.cfg(mode);
        let runs: Vec<Outcome> = (1..=self.seeds)
            .map(|seed| sim::run(&workload::generate(spec, profile, &cfg, seed), self.gpus, profile, &cfg))
            .collect();
        let m = |f: &dyn Fn(&Outcome) -> f64| median(runs.iter().map(f).collect());
        Cell {
            mode: mode.name(),
            label,
            x,
            sar: m(&|o| o.sar),
            image_sar: m(&|o| o.image_sar),
            video_sar: m(&|o| o.video_sar),
            met: m(&|o| (o.images_met + o.videos_met) as f64),
            mean_image_wait_s: m(&|o| o.mean_image_wait_ms / 1000.0),
            pauses: m(&|o| o.stats.pauses as f64),
            sp_changes: m(&|o| o.stats.sp_changes as f64),
        }
    }
}

/// Runs the experiments; returns the Markdown report (also written, with
/// results.json and SVG charts, under `--out`).
pub fn main(args: &SimDiffusionArgs) -> Result<String, String> {
    let text =
        std::fs::read_to_string(&args.profile).map_err(|e| format!("{}: {e}", args.profile.display()))?;
    let profile =
        DiffusionProfile::parse(&args.profile.display().to_string(), &text).map_err(|e| e.to_string())?;
    args.cfg(Mode::GenServe).validate()?;
    std::fs::create_dir_all(&args.out).map_err(|e| e.to_string())?;
    let all = args.experiment == Experiment::All;
    let want = |e: Experiment| all || args.experiment == e;
    let mut md = format!(
        "{} GPUs, profile `{}` ({}), {} requests per run, {}-second videos, Δ_round = {} steps, default SP {}, {} seeds (medians), backend `simulated`\n\n",
        args.gpus,
        profile.model,
        profile.engine_class,
        args.requests,
        args.video_seconds,
        args.round_steps,
        args.default_sp,
        args.seeds
    );
    let mut json = serde_json::Map::new();
    let sweeps: [(Experiment, &str); 4] = [
        (Experiment::Ablation, "ablation"),
        (Experiment::Sigma, "sigma"),
        (Experiment::Mix, "mix"),
        (Experiment::Rate, "rate"),
    ];
    let todo: Vec<_> = sweeps.iter().filter(|(e, _)| want(*e)).collect();
    let mut progress = Progress::new(todo.len() * 8 * MODES.len());
    for (e, name) in todo {
        let points = points(args, *e);
        let mut cells = Vec::new();
        for (label, x, spec) in &points {
            for mode in MODES {
                cells.push(args.cell(&profile, spec, mode, label.clone(), *x));
                progress.tick();
            }
        }
        md.push_str(&render(*e, &cells));
        if points.len() > 1 {
            let _ = std::fs::write(args.out.join(format!("{name}.svg")), chart(*e, &cells));
        }
        json.insert(name.to_string(), serde_json::to_value(&cells).expect("serialises"));
    }
    progress.done();
    if want(Experiment::Solver) {
        let (text, rows) = solver(args, &profile);
        md.push_str(&text);
        json.insert("solver".into(), rows);
    }
    let path = args.out.join("results.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&json).expect("serialises"))
        .map_err(|e| e.to_string())?;
    Ok(md)
}

/// The sweep's points: (label, x, spec); the anchor for the ablation.
fn points(args: &SimDiffusionArgs, e: Experiment) -> Vec<(String, f64, Spec)> {
    let base = args.spec();
    match e {
        Experiment::Sigma => [0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
            .iter()
            .map(|&s| (format!("σ = {s}"), s, Spec { sigma: s, ..base.clone() }))
            .collect(),
        Experiment::Mix => Mix::ALL
            .iter()
            .enumerate()
            .map(|(i, &m)| (m.name().to_string(), i as f64, Spec { mix: m, ..base.clone() }))
            .collect(),
        Experiment::Rate => [12.0, 18.0, 24.0, 30.0, 36.0]
            .iter()
            .map(|&r| (format!("{r} req/min"), r, Spec { rate_per_min: r, ..base.clone() }))
            .collect(),
        _ => vec![(
            format!(
                "{} mix, {:?} resolutions, {} req/min, σ = {}",
                base.mix.name(),
                base.resolutions,
                base.rate_per_min,
                base.sigma
            ),
            0.0,
            base,
        )],
    }
}

fn render(e: Experiment, cells: &[Cell]) -> String {
    let title = match e {
        Experiment::Ablation => "Ablation (cumulative)",
        Experiment::Sigma => "Requests meeting SLO vs σ",
        Experiment::Mix => "SAR vs workload mix",
        Experiment::Rate => "SAR vs arrival rate",
        _ => "",
    };
    let mut md = format!("**{title}**\n\n| setting | scheduler | SAR | image SAR | video SAR | met | mean image wait | pauses | SP changes |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for c in cells {
        md.push_str(&format!(
            "| {} | {} | {:.0}% | {:.0}% | {:.0}% | {:.0} | {:.1} s | {:.0} | {:.0} |\n",
            c.label,
            c.mode,
            c.sar,
            c.image_sar,
            c.video_sar,
            c.met,
            c.mean_image_wait_s,
            c.pauses,
            c.sp_changes
        ));
    }
    md.push('\n');
    md
}

fn chart(e: Experiment, cells: &[Cell]) -> String {
    let (title, x_label) = match e {
        Experiment::Sigma => ("Requests meeting SLO vs σ", "SLO scale σ"),
        Experiment::Mix => ("SAR vs mix (0 image-heavy, 1 balanced, 2 video-heavy)", "mix"),
        _ => ("SAR vs arrival rate", "requests / minute"),
    };
    let series = MODES
        .iter()
        .map(|m| Series {
            name: m.name().to_string(),
            points: cells
                .iter()
                .filter(|c| c.mode == m.name())
                .map(|c| (c.x, Some(if e == Experiment::Sigma { c.met } else { c.sar })))
                .collect(),
        })
        .collect();
    let y_label = if e == Experiment::Sigma { "requests meeting SLO" } else { "SAR %" };
    Chart {
        title: title.into(),
        x_label: x_label.into(),
        y_label: y_label.into(),
        series,
        ..Chart::default()
    }
    .render()
}

/// DP decision time vs concurrent video groups G on `--gpus` GPUs (five
/// candidates per group: wait and SP 1, 2, 4, 8), with images waiting.
fn solver(args: &SimDiffusionArgs, profile: &DiffusionProfile) -> (String, serde_json::Value) {
    use policies::diffusion::{plan_dp, Gpu, ImageReq, Place, Snapshot, VideoReq};
    let cfg = args.cfg(Mode::GenServe);
    let avail: Vec<Gpu> = (0..args.gpus as Gpu).collect();
    let mut md = String::from("**DP decision time vs concurrent video groups** (this machine, release build)\n\n| groups | mean | p99 | max |\n|---:|---:|---:|---:|\n");
    let mut rows = Vec::new();
    for g in [1usize, 2, 4, 6, 8, 10, 12] {
        let frames = profile.frames(args.video_seconds);
        let videos: Vec<VideoReq> = (0..g)
            .map(|i| VideoReq {
                id: i as u64,
                size: i % profile.videos.len(),
                frames,
                arrival_ms: 0.0,
                deadline_ms: 30_000.0 + 5_000.0 * i as f64,
                steps_left: 10 + (i as u32 * 7) % 40,
                place: if i < 2 { Place::Boundary { gpus: vec![i as Gpu] } } else { Place::Queued },
            })
            .collect();
        let images: Vec<ImageReq> = (0..6)
            .map(|i| ImageReq {
                id: 100 + i,
                size: i as usize % profile.images.len(),
                arrival_ms: 0.0,
                deadline_ms: 3_000.0,
            })
            .collect();
        let snap = Snapshot {
            now_ms: 1.0,
            avail: &avail,
            images: &images,
            videos: &videos,
            image_reserve: 0,
            idle: false,
        };
        let mut us: Vec<f64> = (0..2000)
            .map(|_| {
                let t = crate::clock::now();
                std::hint::black_box(plan_dp(&snap, profile, &cfg));
                crate::clock::since(t).as_secs_f64() * 1e6
            })
            .collect();
        us.sort_by(f64::total_cmp);
        let mean = us.iter().sum::<f64>() / us.len() as f64;
        let p99 = us[us.len() * 99 / 100];
        let max = us[us.len() - 1];
        md.push_str(&format!("| {g} | {:.1} µs | {:.1} µs | {:.1} µs |\n", mean, p99, max));
        rows.push(serde_json::json!({"groups": g, "mean_us": mean, "p99_us": p99, "max_us": max}));
    }
    md.push('\n');
    (md, serde_json::Value::Array(rows))
}
