//! The fleet simulator end to end: deterministic for a seed, nothing lost,
//! the production policies behaving as they do live (SLO admission keeps
//! what it admits in SLO where the FCFS baseline does not), and the
//! autoscaler following a burst without flapping or failing requests.

use clap::Parser;
use loadtest::record::Outcome;
use loadtest::results::Results;
use loadtest::sim::{run, SimArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: SimArgs,
}

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn sim(out: &str, extra: &[&str]) -> Results {
    let dir = std::env::temp_dir().join(format!("slo-sim-test-{}-{out}", std::process::id()));
    let r = root();
    let mut argv: Vec<String> = vec![
        "sim".into(),
        "--quiet".into(),
        "--workload".into(),
        r.join("loadtest/workloads/chat-rag.toml").display().to_string(),
        "--policies".into(),
        r.join("policies/default.toml").display().to_string(),
        "--profile".into(),
        r.join("policies/profiles/emulated-a100-8b.toml").display().to_string(),
        "--out".into(),
        dir.display().to_string(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    let cli = Cli::parse_from(argv);
    let out = run(&cli.args).expect("the simulation runs");
    let on_disk = Results::load(&dir.join("results.json")).expect("results.json is a results file");
    let counts = |r: &Results| {
        (r.records.len(), r.summary.overall.ok, r.summary.overall.rejected, r.summary.overall.failed)
    };
    assert!(counts(&on_disk) == counts(&out.results), "what is written is what was summarised");
    assert!(dir.join("report.html").exists());
    let _ = std::fs::remove_dir_all(&dir);
    out.results
}

#[test]
fn the_same_seed_gives_the_same_run_and_another_seed_another() {
    let args = ["--rate", "12", "--duration", "40s", "--engines", "3", "--seed", "7"];
    let a = sim("det-a", &args);
    let b = sim("det-b", &args);
    assert_eq!(a.records, b.records);
    assert_eq!(a.fleet, b.fleet);
    let c = sim("det-c", &["--rate", "12", "--duration", "40s", "--engines", "3", "--seed", "8"]);
    assert_ne!(a.records, c.records);
}

#[test]
fn every_request_ends_and_admitted_work_meets_its_slo_where_fcfs_misses() {
    let burst =
        ["--rate", "16", "--duration", "90s", "--engines", "4", "--burst-factor", "3", "--burst-at", "20s"];
    let ours = sim("ours", &burst);
    let b1 = sim("b1", &[&burst[..], &["--arm", "b1", "--timeout", "90s"]].concat());
    for r in [&ours, &b1] {
        assert_eq!(r.records.len(), r.run.planned);
        for rec in &r.records {
            match rec.outcome {
                Outcome::Ok => {
                    assert!(rec.ttft_ms.is_some() && rec.tlet_ms >= rec.ttft_ms && rec.tokens_out > 0)
                }
                _ => assert!(rec.reason.is_some(), "a refusal or failure says why: {rec:?}"),
            }
        }
    }
    let o = &ours.summary.overall;
    assert_eq!(o.failed, 0, "{:?}", o.failures);
    assert!(o.deadline_miss_rate.unwrap() < 0.02, "ours misses {:?}", o.deadline_miss_rate);
    assert!(o.degraded > 0 && o.rejected > 0, "a x3 burst on 4 engines is shed by brownout and refusals");
    let b = &b1.summary.overall;
    assert!(b.deadline_miss_rate.unwrap() > 0.3, "B1 lets queues grow: {:?}", b.deadline_miss_rate);
    let (g_ours, g_b1) = (ours.summary.goodput_tokens_per_s, b1.summary.goodput_tokens_per_s);
    assert!(g_ours > 1.2 * g_b1, "goodput {g_ours} vs B1 {g_b1} tokens/s");
    // Cost is accounted for the whole fixed fleet.
    let f = ours.fleet.as_ref().unwrap();
    assert!(f.gpu_seconds >= 4.0 * 90.0 && f.cost_per_1m_output_tokens.unwrap() > 0.0);
}

#[test]
fn the_autoscaler_follows_a_burst_without_flapping_or_failing_requests() {
    let r = sim(
        "scale",
        &[
            "--rate",
            "10",
            "--duration",
            "240s",
            "--burst-factor",
            "3",
            "--burst-at",
            "60s",
            "--burst-ramp",
            "10s",
            "--burst-hold",
            "60s",
            "--engines",
            "2",
            "--autoscale",
            "--min-engines",
            "1",
            "--max-engines",
            "10",
            "--cold-start-s",
            "5",
        ],
    );
    let f = r.fleet.as_ref().unwrap();
    let serving = &f.serving;
    let peak_before = serving[..55].iter().cloned().fold(0.0, f64::max);
    let peak_burst = serving[60..140].iter().cloned().fold(0.0, f64::max);
    assert!(peak_burst > peak_before, "more engines in the burst: {peak_before} -> {peak_burst}");
    let last = *serving.last().unwrap();
    assert!(last < peak_burst, "and fewer after it: {peak_burst} -> {last}");
    // Direction changes of the target: out, then in; never back and forth.
    let mut turns = 0;
    let mut dir = 0i32;
    for d in f.decisions.windows(2) {
        let now = (d[1].serving as i32 - d[0].serving as i32).signum();
        if now != 0 && dir != 0 && now != dir {
            turns += 1;
        }
        if now != 0 {
            dir = now;
        }
    }
    assert!(turns <= 2, "{:?}", f.decisions);
    assert_eq!(r.summary.overall.failed, 0, "{:?}", r.summary.overall.failures);
    assert!(f.cold_starts > 0);
    // Cheaper than the peak fleet all the time.
    assert!(f.gpu_seconds < peak_burst * 240.0, "{} GPU-s", f.gpu_seconds);
}

/// Issue 28's regime: a mild burst (×1.6 on 67% of capacity) where FCFS
/// serves almost everything in time. Admission must not cost goodput or any
/// tier's met-SLO share there (beyond half a percent: a request or two it
/// refuses at the margin of a budget), nor brown out on predictions alone.
/// Before issue 28 ours lost 10% of goodput here and 4 points of bronze.
#[test]
fn in_a_mild_burst_ours_loses_nothing_to_fcfs() {
    let mild = [
        "--rate",
        "12",
        "--duration",
        "100s",
        "--engines",
        "4",
        "--burst-factor",
        "1.6",
        "--burst-at",
        "30s",
        "--burst-ramp",
        "10s",
        "--burst-hold",
        "40s",
        "--seed",
        "3",
    ];
    let ours = sim("mild-ours", &mild);
    let b1 = sim("mild-b1", &[&mild[..], &["--arm", "b1"]].concat());
    let (g_ours, g_b1) = (ours.summary.goodput_tokens_per_s, b1.summary.goodput_tokens_per_s);
    assert!(g_ours >= 0.995 * g_b1, "goodput {g_ours} vs B1 {g_b1} tokens/s");
    for (tier, o) in &ours.summary.tiers {
        let b = &b1.summary.tiers[tier];
        let slack = (b.requests as f64 * 0.005).ceil() as u64;
        assert!(o.met_slo + slack >= b.met_slo, "{tier}: ours met {} vs B1 {}", o.met_slo, b.met_slo);
        assert!(o.deadline_miss_rate.unwrap_or(0.0) <= 0.017, "{tier}: {:?}", o.deadline_miss_rate);
        assert!(
            !o.degradations.contains_key("brownout_output_cap"),
            "{tier}: browned out where FCFS meets the SLO: {:?}",
            o.degradations
        );
    }
}

/// The report carries the predictor's calibration, and on a stationary
/// load it is honest: the TTFT prediction covers most requests (it is a
/// 0.75 quantile times γ) without being wildly pessimistic.
#[test]
fn the_ttft_prediction_is_calibrated_on_a_stationary_load() {
    let r = sim("calib", &["--rate", "10", "--duration", "120s", "--engines", "4", "--seed", "5"]);
    let all = r.summary.calibration.iter().find(|c| c.tier == "all" && c.what == "ttft").expect("a TTFT row");
    assert!(all.observed_ms.count > 1000, "{all:?}");
    assert!((0.75..=0.99).contains(&all.coverage), "coverage {all:?}");
    assert!(all.ratio_p50 > 0.4, "median observed / predicted {all:?}");
    assert!(r.summary.calibration.iter().any(|c| c.what == "e2e"), "E2E rows too");
}
