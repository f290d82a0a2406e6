//! `loadtest run` end to end against a real `gateway up` (TLS, HTTP/2 and
//! HTTP/1.1, real engine processes): the run completes, and its results file
//! and HTML report are valid and agree with what was sent.

mod common;

use clap::Parser;
use common::{paced, System, TINY_CPU_MODEL};
use loadtest::record::Outcome;
use loadtest::results::{Results, SCHEMA};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    run: loadtest::run::RunArgs,
}

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn args(sys: &System, out: &std::path::Path, extra: &[&str]) -> loadtest::run::RunArgs {
    args_for(sys, out, &format!("{ROOT}/loadtest/workloads/chat.toml"), extra)
}

fn args_for(sys: &System, out: &std::path::Path, workload: &str, extra: &[&str]) -> loadtest::run::RunArgs {
    let root = ROOT;
    let mut argv = vec![
        "loadtest".to_string(),
        format!("--target={}", sys.base),
        format!("--ca={}", sys.ca.display()),
        format!("--workload={workload}"),
        format!("--policies={root}/policies/default.toml"),
        format!("--out={}", out.display()),
        "--seed=3".into(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    Cli::parse_from(argv).run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_run_writes_valid_results_and_report() {
    let sys = System::start(&paced(2, 1), 1).await;
    let out = sys.dir.join("run-h2");
    let r = loadtest::run::run(&args(&sys, &out, &["--rate=25", "--duration=3s"])).await.expect("run");

    // The file on disk is the documented schema and round-trips.
    let on_disk = Results::load(&out.join("results.json")).expect("valid results.json");
    let ids = |r: &Results| r.records.iter().map(|x| (x.id, x.outcome, x.tokens_out)).collect::<Vec<_>>();
    assert_eq!(ids(&on_disk), ids(&r));
    assert_eq!(on_disk.summary.overall.requests, r.summary.overall.requests);
    assert_eq!(r.schema, SCHEMA);
    assert_eq!(r.records.len(), r.run.planned);
    assert!((40..=110).contains(&r.run.planned), "~75 arrivals expected, got {}", r.run.planned);
    assert!(r.records.iter().all(|x| x.outcome == Outcome::Ok && x.status == 200), "every request served");
    for x in &r.records {
        assert!(x.tokens_out >= 1 && x.tokens_out <= x.max_tokens, "usage within max_tokens");
        assert_eq!(x.tbt_ms.len() + 1, x.tokens_out as usize, "one gap between each pair of tokens");
        assert!(x.ttft_ms.unwrap() <= x.tlet_ms.unwrap() && x.tlet_ms.unwrap() <= x.done_ms.unwrap());
        assert!(x.sent_at_ms >= x.scheduled_at_ms);
    }
    let s = &r.summary;
    assert_eq!(s.overall.requests as usize, r.run.planned);
    assert_eq!(s.tiers.keys().collect::<Vec<_>>(), ["bronze", "gold", "silver"]);
    assert!((s.offered_rps - s.sent_rps).abs() < 1e-9 && s.offered_rps > 10.0);
    assert!(s.schedule_error_ms.unwrap().p50 < 5.0, "the harness sends on time: {:?}", s.schedule_error_ms);
    assert_eq!(s.overall.deadline_miss_rate, Some(0.0), "an idle gateway meets every SLO");

    let html = std::fs::read_to_string(out.join("report.html")).expect("report.html");
    assert!(html.starts_with("<!doctype html>") && html.trim_end().ends_with("</html>"));
    assert!(!html.contains("<script") && !html.contains("src=\"http"), "self-contained");
    for title in
        ["TTFT CDF per tier", "offered vs achieved rate", "TTFT p95 over time", "rejections and failures"]
    {
        assert!(html.contains(title), "missing plot {title}");
    }
    assert_eq!(html.matches("<svg").count(), 6);
    assert_eq!(html.matches("no data").count(), 0, "every plot has data");
}

/// `answers = "received"` against a real cpu engine: each turn of a
/// conversation resends the previous prompt and the answer the engine
/// gave, and the engine, which named the pages its answer filled, serves
/// that whole history from its prefix cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversation_turns_resend_received_answers_and_find_them_cached() {
    let sys = System::start_with(&paced(0, 0), 1, &TINY_CPU_MODEL).await;
    // Two users, short messages, answers of about 24 tokens.
    let shipped = std::fs::read_to_string(format!("{ROOT}/loadtest/workloads/multi-turn.toml")).unwrap();
    let small = shipped
        .replace("users = 64", "users = 2")
        .replace("turn_tokens = 150", "answers = \"received\"\nturn_tokens = 150")
        .replace("p50 = 40\np95 = 160", "p50 = 8\np95 = 16")
        .replace("p50 = 100\np95 = 400", "p50 = 24\np95 = 40");
    assert_ne!(small, shipped);
    let path = sys.dir.join("conversation.toml");
    std::fs::write(&path, small).unwrap();
    let out = sys.dir.join("run-conversation");
    let a = args_for(&sys, &out, path.to_str().unwrap(), &["--rate=3", "--duration=4s"]);
    let r = loadtest::run::run(&a).await.expect("run");
    assert!(r.records.iter().all(|x| x.outcome == Outcome::Ok), "every turn served");

    // Pair each turn with the one it follows (the same plan the run made).
    let (schedule, _) = loadtest::run::schedule(&a.load).unwrap();
    let plan = loadtest::arrival::plan(
        &loadtest::workload::Workload::load(path.to_str().unwrap()).unwrap(),
        &schedule,
        3,
    );
    let rec: std::collections::HashMap<u64, &loadtest::record::Record> =
        r.records.iter().map(|x| (x.id, x)).collect();
    let (mut follows, mut history_blocks, mut prompt_blocks) = (0, 0, 0);
    for p in &plan {
        let Some((prev, own)) = p.after else { continue };
        let (before, now) = (rec[&prev], rec[&p.id]);
        let answered = before.scheduled_at_ms + before.done_ms.unwrap();
        assert!(now.scheduled_at_ms >= answered - 1.0, "a turn waits for the answer it resends");
        assert_eq!(now.tokens_in, before.tokens_in + before.tokens_out + own, "prompt, answer, message");
        // Cached: every full page of 16 up to the answer's last token (no
        // K/V yet); naming prompts alone would give the prompt's pages.
        history_blocks += (before.tokens_in + before.tokens_out - 1) / 16 * 16;
        prompt_blocks += before.tokens_in / 16 * 16;
        follows += 1;
    }
    assert!(follows >= 4, "the run reached later turns: {follows}");
    let load = sys.engine_load(&sys.engines[0].id).await;
    assert!(
        load.prefix_hit_tokens >= u64::from(history_blocks) && history_blocks > prompt_blocks,
        "{} tokens served from the cache, {history_blocks} expected ({prompt_blocks} from prompts alone)",
        load.prefix_hit_tokens
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_runs_and_refusals_are_counted_by_reason() {
    let sys = System::start(&paced(0, 0), 1).await;
    let out = sys.dir.join("run-http1");
    // A key the gateway does not know: every request is refused with 401.
    let a = args(&sys, &out, &["--rate=30", "--duration=1s", "--proto=http1", "--key=sk-unknown"]);
    let r = loadtest::run::run(&a).await.expect("run");
    assert_eq!(r.run.proto, "http1");
    assert!(!r.records.is_empty());
    assert!(r.records.iter().all(|x| x.outcome == Outcome::Rejected && x.status == 401));
    let reasons = &r.summary.overall.rejections;
    assert_eq!(reasons.keys().collect::<Vec<_>>(), ["invalid_api_key"], "{reasons:?}");
    assert_eq!(r.summary.goodput_rps, 0.0);
}

#[derive(Parser)]
struct OverheadCli {
    #[command(flatten)]
    overhead: loadtest::overhead::OverheadArgs,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overhead_measures_the_gateway_and_a_proxy_in_one_interleaved_run() {
    let sys = System::start(&paced(0, 1), 1).await;
    let engine = sys.engines[0].url.clone();
    let token = sys.ca.with_file_name("engine.token");
    let argv = [
        "loadtest".to_string(),
        format!("--gateway={}", sys.base),
        format!("--ca={}", sys.ca.display()),
        format!("--engine={engine}"),
        format!("--engine-token-file={}", token.display()),
        // The engine itself stands in for a proxy: the same API, no hop.
        format!("--proxy={engine}"),
        "--requests=30".into(),
        "--warmup=3".into(),
        "--streams=1".into(),
        "--tokens=4".into(),
    ];
    let r = loadtest::overhead::run(&OverheadCli::parse_from(argv).overhead).await.expect("overhead run");
    let p = r.proxy.expect("the proxy side is measured");
    let counts = (r.nonstream_gateway_ms.count, r.nonstream_direct_ms.count, p.nonstream_ms.count);
    assert_eq!(counts, (30, 30, 30), "every pair has all three sides");
    assert_eq!(p.url, engine);
    assert!(
        p.added_p50_ms < r.added_p50_ms,
        "a proxy that is the engine adds less than the gateway: {} vs {} ms",
        p.added_p50_ms,
        r.added_p50_ms
    );
}
