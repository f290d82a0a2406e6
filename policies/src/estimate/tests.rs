use super::*;

fn profile() -> LatencyProfile {
    LatencyProfile::parse(
        "t.toml",
        r#"
        model = "m"
        engine_class = "c"
        [prefill]
        points = [[0, 0.0], [1000, 100.0], [8192, 819.2]]
        [decode]
        batch_points = [[1, 10.0], [9, 18.0]]
        ms_per_1k_context = 1.0
        "#,
    )
    .unwrap()
}

#[test]
fn prefill_fit_recovers_a_linear_profile_and_a_fixed_cost() {
    let (c, a, w) = fit_prefill(&profile());
    assert_eq!(c, 0.0);
    assert!((w - 1.0).abs() < 1e-6, "w = {w}");
    assert!((a - 0.1).abs() < 1e-6, "a = {a}");
    let shipped =
        LatencyProfile::parse("a100", include_str!("../../profiles/emulated-a100-8b.toml")).unwrap();
    let m = ServiceModel::from_profile(&shipped);
    assert_eq!(m.c, 11.2);
    for n in [16u32, 512, 1024, 2048, 4096, 8192] {
        let ratio = m.prefill_raw_ms(n) / ms(shipped.prefill(n));
        assert!((0.9..1.11).contains(&ratio), "{n} tokens: fit / profile = {ratio}");
    }
}

#[test]
fn prediction_on_a_hand_computed_case() {
    let m = ServiceModel::from_profile(&profile());
    let cfg = EstimatorConfig { guard_factor: 1.25, ..Default::default() };
    // 400-token prompt, 100 output tokens at batch 5:
    // prefill = 0.1 × 400 = 40 ms, × γ = 50 ms (nothing learned yet).
    // step at batch 5 = 14 ms; mean context 400 + 50 = 450 per sequence,
    // 5 × 450 = 2,250 tokens × 1 ms/1k = 2.25 ms → 16.25 ms per token.
    // decode = 100 × 16.25 × 1.25 = 2,031.25 ms.
    let p = m.predict("gold", 400, 100, 5.0, &cfg);
    assert!((p.ttft_ms(0.0) - 50.0).abs() < 1e-6, "{p:?}");
    assert!((p.decode_ms - 2031.25).abs() < 1e-3, "{p:?}");
}

#[test]
fn learns_a_slower_engine_and_keeps_a_high_quantile() {
    let mut m = ServiceModel::from_profile(&profile());
    let cfg = EstimatorConfig::default();
    // The real engine is twice as slow as its profile, with ±10% noise.
    for i in 0..400u32 {
        let noise = 1.0 + 0.1 * if i % 2 == 0 { 1.0 } else { -1.0 };
        let pre = m.prefill_raw_ms(200) * 2.0 * noise;
        let dec = m.decode_raw_ms(200, 49, 4.0) * 2.0 * noise;
        m.observe(200, 0, pre, 50, dec, 4.0, &cfg);
    }
    assert!((m.decode_ratio.mean - 2.0).abs() < 0.05, "{:?}", m.decode_ratio);
    let high = m.decode_ratio.high(cfg.ratio_z);
    assert!(high > 2.1 && high < 2.6, "p95 of the ratio covers the noise: {high}");
}

#[test]
fn output_history_is_a_bounded_quantile_capped_by_max_tokens() {
    let cfg = EstimatorConfig { min_samples: 4, output_window: 10, ..Default::default() };
    let mut h = OutputHistory::default();
    assert_eq!(h.expected(300, &cfg), 300, "no history: max_tokens");
    for n in 1..=10 {
        h.observe(n * 10, &cfg);
    }
    assert_eq!(h.expected(300, &cfg), 90, "p90 of 10..100");
    assert_eq!(h.expected(50, &cfg), 50, "never above max_tokens");
    assert_eq!(h.mean(300, &cfg), 55, "mean of 10..100");
    assert_eq!(h.mean(50, &cfg), 40, "each output capped at max_tokens: (10+20+30+40+6*50)/10");
    for _ in 0..10 {
        h.observe(5, &cfg);
    }
    assert_eq!(h.samples(), 10);
    assert_eq!(h.expected(300, &cfg), 5, "old samples fall out of the window");
}

