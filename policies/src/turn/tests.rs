//! The per-turn decision with made-up times: the turn rule, KV growth and
//! preemption, priority pauses, prefix reuse, and fused decode runs
//! matching step-by-step ones.
use super::*;
use crate::kv::KvConfig;
use crate::prefix::blocks;

/// 100 ms a prefill of any length, 20 ms a decode step.
fn profile() -> LatencyProfile {
    LatencyProfile::parse(
        "t.toml",
        "model = \"m\"\nengine_class = \"c\"\n[prefill]\npoints = [[1, 100.0], [100000, 100.0]]\n[decode]\nbatch_points = [[1, 20.0], [64, 20.0]]\n",
    )
    .unwrap()
}

/// What the tests' payload saw.
#[derive(Debug, Default)]
struct Seen {
    preempted: u32,
    paused: u32,
    resumed: u32,
    failed: Option<&'static str>,
}

impl Payload for Seen {
    fn preempted(seq: &mut Seq<Self>) {
        seq.payload.preempted += 1;
    }
    fn paused(seq: &mut Seq<Self>) {
        seq.payload.paused += 1;
    }
    fn resumed(seq: &mut Seq<Self>) {
        seq.payload.resumed += 1;
    }
    fn failed(seq: &mut Seq<Self>, code: &'static str, _message: &'static str) {
        seq.payload.failed = Some(code);
    }
}

fn turns(pages: u32, max_batch: u32) -> Turns<Seen> {
    let kv = KvAllocator::new(KvConfig {
        total_pages: pages,
        page_tokens: 16,
        low_watermark: 0.0,
        high_watermark: 0.0,
        prefix_cache: true,
    });
    let cfg = TurnConfig {
        limits: BatchLimits { max_batch, reserved_long_slots: 0, ..BatchLimits::default() },
        profile: profile(),
        output_reserve_tokens: 16,
        extend_pages: 1,
        default_ttft: Duration::from_secs(10),
        max_preemptions: 2,
        min_quantum_tokens: 4,
    };
    Turns::new(cfg, kv)
}

fn spec(prompt_tokens: u32, max_tokens: u32) -> Spec {
    Spec {
        prompt_tokens,
        max_tokens,
        key: None,
        ttft_budget: None,
        priority: None,
        blocks: Vec::new(),
        reusable: 0,
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn admit(t: &mut Turns<Seen>, now: Duration, s: Spec) -> u64 {
    match t.admit(now, s, |_| Seen::default()).unwrap() {
        Admitted::Queued(id) => id,
        Admitted::Finished(_) => panic!("finished at admission"),
    }
}

/// Runs the step `next` gives at `now`; every produced token counts, and a
/// sequence is done at `max_tokens`.
fn step(t: &mut Turns<Seen>, now: Duration) -> &'static str {
    let done = |s: &mut Seq<Seen>| {
        s.produced();
        s.generated >= s.max_tokens
    };
    match t.next(now) {
        Step::Prefill(batch) => {
            t.prefilled(now, batch, done);
            "prefill"
        }
        Step::Decode => {
            t.decoded(now, done);
            "decode"
        }
        Step::Idle => "idle",
    }
}

#[test]
fn a_prefill_goes_first_until_the_running_batch_has_stalled() {
    let mut t = turns(1000, 8);
    admit(&mut t, ms(0), spec(32, 100));
    assert_eq!(step(&mut t, ms(0)), "prefill");
    admit(&mut t, ms(10), spec(32, 100));
    // 10 ms since the running sequence's token: under the 500 ms stall.
    assert_eq!(step(&mut t, ms(10)), "prefill");
    assert_eq!(t.running().len(), 2);
    // The running batch's last token was at 10 ms; at 600 ms a new prefill
    // waits for one decode step.
    admit(&mut t, ms(600), spec(32, 100));
    assert_eq!(step(&mut t, ms(600)), "decode");
    assert_eq!(step(&mut t, ms(620)), "prefill");
}

#[test]
fn admission_reserves_the_prompt_and_the_output_reserve_and_refuses_when_draining() {
    let mut t = turns(100, 8);
    admit(&mut t, ms(0), spec(40, 1000)); // 40 + 16 reserved: 4 pages
    assert_eq!(t.kv().snapshot().free, 96);
    let nothing = t.admit(ms(0), spec(10, 0), |_| Seen::default()).unwrap();
    assert!(matches!(nothing, Admitted::Finished(_)));
    t.drain();
    assert_eq!(t.admit(ms(0), spec(10, 10), |_| Seen::default()).unwrap_err(), Refusal::Draining);
    assert_eq!(t.queue().len(), 1);
}

#[test]
fn an_exhausted_cache_preempts_the_worst_key_past_its_quantum_and_recomputes_it() {
    // 8 pages of 16 tokens; two sequences of 32-token prompts, 16 reserved.
    let mut t = turns(8, 8);
    let a = admit(&mut t, ms(0), Spec { key: Some(1.0), ..spec(32, 60) });
    let b = admit(&mut t, ms(0), Spec { key: Some(2.0), ..spec(32, 70) });
    assert_eq!(step(&mut t, ms(0)), "prefill");
    let mut now = 0;
    let mut preempted = None;
    for _ in 0..64 {
        now += 20;
        step(&mut t, ms(now));
        if let Some(s) = t.queue().iter().find(|s| s.payload.preempted > 0) {
            preempted = Some((s.id, s.generated));
            break;
        }
    }
    let (id, generated) = preempted.expect("the cache ran out");
    assert_eq!(id, b, "the worse key goes");
    assert!(t.queue()[0].pages.is_none(), "its pages went back");
    assert_eq!(t.stats().preemptions, 1);
    assert_eq!(t.running().len(), 1);
    assert_eq!(t.running()[0].id, a);
    // It comes back through a prefill of its whole context once a
    // finishes, and runs to its end.
    let mut last = 0;
    while !t.is_empty() {
        now += 20;
        step(&mut t, ms(now));
        if let Some(s) = t.running().iter().find(|s| s.id == b) {
            assert!(s.failed().is_none());
            last = s.generated;
        }
    }
    assert!(t.running().iter().all(|s| s.id != a));
    assert!(last > generated, "b continued where it stopped");
    assert_eq!(last, 69, "its last token ends it at the next boundary");
}

impl Seq<Seen> {
    fn failed(&self) -> Option<&'static str> {
        self.payload.failed
    }
}

