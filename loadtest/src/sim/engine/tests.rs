//! The simulated engine's turns, in virtual time.

use super::*;

fn cfg(max_batch: u32) -> EngineConfig {
    let text = r#"
        model = "m"
        engine_class = "c"
        [prefill]
        points = [[1, 10.0], [1000, 10.0]]
        [decode]
        batch_points = [[1, 10.0], [8, 10.0]]
        ms_per_1k_context = 0.0
    "#;
    let limits = BatchLimits { max_batch, ..BatchLimits::default() };
    EngineConfig::new(limits, LatencyProfile::parse("t", text).unwrap(), 1 << 20, 16)
}

fn seq(req: usize, out: u32, at: f64) -> SimSeq {
    let blocks = std::sync::Arc::from(vec![]);
    let answer = std::sync::Arc::from(vec![]);
    SimSeq {
        req,
        prompt: 100,
        out,
        max_tokens: out,
        key: at,
        enqueued_at: at,
        ttft_budget_ms: 1000.0,
        priority: None,
        blocks,
        answer,
    }
}

/// Runs the engine alone until idle; returns (time, out) in order.
fn drive(e: &mut SimEngine, mut wake: Option<f64>, arrivals: &[(f64, SimSeq)]) -> Vec<(f64, Out)> {
    let mut log = Vec::new();
    let mut pending: Vec<(f64, SimSeq)> = arrivals.to_vec();
    loop {
        let next_arrival = pending.first().map(|(t, _)| *t);
        match (wake, next_arrival) {
            (None, None) => return log,
            (w, Some(a)) if w.is_none_or(|w| a <= w) => {
                let (t, s) = pending.remove(0);
                if let Some(nw) = e.enqueue(t, s).unwrap() {
                    wake = Some(nw);
                }
            }
            (Some(w), _) => {
                let mut outs = Vec::new();
                wake = e.wake(w, &mut outs);
                log.extend(outs.into_iter().map(|o| (w, o)));
            }
            _ => unreachable!(),
        }
    }
}

#[test]
fn one_sequence_takes_prefill_plus_a_step_per_further_token() {
    let c = cfg(8);
    let mut e = SimEngine::new(&c);
    let log = drive(&mut e, None, &[(0.0, seq(0, 5, 0.0))]);
    assert_eq!(log[0], (0.01, Out::FirstToken { req: 0 }));
    let (t, Out::Finished { tokens, .. }) = log[1] else { panic!("{log:?}") };
    assert!((t - 0.05).abs() < 1e-9, "10 ms prefill + 4 steps of 10 ms: {t}");
    assert_eq!(tokens, 5);
    assert!(e.is_empty());
}

#[test]
fn an_arrival_mid_run_is_prefilled_at_the_next_token_boundary() {
    let c = cfg(8);
    let mut e = SimEngine::new(&c);
    // A long answer decodes; a second request arrives at 34 ms: the
    // step in progress ends at 40 ms, its prefill runs 40-50 ms.
    let log = drive(&mut e, None, &[(0.0, seq(0, 100, 0.0)), (0.034, seq(1, 3, 0.034))]);
    let first1 = log.iter().find(|(_, o)| *o == Out::FirstToken { req: 1 }).unwrap().0;
    assert!((first1 - 0.05).abs() < 1e-9, "{first1}");
    // Then both decode together: req 1 needs 2 more steps -> 70 ms.
    let fin1 = log.iter().find(|(_, o)| matches!(o, Out::Finished { req: 1, .. })).unwrap().0;
    assert!((fin1 - 0.07).abs() < 1e-9, "{fin1}");
    // req 0: 10 ms prefill + 99 steps + the 10 ms prefill that paused it.
    let fin0 = log.iter().find(|(_, o)| matches!(o, Out::Finished { req: 0, .. })).unwrap().0;
    assert!((fin0 - 1.01).abs() < 1e-9, "{fin0}");
}

