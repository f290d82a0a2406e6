//! The live side of the OServe benchmark (issue 25): `loadtest
//! oserve-trace` writes the simulator's trace (same types, mixes, rates and
//! sizes as `sim-oserve-latency` for a seed) as a CSV that `loadtest run
//! --trace` replays against a real gateway, and `loadtest oserve-segments`
//! reads the runs' results.json back per trace segment (P99 E2E and TTFT,
//! completed requests per second), as the simulator reports them.

use std::fmt::Write as _;
use std::path::PathBuf;

use super::latency::Trace;
use super::{p99, Gpu};

#[derive(clap::Args, Debug, Clone)]
pub struct TraceArgs {
    /// The GPU of the cost model (the static deployment's capacity sets the rates).
    #[arg(long, value_enum, default_value_t = Gpu::H200)]
    pub gpu: Gpu,
    #[arg(long, default_value_t = 16)]
    pub gpus: u32,
    #[arg(long, default_value_t = 3)]
    pub segments: usize,
    #[arg(long, default_value_t = 60.0)]
    pub segment_s: f64,
    /// Spatial skew (CV of the type shares).
    #[arg(long, default_value_t = 0.5)]
    pub cv: f64,
    #[arg(long, default_value_t = 0.7)]
    pub shift: f64,
    /// Offered rate over the static deployment's capacity in each mix.
    #[arg(long, default_value_t = 0.8)]
    pub load: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The CSV to write (seconds, input tokens, output tokens).
    #[arg(long)]
    pub out: PathBuf,
}

/// Writes the trace; returns a one-line summary.
pub fn write_trace(a: &TraceArgs) -> Result<String, String> {
    let model = a.gpu.model();
    if a.segments == 0 || a.segment_s <= 0.0 || !(0.05..=3.0).contains(&a.load) {
        return Err("need a segment, --segment-s > 0 and --load in [0.05, 3]".into());
    }
    let Trace { fixed, rates, reqs, .. } = Trace::new(
        &model,
        a.gpus,
        (a.segments, a.segment_s),
        (&super::latency::TraceSpec::Generated { cv: a.cv }, a.shift),
        a.seed,
        a.load,
    );
    let mut csv = String::from("seconds,input_tokens,output_tokens\n");
    for r in &reqs {
        let _ = writeln!(csv, "{:.6},{},{}", r.at, r.prompt, r.out);
    }
    std::fs::write(&a.out, csv).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let rates: Vec<String> = rates.iter().map(|r| format!("{r:.2}")).collect();
    Ok(format!(
        "{} requests, {} segments of {} s at {} req/s; static deployment {fixed}\n",
        reqs.len(),
        a.segments,
        a.segment_s,
        rates.join(" / ")
    ))
}

#[derive(clap::Args, Debug, Clone)]
pub struct SegmentsArgs {
    /// results.json of runs that replayed an `oserve-trace` CSV.
    #[arg(required = true)]
    pub results: Vec<PathBuf>,
    #[arg(long, default_value_t = 60.0)]
    pub segment_s: f64,
}

/// Per run and segment: requests, failures, P99 E2E and TTFT, completed/s.
pub fn segments(a: &SegmentsArgs) -> Result<String, String> {
    if a.segment_s <= 0.0 {
        return Err("--segment-s > 0".into());
    }
    let mut md = String::from(
        "| run | segment | requests | not ok | P99 E2E s | P99 TTFT s | completed req/s |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for path in &a.results {
        let r = crate::results::Results::load(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let seg = |ms: f64| (ms / 1e3 / a.segment_s) as usize;
        let n = r.records.iter().map(|x| seg(x.scheduled_at_ms) + 1).max().unwrap_or(0);
        for s in 0..n {
            let of: Vec<_> = r.records.iter().filter(|x| seg(x.scheduled_at_ms) == s).collect();
            let ok: Vec<_> = of.iter().filter(|x| x.outcome == crate::record::Outcome::Ok).collect();
            let e2e = p99(ok.iter().filter_map(|x| x.done_ms).map(|v| v / 1e3).collect());
            let ttft = p99(ok.iter().filter_map(|x| x.ttft_ms).map(|v| v / 1e3).collect());
            let completed = r
                .records
                .iter()
                .filter(|x| x.outcome == crate::record::Outcome::Ok)
                .filter(|x| x.done_ms.is_some_and(|d| seg(x.scheduled_at_ms + d) == s))
                .count();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {e2e:.1} | {ttft:.2} | {:.2} |",
                path.display(),
                s + 1,
                of.len(),
                of.len() - ok.len(),
                completed as f64 / a.segment_s
            );
        }
    }
    Ok(md)
}

