//! Scheduler tests in virtual time (tokio paused clock).

use super::*;
use crate::api::Event;
use crate::backend::emulated::Emulated;
use crate::kv::KvConfig;
use policies::prefix::Chain;
use policies::LatencyProfile;

/// Prefill `prefill_ms` flat; decode 10 ms at batch 1, 12 ms at batch 2.
fn profile(prefill_ms: u32) -> LatencyProfile {
    LatencyProfile::parse(
        "t",
        &format!(
            "model = \"m\"\nengine_class = \"t\"\n[prefill]\npoints = [[0, {prefill_ms}.0]]\n\
             [decode]\nbatch_points = [[1, 10.0], [2, 12.0], [3, 14.0]]\n"
        ),
    )
    .unwrap()
}

fn sched(
    prefill_ms: u32,
    pages: u32,
    page_tokens: u32,
    cfg: impl FnOnce(&mut SchedulerConfig),
) -> (Scheduler, Arc<KvAllocator>) {
    let kv = KvAllocator::new(KvConfig {
        total_pages: pages,
        page_tokens,
        low_watermark: 0.0,
        high_watermark: 0.0,
        prefix_cache: true,
    });
    let mut c = SchedulerConfig {
        limits: BatchLimits::default(),
        profile: profile(prefill_ms),
        output_reserve_tokens: 0,
        extend_pages: 1,
        default_ttft: Duration::from_secs(10),
        max_preemptions: 2,
        min_quantum_tokens: 2,
    };
    cfg(&mut c);
    (
        Scheduler::spawn(Emulated { profile: profile(prefill_ms), to_max_tokens: false }, Arc::clone(&kv), c),
        kv,
    )
}

fn req(prompt: &str, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        request_id: prompt.into(),
        model: "m".into(),
        prompt: prompt.into(),
        max_tokens,
        temperature: None,
        seed: None,
        stop: vec![],
        priority_key: None,
        ttft_budget_ms: None,
        priority: None,
    }
}

/// Events of one sequence with their virtual arrival times.
async fn collect(mut rx: mpsc::UnboundedReceiver<Bytes>, t0: tokio::time::Instant) -> Vec<(Duration, Event)> {
    let mut out = Vec::new();
    while let Some(line) = rx.recv().await {
        out.push((t0.elapsed(), serde_json::from_slice(&line).unwrap()));
    }
    out
}