#[test]
fn prefill_batches_run_back_to_back_only_until_running_sequences_stall_too_long() {
    // Every prompt is long and a batch takes one: three arrivals at
    // 34 ms are three 10 ms prefill batches behind a running answer.
    let firsts = |bound_ms: u32| {
        let mut c = cfg(8);
        c.limits.long_prompt_tokens = 1;
        c.limits.max_long_per_prefill = 1;
        c.limits.reserved_long_slots = 0;
        c.limits.max_decode_stall_ms = bound_ms;
        let mut e = SimEngine::new(&c);
        let mut arrivals = vec![(0.0, seq(0, 100, 0.0))];
        arrivals.extend((1..4).map(|i| (0.034, seq(i, 3, 0.034))));
        let log = drive(&mut e, None, &arrivals);
        (1..4)
            .map(|r| log.iter().find(|(_, o)| *o == Out::FirstToken { req: r }).unwrap().0)
            .collect::<Vec<_>>()
    };
    let close = |got: &[f64], want: [f64; 3]| got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-9);
    // Bound 15 ms (the engine's rule): two back to back, a 10 ms decode
    // step, the third.
    let got = firsts(15);
    assert!(close(&got, [0.05, 0.06, 0.08]), "{got:?}");
    // A bound that never binds: all three back to back.
    let got = firsts(10_000);
    assert!(close(&got, [0.05, 0.06, 0.07]), "{got:?}");
}

#[test]
fn the_batch_cap_makes_the_ninth_sequence_wait_for_a_slot() {
    let c = cfg(8);
    let mut e = SimEngine::new(&c);
    let arrivals: Vec<(f64, SimSeq)> = (0..9).map(|i| (0.0, seq(i, 10, 0.0))).collect();
    let log = drive(&mut e, None, &arrivals);
    let firsts: Vec<f64> =
        log.iter().filter(|(_, o)| matches!(o, Out::FirstToken { .. })).map(|(t, _)| *t).collect();
    assert_eq!(firsts.len(), 9);
    assert!(firsts[..8].iter().all(|t| (t - 0.01).abs() < 1e-9), "{firsts:?}");
    assert!(firsts[8] > 0.09, "the ninth starts once the first eight finish: {firsts:?}");
}

#[test]
fn a_cancelled_running_sequence_leaves_at_the_next_token_boundary_and_frees_its_kv() {
    let c = cfg(8);
    let mut e = SimEngine::new(&c);
    let headroom = e.kv_headroom();
    let wake = e.enqueue(0.0, seq(0, 100, 0.0)).unwrap();
    let mut outs = Vec::new();
    let next = e.wake(wake.unwrap(), &mut outs); // prefill 0-10 ms
    let next = e.wake(next.unwrap(), &mut outs); // first token; a 99-step run starts
    assert_eq!(outs, vec![Out::FirstToken { req: 0 }]);
    assert!(next.unwrap() > 1.0, "the run goes to the end of the answer");
    let cut = e.cancel(0.035, 0).expect("the run is cut at the step in progress");
    assert!((cut - 0.04).abs() < 1e-9, "{cut}");
    outs.clear();
    assert_eq!(e.wake(cut, &mut outs), None, "nothing left to run");
    assert!(outs.is_empty(), "a cancelled sequence reports nothing: {outs:?}");
    assert!(e.is_empty());
    assert_eq!(e.kv_headroom(), headroom, "its KV is back");
}

/// The engine's KV rules: admission reserves the prompt plus the output
/// reserve and refuses below the low watermark; running sequences grow
/// page by page and, when the cache runs out, the worst key past its
/// quantum is preempted and recomputed later, at most `max_preemptions`
/// times (then, with no other victim, it ends `kv_exhausted`, as on the
/// engine); finishing gives every page back.
#[test]
fn admission_reserves_a_prompt_and_the_output_reserve_and_growth_preempts() {
    let run = |max_preemptions: u32| {
        let mut c = cfg(8);
        c.kv_tokens = 1000; // 62 pages, 4 kept free at admission
        c.max_preemptions = max_preemptions;
        let mut e = SimEngine::new(&c);
        let headroom = e.kv_headroom();
        // 100 + 64 reserved: 11 pages each; five fit, the sixth is refused.
        for r in 0..5 {
            assert!(e.enqueue(0.0, seq(r, 500, 0.0)).is_ok(), "{r}");
        }
        assert_eq!(e.enqueue(0.0, seq(5, 500, 0.0)), Err(Refused::Kv));
        // Each grows to 600 tokens (38 pages): they cannot all run at once.
        let log = drive(&mut e, Some(0.0), &[]);
        assert!(e.preemptions() > 0, "the cache ran out and sequences were preempted");
        assert_eq!(e.kv_headroom(), headroom, "every page is back");
        assert!(e.enqueue(100.0, seq(5, 500, 100.0)).is_ok());
        let count = |f: fn(&Out) -> bool| log.iter().filter(|(_, o)| f(o)).count();
        (count(|o| matches!(o, Out::Finished { .. })), count(|o| matches!(o, Out::Failed { .. })))
    };
    assert_eq!(run(8), (5, 0));
    assert_eq!(run(2), (4, 1), "the engine's default bound ends one");
}

