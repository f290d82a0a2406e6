//! `--experiment levels`: TurboServe Appendix A's offline profiling of the
//! volatility table.

use policies::autoscale::VolatilityMeasure;
use policies::video::fleet::FleetConfig;
use serde::Serialize;

use super::super::trace::{self, Kind, Trace, TraceSpec};
use super::super::{run, with_rho, Arm, Outcome};
use super::{initial, median, SimVideoArgs};
use crate::progress::Progress;

#[derive(Debug, Clone, Serialize)]
struct Segment {
    trace: String,
    seed: u64,
    from_s: f64,
    volatility: f64,
    /// The highest ρ̂ of the grid whose worst case meets L_SLO (None: none).
    rho: Option<f64>,
    worst_ms: f64,
    cost: f64,
}

/// σ over `[from_s, to_s)` of a trace: `measure` of activations per
/// `bin_s` bin (the scaler's measure).
fn trace_volatility(t: &Trace, measure: VolatilityMeasure, bin_s: f64, from_s: f64, to_s: f64) -> f64 {
    let bins = (((to_s - from_s) / bin_s).ceil() as usize).max(1);
    let mut counts = vec![0.0f64; bins];
    let activations = t.events.iter().filter(|e| matches!(e.kind, Kind::Arrive | Kind::Resume));
    for e in activations.filter(|e| e.at >= from_s && e.at < to_s) {
        counts[(((e.at - from_s) / bin_s) as usize).min(bins - 1)] += 1.0;
    }
    measure.of(&counts)
}

/// The bundled traces the profile replays.
pub(super) const TRACES: [&str; 6] = ["t1", "t2", "t3", "t4", "t5", "t6"];
/// Where each trace's windows start, s (the run before is warm-up).
pub(super) const STARTS: [f64; 3] = [60.0, 120.0, 180.0];
pub(super) const WINDOW_S: f64 = 120.0;
/// The ρ̂ grid: 0.30 to 0.90 in steps of 0.05.
pub(super) const GRID: [f64; 13] = [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9];

/// One profiling window: its trace cut at the window's end, replayed from
/// the start with the run before `from_s` as unmeasured warm-up.
pub(super) struct Window<'a> {
    pub name: &'static str,
    pub seed: u64,
    pub from_s: f64,
    pub to_s: f64,
    pub trace: Trace,
    args: &'a SimVideoArgs,
    spec: &'a TraceSpec,
    scale: f64,
    k: u32,
    engines: u32,
}

impl Window<'_> {
    /// The full controller (`Arm::Ours`) under `cfg` over this window.
    pub fn replay(&self, cfg: &FleetConfig) -> Outcome {
        let mut setup = self.args.setup(cfg.clone());
        setup.warmup_s = self.from_s;
        run(&setup, &self.trace, Arm::Ours, initial(self.spec, self.scale, self.k, cfg, self.engines), false)
    }
}

/// Calls `f` on every window of every bundled trace and seed ([`TRACES`],
/// `--seeds`, [`STARTS`]), traces scaled to `engines` of capacity `k`, with
/// a progress bar.
pub(super) fn each_window(args: &SimVideoArgs, engines: u32, k: u32, mut f: impl FnMut(&Window)) {
    let mut progress = Progress::new(TRACES.len() * args.seeds as usize);
    for name in TRACES {
        let spec = trace::spec(name).expect("bundled");
        let scale = f64::from(engines) * f64::from(k) * args.fill / spec.peak_active();
        for seed in 1..=args.seeds {
            let full = trace::generate(&spec, scale, args.burst, seed);
            for &from_s in &STARTS {
                let to_s = from_s + WINDOW_S;
                let trace = truncate(&full, to_s);
                f(&Window { name, seed, from_s, to_s, trace, args, spec: &spec, scale, k, engines });
            }
            progress.tick();
        }
    }
    progress.done();
}

/// The events of `t` before `to_s`, as a trace that ends there.
pub(super) fn truncate(t: &Trace, to_s: f64) -> Trace {
    Trace {
        sessions: t.sessions,
        events: t.events.iter().copied().filter(|e| e.at < to_s).collect(),
        duration_s: to_s,
    }
}

