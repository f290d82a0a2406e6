//! `loadtest sweep`: the same workload against several targets ("arms") at
//! increasing rates, interleaved per rate step so every arm sees the same
//! machine noise. Reports, per arm, the latency added over the first arm
//! (the baseline) at the lowest rate, and the highest sustainable rate.
//! The proxy-overhead benchmark (gateway vs nginx in front of one engine)
//! is this command with three arms; see docs/benchmarks.md.

use std::fmt::Write;

use serde::Serialize;

use crate::results::Results;
use crate::run::{run, RunArgs, RunError};
use crate::runner::Api;
use crate::stats::Summary;

/// Options of `loadtest sweep`.
#[derive(Debug, Clone, clap::Args)]
pub struct SweepArgs {
    /// An arm: `LABEL=URL@API` with API `openai` or `engine`, e.g.
    /// `direct=http://127.0.0.1:9100@engine`. Repeat; the first is the baseline.
    #[arg(long = "arm", required = true, value_parser = parse_arm)]
    pub arms: Vec<Arm>,
    /// Offered rates to step through, requests per second.
    #[arg(long, value_delimiter = ',', default_value = "250,500,1000,2000")]
    pub rates: Vec<f64>,
    /// A rate is sustainable when TTFT p99 stays at or under this (ms), at
    /// most 0.1% of requests fail or are refused, and the harness's own
    /// scheduling error p99 stays under 5 ms.
    #[arg(long, default_value_t = 50.0)]
    pub max_ttft_p99_ms: f64,
    /// Everything else, as for `loadtest run` (--target and --api are
    /// replaced by each arm's; --out is the sweep's directory).
    #[command(flatten)]
    pub run: RunArgs,
}

/// One target of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Arm {
    pub label: String,
    pub url: String,
    pub api: Api,
}

fn parse_arm(s: &str) -> Result<Arm, String> {
    let (label, rest) = s.split_once('=').ok_or("expected LABEL=URL@API")?;
    let (url, api) = rest.rsplit_once('@').ok_or("expected LABEL=URL@API")?;
    let api = match api {
        "openai" => Api::Openai,
        "engine" => Api::Engine,
        other => return Err(format!("unknown API {other:?} (openai or engine)")),
    };
    Ok(Arm { label: label.into(), url: url.into(), api })
}

/// One (arm, rate) run, reduced to what the sweep reports.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub rate: f64,
    pub achieved_rps: f64,
    pub ok_share: f64,
    pub ttft_ms: Option<Summary>,
    pub tlet_ms: Option<Summary>,
    pub schedule_error_p99_ms: Option<f64>,
    pub sustainable: bool,
}

/// An arm's steps and its headline numbers.
#[derive(Debug, Clone, Serialize)]
pub struct ArmResult {
    pub arm: Arm,
    pub steps: Vec<Step>,
    /// Highest rate whose step was sustainable. (Capacity is monotone in the
    /// rate; on a shared machine noise makes a step fail spuriously, never
    /// pass, so a failed step below a passing one is taken as noise.)
    pub max_sustainable_rps: Option<f64>,
    /// TTFT and TLET percentiles minus the baseline's, at the lowest rate.
    pub added_ttft_p50_ms: Option<f64>,
    pub added_ttft_p99_ms: Option<f64>,
    pub added_tlet_p50_ms: Option<f64>,
    pub added_tlet_p99_ms: Option<f64>,
}

/// The whole sweep (`sweep.json`).
#[derive(Debug, Clone, Serialize)]
pub struct SweepReport {
    pub workload: String,
    pub duration_s: f64,
    pub max_ttft_p99_ms: f64,
    pub arms: Vec<ArmResult>,
}

fn step(r: &Results, rate: f64, max_ttft_p99_ms: f64) -> Step {
    let o = &r.summary.overall;
    let ok_share = if o.requests == 0 { 0.0 } else { o.ok as f64 / o.requests as f64 };
    let sched = r.summary.schedule_error_ms.map(|s| s.p99);
    let sustainable = ok_share >= 0.999
        && o.ttft_ms.is_some_and(|t| t.p99 <= max_ttft_p99_ms)
        && sched.is_some_and(|s| s < 5.0);
    Step {
        rate,
        achieved_rps: r.summary.achieved_rps,
        ok_share,
        ttft_ms: o.ttft_ms,
        tlet_ms: o.tlet_ms,
        schedule_error_p99_ms: sched,
        sustainable,
    }
}