#[test]
fn a_sequence_that_cannot_grow_and_may_not_be_preempted_ends_kv_exhausted() {
    let mut t = turns(3, 8); // 48 tokens in all
    admit(&mut t, ms(0), spec(32, 100)); // 32 + 16: all 3 pages
    assert_eq!(step(&mut t, ms(0)), "prefill");
    let mut now = 0;
    let mut ended = false;
    for _ in 0..40 {
        now += 20;
        let before = t.running().len();
        step(&mut t, ms(now));
        if before == 1 && t.running().is_empty() {
            ended = true;
            break;
        }
    }
    assert!(ended, "the sequence ended when the cache ran out");
    assert_eq!(t.kv().snapshot().free, 3, "its pages went back");
}

#[test]
fn a_higher_class_that_would_miss_its_ttft_pauses_a_lower_one_which_resumes_later() {
    let mut t = turns(1000, 2);
    let low = |id_key: f64| Spec {
        key: Some(id_key),
        priority: Some(Priority { class: 0, max_pauses: 2, e2e_budget_ms: 60_000 }),
        ..spec(32, 500)
    };
    admit(&mut t, ms(0), low(1.0));
    admit(&mut t, ms(0), low(2.0));
    assert_eq!(step(&mut t, ms(0)), "prefill");
    assert_eq!(t.running().len(), 2);
    let gold = Spec {
        ttft_budget: Some(ms(300)),
        priority: Some(Priority { class: 2, max_pauses: 0, e2e_budget_ms: 10_000 }),
        ..spec(32, 5)
    };
    let g = admit(&mut t, ms(20), gold);
    // Every slot taken and 500 tokens to the next release: gold would miss.
    match t.next(ms(20)) {
        Step::Prefill(batch) => {
            assert_eq!(batch.iter().map(|s| s.id).collect::<Vec<_>>(), [g]);
            t.prefilled(ms(120), batch, |s| {
                s.produced();
                false
            });
        }
        other => panic!("expected gold's prefill, got {other:?}"),
    }
    assert_eq!(t.paused().len(), 1);
    assert_eq!(t.paused()[0].payload.paused, 1);
    assert_eq!(t.stats().pauses, 1);
    // Gold finishes; the paused sequence takes its slot back, pages kept.
    let mut now = 120;
    while t.running().iter().any(|s| s.id == g) {
        now += 20;
        step(&mut t, ms(now));
    }
    step(&mut t, ms(now + 20));
    assert!(t.paused().is_empty());
    assert!(t.running().iter().any(|s| s.payload.resumed == 1 && s.pages.is_some()));
}