fn text(events: &[(Duration, Event)]) -> String {
    events
        .iter()
        .filter_map(|(_, e)| if let Event::Token { text } = e { Some(text.as_str()) } else { None })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn tokens_follow_the_profile_and_sequences_join_at_token_boundaries() {
    let (s, _) = sched(30, 64, 16, |_| {});
    let t0 = tokio::time::Instant::now();
    let (tx, rx) = mpsc::unbounded_channel();
    s.enqueue(req("first", 5), 2, tx).await.unwrap();
    let first = tokio::spawn(collect(rx, t0));
    tokio::time::sleep(Duration::from_millis(45)).await; // mid decode step 2
    let (tx, rx) = mpsc::unbounded_channel();
    s.enqueue(req("second", 2), 2, tx).await.unwrap();
    let second = tokio::spawn(collect(rx, t0));
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    let at = |ev: &[(Duration, Event)]| ev.iter().map(|(t, _)| t.as_millis() as u64).collect::<Vec<_>>();
    // first: prefill 30; decode alone 40, 50; the second's prefill runs
    // 50..80 (decode waits); both decode at batch 2 (92); the second is
    // done and leaves, so the first decodes alone again (102).
    assert_eq!(at(&first), vec![30, 40, 50, 92, 102, 102], "{first:?}");
    // second: prefill 50..80 gives its first token; one decode at batch 2.
    assert_eq!(at(&second), vec![80, 92, 92]);
    assert!(matches!(first.last().unwrap().1, Event::Done { finish_reason: FinishReason::Length, .. }));
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_sequence_frees_its_pages_at_the_next_boundary() {
    let (s, kv) = sched(0, 64, 16, |_| {});
    let (tx, mut rx) = mpsc::unbounded_channel();
    s.enqueue(req("cancel me", 1000), 2, tx).await.unwrap();
    rx.recv().await.unwrap();
    assert!(kv.snapshot().free < 64);
    let t = tokio::time::Instant::now();
    drop(rx);
    while s.snapshot().await.inflight_sequences > 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // One decode step (10 ms) plus this loop's 1 ms polling.
    assert!(t.elapsed() <= Duration::from_millis(11), "within one decode step: {:?}", t.elapsed());
    assert_eq!(kv.snapshot().free, 64);
}

#[tokio::test(start_paused = true)]
async fn preemption_reclaims_pages_and_the_victim_resumes_with_identical_text() {
    // 6 pages of 4 tokens: two sequences growing to 2 + 10 tokens each
    // (3 pages each) cannot both fit with the extension headroom.
    let alone = {
        let (s, _) = sched(0, 64, 4, |_| {});
        let (tx, rx) = mpsc::unbounded_channel();
        s.enqueue(req("victim", 10), 2, tx).await.unwrap();
        text(&collect(rx, tokio::time::Instant::now()).await)
    };
    let (s, kv) = sched(0, 5, 4, |c| c.min_quantum_tokens = 1);
    let t0 = tokio::time::Instant::now();
    let mut rxs = Vec::new();
    for (p, key) in [("keeper", 1.0), ("victim", 9.0)] {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut r = req(p, 10);
        r.priority_key = Some(key);
        s.enqueue(r, 2, tx).await.unwrap();
        rxs.push(tokio::spawn(collect(rx, t0)));
    }
    let keeper = rxs.remove(0).await.unwrap();
    let victim = rxs.remove(0).await.unwrap();
    let snap = s.snapshot().await;
    assert!(snap.preemptions >= 1, "the cache forced a preemption");
    assert!(snap.preemptions <= 2, "the cap (2) holds");
    assert!(matches!(keeper.last().unwrap().1, Event::Done { .. }), "{keeper:?}");
    assert!(matches!(victim.last().unwrap().1, Event::Done { .. }), "{victim:?}");
    assert_eq!(text(&victim), alone, "preempted and resumed, the text is unchanged");
    assert_eq!(kv.snapshot().free, 5);
}

#[tokio::test(start_paused = true)]
async fn without_a_preemptible_victim_the_needy_sequence_fails_cleanly() {
    let (s, kv) = sched(0, 3, 4, |c| c.max_preemptions = 0);
    let (tx, rx) = mpsc::unbounded_channel();
    s.enqueue(req("big", 50), 2, tx).await.unwrap();
    let events = collect(rx, tokio::time::Instant::now()).await;
    let Event::Error { code, .. } = &events.last().unwrap().1 else { panic!("{events:?}") };
    assert_eq!(code, "kv_exhausted");
    assert_eq!(kv.snapshot().free, 3);
}

#[tokio::test(start_paused = true)]
async fn a_lone_sequence_outgrowing_the_cache_ends_and_the_scheduler_stays_responsive() {
    // 4 pages of 4 tokens; quantum 1 so it may preempt itself.
    let (s, kv) = sched(0, 4, 4, |c| c.min_quantum_tokens = 1);
    let (tx, rx) = mpsc::unbounded_channel();
    s.enqueue(req("grows", 100), 2, tx).await.unwrap();
    let events = collect(rx, tokio::time::Instant::now()).await;
    let Event::Error { code, .. } = &events.last().unwrap().1 else { panic!("{events:?}") };
    assert_eq!(code, "kv_exhausted");
    assert_eq!(kv.snapshot().free, 4);
    let snap = tokio::time::timeout(Duration::from_secs(1), s.snapshot()).await.expect("scheduler answers");
    assert_eq!((snap.queued_sequences, snap.inflight_sequences), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn drain_refuses_new_work_and_resolves_when_in_flight_work_is_done() {
    let (s, _) = sched(5, 64, 16, |_| {});
    let (tx, rx) = mpsc::unbounded_channel();
    s.enqueue(req("running", 4), 2, tx).await.unwrap();
    let t0 = tokio::time::Instant::now();
    let events = tokio::spawn(collect(rx, t0));
    let drained = {
        let s = s.clone();
        tokio::spawn(async move {
            s.drain().await;
            t0.elapsed()
        })
    };
    tokio::task::yield_now().await;
    let (tx, _rx) = mpsc::unbounded_channel();
    assert_eq!(s.enqueue(req("late", 4), 2, tx).await, Err(Refusal::Turn(turn::Refusal::Draining)));
    let events = events.await.unwrap();
    assert!(matches!(events.last().unwrap().1, Event::Done { .. }));
    assert_eq!(drained.await.unwrap(), events.last().unwrap().0, "drain ends when the last sequence does");
}

/// Prefill 1 ms per token; decode as [`profile`].
fn linear_prefill() -> LatencyProfile {
    LatencyProfile::parse(
        "t",
        "model = \"m\"\nengine_class = \"t\"\n[prefill]\npoints = [[0, 0.0], [4096, 4096.0]]\n\
         [decode]\nbatch_points = [[1, 10.0], [2, 12.0]]\n",
    )
    .unwrap()
}

/// The first token's virtual time and the done event's cached tokens.
async fn first_token_and_cached(s: &Scheduler, prompt: &str) -> (Duration, u32) {
    let t0 = tokio::time::Instant::now();
    let (tx, rx) = mpsc::unbounded_channel();
    s.enqueue(req(prompt, 2), policies::tokens::count(prompt), tx).await.unwrap();
    let events = collect(rx, t0).await;
    let cached = match events.last() {
        Some((_, Event::Done { usage, .. })) => usage.cached_tokens,
        other => panic!("{other:?}"),
    };
    (events[0].0, cached)
}

#[tokio::test(start_paused = true)]
async fn a_shared_prefix_is_charged_no_prefill_time_and_the_cache_off_charges_it_all() {
    // 64 one-token words: 4 pages of 16. Each prompt adds one token.
    let system: Vec<String> = (0..64).map(|i| format!("s{i:03}")).collect();
    let system = system.join(" ");
    for cache in [true, false] {
        let kv = KvAllocator::new(KvConfig {
            total_pages: 64,
            page_tokens: 16,
            low_watermark: 0.0,
            high_watermark: 0.0,
            prefix_cache: cache,
        });
        let cfg = SchedulerConfig {
            limits: BatchLimits::default(),
            profile: linear_prefill(),
            output_reserve_tokens: 0,
            extend_pages: 1,
            default_ttft: Duration::from_secs(10),
            max_preemptions: 2,
            min_quantum_tokens: 2,
        };
        let s = Scheduler::spawn(
            Emulated { profile: linear_prefill(), to_max_tokens: false },
            Arc::clone(&kv),
            cfg,
        );
        let first = first_token_and_cached(&s, &format!("{system} qone")).await;
        assert_eq!(
            first,
            (Duration::from_millis(65), 0),
            "cache {cache}: the first prompt is computed whole"
        );
        let second = first_token_and_cached(&s, &format!("{system} qtwo")).await;
        if cache {
            // 64 of 65 tokens found: one token of prefill.
            assert_eq!(second, (Duration::from_millis(1), 64));
            let snap = kv.snapshot();
            assert_eq!((snap.cached_pages, snap.hit_tokens), (4, 64), "{snap:?}");
        } else {
            assert_eq!(second, (Duration::from_millis(65), 0));
            assert_eq!(kv.snapshot().cached_pages, 0);
        }
        // A prompt that is exactly the cached prefix still computes its last token.
        let same = first_token_and_cached(&s, &system).await;
        assert_eq!(
            same,
            if cache { (Duration::from_millis(16), 48) } else { (Duration::from_millis(64), 0) }
        );
    }
}

/// Runs one 12-token stream with three 30 ms prefill batches queued behind
/// it mid-stream; returns the longest gap between the stream's tokens and
/// the burst's first-token times.
async fn stall_with_bound(bound_ms: u32) -> (u64, Vec<u64>) {
    // Every prompt is long and a batch takes one long prompt.
    let (s, _) = sched(30, 256, 16, |c| {
        c.limits.long_prompt_tokens = 1;
        c.limits.max_long_per_prefill = 1;
        c.limits.reserved_long_slots = 0;
        c.limits.max_decode_stall_ms = bound_ms;
    });
    let t0 = tokio::time::Instant::now();
    let (tx, rx) = mpsc::unbounded_channel();
    s.enqueue(req("streaming", 12), 2, tx).await.unwrap();
    let running = tokio::spawn(collect(rx, t0));
    tokio::time::sleep(Duration::from_millis(45)).await; // mid decode step 2
    let mut burst = Vec::new();
    for i in 0..3 {
        let (tx, rx) = mpsc::unbounded_channel();
        s.enqueue(req(&format!("burst {i}"), 2), 2, tx).await.unwrap();
        burst.push(tokio::spawn(collect(rx, t0)));
    }
    let at: Vec<u64> = running.await.unwrap().iter().map(|(t, _)| t.as_millis() as u64).collect();
    let longest = at.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    let mut firsts = Vec::new();
    for b in burst {
        let events = b.await.unwrap();
        assert!(matches!(events.last().unwrap().1, Event::Done { .. }), "every burst prompt is served");
        firsts.push(events[0].0.as_millis() as u64);
    }
    (longest, firsts)
}

#[tokio::test(start_paused = true)]
async fn prefill_batches_run_back_to_back_only_until_running_streams_stall_too_long() {
    // Bound 40 ms: two prefills (60 ms) back to back, then the decode step
    // that gives the stream its token (14 ms at batch 3), then the third.
    let (longest, firsts) = stall_with_bound(40).await;
    assert!((72..=76).contains(&longest), "a token waited {longest} ms");
    assert_eq!(firsts[1] - firsts[0], 30, "the first two prefills back to back: {firsts:?}");
    assert!(firsts[2] - firsts[1] > 30, "a decode step before the third: {firsts:?}");
    // Without a binding bound the three run back to back (90 ms and a step).
    let (longest, firsts) = stall_with_bound(10_000).await;
    assert!(longest >= 100, "a token waited only {longest} ms");
    assert_eq!(firsts[2] - firsts[0], 60, "{firsts:?}");
}

fn tiered(prompt: &str, max_tokens: u32, class: u32, ttft_ms: u32) -> GenerateRequest {
    GenerateRequest {
        ttft_budget_ms: Some(ttft_ms),
        priority: Some(crate::api::Priority { class, max_pauses: 1, e2e_budget_ms: 60_000 }),
        ..req(prompt, max_tokens)
    }
}

fn first_token_at(events: &[(Duration, Event)]) -> Duration {
    events.iter().find(|(_, e)| matches!(e, Event::Token { .. })).expect("a token").0
}

#[tokio::test(start_paused = true)]
async fn a_higher_class_pauses_a_lower_one_at_a_token_boundary_and_it_resumes_with_identical_text() {
    // Two slots, both taken by bronze (class 1) sequences of 200 tokens
    // (~2.4 s of decode); gold (class 3, TTFT 100 ms) arrives at 50 ms.
    let limits = BatchLimits { max_batch: 2, ..BatchLimits::default() };
    let (s, _) = sched(20, 256, 16, |c| c.limits = limits.clone());
    let (alone, _) = sched(20, 256, 16, |_| {});
    let (tx, rx) = mpsc::unbounded_channel();
    alone.enqueue(tiered("bronze a", 200, 1, 10_000), 2, tx).await.unwrap();
    let reference = text(&collect(rx, tokio::time::Instant::now()).await);

    let t0 = tokio::time::Instant::now();
    let mut bronze = Vec::new();
    for p in ["bronze a", "bronze b"] {
        let (tx, rx) = mpsc::unbounded_channel();
        s.enqueue(tiered(p, 200, 1, 10_000), 2, tx).await.unwrap();
        bronze.push(tokio::spawn(collect(rx, t0)));
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    s.enqueue(tiered("gold", 5, 3, 100), 2, tx).await.unwrap();
    rx.recv().await.expect("the first token");
    // A token boundary (<= one 12 ms step), then its 20 ms prefill.
    let ttft = t0.elapsed() - Duration::from_millis(50);
    assert!(ttft <= Duration::from_millis(35), "gold waited {ttft:?}, not for a slot");
    let snap = s.snapshot().await;
    assert_eq!((snap.pauses, snap.paused_sequences), (1, 1), "one bronze paused");
    assert_eq!(snap.inflight_sequences, 3, "the paused one is still in flight");
    while rx.recv().await.is_some() {}
    let mut texts = Vec::new();
    for b in bronze {
        texts.push(text(&b.await.unwrap()));
    }
    assert_eq!(texts[0], reference, "paused and resumed, the text is unchanged");
    assert!(texts.iter().all(|t| !t.is_empty()));
    let snap = s.snapshot().await;
    assert_eq!(snap.paused_sequences, 0, "it resumed");
    assert_eq!(snap.preemptions, 0, "kept its pages: never recomputed");
}

#[tokio::test(start_paused = true)]
async fn an_equal_class_waits_for_a_slot_and_a_sequence_is_paused_at_most_its_cap() {
    let limits = BatchLimits { max_batch: 1, ..BatchLimits::default() };
    let (s, _) = sched(20, 256, 16, |c| c.limits = limits.clone());
    let t0 = tokio::time::Instant::now();
    let (tx, rx) = mpsc::unbounded_channel();
    s.enqueue(tiered("silver", 100, 2, 10_000), 2, tx).await.unwrap();
    let silver = tokio::spawn(collect(rx, t0));
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The same class: no pause, it waits for the slot (~1 s of decode).
    let (tx, rx) = mpsc::unbounded_channel();
    s.enqueue(tiered("silver 2", 5, 2, 100), 2, tx).await.unwrap();
    let peer = tokio::spawn(collect(rx, t0));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(s.snapshot().await.pauses, 0, "never for an equal class");
    // Two golds in turn: the silver's cap is one pause.
    for g in ["gold 1", "gold 2"] {
        let (tx, rx) = mpsc::unbounded_channel();
        s.enqueue(tiered(g, 3, 3, 100), 2, tx).await.unwrap();
        collect(rx, t0).await;
    }
    assert_eq!(s.snapshot().await.pauses, 1, "paused once, then no more");
    assert!(!text(&silver.await.unwrap()).is_empty());
    assert!(first_token_at(&peer.await.unwrap()) > Duration::from_millis(500), "waited for the slot");
}

/// What one request saw: first token and end (ms since the start), and
/// whether it finished (else it failed or was refused).
type Seen = Vec<(Option<u64>, Option<u64>, &'static str)>;

/// A prompt of exactly `tokens` one-piece words: the first `shared` from a
/// system prompt every such request shares, the rest its own.
fn words(i: usize, tokens: u32, shared: u32) -> String {
    (0..tokens)
        .map(|k| if k < shared { format!("s{k}") } else { format!("r{i}x{k}") })
        .map(|w| w.chars().take(4).collect::<String>())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The arrivals: (ms, prompt, prompt tokens, max_tokens). The first, at 0,
/// runs through the whole load, so the engine is never idle and every
/// token boundary falls on an even millisecond (every device time is
/// even); the others arrive on odd ones. No arrival meets a boundary,
/// where which goes first would be the runtime's choice.
fn parity_load() -> Vec<(u64, String, u32, u32)> {
    let mut rng = 7u64;
    let mut next = |n: u64| {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (rng >> 33) % n
    };
    let mut load = vec![(0, words(0, 40, 0), 40, 600)];
    load.extend((1..40).map(|i| {
        let at = (i as u64 * 120 + next(40)) | 1;
        let tokens = 20 + next(140) as u32;
        let shared = if i % 2 == 0 { tokens.min(64) } else { 0 };
        let max_tokens = 4 + next(120) as u32;
        (at, words(i, tokens, shared), tokens, max_tokens)
    }));
    load
}

/// The blocks the engine names for a request: its prompt's full blocks,
/// then those its output completes while each token is one piece (the
/// emulated model's words; a longer word ends the naming), as
/// `scheduler::seq` continues the chain.
fn named_blocks(prompt: &str, tokens: u32, max_tokens: u32, page_tokens: u32) -> Vec<u64> {
    let (mut blocks, mut chain) = Chain::of(prompt, page_tokens);
    blocks.truncate((tokens / page_tokens) as usize);
    let mut src = crate::backend::emulated::TextSource::new(prompt, None);
    for _ in 0..max_tokens {
        let Some(text) = src.next_token() else { break };
        let piece = text.trim();
        if policies::tokens::count(piece) != 1 {
            break;
        }
        blocks.extend(chain.push(piece));
    }
    blocks.iter().map(|b| b.hash).collect()
}

/// The simulator's engine (`loadtest::sim::engine`) runs this scheduler's
/// decisions (`policies::turn`): the same arrivals, through this engine
/// (emulated backend, paused time) and through the simulated one, give
/// every request the same first-token and end times and the same outcome,
/// with a cache small enough to refuse and preempt, and half the prompts
/// sharing a prefix.
#[tokio::test(start_paused = true)]
async fn the_simulators_engine_makes_the_same_decisions_at_the_same_times() {
    // Whole even milliseconds everywhere: the timer's 1 ms grain rounds
    // nothing, and token boundaries stay on even milliseconds.
    let profile = || {
        LatencyProfile::parse(
            "t",
            "model = \"m\"\nengine_class = \"t\"\n[prefill]\npoints = [[0, 6.0], [1000, 2006.0]]\n\
             [decode]\nbatch_points = [[1, 10.0], [2, 12.0], [3, 14.0], [4, 16.0]]\n",
        )
        .unwrap()
    };
    let limits = BatchLimits { max_batch: 4, reserved_long_slots: 0, ..BatchLimits::default() };
    let (pages, page_tokens) = (96, 16);
    let load = parity_load();

    // The engine.
    let kv = KvAllocator::new(KvConfig {
        total_pages: pages,
        page_tokens,
        low_watermark: 0.05,
        high_watermark: 0.15,
        prefix_cache: true,
    });
    let cfg = SchedulerConfig {
        limits: limits.clone(),
        profile: profile(),
        output_reserve_tokens: 16,
        extend_pages: 2,
        default_ttft: Duration::from_secs(2),
        max_preemptions: 2,
        min_quantum_tokens: 4,
    };
    let s = Scheduler::spawn(Emulated { profile: profile(), to_max_tokens: true }, kv, cfg);
    let t0 = tokio::time::Instant::now();
    let mut runs = Vec::new();
    for (at, prompt, tokens, max_tokens) in &load {
        tokio::time::sleep_until(t0 + Duration::from_millis(*at)).await;
        let (tx, rx) = mpsc::unbounded_channel();
        match s.enqueue(req(prompt, *max_tokens), *tokens, tx).await {
            Ok(()) => runs.push(Some(tokio::spawn(collect(rx, t0)))),
            Err(_) => runs.push(None),
        }
    }
    let mut live: Seen = Vec::new();
    for run in runs {
        let Some(run) = run else {
            live.push((None, None, "refused"));
            continue;
        };
        let events = run.await.unwrap();
        assert!(events.iter().all(|(t, _)| t.as_millis() % 2 == 0), "a boundary off the grid: {events:?}");
        let ms = |d: Duration| Some(d.as_millis() as u64);
        let first = events.iter().find(|(_, e)| matches!(e, Event::Token { .. })).and_then(|(t, _)| ms(*t));
        let (end, how) = match events.last() {
            Some((t, Event::Done { .. })) => (ms(*t), "finished"),
            Some((t, Event::Error { .. })) => (ms(*t), "failed"),
            _ => (None, "lost"),
        };
        live.push((first, end, how));
    }
    let snap = s.snapshot().await;

    // The simulated engine.
    use loadtest::sim::engine::{EngineConfig, Out, SimEngine, SimSeq};
    let mut c = EngineConfig::new(limits, profile(), u64::from(pages * page_tokens), page_tokens);
    c.output_reserve_tokens = 16;
    c.extend_pages = 2;
    c.max_preemptions = 2;
    c.min_quantum_tokens = 4;
    let mut e = SimEngine::new(&c);
    let mut sim: Seen = vec![(None, None, "lost"); load.len()];
    let mut wake: Option<f64> = None;
    let mut arrivals = load.iter().enumerate().peekable();
    loop {
        let next_arrival = arrivals.peek().map(|(_, (at, ..))| *at as f64 / 1e3);
        let mut outs = Vec::new();
        let now = match (wake, next_arrival) {
            (None, None) => break,
            (w, Some(a)) if w.is_none_or(|w| a < w) => {
                let (i, (_, prompt, tokens, max_tokens)) = arrivals.next().unwrap();
                let seq = SimSeq {
                    req: i,
                    prompt: *tokens,
                    out: *max_tokens,
                    max_tokens: *max_tokens,
                    key: f64::from(tokens + max_tokens),
                    enqueued_at: a,
                    ttft_budget_ms: 2000.0,
                    priority: None,
                    blocks: policies::prefix::block_hashes(prompt, page_tokens).into(),
                    answer: named_blocks(prompt, *tokens, *max_tokens, page_tokens).into(),
                };
                match e.enqueue(a, seq) {
                    Ok(Some(w)) => wake = Some(w),
                    Ok(None) => {}
                    Err(_) => sim[i].2 = "refused",
                }
                a
            }
            (Some(w), _) => {
                wake = e.wake(w, &mut outs);
                w
            }
            _ => unreachable!(),
        };
        let ms = Some((now * 1e3).round() as u64);
        for o in outs {
            match o {
                Out::FirstToken { req } => sim[req].0 = ms,
                Out::Finished { req, .. } => (sim[req].1, sim[req].2) = (ms, "finished"),
                Out::Failed { req, .. } => (sim[req].1, sim[req].2) = (ms, "failed"),
            }
        }
    }
    for (i, (l, s)) in live.iter().zip(&sim).enumerate() {
        assert_eq!(l, s, "request {i}: engine {l:?}, simulator {s:?}");
    }
    assert_eq!((e.preemptions(), e.hit_tokens()), (snap.preemptions, snap.cached_tokens));
    let count = |what: &str| live.iter().filter(|r| r.2 == what).count();
    assert!(count("finished") >= 25, "{live:?}");
    assert!(count("refused") > 0, "the cache was small enough to refuse: {live:?}");
    assert!(snap.preemptions > 0, "and to preempt");
    assert!(snap.cached_tokens > 0, "and prompts shared prefixes");
}