/// Runs the sweep; writes each run under `--out/<label>-<rate>/` and the
/// sweep's own `sweep.json`.
pub async fn sweep(a: &SweepArgs) -> Result<SweepReport, RunError> {
    let mut rates = a.rates.clone();
    rates.sort_by(f64::total_cmp);
    let mut steps: Vec<Vec<Step>> = vec![Vec::new(); a.arms.len()];
    for &rate in &rates {
        for (i, arm) in a.arms.iter().enumerate() {
            eprintln!("sweep: {} at {rate} req/s", arm.label);
            let mut args = a.run.clone();
            args.target = arm.url.clone();
            args.api = arm.api;
            args.load.rate = rate;
            args.label = Some(format!("{} @ {rate}", arm.label));
            args.out = a.run.out.join(format!("{}-{rate}", arm.label));
            args.quiet = true;
            let r = run(&args).await?;
            steps[i].push(step(&r, rate, a.max_ttft_p99_ms));
        }
    }
    let base = steps[0].first().cloned();
    let arms = a
        .arms
        .iter()
        .zip(steps)
        .map(|(arm, steps)| {
            let max_sustainable_rps = steps.iter().rev().find(|s| s.sustainable).map(|s| s.rate);
            let low = steps.first();
            let diff = |f: fn(&Step) -> Option<f64>| Some(f(low?)? - f(base.as_ref()?)?);
            ArmResult {
                added_ttft_p50_ms: diff(|s| s.ttft_ms.map(|t| t.p50)),
                added_ttft_p99_ms: diff(|s| s.ttft_ms.map(|t| t.p99)),
                added_tlet_p50_ms: diff(|s| s.tlet_ms.map(|t| t.p50)),
                added_tlet_p99_ms: diff(|s| s.tlet_ms.map(|t| t.p99)),
                arm: arm.clone(),
                steps,
                max_sustainable_rps,
            }
        })
        .collect();
    let report = SweepReport {
        workload: a.run.load.workload.clone(),
        duration_s: a.run.load.duration.as_secs_f64(),
        max_ttft_p99_ms: a.max_ttft_p99_ms,
        arms,
    };
    let path = a.run.out.join("sweep.json");
    let json = serde_json::to_string_pretty(&report).expect("sweep reports serialise");
    std::fs::write(&path, json).map_err(|e| RunError::Write(path.display().to_string(), e))?;
    Ok(report)
}

/// The sweep as text: per-step table, then headline numbers with ratios of
/// every arm to the second (the first non-baseline arm).
pub fn text(r: &SweepReport) -> String {
    let mut out = format!(
        "{:<10} {:>8} {:>10} {:>7} {:>9} {:>9} {:>9} {:>9} {:>10} {:>6}\n",
        "arm",
        "rate",
        "achieved",
        "ok%",
        "ttft p50",
        "ttft p99",
        "tlet p50",
        "tlet p99",
        "sched p99",
        "sust."
    );
    for a in &r.arms {
        for s in &a.steps {
            let q = |x: Option<Summary>, f: fn(&Summary) -> f64| {
                x.map_or("-".into(), |x| format!("{:.2}", f(&x)))
            };
            let _ = writeln!(
                out,
                "{:<10} {:>8.0} {:>10.1} {:>7.2} {:>9} {:>9} {:>9} {:>9} {:>10} {:>6}",
                a.arm.label,
                s.rate,
                s.achieved_rps,
                s.ok_share * 100.0,
                q(s.ttft_ms, |t| t.p50),
                q(s.ttft_ms, |t| t.p99),
                q(s.tlet_ms, |t| t.p50),
                q(s.tlet_ms, |t| t.p99),
                s.schedule_error_p99_ms.map_or("-".into(), |e| format!("{e:.3}")),
                if s.sustainable { "yes" } else { "no" }
            );
        }
    }
    let _ = writeln!(
        out,
        "\nadded over {} at the lowest rate (ms), and highest sustainable rate:",
        r.arms[0].arm.label
    );
    let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:+.3}"));
    for a in &r.arms[1..] {
        let _ = writeln!(
            out,
            "{:<10} TTFT p50 {} p99 {}  TLET p50 {} p99 {}  max sustainable {}",
            a.arm.label,
            f(a.added_ttft_p50_ms),
            f(a.added_ttft_p99_ms),
            f(a.added_tlet_p50_ms),
            f(a.added_tlet_p99_ms),
            a.max_sustainable_rps.map_or("none of the rates".into(), |v| format!("{v} req/s"))
        );
    }
    if r.arms.len() >= 3 {
        let (b, c) = (&r.arms[1], &r.arms[2]);
        let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
            (Some(x), Some(y)) if y != 0.0 => format!("{:.2}", x / y),
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "{}/{}: added TTFT p50 {}, p99 {}; max sustainable rate {}",
            b.arm.label,
            c.arm.label,
            ratio(b.added_ttft_p50_ms, c.added_ttft_p50_ms),
            ratio(b.added_ttft_p99_ms, c.added_ttft_p99_ms),
            ratio(b.max_sustainable_rps, c.max_sustainable_rps)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arms_parse_and_bad_ones_say_why() {
        let a = parse_arm("nginx=https://localhost:8444@engine").unwrap();
        assert_eq!(
            (a.label.as_str(), a.url.as_str(), a.api),
            ("nginx", "https://localhost:8444", Api::Engine)
        );
        assert!(parse_arm("x=http://h@grpc").unwrap_err().contains("unknown API"));
        assert!(parse_arm("http://h").is_err());
    }
}