/// Every window's volatility and the highest ρ̂ of the grid whose worst
/// case meets L_SLO, calmest first.
fn segments(args: &SimVideoArgs, cfg: &FleetConfig, engines: u32, k: u32) -> Vec<Segment> {
    let measure = cfg.volatility_measure;
    let mut segments = Vec::new();
    each_window(args, engines, k, |w| {
        let volatility = trace_volatility(&w.trace, measure, cfg.volatility_bin_s, w.from_s, w.to_s);
        let mut seg = Segment {
            trace: w.name.into(),
            seed: w.seed,
            from_s: w.from_s,
            volatility,
            rho: None,
            worst_ms: f64::NAN,
            cost: f64::NAN,
        };
        for &rho in GRID.iter().rev() {
            let o = w.replay(&with_rho(cfg, rho));
            if o.worst_ms <= args.slo_ms {
                (seg.rho, seg.worst_ms, seg.cost) = (Some(rho), o.worst_ms, o.cost);
                break;
            }
        }
        segments.push(seg);
    });
    segments.sort_by(|a, b| a.volatility.total_cmp(&b.volatility));
    segments
}

/// Appendix A's offline profiling: 2-minute windows of every bundled trace
/// (t1-t6, each seed, starting at 60, 120 and 180 s; the run before the
/// window is its warm-up, not measured or billed) are replayed through the
/// full controller for each ρ̂ of the grid; each window keeps the highest ρ̂
/// whose worst case meets L_SLO. Windows sorted by volatility fall into
/// `--levels` equal groups; a level's ρ̂ is the lowest its windows need
/// (every window of the level within L_SLO), never above the calmer
/// level's.
pub(super) fn levels(args: &SimVideoArgs, fleet_cfg: &FleetConfig) -> (String, serde_json::Value) {
    let engines = args.engines.first().copied().unwrap_or(64);
    let mut cfg = fleet_cfg.clone();
    cfg.max_engines = engines;
    if let Some(v) = args.volatility {
        cfg.volatility_measure = v.into();
    }
    let measure = cfg.volatility_measure;
    let k = args.setup(cfg.clone()).capacity();
    let segments = segments(args, &cfg, engines, k);
    // `--levels` groups as equal as the windows allow (54 in 10: 5 or 6).
    let n_levels = args.levels.clamp(1, segments.len().max(1));
    let bounds: Vec<usize> = (0..=n_levels).map(|l| l * segments.len() / n_levels).collect();
    let groups: Vec<&[Segment]> = bounds.windows(2).map(|w| &segments[w[0]..w[1]]).collect();
    let mut md = format!(
        "Offline profiling at {engines} engines (K = {k}), σ = {measure:?}, L_SLO = {} ms, ρ̂ grid 0.30-0.90, λ = {}, {} windows of 120 s from t1-t6 × {} seeds:\n\n| level | windows | σ from | σ to | ρ̂ | windows within L_SLO at some ρ̂ | their ρ̂ (min / median / max) |\n| ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
        args.slo_ms,
        cfg.levels[0].lambda,
        segments.len(),
        args.seeds
    );
    let mut toml = String::new();
    let mut last_rho = f64::INFINITY;
    let mut rows = Vec::new();
    for (l, group) in groups.into_iter().enumerate() {
        let feasible: Vec<f64> = group.iter().filter_map(|s| s.rho).collect();
        let rho = feasible.iter().copied().fold(f64::INFINITY, f64::min).min(last_rho);
        let rho = if rho.is_finite() { rho } else { GRID[0] };
        let above = if l == 0 {
            0.0
        } else {
            ((segments[bounds[l] - 1].volatility + group[0].volatility) / 2.0 * 100.0).round() / 100.0
        };
        md.push_str(&format!(
            "| {} | {} | {:.2} | {:.2} | {rho:.2} | {} of {} | {:.2} / {:.2} / {:.2} |\n",
            l + 1,
            group.len(),
            group[0].volatility,
            group[group.len() - 1].volatility,
            feasible.len(),
            group.len(),
            feasible.iter().copied().fold(f64::INFINITY, f64::min),
            median(feasible.clone()),
            feasible.iter().copied().fold(0.0, f64::max),
        ));
        if rho < last_rho {
            toml.push_str(&format!(
                "[[video.fleet.levels]]\nengines = {engines}\nabove = {above}\ntarget_utilization = {rho:.2}\nlambda = {}\n\n",
                cfg.levels[0].lambda
            ));
        }
        rows.push(serde_json::json!({"level": l + 1, "above": above, "rho": rho}));
        last_rho = rho;
    }
    md.push_str(&format!(
        "\nThe `[[video.fleet.levels]]` rows (levels with the same ρ̂ merged):\n\n```toml\n{toml}```\n"
    ));
    (md, serde_json::json!({"experiment": "levels", "levels": rows, "segments": segments}))
}
