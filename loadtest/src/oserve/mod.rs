//! `loadtest sim-oserve`: OServe's deployment planning (issue 25) against
//! static deployments on traces of shifting workload-type mixes, at the
//! capacity level: for each trace segment, the requests per second each
//! deployment sustains in that segment's mix (the max concurrent flow of
//! the lower level, `policies::oserve::deploy::mix_capacity`), under the
//! cost model of `policies::oserve::capacity` (backend `simulated`).
//!
//! Traces (the Azure traces the paper uses cannot be fetched here): four
//! types (SISO, SILO, LISO, LILO centroids); each segment's type shares
//! have a controlled coefficient of variation (spatial skew, `--cv`), with
//! the dominant type rotating, and each segment moves `--shift` of the way
//! from the previous segment's mix to a fresh one (temporal shift).
//!
//! Planners: `static` (the best homogeneous deployment for the trace's
//! average mix, fixed), `static+reload` (the best homogeneous deployment
//! for each segment's mix, its reload time ignored: an upper bound on
//! reloading), `oserve` (the flow-guided search per segment for the
//! segment's mix: an oracle forecast), `oserve (last mix)` (planned on the
//! previous segment's mix: the naive forecast).
//!
//! Forecasts: per-type arrivals per minute over 6 hours (a 60-minute cycle
//! per type with its own phase, a level shift of some types at 3 h 20 min,
//! Poisson-like noise); each predictor is fitted on the first 4 hours and
//! scored by its one-step RRMSE on the last 2 (the LSTM over the last 50
//! minutes as in the paper, Holt-Winters with a 60-minute season, the
//! 5-minute moving average).
//!
//! Not measured here: latency (P99) and the cost of switching.

use std::fmt::Write as _;

mod fleet;
pub mod latency;
pub mod live;

use policies::oserve::capacity::CostModel;
use policies::oserve::deploy::{min_gpus, mix_capacity, search_mix, Deployment};
use policies::oserve::forecast::{moving_average, rrmse, HoltWinters, Lstm};
use policies::rng::SplitMix;

/// The four types' centroids, (input, output) tokens.
pub const TYPES: [(f64, f64); 4] = [(200.0, 100.0), (200.0, 1500.0), (6000.0, 100.0), (6000.0, 1500.0)];
pub const NAMES: [&str; 4] = ["SISO", "SILO", "LISO", "LILO"];

/// `--gpu`: the cost model's GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Gpu {
    /// H100-80GB, the paper's testbed: little KV room on 2 GPUs.
    H100,
    /// H200-141GB: room for long contexts on 2 GPUs.
    H200,
}

/// `--model`: the served model of the cost model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Model {
    /// Llama-2-70B: grouped KV (327,680 bytes per token), TP 1/2/4/8.
    #[default]
    #[value(name = "llama-70b")]
    Llama70b,
    /// OPT-66B, the paper's Table 3 model: full multi-head KV (2.36 MB per
    /// token), 72 heads (TP 1/2/3/4/6/8).
    #[value(name = "opt-66b")]
    Opt66b,
}

impl Model {
    pub fn label(self) -> &'static str {
        match self {
            Model::Llama70b => "Llama-2-70B",
            Model::Opt66b => "OPT-66B",
        }
    }
}

impl Gpu {
    /// Llama-2-70B on this GPU.
    pub fn model(self) -> CostModel {
        self.cost(Model::Llama70b)
    }