#[derive(clap::Args, Debug, Clone)]
pub struct TrainArgs {
    /// The policy file whose `[oserve] types` the models are for.
    #[arg(long, default_value = "policies/default.toml")]
    pub policies: PathBuf,
    /// results.json of recorded runs: each completed request counts in its
    /// type's interval. Without: the generated 6-hour trace of `sim-oserve`'s
    /// forecast table (needs four types; one series per type in order).
    #[arg(long)]
    pub results: Vec<PathBuf>,
    /// Seconds per interval (the planner's `plan_interval_s`).
    #[arg(long, default_value_t = 60.0)]
    pub interval_s: f64,
    #[arg(long, default_value_t = 40)]
    pub epochs: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The model file to write (`[oserve] lstm_models`).
    #[arg(long)]
    pub out: PathBuf,
}

/// Per-type arrivals per interval of the completed requests of `results`,
/// typed by `cfg`.
fn recorded_series(
    cfg: &policies::oserve::OserveConfig,
    results: &[PathBuf],
    interval_s: f64,
) -> Result<Vec<Vec<f64>>, String> {
    let mut series = vec![Vec::new(); cfg.types.len()];
    for path in results {
        let r = crate::results::Results::load(path).map_err(|e| format!("{}: {e}", path.display()))?;
        for x in r.records.iter().filter(|x| x.outcome == crate::record::Outcome::Ok) {
            let Some((j, _)) = cfg.classify(f64::from(x.tokens_in), f64::from(x.tokens_out)) else {
                continue;
            };
            let t = (x.scheduled_at_ms / 1e3 / interval_s) as usize;
            if t >= 1_000_000 {
                return Err(format!("{}: a request past a million intervals", path.display()));
            }
            for s in series.iter_mut() {
                if s.len() <= t {
                    s.resize(t + 1, 0.0);
                }
            }
            series[j][t] += 1.0;
        }
    }
    Ok(series)
}

/// Trains one LSTM per type and writes the model file; returns a summary.
pub fn train(a: &TrainArgs) -> Result<String, String> {
    let text = std::fs::read_to_string(&a.policies).map_err(|e| format!("{}: {e}", a.policies.display()))?;
    let doc = policies::PolicyDocument::parse(&a.policies.display().to_string(), &text)
        .map_err(|e| e.to_string())?;
    let cfg = &doc.oserve;
    if cfg.types.is_empty() || a.interval_s <= 0.0 {
        return Err("need [oserve] types and --interval-s > 0".into());
    }
    let series = if a.results.is_empty() {
        if cfg.types.len() != super::TYPES.len() {
            return Err(format!(
                "the generated trace has {} types; the policy has {}",
                super::TYPES.len(),
                cfg.types.len()
            ));
        }
        super::arrivals(a.seed, 360)
    } else {
        recorded_series(cfg, &a.results, a.interval_s)?
    };
    if series.iter().any(|s| s.len() < 8) {
        return Err("fewer than 8 intervals of history".into());
    }
    let models: Vec<policies::oserve::forecast::Lstm> = series
        .iter()
        .enumerate()
        .map(|(j, s)| policies::oserve::forecast::Lstm::train(s, a.epochs, a.seed + j as u64))
        .collect();
    let file = policies::oserve::forecast::LstmModels {
        interval_s: a.interval_s,
        types: cfg.types.iter().map(|t| t.name.clone()).collect(),
        models,
    };
    let json = serde_json::to_string(&file).map_err(|e| e.to_string())?;
    std::fs::write(&a.out, json).map_err(|e| format!("{}: {e}", a.out.display()))?;
    Ok(format!(
        "{} LSTMs over {} intervals each written to {}\n",
        file.types.len(),
        series[0].len(),
        a.out.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trained_models_are_written_for_the_policys_types_and_read_back() {
        let dir = std::env::temp_dir().join(format!("oserve-train-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let policies = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../policies/default.toml");
        let args = TrainArgs {
            policies: policies.clone(),
            results: Vec::new(),
            interval_s: 60.0,
            epochs: 1,
            seed: 1,
            out: dir.join("lstm.json"),
        };
        train(&args).unwrap();
        let m: policies::oserve::forecast::LstmModels =
            serde_json::from_str(&std::fs::read_to_string(&args.out).unwrap()).unwrap();
        let doc = policies::PolicyDocument::parse("d", &std::fs::read_to_string(&policies).unwrap()).unwrap();
        let names: Vec<&str> = doc.oserve.types.iter().map(|t| t.name.as_str()).collect();
        m.check(&names).unwrap();
        assert!(m.check(&names[..3]).is_err(), "another policy's types are refused");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
