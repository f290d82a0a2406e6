//! Feasibility math on hand-computed cases, and the ladder's order.
//!
//! The test profile makes the arithmetic easy: prefill 0.1 ms per prompt
//! token (fitted exactly as a = 0.1, w = 1), decode step 10 ms at batch 1
//! plus 1 ms per extra sequence, no context term; γ = 1.

use super::*;
use crate::profile::LatencyProfile;

fn model(class: &str, step_at_1: f64) -> ServiceModel {
    let text = format!(
        r#"
        model = "m"
        engine_class = "{class}"
        [prefill]
        points = [[0, 0.0], [1000, 100.0], [8192, 819.2]]
        [decode]
        batch_points = [[1, {step_at_1}], [9, {}]]
        "#,
        step_at_1 + 8.0
    );
    ServiceModel::from_profile(&LatencyProfile::parse("t.toml", &text).unwrap())
}

fn est() -> EstimatorConfig {
    EstimatorConfig { guard_factor: 1.0, ..Default::default() }
}

fn engine(idx: usize, slots: u32, active: u32) -> Candidate {
    Candidate {
        idx,
        class: 0,
        slots,
        active,
        active_out_tokens: u64::from(active) * 100,
        prefill_backlog_tokens: 0,
        kv_headroom_tokens: 1 << 20,
        long_lane: false,
        cached_tokens: 0,
        preemptible: 0,
    }
}

fn ask(ttft: f64, e2e: f64) -> Ask<'static> {
    Ask {
        unattainable: Unattainable::Overload,
        preempt: false,
        tier: "gold",
        n_in: 400,
        max_tokens: 100,
        expected_out: 100,
        output_floor: 32,
        ttft_budget_ms: ttft,
        e2e_budget_ms: e2e,
        sampling: false,
        degradations: &[Degradation::ReduceOutput, Degradation::Greedy, Degradation::FasterClass],
        class: 0,
        overflow_class: None,
        long: false,
        queue_ahead_out_tokens: 0.0,
        turn: 0,
    }
}

fn admitted(d: Decision) -> Plan {
    match d {
        Decision::Admit(p) => p,
        Decision::Reject(r) => panic!("rejected: {r:?}"),
    }
}

fn rejected(d: Decision) -> Rejection {
    match d {
        Decision::Reject(r) => r,
        Decision::Admit(p) => panic!("admitted: {p:?}"),
    }
}

fn close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-6, "{a} != {b}");
}

#[test]
fn free_slot_wait_is_batch_fill_plus_backlog() {
    let models = [model("c", 10.0)];
    let cfg = AdmissionConfig::default();
    // 3 running + this one = batch 4: step 13 ms. TTFT = 13 (join at the
    // next token boundary) + 40 (prefill 400 tokens); E2E = 53 + 100 × 13.
    let p = admitted(decide(&ask(500.0, 2000.0), &[engine(0, 8, 3)], &models, &est(), &cfg));
    assert_eq!(p.engine, Some(0));
    close(p.ttft_ms, 53.0);
    close(p.e2e_ms, 1353.0);
    assert!(p.steps.is_empty());
    // 600 prompt tokens already waiting for prefill there add 60 ms.
    let mut e = engine(0, 8, 3);
    e.prefill_backlog_tokens = 600;
    close(admitted(decide(&ask(500.0, 2000.0), &[e], &models, &est(), &cfg)).ttft_ms, 113.0);
}