#[test]
fn a_prompt_sharing_a_prefilled_prefix_computes_only_the_rest() {
    let mut t = turns(1000, 8);
    let text = (0..40).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ");
    let with_blocks = |tokens: u32| {
        let b = blocks(&text, 16);
        let reusable = ((tokens - 1) / 16) as usize;
        Spec { blocks: b, reusable, ..spec(tokens, 10) }
    };
    admit(&mut t, ms(0), with_blocks(40));
    assert_eq!(step(&mut t, ms(0)), "prefill");
    admit(&mut t, ms(10), with_blocks(40));
    match t.next(ms(10)) {
        Step::Prefill(batch) => {
            assert_eq!(batch[0].cached_tokens, 32, "two full blocks before the last token");
            assert_eq!(batch[0].cached(), 32);
        }
        other => panic!("expected a prefill, got {other:?}"),
    }
    assert_eq!(t.stats().prompt_tokens, 80);
    assert_eq!(t.stats().cached_tokens, 32);
}

/// Fused runs of `fusable` steps end sequences at the same moments, with
/// the same pages, and preempt at the same boundaries, as the same steps
/// one at a time (a cache small enough to preempt).
#[test]
fn a_fused_decode_run_matches_the_same_steps_one_at_a_time() {
    let run = |fused: bool| {
        let mut t = turns(20, 8);
        for (p, m) in [(30, 250), (70, 120), (5, 90)] {
            admit(&mut t, ms(0), spec(p, m));
        }
        let (mut now, mut log, mut runs) = (0, Vec::new(), 0);
        while !t.is_empty() {
            let batch = match t.next(ms(now)) {
                Step::Prefill(batch) => batch,
                Step::Decode => Vec::new(),
                Step::Idle => {
                    assert!(
                        t.is_empty(),
                        "idle with sequences at {now} ms: {:?} {:?} {:?}",
                        t.queue(),
                        t.paused(),
                        t.kv().snapshot()
                    );
                    continue;
                }
            };
            if !batch.is_empty() {
                now += 100;
                t.prefilled(ms(now), batch, |s| {
                    s.produced();
                    false
                });
                continue;
            }
            let left = t.running().iter().map(|s| u64::from(s.max_tokens - s.generated)).min().unwrap();
            let n = if fused { t.fusable(ms(now), left) } else { 1 };
            t.extend(n);
            now += 20 * n;
            runs += 1;
            t.decoded(ms(now), |s| {
                for _ in 0..n {
                    s.produced();
                }
                let done = s.generated >= s.max_tokens;
                if done {
                    let pages = s.pages.as_ref().unwrap().pages().len();
                    log.push((now, s.id, s.generated, pages, s.preemptions));
                }
                done
            });
        }
        (log, t.kv().snapshot().free, t.stats(), runs)
    };
    let (one, fused) = (run(false), run(true));
    assert_eq!((&one.0, one.1, one.2), (&fused.0, fused.1, fused.2));
    assert_eq!(one.0.len(), 3, "{one:?}");
    assert!(one.2.preemptions > 0, "the cache was small enough to preempt: {one:?}");
    assert!(fused.3 * 4 < one.3, "fused: {} runs for {} steps", fused.3, one.3);
}

#[test]
fn a_run_is_one_step_while_the_turn_rule_holds_a_prefill_and_bounded_by_free_pages() {
    let mut t = turns(20, 8);
    admit(&mut t, ms(0), spec(32, 400)); // 3 pages
    assert_eq!(step(&mut t, ms(0)), "prefill");
    assert!(matches!(t.next(ms(20)), Step::Decode));
    // 17 free pages: the sequence grows 16 tokens a page from 33 (+16
    // reserved) tokens.
    let n = t.fusable(ms(20), 1000);
    assert_eq!(n, 48 - 33 + 17 * 16);
    admit(&mut t, ms(700), spec(16, 10));
    // The running sequence last had a token at 0 ms: stalled 700 ms.
    assert_eq!(t.fusable(ms(700), 1000), 1);
}
