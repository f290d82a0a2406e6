//! `loadtest sweep`: the same workload against several targets ("arms") at
//! increasing rates, interleaved per rate step so every arm sees the same
//! machine noise. Reports, per arm, the latency added over the first arm
//! (the baseline) at the lowest rate, and the highest sustainable rate.
//! The proxy-overhead benchmark (gateway vs nginx in front of one engine)
//! is this command with three arms; see docs/benchmarks/admission.md.

use std::fmt::Write;

use serde::Serialize;

use crate::client::Proto;
use crate::results::Results;
use crate::run::{run, RunArgs, RunError};
use crate::runner::Api;
use crate::stats::Summary;

/// Options of `loadtest sweep`.
#[derive(Debug, Clone, clap::Args)]
pub struct SweepArgs {
    /// An arm: `LABEL=URL@API` with API `openai` (text completions),
    /// `chat` (chat completions) or `engine`, e.g.
    /// `direct=http://127.0.0.1:9100@engine`, optionally followed by
    /// `;proto=http1` or `;proto=h2` (this arm's HTTP version, else
    /// --proto), `;key=KEY` (this arm's API key, else --key or the
    /// workload's) and `;pid=PID` (the proxy's process: its CPU time and
    /// its descendants' is read before and after each of the arm's steps).
    /// Repeat; the first is the baseline.
    #[arg(long = "arm", required = true, value_parser = parse_arm)]
    pub arms: Vec<Arm>,
    /// Offered rates to step through, requests per second.
    #[arg(long, value_delimiter = ',', default_value = "250,500,1000,2000")]
    pub rates: Vec<f64>,
    /// A rate is sustainable when TTFT p99 stays at or under this (ms), at
    /// least --min-ok-share of requests are answered, and the harness's own
    /// scheduling error p99 stays under 5 ms.
    #[arg(long, default_value_t = 50.0)]
    pub max_ttft_p99_ms: f64,
    /// An arm that fails this many steps in a row runs no higher rate (its
    /// backlog would only slow the arms after it); 0 runs every step.
    #[arg(long, default_value_t = 0)]
    pub stop_after_failures: usize,
    /// The share of requests that must be answered for a sustainable step.
    #[arg(long, default_value_t = 0.999)]
    pub min_ok_share: f64,
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
    /// This arm's HTTP version (else the run's).
    #[serde(skip)]
    pub proto: Option<Proto>,
    /// This arm's API key (else the run's).
    #[serde(skip)]
    pub key: Option<String>,
    /// The proxy's process, whose CPU per request each step reports.
    pub pid: Option<u32>,
}

fn parse_arm(s: &str) -> Result<Arm, String> {
    let mut parts = s.split(';');
    let head = parts.next().unwrap_or_default();
    let (label, rest) = head.split_once('=').ok_or("expected LABEL=URL@API")?;
    let (url, api) = rest.rsplit_once('@').ok_or("expected LABEL=URL@API")?;
    let api = match api {
        "openai" => Api::Openai,
        "chat" => Api::Chat,
        "engine" => Api::Engine,
        other => return Err(format!("unknown API {other:?} (openai, chat or engine)")),
    };
    let mut arm = Arm { label: label.into(), url: url.into(), api, proto: None, key: None, pid: None };
    for option in parts {
        match option.split_once('=') {
            Some(("proto", "http1")) => arm.proto = Some(Proto::Http1),
            Some(("proto", "h2")) => arm.proto = Some(Proto::H2),
            Some(("key", key)) if !key.is_empty() => arm.key = Some(key.into()),
            Some(("pid", pid)) => {
                arm.pid = Some(pid.parse().map_err(|_| format!("pid: {pid:?} is not a process id"))?)
            }
            _ => return Err(format!("unknown arm option {option:?} (proto=http1|h2, key=KEY, pid=PID)")),
        }
    }
    Ok(arm)
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
    /// Requests sent in the step.
    pub requests: u64,
    /// CPU time the arm's process tree spent during the step, per request
    /// sent (arms with a `pid`).
    pub cpu_us_per_request: Option<f64>,
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

fn step(r: &Results, rate: f64, max_ttft_p99_ms: f64, min_ok_share: f64) -> Step {
    let o = &r.summary.overall;
    let ok_share = if o.requests == 0 { 0.0 } else { o.ok as f64 / o.requests as f64 };
    let sched = r.summary.schedule_error_ms.map(|s| s.p99);
    let sustainable = ok_share >= min_ok_share
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
        requests: o.requests,
        cpu_us_per_request: None,
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
            let failed_in_a_row = steps[i].iter().rev().take_while(|s| !s.sustainable).count();
            if a.stop_after_failures > 0 && failed_in_a_row >= a.stop_after_failures {
                continue;
            }
            eprintln!("sweep: {} at {rate} req/s", arm.label);
            let mut args = a.run.clone();
            args.target = arm.url.clone();
            args.api = arm.api;
            args.proto = arm.proto.unwrap_or(a.run.proto);
            args.key = arm.key.clone().or_else(|| a.run.key.clone());
            args.load.rate = rate;
            args.label = Some(format!("{} @ {rate}", arm.label));
            args.out = a.run.out.join(format!("{}-{rate}", arm.label));
            args.quiet = true;
            let before = arm.pid.and_then(crate::cpu::tree_ticks);
            let r = run(&args).await?;
            let after = arm.pid.and_then(crate::cpu::tree_ticks);
            let mut s = step(&r, rate, a.max_ttft_p99_ms, a.min_ok_share);
            if let (Some(b), Some(e)) = (before, after) {
                let cpu_s = e.saturating_sub(b) as f64 / crate::cpu::TICKS_PER_S;
                s.cpu_us_per_request = (s.requests > 0).then(|| cpu_s * 1e6 / s.requests as f64);
            }
            steps[i].push(s);
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
        "{:<18} {:>8} {:>10} {:>7} {:>9} {:>9} {:>9} {:>9} {:>10} {:>6}\n",
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
                "{:<18} {:>8.0} {:>10.1} {:>7.2} {:>9} {:>9} {:>9} {:>9} {:>10} {:>6}",
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
            "{:<18} TTFT p50 {} p99 {}  TLET p50 {} p99 {}  max sustainable {}",
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
        assert_eq!((a.proto, a.key), (None, None));
        let a = parse_arm("litellm=http://127.0.0.1:4000@openai;proto=http1;key=sk-1").unwrap();
        assert_eq!(
            (a.url.as_str(), a.proto, a.key.as_deref()),
            ("http://127.0.0.1:4000", Some(Proto::Http1), Some("sk-1"))
        );
        assert!(parse_arm("x=http://h@openai;proto=h3").unwrap_err().contains("unknown arm option"));
        assert_eq!(parse_arm("x=http://h@openai;pid=42").unwrap().pid, Some(42));
        assert!(parse_arm("x=http://h@openai;pid=me").unwrap_err().contains("not a process id"));
        assert!(parse_arm("x=http://h@grpc").unwrap_err().contains("unknown API"));
        assert!(parse_arm("http://h").is_err());
    }
}