#[test]
fn busy_slots_wait_at_the_gateway_for_throughput() {
    let models = [model("c", 10.0)];
    let cfg = AdmissionConfig::default();
    let engines = [engine(0, 4, 4), engine(1, 4, 4)];
    let mut a = ask(1000.0, 5000.0);
    a.queue_ahead_out_tokens = 300.0;
    // μ = 2 engines × 4 slots / 13 ms. Wait = (300 ahead + 100/2) / μ =
    // 568.75 ms, + batch fill 13 + prefill 40 = 621.75 ms.
    let p = admitted(decide(&a, &engines, &models, &est(), &cfg));
    assert_eq!(p.engine, None, "waits for a slot");
    close(p.ttft_ms, 621.75);
    // With a 500 ms budget: rejected, back once the 121.75 ms excess drained.
    a.ttft_budget_ms = 500.0;
    let r = rejected(decide(&a, &engines, &models, &est(), &cfg));
    assert_eq!(r.reason, RejectReason::TtftInfeasible);
    assert_eq!(r.retry_after_s, 1);
    close(r.predicted_ttft_ms, 621.75);
    a.queue_ahead_out_tokens = 30_000.0; // ~49 s of work ahead
    let r = rejected(decide(&a, &engines, &models, &est(), &cfg));
    assert_eq!(r.retry_after_s, cfg.retry_after_max_s, "clamped");
    let r = rejected(decide(&ask(1.0, 5000.0), &[engine(0, 4, 0)], &models, &est(), &cfg));
    assert_eq!(r.retry_after_s, 1, "never below the floor");
}

#[test]
fn reduce_output_fits_the_e2e_budget_down_to_the_floor() {
    let models = [model("c", 10.0)];
    let cfg = AdmissionConfig::default();
    // E2E 1353 > 1000: (1000 - 53) / 13 = 72.8 -> max_tokens 72.
    let p = admitted(decide(&ask(500.0, 1000.0), &[engine(0, 8, 3)], &models, &est(), &cfg));
    assert_eq!(p.steps, vec![Degradation::ReduceOutput]);
    assert_eq!(p.max_tokens, 72);
    close(p.e2e_ms, 53.0 + 72.0 * 13.0);
    // 300 ms would need 19 tokens, under the floor of 32: rejected.
    let r = rejected(decide(&ask(500.0, 300.0), &[engine(0, 8, 3)], &models, &est(), &cfg));
    assert_eq!(r.reason, RejectReason::E2eInfeasible);
}

#[test]
fn the_ladder_runs_in_the_configured_order() {
    let models = [model("c", 10.0)];
    let cfg = AdmissionConfig::default(); // sampling costs 1.05
    let mut a = ask(500.0, 1300.0);
    a.sampling = true;
    // Sampling: E2E = 53 + 1300 × 1.05 = 1418 > 1300.
    // greedy first: 1353, still over; then reduce to (1300-53)/13 = 95.
    a.degradations = &[Degradation::Greedy, Degradation::ReduceOutput];
    let p = admitted(decide(&a, &[engine(0, 8, 3)], &models, &est(), &cfg));
    assert_eq!(p.steps, vec![Degradation::Greedy, Degradation::ReduceOutput]);
    assert!(!p.sampling);
    assert_eq!(p.max_tokens, 95);
    // reduce first: (1300-53)/13.65 = 91 tokens is enough; sampling stays.
    a.degradations = &[Degradation::ReduceOutput, Degradation::Greedy];
    let p = admitted(decide(&a, &[engine(0, 8, 3)], &models, &est(), &cfg));
    assert_eq!(p.steps, vec![Degradation::ReduceOutput]);
    assert!(p.sampling);
    assert_eq!(p.max_tokens, 91);
    // A tier that allows no degradation is refused.
    a.degradations = &[];
    let r = rejected(decide(&a, &[engine(0, 8, 3)], &models, &est(), &cfg));
    assert_eq!(r.reason, RejectReason::E2eInfeasible);
}

#[test]
fn faster_class_takes_the_overflow_engines() {
    let models = [model("slow", 10.0), model("fast", 2.0)];
    let cfg = AdmissionConfig::default();
    let mut overflow = engine(1, 8, 0);
    overflow.class = 1;
    let engines = [engine(0, 4, 4), overflow];
    let mut a = ask(300.0, 5000.0);
    a.queue_ahead_out_tokens = 300.0;
    a.overflow_class = Some(1);
    let p = admitted(decide(&a, &engines, &models, &est(), &cfg));
    assert_eq!(p.steps, vec![Degradation::FasterClass]);
    assert_eq!((p.engine, p.class), (Some(1), 1));
    // Without an overflow class the same request is refused.
    a.overflow_class = None;
    assert_eq!(rejected(decide(&a, &engines, &models, &est(), &cfg)).reason, RejectReason::TtftInfeasible);
}