/// The calibration's memory is bounded three ways: residuals per tier
/// (`calibration_window`), their age (`calibration_max_age_s`), and
/// tiers per class (a policy renaming tiers again and again).
#[test]
fn ttft_calibration_memory_is_bounded() {
    let cfg = EstimatorConfig { min_samples: 4, calibration_window: 16, ..Default::default() };
    let mut m = ServiceModel::from_profile(&profile());
    // 1,000 huge residuals, then two windows of small ones (the
    // quantile is recomputed every 16 changes): only the last window is
    // remembered.
    for i in 0..1000 {
        m.observe_ttft(f64::from(i) * 0.001, "gold", 10_000.0, 0.0, &cfg);
    }
    for i in 0..32 {
        m.observe_ttft(1.0 + f64::from(i) * 0.001, "gold", 5.0, 0.0, &cfg);
    }
    assert_eq!(m.ttft_residual("gold"), Some(5.0));
    assert!(m.tiers[0].1.residuals.len() <= cfg.calibration_window);
    for t in 0..(ServiceModel::MAX_TIERS + 8) {
        m.observe_ttft(2.0, &format!("tier-{t}"), 5.0, 0.0, &cfg);
    }
    assert_eq!(m.tiers.len(), ServiceModel::MAX_TIERS, "oldest tiers dropped");
    assert!(m.tiers.iter().all(|(t, _)| t != "gold"));
}

#[test]
fn ratios_ignore_nonsense() {
    let mut r = Ratio::default();
    r.observe(f64::NAN, 0.5);
    r.observe(1e9, 0.5);
    assert!(r.mean <= 20.0 && r.mean.is_finite());
}

/// The sorted window gives what selecting the quantile from the window
/// itself gives, as lengths come and go (window shrinks included).
#[test]
fn output_quantile_from_the_sorted_window_matches_a_selection_over_the_window() {
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for (window, quantile) in [(1, 0.5), (7, 0.9), (64, 0.5), (256, 0.9), (256, 1.0)] {
        let mut cfg = EstimatorConfig {
            min_samples: 1,
            output_window: window,
            output_quantile: quantile,
            ..Default::default()
        };
        let (mut h, mut plain) = (OutputHistory::default(), std::collections::VecDeque::new());
        for i in 0..2_000 {
            if i == 1_500 {
                cfg.output_window = window.div_ceil(2); // a reload shrinks the window
            }
            let tokens = (next() % 40) as u32 * 16; // many repeats
            h.observe(tokens, &cfg);
            if plain.len() >= cfg.output_window {
                plain.pop_front();
            }
            plain.push_back(tokens);
            let mut v: Vec<u32> = plain.iter().copied().collect();
            let rank = ((v.len() as f64 * quantile).ceil() as usize).clamp(1, v.len()) - 1;
            let want = (*v.select_nth_unstable(rank).1).clamp(1, 500);
            assert_eq!(h.expected(500, &cfg), want, "window {window}, quantile {quantile}, step {i}");
        }
    }
}

#[test]
fn a_backlog_of_several_prompts_is_not_charged_one_long_prompts_attention() {
    // The A100 profile has no attention term: a backlog costs the fit.
    let a100 = LatencyProfile::parse("a100", include_str!("../../profiles/emulated-a100-8b.toml")).unwrap();
    let m = ServiceModel::from_profile(&a100);
    assert_eq!(m.backlog_raw_ms(1000), m.prefill_raw_ms(1000));
    // The cpu profile's attention is most of a long prompt's prefill; a
    // backlog of 1,000 tokens in five prompts measures ~389 ms (the
    // profile's batch model), one prompt of 1,000 ~915 ms.
    let cpu = LatencyProfile::parse("cpu", include_str!("../../profiles/cpu-epyc-2core.toml")).unwrap();
    let m = ServiceModel::from_profile(&cpu);
    let five = cpu.prefill_batch_ms((0..5).map(|_| (200, 0)));
    for (tokens, batch) in [(1000, five), (600, cpu.prefill_batch_ms((0..5).map(|_| (120, 0))))] {
        let backlog = m.backlog_raw_ms(tokens);
        assert!(backlog < 0.6 * m.prefill_raw_ms(tokens), "{tokens}: {backlog} vs one prompt");
        assert!((backlog / batch - 1.0).abs() < 0.2, "{tokens}: {backlog} vs batched {batch}");
    }
    assert!(m.backlog_raw_ms(1) >= m.c, "never below the fixed cost");
}