    /// `model` on this GPU.
    pub fn cost(self, model: Model) -> CostModel {
        match (model, self) {
            (Model::Llama70b, Gpu::H100) => CostModel::LLAMA70B_H100,
            (Model::Llama70b, Gpu::H200) => CostModel::LLAMA70B_H200,
            (Model::Opt66b, Gpu::H100) => CostModel::OPT66B_H100,
            (Model::Opt66b, Gpu::H200) => CostModel::OPT66B_H200,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Gpu::H100 => "H100-80GB",
            Gpu::H200 => "H200-141GB",
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct SimOserveArgs {
    /// The GPU of the cost model.
    #[arg(long, value_enum, default_value_t = Gpu::H200)]
    pub gpu: Gpu,
    /// The served model of the cost model.
    #[arg(long, value_enum, default_value_t = Model::Llama70b)]
    pub model: Model,
    /// GPUs in the fleet.
    #[arg(long, default_value_t = 16)]
    pub gpus: u32,
    /// Trace segments (planning intervals).
    #[arg(long, default_value_t = 6)]
    pub segments: usize,
    /// Spatial skew: the coefficient of variation of each segment's type
    /// shares. Several values give the sensitivity table.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.3,0.5,0.7")]
    pub cv: Vec<f64>,
    /// Temporal shift: how far each segment's mix moves from the last one
    /// (0: fixed mix, 1: a fresh mix each segment).
    #[arg(long, default_value_t = 0.7)]
    pub shift: f64,
    /// Seeds 1..=N; medians of the ratios are reported.
    #[arg(long, default_value_t = 5)]
    pub seeds: u64,
    /// Search iterations per plan.
    #[arg(long, default_value_t = 50)]
    pub iterations: usize,
    /// LSTM training passes over the forecast trace.
    #[arg(long, default_value_t = 40)]
    pub epochs: usize,
}

/// Shares of `n` types with coefficient of variation `cv` (as close as the
/// simplex allows), the largest on type `dominant`.
pub fn shares(rng: &mut SplitMix, n: usize, cv: f64, dominant: usize) -> Vec<f64> {
    let mut z: Vec<f64> = (0..n).map(|_| rng.unit_f64()).collect();
    let mean = z.iter().sum::<f64>() / n as f64;
    z.iter_mut().for_each(|v| *v -= mean);
    let sd = (z.iter().map(|v| v * v).sum::<f64>() / n as f64).sqrt().max(1e-12);
    // Put the largest deviation on the dominant type.
    let top = (0..n).max_by(|&a, &b| z[a].total_cmp(&z[b])).unwrap_or(0);
    z.swap(top, dominant);
    let s: Vec<f64> = z.iter().map(|v| (1.0 + cv * v / sd).max(0.01)).collect();
    let total: f64 = s.iter().sum();
    s.iter().map(|v| v / total).collect()
}

/// The coefficient of variation of `v`.
pub fn cv_of(v: &[f64]) -> f64 {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt() / mean
}

/// The first line of a report: the fleet, the trace and the types.
pub(crate) fn header(
    (gpu, model): (Gpu, Model),
    gpus: u32,
    segments: &str,
    shift: f64,
    seeds: u64,
    level: &str,
) -> String {
    let types: Vec<String> = NAMES.iter().zip(TYPES).map(|(n, (i, o))| format!("{n} ({i}/{o})")).collect();
    format!(
        "{gpus} GPUs ({} cost model, {}), {segments}, shift {shift}, {seeds} seeds (medians), types {}; backend `simulated` ({level})\n\n",
        gpu.label(),
        model.label(),
        types.join(", ")
    )
}

/// The paper's workload compositions (Table 1, S1-S5), as shares of
/// SISO / SILO / LISO / LILO (the paper lists SILO/LILO/SISO/LISO).
pub const PAPER_MIXES: [(&str, [f64; 4]); 5] = [
    ("S1", [0.273, 0.263, 0.202, 0.262]),
    ("S2", [0.242, 0.300, 0.178, 0.280]),
    ("S3", [0.355, 0.188, 0.268, 0.189]),
    ("S4", [0.411, 0.132, 0.315, 0.142]),
    ("S5", [0.471, 0.082, 0.366, 0.082]),
];

/// The paper's temporal traces (Table 2): the compositions they move
/// through.
pub const PAPER_TRACES: [(&str, [&str; 3]); 4] = [
    ("T1", ["S1", "S2", "S1"]),
    ("T2", ["S1", "S3", "S2"]),
    ("T3", ["S2", "S4", "S3"]),
    ("T4", ["S1", "S4", "S5"]),
];

/// The mixes of `segments` segments of the paper's trace or composition
/// `name` (`T1`-`T4`: each composition held for an equal share of the
/// segments; `S1`-`S5`: one composition throughout); `None` for another
/// name.
pub fn paper_trace(name: &str, segments: usize) -> Option<Vec<Vec<f64>>> {
    let mix = |s: &str| PAPER_MIXES.iter().find(|(n, _)| *n == s).map(|(_, m)| m.to_vec());
    if let Some(m) = mix(name) {
        return Some(vec![m; segments]);
    }
    let (_, seq) = PAPER_TRACES.iter().find(|(n, _)| *n == name)?;
    (0..segments).map(|i| mix(seq[(i * seq.len() / segments.max(1)).min(seq.len() - 1)])).collect()
}

/// The 99th percentile (nearest rank) of `v`; NaN when empty.
pub(crate) fn p99(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1]
}

/// A trace: one mix per segment.
pub fn trace(seed: u64, segments: usize, cv: f64, shift: f64) -> Vec<Vec<f64>> {
    let mut rng = SplitMix(seed);
    let mut out: Vec<Vec<f64>> = Vec::with_capacity(segments);
    for s in 0..segments {
        let fresh = shares(&mut rng, TYPES.len(), cv, s % TYPES.len());
        let mix = match out.last() {
            None => fresh,
            Some(prev) => prev.iter().zip(&fresh).map(|(p, f)| (1.0 - shift) * p + shift * f).collect(),
        };
        out.push(mix);
    }
    out
}

/// Every homogeneous deployment of `gpus` GPUs the model fits: as many
/// replicas of each configuration as fit.
pub(crate) fn homogeneous(model: &CostModel, gpus: u32) -> Vec<Deployment> {
    model
        .configurations()
        .into_iter()
        .filter(|p| p.gpus() <= gpus)
        .map(|p| Deployment { replicas: vec![p; (gpus / p.gpus()) as usize] })
        .collect()
}

pub(crate) fn best_static(model: &CostModel, gpus: u32, mix: &[f64]) -> (Deployment, f64) {
    homogeneous(model, gpus)
        .into_iter()
        .map(|d| {
            let c = mix_capacity(model, &d, &TYPES, mix);
            (d, c)
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or((Deployment { replicas: Vec::new() }, 0.0))
}

/// OServe's plan for `mix`: the search for the highest rate sustained in
/// that mix.
fn oserve_plan(model: &CostModel, gpus: u32, mix: &[f64], iterations: usize) -> Option<Deployment> {
    search_mix(model, gpus, &TYPES, mix, iterations).map(|p| p.deployment)
}

/// Per (cv, seed): the four planners' mean capacity over the segments.
struct Run {
    cv: f64,
    measured_cv: f64,
    capacity: [f64; 4],
    plan_ms: Vec<f64>,
    example: Vec<(Vec<f64>, Deployment, f64, f64)>,
}

fn run(model: &CostModel, args: &SimOserveArgs, cv: f64, seed: u64) -> Run {
    let mixes = trace(seed, args.segments, cv, args.shift);
    let n = TYPES.len() as f64;
    let avg: Vec<f64> = (0..TYPES.len()).map(|j| mixes.iter().map(|m| m[j]).sum::<f64>() / n).collect();
    let (fixed, _) = best_static(model, args.gpus, &avg);
    let (mut sum, mut plan_ms, mut example) = ([0.0; 4], Vec::new(), Vec::new());
    let mut last: Option<Deployment> = None;
    for mix in &mixes {
        let t = clock::now();
        let plan = oserve_plan(model, args.gpus, mix, args.iterations).unwrap_or_else(|| fixed.clone());
        plan_ms.push(clock::since(t).as_secs_f64() * 1e3);
        let stale = last.clone().unwrap_or_else(|| fixed.clone());
        let caps = [
            mix_capacity(model, &fixed, &TYPES, mix),
            best_static(model, args.gpus, mix).1,
            mix_capacity(model, &plan, &TYPES, mix),
            mix_capacity(model, &stale, &TYPES, mix),
        ];
        sum.iter_mut().zip(caps).for_each(|(s, c)| *s += c);
        example.push((mix.clone(), plan.clone(), caps[0], caps[2]));
        last = Some(plan);
    }
    let segs = mixes.len() as f64;
    let measured_cv = mixes.iter().map(|m| cv_of(m)).sum::<f64>() / segs;
    Run { cv, measured_cv, capacity: sum.map(|s| s / segs), plan_ms, example }
}

/// Requests per second per GPU of each type on each configuration, and the
/// most any deployment can gain over each homogeneous one in any mix
/// ([`CostModel::gain_bound`]).
fn bound_table(model: &CostModel) -> String {
    let configs = model.configurations();
    let mut md = String::from(
        "\nRequests per second per GPU under the cost model, and the most any deployment of these configurations can sustain of any mix over the homogeneous one (`CostModel::gain_bound`):\n\n| configuration |",
    );
    for n in NAMES {
        let _ = write!(md, " {n} |");
    }
    md.push_str(" gain bound |\n|---|");
    md.push_str(&"---:|".repeat(NAMES.len() + 1));
    md.push('\n');
    for p in configs {
        let _ = write!(md, "| {p} |");
        for (i, o) in TYPES {
            let _ = write!(md, " {:.3} |", model.capacity(p, i, o) / f64::from(p.gpus()));
        }
        let _ = writeln!(md, " {:.2}x |", model.gain_bound(p, &TYPES));
    }
    md
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// `loadtest oserve-profiles`: a latency profile per parallel configuration.
#[derive(clap::Args, Debug, Clone)]
pub struct OserveProfilesArgs {
    /// Folder to write `oserve-70b-h200-<config>.toml` into.
    #[arg(long, default_value = "policies/profiles")]
    pub out: std::path::PathBuf,
    /// Largest replica, in GPUs.
    #[arg(long, default_value_t = 8)]
    pub max_gpus: u32,
}

/// Writes every configuration's profile the model fits; returns the paths.
pub fn write_profiles(args: &OserveProfilesArgs) -> Result<String, String> {
    let model = CostModel::LLAMA70B_H200;
    std::fs::create_dir_all(&args.out).map_err(|e| e.to_string())?;
    let mut out = String::new();
    // The power-of-two replicas the shipped policies deploy.
    for g in (0..=3).map(|e| 1u32 << e).filter(|&g| g <= args.max_gpus) {
        for p in model.splits(g).into_iter().filter(|p| p.tp.is_power_of_two()) {
            let name = format!("oserve-70b-h200-{}", p.to_string().to_lowercase());
            let path = args.out.join(format!("{name}.toml"));
            std::fs::write(&path, model.profile_toml(p, "llama-70b", &name))
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let _ = writeln!(out, "{}", path.display());
        }
    }
    Ok(out)
}

/// `loadtest oserve-fit`: workload types refit from recorded traffic.
#[derive(clap::Args, Debug, Clone)]
pub struct OserveFitArgs {
    /// results.json files of live or simulated runs (their completed
    /// requests' prompt and output tokens are the samples).
    #[arg(required = true)]
    pub results: Vec<std::path::PathBuf>,
    /// Types to fit (k of k-means).
    #[arg(long, default_value_t = 4)]
    pub types: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// The `[oserve]` section for the completed requests of `results`.
pub fn fit(args: &OserveFitArgs) -> Result<String, String> {
    let mut samples = Vec::new();
    for path in &args.results {
        let r = crate::results::Results::load(path).map_err(|e| format!("{}: {e}", path.display()))?;
        samples.extend(
            r.records
                .iter()
                .filter(|x| x.outcome == crate::record::Outcome::Ok)
                .map(|x| (f64::from(x.tokens_in), f64::from(x.tokens_out))),
        );
    }
    if samples.is_empty() {
        return Err("no completed requests in the results".into());
    }
    if !(1..=policies::oserve::MAX_TYPES).contains(&args.types) {
        return Err(format!("--types: 1 to {}", policies::oserve::MAX_TYPES));
    }
    Ok(fit_samples(&samples, args.types, args.seed, args.results.len()))
}

/// The `[oserve]` section of `k` types fitted to (prompt, output) samples.
pub fn fit_samples(samples: &[(f64, f64)], k: usize, seed: u64, files: usize) -> String {
    let types = policies::oserve::typing::Types::fit(samples, k, seed);
    let mut counts = vec![0usize; types.len()];
    samples.iter().for_each(|&(i, o)| counts[types.classify(i, o)] += 1);
    let mut out = format!(
        "# Refit by `loadtest oserve-fit` from {} completed requests ({files} files).\n",
        samples.len()
    );
    for (j, &(input, output)) in types.centroids.iter().enumerate() {
        let (i, o) = (input.round(), output.round());
        let _ = write!(
            out,
            "\n# {} requests\n[[oserve.types]]\nname = \"t{j}-{i}in-{o}out\"\ninput = {i}\noutput = {o}\n",
            counts[j]
        );
    }
    out
}

/// Arrivals per minute of each type over `minutes` (see the module docs).
pub fn arrivals(seed: u64, minutes: usize) -> Vec<Vec<f64>> {
    let mut rng = SplitMix(seed);
    let base = [120.0, 60.0, 40.0, 20.0];
    (0..TYPES.len())
        .map(|j| {
            let phase = j as f64 * 1.3;
            (0..minutes)
                .map(|t| {
                    let shift = if t >= 200 && j % 2 == 1 { 1.6 } else { 1.0 };
                    let cycle = 1.0 + 0.5 * (t as f64 * std::f64::consts::TAU / 60.0 + phase).sin();
                    let lambda = base[j] * shift * cycle;
                    (lambda + lambda.sqrt() * rng.normal()).round().max(0.0)
                })
                .collect()
        })
        .collect()
}

/// RRMSE per type of the LSTM, Holt-Winters and the moving average.
fn forecast_table(seed: u64, epochs: usize) -> String {
    let (minutes, train) = (360, 240);
    let series = arrivals(seed, minutes);
    let mut md = String::from(
        "| type | LSTM (50 min) | Holt-Winters (season 60) | moving average (5 min) |\n|---|---:|---:|---:|\n",
    );
    for (j, s) in series.iter().enumerate() {
        let lstm = Lstm::train(&s[..train], epochs, seed + j as u64);
        let hw = HoltWinters::fit(&s[..train], 60);
        let actual = &s[train..];
        let l: Vec<f64> = (train..minutes).map(|t| lstm.forecast(&s[..t])).collect();
        let m: Vec<f64> = (train..minutes).map(|t| moving_average(&s[..t], 5)).collect();
        let h = hw.one_step(s);
        let _ = writeln!(
            md,
            "| {} | {:.3} | {:.3} | {:.3} |",
            NAMES[j],
            rrmse(&l, actual),
            rrmse(&h[train - 1..], actual),
            rrmse(&m, actual)
        );
    }
    md
}

/// Runs the experiment; returns the Markdown report.
pub fn main(args: &SimOserveArgs) -> Result<String, String> {
    let model = args.gpu.cost(args.model);
    if min_gpus(&model).is_none_or(|g| g > args.gpus) || args.segments == 0 || args.seeds == 0 {
        return Err("need GPUs for at least one replica, one segment and one seed".into());
    }
    let segments = format!("{} segments", args.segments);
    let mut md =
        header((args.gpu, args.model), args.gpus, &segments, args.shift, args.seeds, "capacity level");
    md.push_str("| spatial CV (asked / measured) | static req/s | static+reload | oserve (oracle mix) | oserve (last mix) | oserve / static | planner ms (median) |\n|---|---:|---:|---:|---:|---:|---:|\n");
    let mut first_example = None;
    for &cv in &args.cv {
        let runs: Vec<Run> = (1..=args.seeds).map(|s| run(&model, args, cv, s)).collect();
        let col = |i: usize| median(runs.iter().map(|r| r.capacity[i]).collect());
        let ratio = median(runs.iter().map(|r| r.capacity[2] / r.capacity[0]).collect());
        let ms = median(runs.iter().flat_map(|r| r.plan_ms.clone()).collect());
        let measured = median(runs.iter().map(|r| r.measured_cv).collect());
        let _ = writeln!(
            md,
            "| {:.2} / {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}x | {:.1} |",
            runs[0].cv,
            measured,
            col(0),
            col(1),
            col(2),
            col(3),
            ratio,
            ms
        );
        if first_example.is_none() && cv >= 0.5 {
            first_example = runs.into_iter().next().map(|r| r.example);
        }
    }
    if let Some(example) = first_example {
        md.push_str("\nSeed 1 at the first CV ≥ 0.5, segment by segment (shares SISO/SILO/LISO/LILO):\n\n| segment | mix | oserve deployment | static req/s | oserve req/s |\n|---:|---|---|---:|---:|\n");
        for (i, (mix, dep, s, o)) in example.iter().enumerate() {
            let shares: Vec<String> = mix.iter().map(|v| format!("{:.2}", v)).collect();
            let _ = writeln!(md, "| {} | {} | {} | {:.2} | {:.2} |", i + 1, shares.join(" / "), dep, s, o);
        }
    }
    md.push_str(&bound_table(&model));
    let t = clock::now();
    let table = forecast_table(1, args.epochs);
    let _ = write!(
        md,
        "\nForecast RRMSE per type, one step ahead over the last 2 of 6 hours (seed 1; training {:.1} s for four LSTMs, {} epochs):\n\n{table}",
        clock::since(t).as_secs_f64(),
        args.epochs
    );
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_mixes_have_the_asked_skew_and_move_between_segments() {
        let mut rng = SplitMix(3);
        for cv in [0.1, 0.3, 0.5] {
            let s = shares(&mut rng, 4, cv, 2);
            assert!((s.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            assert!((cv_of(&s) - cv).abs() < 1e-6, "{cv}: {}", cv_of(&s));
            assert_eq!((0..4).max_by(|&a, &b| s[a].total_cmp(&s[b])), Some(2), "the dominant type leads");
        }
        let t = trace(1, 4, 0.5, 0.0);
        assert!(t.windows(2).all(|w| w[0] == w[1]), "no shift: one mix throughout");
        let t = trace(1, 4, 0.5, 1.0);
        assert!(t.windows(2).all(|w| w[0] != w[1]));
    }

    #[test]
    fn a_refit_prints_a_valid_oserve_section() {
        let samples: Vec<(f64, f64)> = (0..200)
            .map(|i| if i % 2 == 0 { (100.0 + i as f64, 50.0) } else { (5000.0, 900.0 + i as f64) })
            .collect();
        let text = fit_samples(&samples, 2, 1, 1);
        #[derive(serde::Deserialize)]
        struct Doc {
            oserve: policies::oserve::OserveConfig,
        }
        let doc: Doc = toml::from_str(&text).unwrap();
        doc.oserve.validate().unwrap();
        assert_eq!(doc.oserve.types.len(), 2, "{text}");
        assert_eq!(doc.oserve.classify(120.0, 40.0).map(|t| t.0), Some(0));
        assert_eq!(doc.oserve.classify(5000.0, 1000.0).map(|t| t.0), Some(1));
        assert!(text.contains("# 100 requests"), "{text}");
    }

    #[test]
    fn forecast_arrivals_cycle_and_shift_the_odd_types() {
        let a = arrivals(1, 360);
        assert_eq!((a.len(), a[0].len()), (4, 360));
        let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
        // Whole cycles before and after the shift at minute 200.
        let (before, after) = (|j: usize| mean(&a[j][80..200]), |j: usize| mean(&a[j][240..360]));
        assert!((after(1) / before(1) - 1.6).abs() < 0.1, "SILO shifts up 1.6x");
        assert!((after(0) / before(0) - 1.0).abs() < 0.1, "SISO does not shift");
    }

    #[test]
    fn oserve_sustains_at_least_the_best_static_deployment_in_every_segment() {
        let args = SimOserveArgs {
            gpu: Gpu::H200,
            model: Model::Llama70b,
            gpus: 16,
            segments: 3,
            cv: vec![0.6],
            shift: 0.7,
            seeds: 1,
            iterations: 30,
            epochs: 1,
        };
        let r = run(&CostModel::LLAMA70B_H200, &args, 0.6, 2);
        assert!(r.capacity[2] >= r.capacity[0] * (1.0 - 1e-6), "{:?}", r.capacity);
        assert!(
            r.capacity[1] >= r.capacity[0] * (1.0 - 1e-6),
            "reloading the best static is at least static"
        );
    }
}