#[test]
fn kv_headroom_and_lanes_steer_the_choice() {
    let models = [model("c", 10.0)];
    let cfg = AdmissionConfig::default();
    let mut full = engine(0, 8, 0);
    full.kv_headroom_tokens = 100; // less than 400 + 100
    let p = admitted(decide(&ask(500.0, 5000.0), &[full.clone(), engine(1, 8, 5)], &models, &est(), &cfg));
    assert_eq!(p.engine, Some(1), "never below the low watermark");
    let r = rejected(decide(&ask(500.0, 5000.0), &[full], &models, &est(), &cfg));
    assert_eq!(r.reason, RejectReason::KvHeadroom);
    // Long prompts go to the long lane even when it is busier.
    let mut lane = engine(0, 8, 4);
    lane.long_lane = true;
    let engines = [lane, engine(1, 8, 0)];
    let mut long = ask(5000.0, 60000.0);
    long.long = true;
    assert_eq!(admitted(decide(&long, &engines, &models, &est(), &cfg)).engine, Some(0));
    assert_eq!(admitted(decide(&ask(5000.0, 60000.0), &engines, &models, &est(), &cfg)).engine, Some(1));
    assert_eq!(
        rejected(decide(&ask(500.0, 5000.0), &[], &models, &est(), &cfg)).reason,
        RejectReason::NoEngine
    );
}

#[test]
fn a_cached_prefix_is_predicted_cheaper_and_admitted_where_a_cold_prompt_is_not() {
    let models = [model("c", 10.0)];
    let cfg = AdmissionConfig::default();
    // 4,000 prompt tokens: prefill 400 ms, + a 13 ms batch fill = 413 ms.
    let mut a = ask(300.0, 60_000.0);
    a.n_in = 4000;
    assert_eq!(
        rejected(decide(&a, &[engine(0, 8, 3)], &models, &est(), &cfg)).reason,
        RejectReason::TtftInfeasible
    );
    // The same prompt on an engine holding its first 3,600 tokens: 40 ms.
    let mut warm = engine(1, 8, 3);
    warm.cached_tokens = 3600;
    let p = admitted(decide(&a, &[engine(0, 8, 3), warm.clone()], &models, &est(), &cfg));
    assert_eq!(p.engine, Some(1));
    close(p.ttft_ms, 53.0);
    // Among free engines that meet the budgets, the warm one (prefill the
    // fleet does not repeat), though an idle one would finish first
    // (50 + 100 x 10 ms against 16 + 100 x 16 ms at batch 7)...
    let mut warm_busy = warm;
    warm_busy.active = 6;
    let engines = [engine(0, 8, 0), warm_busy];
    let p = admitted(decide(&ask(1000.0, 60_000.0), &engines, &models, &est(), &cfg));
    assert_eq!(p.engine, Some(1), "affinity among feasible engines");
    // ...but never one that would miss them: with a 1.5 s end-to-end
    // budget only the idle engine fits.
    let p = admitted(decide(&ask(1000.0, 1500.0), &engines, &models, &est(), &cfg));
    assert_eq!(p.engine, Some(0), "the budget first");
}