#[test]
fn a_cached_prefix_is_charged_no_prefill_and_evictions_are_reported() {
    // Prefill 1 ms per token; KV for 10 pages of 16 tokens.
    let text = "model = \"m\"\nengine_class = \"t\"\n[prefill]\npoints = [[0, 0.0], [1000, 1000.0]]\n\
                [decode]\nbatch_points = [[1, 10.0]]\nms_per_1k_context = 0.0\n";
    let c = EngineConfig { profile: LatencyProfile::parse("t", text).unwrap(), kv_tokens: 128, ..cfg(8) };
    let prompt = |req: usize, blocks: Vec<u64>, at: f64| SimSeq {
        prompt: 65,
        blocks: blocks.into(),
        ..seq(req, 1, at)
    };
    let first_at =
        |log: &[(f64, Out)]| log.iter().find(|(_, o)| matches!(o, Out::FirstToken { .. })).unwrap().0;
    let mut e = SimEngine::new(&c);
    let log = drive(&mut e, None, &[(0.0, prompt(0, vec![1, 2, 3, 4], 0.0))]);
    assert!((first_at(&log) - 0.065).abs() < 1e-9, "65 tokens computed: {log:?}");
    // The same four blocks and one more token: 64 cached, 1 computed.
    let log = drive(&mut e, None, &[(1.0, prompt(1, vec![1, 2, 3, 4], 1.0))]);
    assert!((first_at(&log) - 1.001).abs() < 1e-9, "{log:?}");
    assert_eq!((e.lookup_tokens(), e.hit_tokens()), (130, 64));
    // Another prompt's blocks push the least recently used out of the 8
    // pages (a 65-token prompt + 1 output holds 5 while it runs).
    drive(&mut e, None, &[(2.0, prompt(2, vec![5, 6, 7, 8], 2.0))]);
    assert!(!e.evicted.is_empty(), "evictions are reported");
    assert!(e.evicted.iter().all(|h| [1, 2, 3, 4].contains(h)), "{:?}", e.evicted);
    let off = EngineConfig { prefix_cache: false, ..c.clone() };
    let mut e = SimEngine::new(&off);
    drive(&mut e, None, &[(0.0, prompt(0, vec![1, 2, 3, 4], 0.0))]);
    let log = drive(&mut e, None, &[(1.0, prompt(1, vec![1, 2, 3, 4], 1.0))]);
    assert!((first_at(&log) - 1.065).abs() < 1e-9, "the cache off: all computed");
}

#[test]
fn an_answer_a_later_prompt_resends_is_named_when_it_ends() {
    // Prefill 1 ms per token. A 40-token prompt (2 full blocks) answers
    // 30 tokens: at its end blocks 1-4 hold K/V (69 positions), block 5
    // would need the last token's.
    let text = "model = \"m\"\nengine_class = \"t\"\n[prefill]\npoints = [[0, 0.0], [1000, 1000.0]]\n\
                [decode]\nbatch_points = [[1, 10.0]]\nms_per_1k_context = 0.0\n";
    let c = EngineConfig { profile: LatencyProfile::parse("t", text).unwrap(), ..cfg(8) };
    let first_at =
        |log: &[(f64, Out)]| log.iter().find(|(_, o)| matches!(o, Out::FirstToken { .. })).unwrap().0;
    let turn = |req: usize, prompt: u32, blocks: Vec<u64>, answer: Vec<u64>, at: f64| SimSeq {
        prompt,
        blocks: blocks.into(),
        answer: answer.into(),
        ..seq(req, 30, at)
    };
    for (resent, cached) in [(true, 64), (false, 32)] {
        let mut e = SimEngine::new(&c);
        let answer = if resent { vec![1, 2, 3, 4, 5] } else { vec![] };
        drive(&mut e, None, &[(0.0, turn(0, 40, vec![1, 2], answer, 0.0))]);
        // The next turn: prompt, answer and a 10-token message, 80 tokens.
        let log = drive(&mut e, None, &[(5.0, turn(1, 80, vec![1, 2, 3, 4, 5], vec![], 5.0))]);
        assert_eq!(e.hit_tokens(), cached, "answer resent: {resent}");
        let computed = f64::from(80 - cached as u32) / 1e3;
        assert!((first_at(&log) - 5.0 - computed).abs() < 1e-9, "{log:?}");
    }
}