#[test]
fn credit_goes_to_matched_engines_only_while_the_fleet_is_balanced() {
    let cfg = crate::prefix::AffinityConfig::default(); // 16-token blocks; imbalance past 4,096 and 1.5x
    let mut cands = vec![engine(0, 8, 2), engine(1, 8, 2), engine(2, 8, 2)];
    let matched = [10, 4, 0];
    credit_prefix(&mut cands, &mut [], &matched, (12, 200), &cfg);
    assert_eq!(cands.iter().map(|c| c.cached_tokens).collect::<Vec<_>>(), vec![160, 64, 0]);
    // Never the whole prompt: its last token is computed.
    credit_prefix(&mut cands, &mut [], &matched, (10, 160), &cfg);
    assert_eq!(cands[0].cached_tokens, 159);
    // Engine 0 carries 10,000 tokens more than the least loaded: no credit
    // there; engine 1's shorter match still counts.
    cands[0].active_out_tokens = 10_200;
    credit_prefix(&mut cands, &mut [], &matched, (12, 200), &cfg);
    assert_eq!(cands.iter().map(|c| c.cached_tokens).collect::<Vec<_>>(), vec![0, 64, 0]);
    // A match under min_match (a quarter of the prompt) is none either.
    cands[0].active_out_tokens = 200;
    credit_prefix(&mut cands, &mut [], &[2, 0, 0], (12, 200), &cfg);
    assert!(cands.iter().all(|c| c.cached_tokens == 0));
}

#[test]
fn equally_fit_engines_are_taken_in_turn_and_a_fitter_one_always_wins() {
    let models = [model("c", 10.0)];
    let cfg = AdmissionConfig::default();
    let pick = |engines: &[Candidate], turn: u64| {
        admitted(decide(&Ask { turn, ..ask(500.0, 2000.0) }, engines, &models, &est(), &cfg)).engine
    };
    // An idle fleet: each decision starts one engine further on.
    let idle = [engine(0, 8, 0), engine(1, 8, 0), engine(2, 8, 0)];
    let picks: Vec<_> = (0..4).map(|t| pick(&idle, t)).collect();
    assert_eq!(picks, vec![Some(0), Some(1), Some(2), Some(0)]);
    // Engine 1 runs 3 sequences (a longer step, a later finish): only the
    // two idle engines take turns.
    let mixed = [engine(0, 8, 0), engine(1, 8, 3), engine(2, 8, 0)];
    let picks: Vec<_> = (0..3).map(|t| pick(&mixed, t)).collect();
    assert_eq!(picks, vec![Some(0), Some(2), Some(2)]);
}

/// One decision scans the engines a bounded number of times: a long
/// prompt's lane check once read the whole list per engine, which cost
/// nothing while the lane engine came first and made a decision quadratic
/// (4x slower at 256 engines) once ties were taken in turn. Timed as a
/// ratio (8x the engines must cost well under 64x), so the machine's speed
/// does not matter; each size is the fastest of five runs.
#[test]
#[allow(clippy::disallowed_methods, clippy::disallowed_types)] // a cost bound: wall time is what it measures
fn a_decision_is_linear_in_engines_wherever_the_long_lane_sits() {
    let models = [model("c", 10.0)];
    let cfg = AdmissionConfig::default();
    let long_ask = Ask { n_in: 3000, long: true, ..ask(1e9, 1e9) };
    let fastest = |n: usize| {
        let mut engines: Vec<Candidate> = (0..n).map(|i| engine(i, 8, (i % 7) as u32 + 1)).collect();
        engines[n - 1].long_lane = true; // last in the scan order
        (0..5)
            .map(|_| {
                let t = std::time::Instant::now();
                let d = decide(&long_ask, &engines, &models, &est(), &cfg);
                let spent = t.elapsed();
                assert!(matches!(d, Decision::Admit(_)));
                spent.as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let (small, large) = (fastest(2_000), fastest(16_000));
    assert!(large < 24.0 * small, "8x the engines took {:.1}x the time", large / small);
}

#[test]
fn a_target_no_idle_engine_can_meet_is_unattainable_not_an_overload() {
    let models = [model("a", 10.0)];
    let cfg = AdmissionConfig::default();
    // 8,000 prompt tokens prefill in 800 ms on an idle engine: a 500 ms
    // TTFT budget is out of reach whatever the load.
    let long = Ask { n_in: 8000, unattainable: Unattainable::Refuse, ..ask(500.0, 20_000.0) };
    let idle = [engine(0, 8, 0), engine(1, 8, 0)];
    let r = rejected(decide(&long, &idle, &models, &est(), &cfg));
    assert_eq!((r.reason, r.retry_after_s), (RejectReason::Unattainable, 0), "{r:?}");
    close(r.predicted_ttft_ms, 800.0 + 10.0);
    let busy = [engine(0, 8, 7), engine(1, 8, 7)];
    let r = rejected(decide(&long, &busy, &models, &est(), &cfg));
    assert_eq!(r.reason, RejectReason::Unattainable, "busy or not, it is not an overload");
    // Best effort: admitted where it finishes first, marked.
    let served = Ask { unattainable: Unattainable::BestEffort, ..long.clone() };
    let p = admitted(decide(&served, &idle, &models, &est(), &cfg));
    assert!(p.unattainable && p.engine.is_some(), "{p:?}");
    // Attainable when idle but not now: the overload answer, as before.
    let short = Ask { n_in: 400, unattainable: Unattainable::Refuse, ..ask(60.0, 20_000.0) };
    let loaded = [
        Candidate { prefill_backlog_tokens: 4000, ..engine(0, 1, 0) },
        Candidate { prefill_backlog_tokens: 4000, ..engine(1, 1, 0) },
    ];
    let r = rejected(decide(&short, &loaded, &models, &est(), &cfg));
    assert_eq!(r.reason, RejectReason::TtftInfeasible, "{r:?}");
    assert!(r.retry_after_s >= 1);
    // A tier that does not choose: the overload answer, as before.
    let legacy = Ask { unattainable: Unattainable::Overload, ..long };
    assert_eq!(rejected(decide(&legacy, &idle, &models, &est(), &cfg)).reason, RejectReason::TtftInfeasible);
}

#[test]
fn a_higher_tier_starts_by_pausing_a_lower_one_only_when_nothing_else_meets_its_budget() {
    let models = [model("c", 10.0)];
    let cfg = AdmissionConfig::default();
    let mut a = ask(500.0, 5000.0);
    a.queue_ahead_out_tokens = 300.0;
    a.preempt = true;
    // Every slot busy: the gate's 621.75 ms misses 500 ms (see above).
    let mut engines = [engine(0, 4, 4), engine(1, 4, 4)];
    assert_eq!(rejected(decide(&a, &engines, &models, &est(), &cfg)).reason, RejectReason::TtftInfeasible);
    // Two bronze sequences on engine 1 that may be paused: it starts there
    // as on a free slot at a full batch (step 13 ms + prefill 40 ms).
    engines[1].preemptible = 2;
    let p = admitted(decide(&a, &engines, &models, &est(), &cfg));
    assert_eq!((p.engine, p.preempts), (Some(1), true));
    close(p.ttft_ms, 53.0);
    // Two started over its slots already: its two are spoken for.
    engines[1].active = 6;
    assert_eq!(rejected(decide(&a, &engines, &models, &est(), &cfg)).reason, RejectReason::TtftInfeasible);
    // Preemption off: the same request is refused.
    engines[1].active = 4;
    a.preempt = false;
    assert_eq!(rejected(decide(&a, &engines, &models, &est(), &cfg)).reason, RejectReason::TtftInfeasible);
    // A gate wait that meets the budget is preferred to pausing anyone.
    a.preempt = true;
    a.ttft_budget_ms = 1000.0;
    let p = admitted(decide(&a, &engines, &models, &est(), &cfg));
    assert_eq!((p.engine, p.preempts), (None, false), "waits at the gate");
    // So is a free slot.
    let free = Ask { preempt: true, ..ask(500.0, 5000.0) };
    let p = admitted(decide(&free, &[engine(0, 4, 3), engines[1].clone()], &models, &est(), &cfg));
    assert!(!p.preempts);
}

#[test]
fn pauses_per_sequence_out_of_range_are_refused() {
    for bad in [0, 9] {
        let cfg = AdmissionConfig { max_pauses: bad, ..AdmissionConfig::default() };
        assert_eq!(cfg.validate().unwrap_err().0, "admission.max_pauses");
    }
}
